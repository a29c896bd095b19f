"""``agent``: an agent program that drives the model itself, through an OpenAI-compatible endpoint the generator
serves (``grpo_ray.rollouts.endpoint``), instead of an environment answering between turns::

    environment: {name: agent, options: {program: my_agent:run, kwargs: {tools: 3}, timeout_s: 300}}

    # my_agent.py
    def run(base_url, row, tools=3):            # or async def
        client = openai.OpenAI(base_url=base_url, api_key="none")
        messages = row["messages"]
        ...                                     # its own loop: chat completions, tools, a verifier
        return reward                           # the episode's reward (a number)

Each trajectory is one call of the program, in an agent process (``grpo_ray.envs.agent_child``: the sandbox, the
endpoint the only thing it can reach), given the session's ``base_url`` and the row (``ground_truth``,
``data_source``, ``extra_info``, ``prompt``, ``messages``, as ``Environment.reset`` gets it). What it asks the model
is recorded token in, token out, and is the trajectory trained, its first call's prompt the group's prompt (the
programs of a group must open alike); its return value is the reward (component ``environment``). A program that
raises, returns something that is not a number, runs past ``timeout_s`` or calls the model 0 times ends its
trajectory, counted, never the run.

A program may carry a preparation, ``prepare`` (an attribute of the function: ``run.prepare = prepare``): called
with the program's kwargs once a generator before its agent processes start, in the generator's process (outside
the sandbox, with the node's network and files, as the recipe's data is read), it returns the node's paths to show
the agent processes read-only and keyword arguments added to each episode's. So what a program would fetch or build
in every process is made once a node and handed in (verifiers' adapter prepares its harness's programs this way).
"""

from __future__ import annotations

import math
import typing

import pydantic

from grpo_ray.envs.base import Environment, Step, import_function

_programs: dict[str, typing.Callable] = {}


def program(name: str) -> typing.Callable:
    """The function `name` (``module:function``) names, imported once; ValueError saying why not."""
    if name not in _programs:
        try:
            _programs[name] = import_function(name)
        except ValueError as e:
            raise ValueError(f"program={name!r}: {e}") from None
    return _programs[name]


def reward_of(value) -> float:
    """A program's return value as the episode's reward; TypeError unless it is a finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"the program returned {type(value).__name__} {str(value)[:80]!r}: expected a finite number")
    return float(value)


def prepared(name: str, kwargs: dict) -> tuple[list[str], dict]:
    """What program `name`'s preparation hands its agent processes: the paths to show them and the episodes'
    kwargs (its own kwargs where it has no preparation)."""
    prepare = getattr(program(name), "prepare", None)
    if prepare is None:
        return [], dict(kwargs)
    paths, more = prepare(**kwargs)
    return [str(p) for p in paths], {**kwargs, **more}


class Agent(Environment):
    program = True

    @classmethod
    def imports(cls, options: dict) -> list[str]:
        return [options.get("program") or ""]

    class Options(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")

        program: str
        """The agent program, ``module:function`` (``function(base_url, row, **kwargs) -> reward``, or async)."""
        kwargs: dict[str, typing.Any] = {}
        """Its keyword arguments."""
        timeout_s: float = pydantic.Field(300.0, gt=0)
        """Time limit of one episode, the program's whole run."""

        @pydantic.model_validator(mode="after")
        def _imports(self):
            program(self.program)
            return self

    def reset(self, row: dict) -> None:
        raise TypeError("an agent program drives its episode itself: it has no reset")

    def step(self, turn: str) -> Step:
        raise TypeError("an agent program drives its episode itself: it has no step")
