"""Starting a job: join (or start) the Ray cluster, then train, or replay one step of a dump."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import ray

from grpo_ray.config import Recipe
from grpo_ray.controller import Controller
from grpo_ray.metrics import since_start
from grpo_ray.setup_run import RunInputs

__all__ = ["connect", "train", "replay"]


def connect(recipe: Recipe) -> None:
    """Join the cluster in RAY_ADDRESS (as under `ray job submit`), or start a new local one that stands in
    for every node group: it carries each node marker the recipe's pools ask for."""
    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            ray.init(address=os.environ["RAY_ADDRESS"])
        else:
            # Ray 2.60 turns token auth on for a new local cluster and warns that it did: nothing to act on here
            logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
            markers = {m: 1000.0 for m in recipe.cluster.node_resources.values()}
            ray.init(address="local", include_dashboard=False, resources=markers or None)
        nodes, has = [n for n in ray.nodes() if n["Alive"]], ray.cluster_resources()
        where = f"joined {os.environ['RAY_ADDRESS']}" if os.environ.get("RAY_ADDRESS") else "a local cluster"
        print(
            f"{since_start()} Ray up: {where}, {len(nodes)} node(s), {has.get('CPU', 0):g} CPUs, "
            f"{has.get('GPU', 0):g} GPUs",
            flush=True,
        )


def train(recipe: Recipe, inputs: RunInputs) -> None:
    connect(recipe)
    Controller(recipe, inputs).run()


def replay(recipe: Recipe, dump_path: str) -> dict[str, float]:
    """One learner step on a training dump, with no generators: only the learner (and reference) pools start.

    The loaded weights are taken as those that generated the dump (its policy_version), so replaying step N's
    dump into learners holding the weights of step N-1 reproduces an on-policy step's update. A batch generated
    with older weights than the learner's (max_staleness >= 1) had those older weights as its old policy: its
    replay reproduces the update only when the loaded weights are the generating ones and the step's own."""
    from grpo_ray import models
    from grpo_ray.dims import model_dims
    from grpo_ray.dumps import load_dump

    rollouts, advantages = load_dump(dump_path)
    out = Path(recipe.trainer.output_dir) / "replay"
    out.mkdir(parents=True, exist_ok=True)
    connect(recipe)
    model = models.resolve(recipe.model.path)
    teacher = models.resolve(recipe.teacher.model) if recipe.teacher.model else ""
    c = Controller(recipe, RunInputs(model, model_dims(model), [], [], {}, out, [], teacher_path=teacher))
    try:
        c.start(pools=("learner", "reference", "teacher"))
        return c.replay(rollouts, advantages)
    finally:
        c.shutdown()
