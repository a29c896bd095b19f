"""``plan --suggest``: the layouts a recipe allows (engines and learner ranks, the schedule, the forward's layout, the
micro batch), each predicted (``speed.predict``) and checked to fit (``fit.check``), fastest first."""

from __future__ import annotations

import os
from dataclasses import dataclass

from grpo_ray import placement
from grpo_ray.config import KINDS, Recipe
from grpo_ray.models.dims import ModelDims
from grpo_ray.planner import fit
from grpo_ray.planner.rates import Rates
from grpo_ray.planner.speed import Prediction, Shape, predict


@dataclass
class Suggestion:
    overrides: list[str]
    prediction: Prediction
    memory_gb: float
    """The fullest device's memory (GPU) or node's host memory (CPU), as plan counts it."""


def layouts(r: Recipe, devices: int) -> list[list[str]]:
    """The layouts the recipe allows, as override lists: the generator / learner split (on GPUs, engines x tensor
    parallel and learner ranks on `devices` GPUs less the frozen pools'; on CPU one or two engines and ranks), the
    schedule (max_staleness 0 or 1), the forward's layout (shared prompts or packed) and the learner's micro batch
    size (half, as is, twice)."""
    g, l = r.generator, r.learner
    if r.cluster.device == "cuda":
        plans = placement.plan(r)
        frozen = sum(plans[k.name].actors * plans[k.name].gpus for k in KINDS.values() if k.model and k.signal)
        splits = [
            (e, tp, devices - frozen - e * tp)
            for tp in sorted({g.tensor_parallel_size, 1, 2, 4, 8})
            for e in range(1, devices)
            if devices - frozen - e * tp >= 1
        ]
    else:
        splits = [(e, 1, w) for e in (1, 2) for w in (1, 2)]
    micro = sorted({max(1, l.micro_batch_size // 2), l.micro_batch_size, l.micro_batch_size * 2})
    return [
        [
            f"generator.num_engines={e}",
            *([f"generator.tensor_parallel_size={tp}"] if r.cluster.device == "cuda" else []),
            f"learner.world_size={w}",
            f"algorithm.max_staleness={k}",
            f"model.shared_prompt={s}",
            f"learner.micro_batch_size={m}",
        ]
        for e, tp, w in splits
        for k in sorted({r.algorithm.max_staleness, 0, 1})
        for s in ("true", "false")
        for m in micro
    ]


def suggest(
    make, r: Recipe, d: ModelDims, rates: Rates, shape: Shape, devices: int, top: int | None = 3, node_cpus: int = 0
) -> list[Suggestion]:
    """The `top` fastest layouts (``layouts``; None: all of them) that load (`make(overrides)` -> Recipe, raising
    RecipeError when the combination is refused) and fit (``fit.check``; on CPU, their pools also ask for no more
    CPUs than the nodes have: `node_cpus` each, 0: this machine's cores, as ``predict`` assumes), by predicted step
    time."""
    from grpo_ray.config import RecipeError

    out = []
    for overrides in layouts(r, devices):
        try:
            candidate = make(overrides)
        except RecipeError:
            continue
        report = fit.check(candidate, d)
        if not report.fits or cpus_short(candidate, node_cpus):
            continue
        busiest = max((m.total for m in report.memory), default=0.0)
        out.append(Suggestion(overrides, predict(candidate, d, rates, shape, node_cpus), busiest))
    out.sort(key=lambda s: s.prediction.step)
    distinct, seen = [], set()
    for s in out:  # layouts that change nothing of the step (a micro batch larger than a rank's share) once
        key = (round(s.prediction.step, 6), round(s.memory_gb, 3))
        if key not in seen:
            seen.add(key)
            distinct.append(s)
    return distinct[:top]


def cpus_short(r: Recipe, node_cpus: int = 0) -> bool:
    """A CPU recipe whose pools ask for more CPUs than its nodes have, `node_cpus` each (0: this machine's cores):
    ``placement.reserve`` would refuse it."""
    if r.cluster.device != "cpu":
        return False
    asked = sum(p.actors * p.cpus for p in placement.plan(r).values())
    return asked > r.cluster.nodes * (node_cpus or len(os.sched_getaffinity(0))) + 1e-9


def suggestions_text(now: Prediction, found: list[Suggestion]) -> str:
    lines = [f"fastest layouts that fit (predicted; the recipe as it is: {now.step:.3f} s a step):"]
    for i, s in enumerate(found, 1):
        lines.append(
            f"  {i}. {s.prediction.step:.3f} s a step ({now.step / s.prediction.step:.2f}x), the largest pool "
            f"{s.memory_gb:.2f} GB per device: {' '.join(s.overrides)}"
        )
    if not found:
        lines.append("  none of the layouts considered fits")
    return "\n".join(lines)
