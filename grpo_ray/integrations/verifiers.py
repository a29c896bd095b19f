"""verifiers v1 tasksets (prime-rl's environment library) with no glue (``pip install 'grpo-ray[envs]'``): a
taskset's tasks as rows, each episode played by verifiers itself, its harness driving the model through the run's
OpenAI-compatible endpoint (``environment.name: agent``)::

    data.train_files=[verifiers://my_taskset?size=256&seed=0]
    environment: {name: agent, options: {program: grpo_ray.integrations.verifiers:episode}}

A spec names a taskset as verifiers names it (``--env.taskset.id``: an installed module exporting one ``Taskset``,
or one of verifiers' own), ``size`` tasks (default 1000) in the taskset's order or shuffled by ``seed``, and any
other key the taskset's config's (integers, numbers, true/false, else text). Each task is a row: its system prompt
and prompt as the row's messages, data_source ``verifiers/<id>``, no ground truth (the task's own rewards score it)
and ``extra_info`` ``{taskset, idx}``: its configuration and its place in the taskset.

Each episode is the taskset's own ``Env`` where its module exports one (a multi-turn env driving its seat through
``interaction.turn()``, a multi-agent env's seats), else verifiers' ``SingleAgentEnv``, on that task
(``Env.run_episode``): every seat in verifiers' subprocess runtime (the sandbox is the box), a seat that pins no
harness on ``harness`` (``null`` by default, verifiers' chat program; ``options.kwargs.harness`` names another), its
calls through verifiers' interception server to this run's endpoint, where they are recorded token in, token out.
Exactly one seat may play the run's model (the endpoint records one conversation an episode): an env seating it
twice is refused before start. The reward is that seat's trace's (the task's ``@reward`` functions and what the env
records, weighted as they weight them); an episode that verifiers records as failed (a harness error, a model call
refused) raises with its errors, so its trajectory ends, counted.

verifiers prepares a harness's programs as uv scripts (their packages from the package index). ``prepare``, the
program's preparation (``grpo_ray.envs.agent``), does it once a generator outside the sandbox, in the node's uv
cache; the agent processes see the prepared environments read-only and run them as they are, with no network. uv
comes with the ``envs`` extra, found beside python.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import parse_qsl

from grpo_ray.integrations.reasoning_gym import value


class Untrainable(ValueError):
    """A taskset's env this run cannot train, said in grpo-ray's words (not as verifiers' refusal)."""


_tasks: dict[str, tuple] = {}  # by taskset configuration: the tasks found so far by place, and the rest to read
_lock = threading.Lock()


def library():
    """verifiers.v1, or ValueError saying why it does not import (not installed, or a dependency's version)."""
    try:
        import verifiers.v1 as vf
    except ImportError as e:
        from grpo_ray.envs.base import import_trouble

        raise ValueError(import_trouble("verifiers", e)) from None
    return vf


def environment(taskset: dict, harness: str = "null"):
    """verifiers' environment for `taskset` (its configuration: id and the taskset's keys): the taskset's own `Env`
    where its module exports one (its seats as it declares them), else verifiers' `SingleAgentEnv`; every seat in
    the subprocess runtime (the sandbox is the box here), a seat that pins no harness on `harness`. ValueError,
    in grpo-ray's words, for an env this run cannot train: other than exactly one seat playing the run's model."""
    library()
    from verifiers.v1.configs.agent import agent_config_fields
    from verifiers.v1.utils.loaders import env_config_type, load_environment

    kind = env_config_type(taskset["id"])
    seats = agent_config_fields(kind.model_validate({"taskset": taskset}))
    policy = policy_seats(seats)
    if len(policy) != 1:
        raise Untrainable(
            f"taskset {taskset['id']!r}: its env's config {kind.__name__} seats {', '.join(policy) or 'no agent'} "
            "on the run's model: a run trains one "
            "conversation an episode (one recorded session of its endpoint), so exactly one seat may play the "
            "policy; pin the others to a model and client of their own in the env's config"
        )
    agents = {
        name: {"runtime": {"type": "subprocess"}} | ({} if seat.harness else {"harness": {"id": harness}})
        for name, seat in seats.items()
    }
    return load_environment(kind.model_validate({"taskset": taskset, **agents}))


def policy_seats(seats: dict) -> list[str]:
    """The names of the seats (verifiers' ``AgentConfig`` by name) that play the run's model: no model or client of
    their own."""
    return [name for name, seat in seats.items() if seat.model is None and seat.client is None]


def seat(env) -> str:
    """The name of `env`'s one seat on the run's model (``environment`` checked there is one)."""
    from verifiers.v1.configs.agent import agent_config_fields

    return policy_seats(agent_config_fields(env.config))[0]


def messages(data) -> list[dict]:
    """A task's system prompt and prompt as chat messages; ValueError for a task with no prompt (the user opens)."""
    prompt = data.prompt
    if prompt is None:
        raise ValueError(f"task {data.idx} has no prompt (a user that opens the conversation is not supported here)")
    turns = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    system = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    return system + [{"role": m["role"], "content": str(m["content"])} for m in turns]


def rows(spec: str) -> list[dict]:
    """The rows of a ``verifiers://taskset?size=N&seed=S&key=value`` spec; ValueError saying what is wrong (the
    data layer says it as the spec's DataError)."""
    name, _, query = spec.removeprefix("verifiers://").partition("?")
    config = {k: value(v) for k, v in parse_qsl(query)}
    size, seed = config.pop("size", 1000), config.pop("seed", None)
    taskset = {"id": name.strip("/"), **config}
    library()
    try:
        tasks = environment(taskset).taskset
        tasks = list((tasks.shuffle(seed) if seed is not None else tasks).take(size))
    except Untrainable:
        raise
    except Exception as e:  # verifiers' own checks of the taskset and its configuration: said as it says them
        said = " ".join(str(e).split())[:300]
        raise ValueError(f"verifiers refuses taskset {taskset}: {type(e).__name__}: {said}") from None
    made = [messages(t.data) for t in tasks]
    return [
        {
            "data_source": f"verifiers/{taskset['id']}",
            "prompt": prompt,
            "reward_model": {"style": "rule", "ground_truth": ""},
            "extra_info": {"index": i, "taskset": taskset, "idx": t.data.idx},
        }
        for i, (t, prompt) in enumerate(zip(tasks, made))
    ]


def task(env, taskset: dict, idx: int):
    """The task at place `idx` of `env`'s taskset (its load order), found once per process."""
    key = json.dumps(taskset, sort_keys=True)
    with _lock:
        found, rest = _tasks.setdefault(key, ({}, iter(env.taskset)))
        while idx not in found:  # each task read once, however many rows ask
            t = next(rest)
            found[t.data.idx] = t
    return found[idx]


def episode(base_url: str, row: dict, harness: str = "null", prepared: dict | None = None) -> float:
    """One episode of the row's task, verifiers' harness calling the model at `base_url`; its reward. Every
    episode of a process runs on one event loop of its own, in one serving environment a taskset and harness:
    verifiers' runtimes keep asyncio locks that belong to the loop they were made on. `prepared`: the harness's
    programs as ``prepare`` left them on this node (their interpreters by the script's digest)."""
    return asyncio.run_coroutine_threadsafe(_episode(base_url, row, harness, prepared or {}), _loop()).result()


async def _episode(base_url: str, row: dict, harness: str, prepared: dict) -> float:
    vf = library()
    info = row.get("extra_info") or {}
    if not isinstance(info.get("taskset"), dict) or not isinstance(info.get("idx"), int):
        raise ValueError("verifiers episodes play rows of verifiers:// data (extra_info.taskset and .idx)")
    await _adopt(harness, prepared)
    env = await _serving(info["taskset"], harness)
    # an unset key variable: the endpoint needs no key, and verifiers then sends a placeholder
    client = vf.EvalClientConfig(base_url=base_url, api_key_var="GRPO_RAY_ENDPOINT_KEY")
    played = await env.run_episode(task(env, info["taskset"], info["idx"]), vf.ModelContext("policy", client))
    if not played.ok or not played.traces:
        raise RuntimeError(f"verifiers' episode failed: {failures(played)}")
    # the policy seat's run: the conversation the endpoint recorded (a seat run again is answered off the record)
    policy = seat(env)
    ours = [t for t in played.traces if t.agent.name == policy]
    if not ours:
        raise RuntimeError(f"verifiers' episode ran no agent on the seat {policy!r} that plays the run's model")
    return float(ours[0].reward)


class _Scripts:
    """Stands in for a runtime in a harness's ``setup``: the uv scripts it would prepare, by digest."""

    def __init__(self):
        self.found: dict[str, tuple[bytes, dict]] = {}

    async def prepare_uv_script(self, script, env=None, *, activate=True):
        data = script.encode() if isinstance(script, str) else script
        self.found[hashlib.sha256(data).hexdigest()] = (data, dict(env or {}))
        return []


async def scripts(harness: str) -> dict[str, tuple[bytes, dict]]:
    """The uv scripts `harness`'s setup prepares (its program's source and uv's environment, by digest); {} for a
    harness that sets up more than uv scripts (node programs: it prepares in the agent processes, as verifiers
    does)."""
    from verifiers.v1.utils.loaders import harness_config_type, load_harness

    found = _Scripts()
    try:
        await load_harness(harness_config_type(harness).model_validate({"id": harness})).setup(found)
    except AttributeError:  # it asked the runtime for more than a script
        return {}
    return found.found


def prepare(harness: str = "null") -> tuple[list[str], dict]:
    """The agent program's preparation (``grpo_ray.envs.agent``), once a generator, outside the sandbox: the
    harness's uv scripts synced in this node's uv cache (the user's, as verifiers on this node would use it: from
    the cache offline where they are there, else fetched from the package index once), shown read-only to the agent
    processes, which run them as they are (no uv, no network, no download in an episode). RuntimeError with uv's
    words where a script cannot be prepared."""
    library()
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    bin_dir = Path(sys.executable).parent  # the envs extra's uv
    base = {**os.environ, "PATH": os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])}
    uv = [str(bin_dir / "uv") if (bin_dir / "uv").is_file() else "uv"]
    interpreters = {}
    for digest, (data, env) in asyncio.run(scripts(harness)).items():
        path = Path(SubprocessRuntime.scripts_dir) / f"{digest}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_bytes() != data:
            path.write_bytes(data)
        sync = [*uv, "sync", "--script", str(path), "-q", "--no-config"]
        done = subprocess.run(sync, env={**base, **env, "UV_OFFLINE": "1"}, capture_output=True, text=True)
        if done.returncode:  # not all in the cache: fetched once
            done = subprocess.run(sync, env={**base, **env, "UV_OFFLINE": "0"}, capture_output=True, text=True)
        if done.returncode:
            said = " ".join(done.stderr.split())[-400:]
            raise RuntimeError(f"verifiers' {harness} harness: its program could not be prepared with uv: {said}")
        find = [*uv, "python", "find", "--script", str(path), "--no-config"]
        found = subprocess.run(find, env={**base, **env, "UV_OFFLINE": "1"}, capture_output=True, text=True)
        interpreters[digest] = found.stdout.strip().splitlines()[-1]
    return [str(Path(i).parent.parent) for i in interpreters.values()], {"prepared": interpreters}


