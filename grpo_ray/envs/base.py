"""The environment interface: one instance plays one episode (``grpo_ray.envs`` says how it is run)."""

from __future__ import annotations

import importlib
import typing
from dataclasses import dataclass, field

import pydantic


@dataclass
class Step:
    """The environment's answer to one model turn."""

    observation: str = ""
    """Text answered to the model as the next message (a tool's output, feedback); ignored when done."""
    reward: float = 0.0
    """This turn's reward, kept at its turn (``Episode.rewards``); the episode's is the sum."""
    done: bool = False
    """The episode is over: no more turns."""
    tool_call: bool = False
    """The turn called a tool (for env/tool_calls)."""
    tool_error: bool = False
    """The tool it called failed (for env/tool_errors): the failure's text is the observation, the episode goes on."""
    role: str = ""
    """The chat role the observation is written as (a game's ``user``, a tool's ``tool``); empty: environment.role."""
    images: list = field(default_factory=list)
    """Images shown with the observation, before its text (image files' bytes, PIL images, or paths), for a
    vision-language model (NeMo RL's VLM environments' observations): the engine and the learner read them in
    place; one that does not open ends the trajectory as the environment's error."""


class Environment:
    """One episode. Subclasses set ``Options`` (a pydantic model of their recipe options) and write ``reset`` and
    ``step``."""

    class Options(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")

    program: typing.ClassVar[bool] = False
    """Whether an episode is a program that drives the model itself (``agent``: ``grpo_ray.rollouts.agents`` runs
    it) rather than turns the class answers by ``reset`` and ``step`` (``grpo_ray.rollouts.episodes`` runs them)."""

    @classmethod
    def imports(cls, options: dict) -> list[str]:
        """The ``module:name`` strings `options` (the recipe's, as given) name beyond the class: the generators
        import them from where the driver found them."""
        return []

    @classmethod
    def check_recipe(cls, recipe, options: dict) -> None:
        """Before start, what the rest of the recipe must hold for the class played with `options` (ValueError
        saying what); the options themselves are checked by ``Options``."""

    @classmethod
    def shown(cls, recipe) -> list[str]:
        """The node's paths its processes see beyond the section's ``paths`` (Harbor's tasks)."""
        return []

    def __init__(self, options: pydantic.BaseModel):
        self.options = options

    def reset(self, row: dict) -> str | None:
        """Start an episode on the prompt's data row: ``ground_truth``, ``data_source``, ``extra_info``, ``prompt``
        (the text the model is given, templated) and ``messages`` (the row's chat messages). It may return the
        opening observation (a game's board, a task it holds): the prompt's user turn where the row's prompt has
        none, else checked against it (``environment.opening``). The episodes of one group must open alike."""

    def step(self, turn: str) -> Step:
        """The answer to the model's turn (its text, decoded, end of turn not included). A turn cut at the token
        limit is stepped too, as its last (an environment that is the reward scores it): with ``truncated=True``
        when ``step`` takes that keyword; its observation is not used. The turn at ``environment.max_turns`` comes
        with ``last=True`` when ``step`` takes that keyword (an environment that scores at the end scores then)."""
        raise NotImplementedError

    def close(self) -> None:
        """Free what the episode holds (a sandbox, a connection, a game). Called once at every end: done, the turn
        or token limit, a cut turn, a reset or step that raised, and the generator's shutdown. A call that hangs
        or exits costs its process: then the process's end frees what it held."""


def import_class(name: str) -> type:
    """The class `name` (``module:Class``) names; ValueError saying why not (a module that fails to import, for
    any reason, included)."""
    return _imported(name, "class")


def import_function(name: str):
    """The function (any callable) `name` (``module:function``) names; ValueError saying why not."""
    return _imported(name, "function")


def _imported(name: str, what: str):
    module_name, _, attr = name.rpartition(":")
    if not module_name or not attr:
        raise ValueError(f"expected 'module:{'Class' if what == 'class' else what}', given {name!r}")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:
        raise ValueError(f"cannot import {module_name!r} ({type(e).__name__}: {e})") from None
    found = getattr(module, attr, None)
    if not (isinstance(found, type) if what == "class" else callable(found)):
        raise ValueError(f"{module_name!r} has no {what} {attr!r}")
    return found


def import_trouble(dist: str, error: ImportError) -> str:
    """Why `dist` (a distribution, e.g. openenv-core) does not import, as the user can act on it: not installed,
    or installed beside a dependency whose version does not satisfy what `dist` or its own dependencies require
    (another package pinned it), or else the import's own error."""
    from importlib.metadata import PackageNotFoundError, requires, version

    from packaging.requirements import InvalidRequirement, Requirement

    try:
        have = version(dist)
    except PackageNotFoundError:
        return f"{dist} is not installed (pip install 'grpo-ray[envs]')"
    seen, todo = {dist}, [dist]
    while todo:  # its dependencies, breadth first: the first one installed at a version its dependent does not take
        name = todo.pop(0)
        for text in requires(name) or []:
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            if req.marker and not req.marker.evaluate({"extra": ""}) or req.name in seen:
                continue
            seen.add(req.name)
            try:
                installed = version(req.name)
            except PackageNotFoundError:
                return f"{dist} {have} is installed, but its dependency {req.name} is not (needed by {name}: {req})"
            if req.specifier and not req.specifier.contains(installed, prereleases=True):
                return (
                    f"{dist} {have} is installed, but {req.name} {installed} is, where {name} needs {req}: a version "
                    "another package pinned (pip check names both)"
                )
            todo.append(req.name)
    return f"{dist} {have} is installed, and importing it failed: {type(error).__name__}: {error}"
