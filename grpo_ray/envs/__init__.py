"""Environments: what answers the model between its turns (a tool, a game, a checker), for multi-turn rollouts.

An environment is a class. One instance plays one episode (a trajectory): it starts from the prompt's data row,
reads each of the model's turns as text and answers with a ``Step``::

    class Guess(Environment):
        class Options(pydantic.BaseModel):          # the recipe's environment.options, checked before start
            partial: float = 0.2

        def reset(self, row: dict) -> None:        # row: ground_truth, data_source, extra_info, prompt, messages
            self.target = int(row["ground_truth"])

        def step(self, turn: str) -> Step:         # the model's turn, decoded
            if turn.strip() == str(self.target):
                return Step(reward=1.0, done=True)
            return Step("higher" if ... else "lower")

``reset`` may return text, the episode's opening observation: the prompt's user turn for rows that have none
(a game's board), else checked against the row's (``environment.opening``, ``grpo_ray.rollouts.episodes.open_prompt``).

A recipe names one by a built-in name (``known()``) or ``module:Class`` (``environment.name``), like reward
functions. The generator runs each trajectory turn by turn (``grpo_ray.rollouts.episodes``): the model's tokens as
sampled, then the observation's tokens as the chat template lays out a message of ``environment.role``, up to
``environment.max_turns`` turns and ``environment.max_tokens`` tokens after the prompt. Only the model's own
tokens are trained on. An episode's reward is the sum of its steps' rewards; the recipe's reward functions, if
any, score the trajectory's text beside it (reward component ``environment``).

Environment code runs in sandboxed child processes of the generator (``grpo_ray.envs.child``,
``grpo_ray.sandbox``): a step that raises, runs past ``environment.timeout_s``, exits, runs out of memory
or answers something that is not a ``Step`` ends that trajectory, counted (``env/errors``, ``env/timeouts``),
never the run.
"""

from __future__ import annotations

import pydantic

from grpo_ray import libraries
from grpo_ray.envs.agent import Agent
from grpo_ray.envs.base import Environment, Step, import_class
from grpo_ray.envs.builtin import Calculator, Guess
from grpo_ray.errors import UserError

__all__ = [
    "Environment",
    "Step",
    "EnvironmentLoadError",
    "known",
    "load",
    "options",
    "played",
    "modules",
    "check",
    "jail",
]


class EnvironmentLoadError(UserError):
    """An environment name that is neither built in nor an importable ``module:Class``, or options it refuses."""


def known() -> dict[str, type[Environment] | str]:
    """The built-in environments by name: grpo-ray's own classes, and each library's adapter as the
    ``module:Class`` that ``grpo_ray.libraries`` names (imported when played)."""
    return {"agent": Agent, "calculator": Calculator, "guess": Guess, **libraries.ENVIRONMENTS}


def load(name: str) -> type[Environment]:
    """The environment class called `name`: a built-in or ``module:Class``."""
    builtins = known()
    target = builtins.get(name, name)  # a class of grpo-ray's, or a library's or a user's module:Class
    if isinstance(target, type):
        return target
    if ":" not in target:
        raise EnvironmentLoadError(
            f"environment.name={name!r}: expected a built-in ({', '.join(sorted(builtins))}) or 'module:Class'"
        )
    try:
        cls = import_class(target)
    except ValueError as e:
        raise EnvironmentLoadError(
            f"environment.name={name!r}: {e}; a module of your own is found in the working directory or the "
            "recipe's folder"
        ) from None
    missing = [f"{m}({arg})" for m, arg in (("reset", "row"), ("step", "turn")) if not callable(getattr(cls, m, None))]
    if getattr(cls, "step", None) is Environment.step:
        missing.append("step(turn) of its own (Environment's only raises)")
    if missing:
        raise EnvironmentLoadError(f"environment.name={name!r}: {cls.__name__} has no {' and no '.join(missing)}")
    return cls


def options(cls: type, given: dict) -> pydantic.BaseModel:
    """`cls`'s options from the recipe's environment.options; EnvironmentLoadError naming the key when refused."""
    kind = getattr(cls, "Options", Environment.Options)
    try:
        return kind.model_validate(dict(given))
    except pydantic.ValidationError as e:
        first = e.errors()[0]
        key = "".join(f".{p}" for p in first["loc"])
        raise EnvironmentLoadError(
            f"environment.options{key}: {first['msg'].removeprefix('Value error, ')} (given {first.get('input')!r}; "
            f"{cls.__name__} takes {', '.join(kind.model_fields) or 'no options'})"
        ) from None


def played(e) -> dict[str, tuple[str, dict]]:
    """Environment config `e`'s environments as (name, options) by label: "" for environment.name's (the rows that
    choose none), then each of environment.choices."""
    out = {"": (e.name, dict(e.options))} if e.name else {}
    return out | {label: (c.name, dict(c.options)) for label, c in e.choices.items()}


def modules(e) -> list[str]:
    """The ``module:Class`` names environment config `e` imports: each environment's name and what its options
    name (``Environment.imports``: what the openenv adapter plays, the textarena adapter's opponent, an agent's
    program); the generators import them from where the driver found them."""
    names = []
    for name, given in played(e).values():
        names += [name, *load(name).imports(given)]
    return [n for n in names if ":" in n]


def program(e) -> bool:
    """Whether environment config `e` plays an agent program (``Environment.program``): its episodes are programs
    that drive the model themselves (``grpo_ray.rollouts.agents``), not turns answered by ``step``."""
    return bool(e.name) and load(e.name).program


def check(recipe) -> None:
    """The recipe's environments load and take their options (before any actor starts), and the rest of the recipe
    holds what each needs (``Environment.check_recipe``: Harbor tasks that install at verify time need the
    network); a choice's refusal names its key (environment.choices.<label>...). An agent program plays every row:
    no choices beside it."""
    if program(recipe.environment) and recipe.environment.choices:
        raise EnvironmentLoadError(
            f"environment.name={recipe.environment.name} with environment.choices: an agent program plays every row "
            "(no choices)"
        )
    for label, (name, given) in played(recipe.environment).items():
        try:
            cls = load(name)
            try:
                cls.check_recipe(recipe, given)
            except ValueError as e:
                raise EnvironmentLoadError(str(e)) from None
            options(cls, given)
        except EnvironmentLoadError as e:
            if not label:
                raise
            raise EnvironmentLoadError(str(e).replace("environment.", f"environment.choices.{label}.", 1)) from None


def jail(recipe):
    """The sandbox of the recipe's environment processes (``grpo_ray.sandbox.Jail``): its section's, showing what
    its environments need beside its own ``paths`` (``Environment.shown``: the Harbor tasks its data names)."""
    from grpo_ray.sandbox import Jail

    out = Jail.of(recipe.environment)
    shown = [p for name, _ in played(recipe.environment).values() for p in load(name).shown(recipe)]
    out.paths = [*out.paths, *dict.fromkeys(shown)]
    return out
