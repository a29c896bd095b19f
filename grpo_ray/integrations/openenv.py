"""``openenv``: an environment written for OpenEnv (``openenv-core``, Meta's and Hugging Face's environment library),
run in-process as one of ours.

An OpenEnv environment is a class with ``reset() -> Observation`` and ``step(action) -> Observation``, its action
and observation pydantic models, the observation carrying ``reward`` and ``done``: the same shape as ours. This
adapter plays one such environment per episode:

- ``reset``: the OpenEnv environment is made with ``options.kwargs`` and reset (with the row's
  ``extra_info[options.reset_key]`` as keyword arguments when that option is set); its first observation, where it
  has text, is the episode's opening (``environment.opening``): the prompt's user turn for rows that have none
  (env-first environments: a game, a task the environment draws), else checked against the row's, so that an
  environment reset on another task than the row's is seen.
- ``step``: the model's turn becomes the environment's action: the text itself in ``options.action_field`` (by
  default the action's only text field), or, when the action has other fields, the turn read as the action's
  JSON. A turn that is not a valid action is answered with the validation error (``env/tool_errors``), and the
  episode goes on. An MCP environment's tool calls (``CallToolAction``: ``{"tool_name": ..., "arguments": ...}``)
  count in ``env/tool_calls``, and those answered with an error in ``env/tool_errors``.
- The observation answered is ``options.observation_field`` (by default the observation's only field besides
  ``done``, ``reward`` and ``metadata``; its fields as JSON when there are several); its ``reward`` is the turn's
  reward (None: 0) and ``done`` ends the episode.

Recipe: ``environment: {name: openenv, options: {env: my_env.server.my_environment:MyEnvironment}}``. The class is
imported, and its action type read from its ``step``'s annotation, before anything starts. OpenEnv environments
served over HTTP (Docker, Hugging Face Spaces) are not reached: environment processes have no network.
"""

from __future__ import annotations

import inspect
import json
import typing

import pydantic

from grpo_ray.envs.base import Environment, Step, import_class, import_trouble

RESERVED = {"done", "reward", "metadata"}


def step_types(env_cls: type) -> tuple[type | None, type | None]:
    """The action and observation classes `env_cls.step` is annotated to take and return (None where it does not
    name an openenv Action / Observation subclass)."""
    from openenv.core.env_server.types import Action, Observation

    try:
        hints = typing.get_type_hints(env_cls.step)
    except Exception:
        hints = {}
    act, obs = hints.get("action"), hints.get("return")
    act = act if isinstance(act, type) and issubclass(act, Action) and act is not Action else None
    return act, obs if isinstance(obs, type) and issubclass(obs, Observation) else None


