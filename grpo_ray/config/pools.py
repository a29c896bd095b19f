"""The pool kinds, one row each: the recipe section that holds a pool, how many actors it runs (0: off) and what each
asks for, how its actors form a group, what a lost actor costs, the signal it gives, and the names of the planner's
memory and time models for it (None: not modelled, and ``plan`` says so). Placement reads its counts and resources
from here; the planner, start-up, metrics and fault handling are to follow (issue 54).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from grpo_ray.config.schema import Recipe


@dataclass(frozen=True)
class PoolKind:
    name: str
    section: str
    """The recipe section that configures it."""
    count: Callable[[Recipe], int]
    """Its actors under the recipe; 0 when the recipe does not turn it on."""
    cpus: Callable[[Recipe], float]
    """Ray CPUs per actor."""
    gpus: Callable[[Recipe], int]
    """GPUs per actor on cuda (0 on CPU, where every pool runs on the node's cores)."""
    group: str
    """How its actors work together: "fsdp" (one sharded group: every actor in every call), "engines" (each its own
    vLLM engine, an even share each), "workers" (independent processes, an even share each)."""
    lost: str
    """What a lost actor costs the run."""
    signal: str
    """What it gives the step."""
    memory: tuple[str, ...]
    """The fit check's names (``grpo_ray.fit``) for one actor's memory; empty: not modelled."""
    time: str | None
    """The time model's phase for its work (``grpo_ray.speed``), or None: not modelled."""


def _on_gpu(n: int) -> Callable[[Recipe], int]:
    return lambda r: n if r.cluster.device == "cuda" else 0


def _frozen_scorer(name: str, count: Callable[[Recipe], int], signal: str) -> PoolKind:
    """A frozen model scoring every sampled token: one FSDP2 group over its actors, the reference's memory model on
    its own shape, a phase of its own in the time model; a lost actor stops the run (its shard is gone)."""
    return PoolKind(
        name,
        name,
        count=count,
        cpus=lambda r: getattr(r, name).num_cpus,
        gpus=_on_gpu(1),
        group="fsdp",
        lost="the run stops; a rerun resumes from the last checkpoint",
        signal=signal,
        memory=("reference_memory",),
        time=name,
    )


KINDS: dict[str, PoolKind] = {
    k.name: k
    for k in (
        PoolKind(
            "generator",
            "generator",
            count=lambda r: r.generator.num_engines,
            cpus=lambda r: r.generator.num_cpus,
            gpus=lambda r: r.generator.tensor_parallel_size if r.cluster.device == "cuda" else 0,
            group="engines",
            lost="replaced in its bundle, given the current weights, its share generated again",
            signal="rollouts (token ids, sampler logprobs)",
            memory=("generator_memory",),
            time="generation",
        ),
        PoolKind(
            "learner",
            "learner",
            count=lambda r: r.learner.world_size,
            cpus=lambda r: r.learner.num_cpus,
            gpus=_on_gpu(1),
            group="fsdp",
            lost="the run stops (its shard of the state is gone); a rerun resumes from the last checkpoint",
            signal="the update, and the weights pushed to the generators",
            memory=("learner_memory", "job_learner_memory"),
            time="update",
        ),
        # no KL term: no reference; LoRA: the learner is its own reference (the adapters switched off)
        _frozen_scorer(
            "reference",
            lambda r: r.reference.num_actors if r.algorithm.kl_coef > 0 and not r.model.lora.rank else 0,
            "per token: the frozen policy's logprobs (the KL term)",
        ),
        _frozen_scorer(
            "teacher",
            lambda r: r.teacher.num_actors if r.teacher.model else 0,
            "per token: the teacher's logprobs (distillation)",
        ),
        PoolKind(
            "reward_model",
            "reward_model",
            count=lambda r: r.reward_model.num_actors if r.reward_model.model else 0,
            cpus=lambda r: r.reward_model.num_cpus,
            gpus=_on_gpu(1),
            group="fsdp",  # a classifier's (or whole copies with shard: false); a judge's actors are engines
            lost="the pool is started again and the batch scored again",
            signal="per sequence: a learned score, or a judge's",
            memory=("reference_memory", "judge_memory"),
            time=None,
        ),
        PoolKind(
            "reward",
            "reward",
            count=lambda r: r.reward.num_actors,
            cpus=lambda r: r.reward.num_cpus,
            gpus=_on_gpu(0),
            group="workers",
            lost="its sandboxed child is replaced; a failing sample scores 0 and is counted",
            signal="per sequence: the reward functions' weighted sum",
            memory=("CPU_RUNTIME_GB",),  # its process alone: the samples run in children
            time="reward",
        ),
    )
}
"""Every pool kind, in the order pools start and are listed."""

POOLS = tuple(KINDS)
"""The pool names, in KINDS' order."""
