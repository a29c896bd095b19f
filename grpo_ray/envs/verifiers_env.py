"""verifiers v1 tasksets (prime-rl's environment library) with no glue (``pip install 'grpo-ray[envs]'``): a
taskset's tasks as rows, each episode played by verifiers itself, its harness driving the model through the run's
OpenAI-compatible endpoint (``environment.name: agent``)::

    data.train_files=[verifiers://my_taskset?size=256&seed=0]
    environment: {name: agent, network: true, options: {program: grpo_ray.envs.verifiers_env:episode}}

A spec names a taskset as verifiers names it (``--env.taskset.id``: an installed module exporting one ``Taskset``,
or one of verifiers' own), ``size`` tasks (default 1000) in the taskset's order or shuffled by ``seed``, and any
other key the taskset's config's (integers, numbers, true/false, else text). Each task is a row: its system prompt
and prompt as the row's messages, data_source ``verifiers/<id>``, no ground truth (the task's own rewards score it)
and ``extra_info`` ``{taskset, idx}``: its configuration and its place in the taskset.

Each episode is verifiers' ``SingleAgentEnv`` on that task (``Env.run_episode``): the harness (``null`` by default,
verifiers' chat program; ``options.kwargs.harness`` names another) runs in verifiers' subprocess runtime and calls the
model through verifiers' interception server, which forwards each call to this run's endpoint, where it is recorded
token in, token out. The reward is the trace's (the task's ``@reward`` functions, weighted as it weights them); an
episode that verifiers records as failed (a harness error, a model call refused) raises with its errors, so its
trajectory ends, counted. verifiers prepares its harness programs as uv scripts on first use (their packages from
the package index, cached under HOME: the sandbox's scratch dir), so the agent processes need the network:
``environment.network: true`` (the filesystem stays read-only). uv comes with the ``envs`` extra, found beside
python.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import threading
from pathlib import Path
from urllib.parse import parse_qsl

from grpo_ray.data.reasoning_gym import value

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
    """verifiers' environment for `taskset` (its configuration: id and the taskset's keys), one agent on `harness`
    in the subprocess runtime."""
    vf = library()
    from verifiers.v1.utils.loaders import load_environment

    agent = {"harness": {"id": harness}, "runtime": {"type": "subprocess"}}
    return load_environment(vf.SingleAgentEnvConfig.model_validate({"taskset": taskset, "agent": agent}))


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
    name, _, query = spec.removeprefix("verifiers://").partition("?")  # (data.VERIFIERS_SCHEME)
    config = {k: value(v) for k, v in parse_qsl(query)}
    size, seed = config.pop("size", 1000), config.pop("seed", None)
    taskset = {"id": name.strip("/"), **config}
    library()
    try:
        tasks = environment(taskset).taskset
        tasks = list((tasks.shuffle(seed) if seed is not None else tasks).take(size))
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


def episode(base_url: str, row: dict, harness: str = "null") -> float:
    """One episode of the row's task, verifiers' harness calling the model at `base_url`; its reward. Every
    episode of a process runs on one event loop of its own, in one serving environment a taskset and harness:
    verifiers' runtimes keep asyncio locks that belong to the loop they were made on."""
    return asyncio.run_coroutine_threadsafe(_episode(base_url, row, harness), _loop()).result()


async def _episode(base_url: str, row: dict, harness: str) -> float:
    vf = library()
    info = row.get("extra_info") or {}
    if not isinstance(info.get("taskset"), dict) or not isinstance(info.get("idx"), int):
        raise ValueError("verifiers episodes play rows of verifiers:// data (extra_info.taskset and .idx)")
    env = await _serving(info["taskset"], harness)
    # an unset key variable: the endpoint needs no key, and verifiers then sends a placeholder
    client = vf.EvalClientConfig(base_url=base_url, api_key_var="GRPO_RAY_ENDPOINT_KEY")
    played = await env.run_episode(task(env, info["taskset"], info["idx"]), vf.ModelContext("policy", client))
    if not played.ok or not played.traces:
        raise RuntimeError(f"verifiers' episode failed: {failures(played)}")
    return float(played.traces[0].reward)


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