class OpenEnv(Environment):
    @classmethod
    def imports(cls, options: dict) -> list[str]:
        return [options.get("env") or "", options.get("action") or ""]

    class Options(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        _classes: tuple = pydantic.PrivateAttr(default=())  # the environment's class and its action's

        env: str
        """The OpenEnv environment class, ``module:Class`` (a subclass of openenv.core.env_server.Environment)."""
        kwargs: dict[str, typing.Any] = {}
        """Its constructor's keyword arguments."""
        action: str | None = None
        """Its action class as ``module:Class``; by default the annotation of its ``step``'s action."""
        action_field: str | None = None
        """The action field the turn's text goes in; by default the action's only field (metadata aside), when it
        takes text; without one, the turn is read as the action's JSON."""
        observation_field: str | None = None
        """The observation field shown to the model; by default its only field besides done, reward and metadata,
        or all of them as JSON."""
        reset_key: str | None = None
        """A key of the row's extra_info whose dict is passed to the environment's ``reset`` as keyword
        arguments (the episode's task); none: ``reset()``. An environment whose ``reset`` takes arguments of its own
        (beside seed and episode_id) needs one: without it every episode would play reset's defaults, not its row's
        task, so that is refused before start (unless ``no_task``)."""
        no_task: bool = False
        """Play every episode with ``reset()``'s defaults although it takes a task (the rows' tasks unused; their
        openings are then checked against the rows' prompts as environment.opening says)."""

        @pydantic.model_validator(mode="after")
        def _resolve(self):
            try:
                from openenv.core.env_server.interfaces import Environment as OpenEnvEnvironment
                from openenv.core.env_server.types import Action
            except ImportError as e:
                raise ValueError(
                    f"the openenv adapter needs openenv-core: {import_trouble('openenv-core', e)}"
                ) from None

            cls = import_class(self.env)
            if not issubclass(cls, OpenEnvEnvironment):
                raise ValueError(f"env={self.env!r} is not an openenv Environment subclass")
            act, shown = step_types(cls)
            if self.action:
                act = import_class(self.action)
                if not issubclass(act, Action):
                    raise ValueError(f"action={self.action!r} is not a subclass of openenv's Action")
            elif act is None:
                raise ValueError(
                    f"{cls.__name__}.step is not annotated with a subclass of openenv's Action: name its action class "
                    "in environment.options.action"
                )
            fields = [f for f in act.model_fields if f != "metadata"]
            if self.action_field is not None and self.action_field not in fields:
                raise ValueError(f"action_field={self.action_field!r}: {act.__name__} has fields {fields}")
            if self.action_field is None and len(fields) == 1 and act.model_fields[fields[0]].annotation is str:
                self.action_field = fields[0]
            if self.observation_field and shown and self.observation_field not in shown.model_fields:
                have = [f for f in shown.model_fields if f not in RESERVED]
                raise ValueError(f"observation_field={self.observation_field!r}: {shown.__name__} has fields {have}")
            takes = task_arguments(cls)
            if takes and self.reset_key is None and not self.no_task:
                raise ValueError(
                    f"{cls.__name__}.reset takes {', '.join(takes)} (an episode's task): name the key of the rows' "
                    "extra_info holding them in environment.options.reset_key, or set no_task: true to play every "
                    "episode with reset's defaults"
                )
            self._classes = cls, act
            return self

    def reset(self, row: dict) -> str | None:
        cls, self.action_cls = self.options._classes
        self.env = cls(**self.options.kwargs)
        key = self.options.reset_key
        kwargs = (row.get("extra_info") or {}).get(key) if key else {}
        if not isinstance(kwargs, dict):
            raise TypeError(f"extra_info[{key!r}] is {type(kwargs).__name__}: expected a dict of reset arguments")
        obs = self.env.reset(**kwargs)
        if inspect.isawaitable(obs):
            raise TypeError(f"{cls.__name__}.reset is async: the adapter calls reset() synchronously")
        return self.text(obs) if obs is not None and obs.model_dump(exclude=RESERVED) else None

    def step(self, turn: str) -> Step:
        try:
            if self.options.action_field:
                action = self.action_cls(**{self.options.action_field: turn})
            else:
                action = self.action_cls.model_validate_json(turn.strip())
        except pydantic.ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "the turn"
            return Step(f"invalid action: {where}: {first['msg']}", tool_call=True, tool_error=True)
        obs = self.env.step(action)
        if inspect.isawaitable(obs):
            raise TypeError(f"{type(self.env).__name__}.step is async: the adapter calls step() synchronously")
        tool = type(action).__name__ == "CallToolAction"  # an MCP tool call, OpenEnv's way to offer tools
        return Step(
            self.text(obs),
            reward=float(obs.reward or 0.0),
            done=bool(obs.done),
            tool_call=tool,
            tool_error=tool and getattr(obs, "error", None) is not None,
        )

    def text(self, obs) -> str:
        """The observation as the model reads it."""
        if self.options.observation_field:
            value = getattr(obs, self.options.observation_field)
            return value if isinstance(value, str) else json.dumps(value, default=str)
        shown = obs.model_dump(exclude=RESERVED)
        if len(shown) == 1:
            (value,) = shown.values()
            return value if isinstance(value, str) else json.dumps(value, default=str)
        return json.dumps(shown, default=str)


def task_arguments(cls) -> list[str]:
    """The arguments of `cls`'s ``reset`` beside seed and episode_id (and ``*args``, ``**kwargs``): its task's."""
    params = inspect.signature(cls.reset).parameters.values()
    loose = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [p.name for p in params if p.name not in ("self", "seed", "episode_id") and p.kind not in loose]
