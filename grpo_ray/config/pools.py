"""The pool kinds, one row each (a pool's recipe section is its name): how many actors it runs (0: off) and what each
asks for, and the names of the planner's memory and time models for it (no time: not modelled, and ``plan`` says
so). Placement reads its counts and resources from here and ``plan`` its time model's phase; a row gains a field
when a reader of it moves here (start-up, metrics and fault handling still name pools: issue 54).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from grpo_ray.config.schema import Recipe


@dataclass(frozen=True)
class PoolKind:
    name: str
    count: Callable[[Recipe], int]
    """Its actors under the recipe; 0 when the recipe does not turn it on."""
    cpus: Callable[[Recipe], float]
    """Ray CPUs per actor."""
    gpus: Callable[[Recipe], int]
    """GPUs per actor on cuda (0 on CPU, where every pool runs on the node's cores)."""
    memory: str
    """The fit check's function for one actor's memory (``grpo_ray.planner.memory``; every pool's is modelled)."""
    time: str | None
    """The time model's phase for its work (``grpo_ray.planner.speed``), or None: not modelled."""


def _on_gpu(n: int) -> Callable[[Recipe], int]:
    return lambda r: n if r.cluster.device == "cuda" else 0


def _frozen_scorer(name: str, count: Callable[[Recipe], int]) -> PoolKind:
    """A frozen model scoring every sampled token (one FSDP2 group): the reference's memory model on its own shape,
    a phase of its own in the time model."""
    return PoolKind(name, count, lambda r: getattr(r, name).num_cpus, _on_gpu(1), f"{name}_pool", name)


KINDS: dict[str, PoolKind] = {
    k.name: k
    for k in (
        PoolKind(
            "generator",
            count=lambda r: r.generator.num_engines,
            cpus=lambda r: r.generator.num_cpus,
            gpus=lambda r: r.generator.tensor_parallel_size if r.cluster.device == "cuda" else 0,
            memory="generator_pool",
            time="generation",
        ),
        PoolKind(
            "learner",
            count=lambda r: r.learner.world_size,
            cpus=lambda r: r.learner.num_cpus,
            gpus=_on_gpu(1),
            memory="learner_pool",
            time="update",
        ),
        # no KL term: no reference; LoRA: the learner is its own reference (the adapters switched off)
        _frozen_scorer(
            "reference", lambda r: r.reference.num_actors if r.algorithm.kl_coef > 0 and not r.model.lora.rank else 0
        ),
        _frozen_scorer("teacher", lambda r: r.teacher.num_actors if r.teacher.model else 0),
        PoolKind(  # a classifier (the reference's memory model) or a judge's engines
            "reward_model",
            count=lambda r: r.reward_model.num_actors if r.reward_model.model else 0,
            cpus=lambda r: r.reward_model.num_cpus,
            gpus=_on_gpu(1),
            memory="reward_model_pool",
            time="reward_model",
        ),
        PoolKind(
            "reward",
            count=lambda r: r.reward.num_actors,
            cpus=lambda r: r.reward.num_cpus,
            gpus=lambda r: 0,  # rule rewards run on CPUs everywhere
            memory="reward_pool",
            time="reward",
        ),
    )
}
"""Every pool kind, in the order pools start and are listed."""

POOLS = tuple(KINDS)
"""The pool names, in KINDS' order."""