episode.prepare = prepare


async def _adopt(harness: str, prepared: dict) -> None:
    """Hand verifiers' subprocess runtime the programs ``prepare`` left on this node, once a process (concurrent
    first episodes wait for one): each script written where verifiers looks for it, its interpreter known, so that
    verifiers runs it without preparing it."""
    adopted = _state.setdefault("adopted", {})
    if prepared and harness not in adopted:
        adopted[harness] = asyncio.ensure_future(_write(harness, prepared))
    if prepared:
        await adopted[harness]


async def _write(harness: str, prepared: dict) -> None:
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    for digest, (data, _) in (await scripts(harness)).items():
        if digest in prepared and Path(prepared[digest]).exists():
            path = Path(SubprocessRuntime.scripts_dir) / f"{digest}.py"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            SubprocessRuntime._interpreters[str(path)] = prepared[digest]


_state: dict = {}  # the loop, the serving environments and what keeps them serving, made once a process


def _loop() -> asyncio.AbstractEventLoop:
    with _lock:
        if "loop" not in _state:
            # verifiers looks for uv on PATH (else downloads it): the one the envs extra installs beside python
            os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="verifiers", daemon=True).start()
            _state.update(loop=loop, envs={}, stack=contextlib.AsyncExitStack())
    return _state["loop"]


async def _serving(taskset: dict, harness: str):
    """The environment of `taskset` on `harness`, serving (its interception server up) until the process ends."""
    key = json.dumps([taskset, harness], sort_keys=True)
    envs = _state["envs"]
    if key not in envs:
        envs[key] = asyncio.ensure_future(_serve(taskset, harness))  # concurrent first episodes wait for one
    return await envs[key]


async def _serve(taskset: dict, harness: str):
    env = environment(taskset, harness)
    await _state["stack"].enter_async_context(env.serving())
    return env


def failures(played) -> str:
    """What went wrong in a failed episode, as verifiers recorded it: the episode's, its traces' and their model
    calls' errors (the first one's traceback where it has one)."""
    errors = [
        *played.errors,
        *(e for t in played.traces for e in t.errors),
        *(c.error for t in played.traces for c in t.calls if c.error),
    ]
    if not errors:
        return "not ok, no error recorded"
    said = "; ".join(f"{e.type}: {e.message}" for e in errors[:3])
    return said + (f"\n{errors[0].traceback}" if errors[0].traceback else "")
