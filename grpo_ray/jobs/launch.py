"""Starting a job: join (or start) the Ray cluster, then train, or replay one step of a dump."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from pathlib import Path

import ray

from grpo_ray import checkpoint
from grpo_ray.config import KINDS, LEARNER, Recipe
from grpo_ray.controller import GRPOController
from grpo_ray.errors import RunError, StateLost
from grpo_ray.faults import fault_at
from grpo_ray.placement import local_markers
from grpo_ray.runner import Runner
from grpo_ray.setup_run import RunInputs
from grpo_ray.telemetry.metrics import since_start

__all__ = ["connect", "train", "kept_going", "replay"]

PRESTART_OFF = ("RAY_enable_worker_prestart", "RAY_prestart_worker_first_driver")
"""Ray's settings (read by the raylet a new local cluster starts) that start idle workers ahead of any task."""


def connect(recipe: Recipe) -> None:
    """Join the cluster in RAY_ADDRESS (as under `ray job submit`), or start a new local one that stands in
    for every node group: it carries each node marker the recipe's pools ask for."""
    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            ray.init(address=os.environ["RAY_ADDRESS"])
        else:
            # Ray 2.60 turns token auth on for a new local cluster and warns that it did: nothing to act on here
            logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
            # no idle workers started ahead: every pool's actor has a runtime env of its own and starts its own
            # worker, so those would only take CPU from the actors' imports while they start (a second here)
            for var in PRESTART_OFF:
                os.environ.setdefault(var, "0")
            start_local(local_markers(recipe.cluster))
        nodes, has = [n for n in ray.nodes() if n["Alive"]], ray.cluster_resources()
        where = f"joined {os.environ['RAY_ADDRESS']}" if os.environ.get("RAY_ADDRESS") else "a local cluster"
        print(
            f"{since_start()} Ray up: {where}, {len(nodes)} node(s), {has.get('CPU', 0):g} CPUs, "
            f"{has.get('GPU', 0):g} GPUs",
            flush=True,
        )


STARTUP_TIMEOUT = "timed out during startup"
"""Ray's words when its raylet did not register in time: on a busy machine its dashboard agent can take longer than
the 15 s the raylet waits for it (ray-project/ray#65983), and the raylet exits."""


def start_local(markers: dict[str, float], tries: int = 3) -> None:
    """Start a local Ray cluster; a start that timed out (a busy machine) is tried again, said in one line."""
    for attempt in range(1, tries + 1):
        try:
            if fault_at("ray_start_timeout", attempt):
                raise RuntimeError(f"fault injected: the current node {STARTUP_TIMEOUT}")
            ray.init(address="local", include_dashboard=False, resources=markers or None)
            return
        except Exception as e:  # Ray raises a bare Exception here
            if STARTUP_TIMEOUT not in str(e) or attempt == tries:
                raise
            print(
                f"{since_start()} Ray's local start timed out (its raylet gave up waiting for its dashboard agent: "
                f"a busy machine, ray-project/ray#65983); starting it again ({attempt + 1} of {tries})",
                flush=True,
            )


def train(recipe: Recipe, inputs: RunInputs) -> None:
    connect(recipe)
    kept_going(lambda given: GRPOController(recipe, given), inputs)


def kept_going(runner: Callable[[RunInputs], Runner], inputs: RunInputs) -> None:
    """``runner(inputs).run()``; where the run lost a learner rank and no copy of its state survived to start it
    again from (``StateLost``, trainer.fault_tolerance=all), the run is started again in this job from its newest
    whole checkpoint (the one it started from, where it has saved none since), as a retried job would: its pools
    new, the steps after the checkpoint trained again. Once per checkpoint: lost again before a newer one, it
    stops."""
    tried: set[Path] = set()
    while True:
        try:
            runner(inputs).run()
            return
        except StateLost as e:
            ckpt = checkpoint.find_resume(inputs.output_dir, "auto") or inputs.resume
            if ckpt is None or ckpt in tried:
                why = "no whole checkpoint to start from" if ckpt is None else f"lost again since starting from {ckpt}"
                raise RunError(f"{e}; {why}") from e
            tried.add(ckpt)
            done = checkpoint.load_state(ckpt)["step"]
            last = checkpoint.last_logged(inputs.output_dir / "metrics.jsonl")
            print(
                f"{since_start()} {e}; starting the run again in this job from {ckpt} (step {done}; steps "
                f"{done + 1} on trained again, {max(0, last - done)} of them done before)",
                flush=True,
            )
            inputs = dataclasses.replace(inputs, resume=ckpt)


def replay(recipe: Recipe, dump_path: str) -> dict[str, float]:
    """One learner step on a training dump, with no generators: only the learner (and reference) pools start.

    The loaded weights are taken as those that generated the dump (its policy_version), so replaying step N's
    dump into learners holding the weights of step N-1 reproduces an on-policy step's update. A batch generated
    with older weights than the learner's (max_staleness >= 1) had those older weights as its old policy: its
    replay reproduces the update only when the loaded weights are the generating ones and the step's own."""
    from grpo_ray import models
    from grpo_ray.models.dims import model_dims
    from grpo_ray.telemetry.dumps import load_dump

    rollouts, advantages = load_dump(dump_path)
    out = Path(recipe.trainer.output_dir) / "replay"
    out.mkdir(parents=True, exist_ok=True)
    connect(recipe)
    model = models.resolve(recipe.model.path)
    tokens = [k for k in KINDS.values() if k.signal == "token"]  # the learner's signals: reference, teacher, ...
    own = {k.model: models.resolve(k.model_name(recipe)) for k in tokens if k.model != "model.path" and k.count(recipe)}
    c = GRPOController(recipe, RunInputs(model, model_dims(model), [], [], {}, out, [], scorer_models=own))
    try:
        c.start(pools=(LEARNER, *(k.name for k in tokens)))
        return c.replay(rollouts, advantages)
    finally:
        c.shutdown()
