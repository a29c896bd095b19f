"""The recipe's ``environment`` section: multi-turn rollouts (``grpo_ray.envs``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING


@dataclass
class EnvChoice:
    """One of the environments rows may choose (``environment.choices``)."""

    name: str = MISSING
    """As environment.name: a built-in or ``module:Class``."""
    options: dict[str, Any] = field(default_factory=dict)
    """Its options."""


@dataclass
class EnvironmentConfig:
    """Multi-turn rollouts (``grpo_ray.envs``): the model acts in an environment turn by turn (calls a tool, reads
    its answer, goes on) before its reward. Without a name, each rollout is one completion."""

    name: str = ""
    """A built-in environment (``calculator``, ``guess``, ``openenv``: one written for OpenEnv) or ``module:Class``;
    empty: single-turn rollouts."""
    options: dict[str, Any] = field(default_factory=dict)
    """The environment's own options (its ``Options``), checked before anything starts."""
    max_turns: int = 4
    """Model turns per trajectory at most."""
    max_tokens: int = 512
    """Tokens after the prompt per trajectory at most, the model's and the observations' (each turn at most
    generator.sampling.max_tokens): the learner's sequences are data.max_prompt_length plus this."""
    stop: list[str] = field(default_factory=list)
    """Strings that end a model turn before its end-of-turn token (a tool call's closing tag, ``</calc>``): the
    environment answers at once, and the end-of-turn token is the template's, not trained on."""
    role: str = "tool"
    """The chat role observations are written as (``user`` for a template without a tool role, e.g. Gemma's)."""
    timeout_s: float = 10.0
    """Time limit of one environment call; past it the trajectory ends, counted in env/timeouts."""
    memory_mb: int = 2048
    """Address-space limit of each environment process."""
    sandbox: bool = True
    """Run environment code, agent programs and Harbor tasks' commands sandboxed, as reward code runs
    (docs/operations.md#the-sandbox); an agent program reaches the run's endpoint and nothing else."""
    network: bool = False
    """Let sandboxed environment code and agent programs reach the network (a package index, a remote tool) as
    reward.network lets reward code; the rest of the sandbox holds."""
    max_processes: int = 512
    """Processes and threads an environment process may run at once (an agent process runs an episode a thread)."""
    scratch_mb: int = 1024
    """Size of an environment process's scratch tmpfs (its /tmp and HOME; /dev/shm as much again)."""
    paths: list[str] = field(default_factory=list)
    """The node's files or folders environment code may read beside the system's, Python's, sys.path's and the
    Harbor tasks' of data.train_files and data.val_files."""
    pass_env: list[str] = field(default_factory=list)
    """Environment variables handed to environment code and agent programs by name; no other variable but PATH,
    LANG, thread counts and the like reaches them."""
    workers: int = 2
    """Environment processes per engine: calls of different trajectories run at once on as many."""
    max_observation_chars: int = 8192
    """An observation longer than this ends its trajectory, counted in env/errors (a tool flooding its output)."""
    choices: dict[str, EnvChoice] = field(default_factory=dict)
    """Environments a row may choose by its label (SkyRL's ``env_class``, several environments in one dataset): label
    -> {name, options}. A row names one at ``row_key``; a row that names none plays environment.name, and one that
    names a label not here is refused before start. The other environment keys hold for all."""
    row_key: str = "env_class"
    """The row's key (dotted for a nested one: ``extra_info.env``) naming its environment among ``choices``."""
    opening: str = "prompt"
    """What an environment's opening observation (what ``reset`` returns: a game's board, a taskset's task) does:
    ``prompt``: it is the prompt's last user turn where the row's prompt has none (ends with its system message),
    and where the row has one it must be found in it, a mismatch counted in env/opening_mismatches and the first
    shown (the model read the row's prompt); ``check``: a mismatch is an error (before start, on the first row;
    then, in env/errors); ``ignore``: openings are not used."""
