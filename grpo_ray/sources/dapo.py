"""DAPO's dynamic sampling (``algorithm.filter_groups``): a step trains only groups whose rewards differ, and takes
more of the batch source's batches for it until it has enough."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import ray

from grpo_ray.algo.groups import select_groups, signal_groups, take_groups
from grpo_ray.config import Recipe
from grpo_ray.lengths import response_budget


def keep_signal(
    r: Recipe, batch: tuple[list, list, list], more: Callable[[], tuple[list, list, list]]
) -> tuple[list, list, list, dict]:
    """Keep the groups of `batch` (rollout refs, stats, scores) whose rewards are not all equal; while fewer than
    data.train_batch_size are kept, take `more` (the source's next batch for the step, scored), up to
    filter_groups.max_num_gen_batches batches in all, then fill up with dropped groups (equal scores: advantage
    0 unless the overlong penalty tells their lengths apart). Only the scores are read here; a task per rollout
    cuts the chosen groups out of it. The kept batch and the metrics of the filtering."""
    G, want, cfg = r.algorithm.group_size, r.data.train_batch_size, r.algorithm.filter_groups
    batches, kept, dropped = [], [], []
    rollouts, stats, scores = batch
    while True:
        signal = signal_groups(len(batches), stats, scores, G)
        kept, dropped = kept + signal[0], dropped + signal[1]
        batches.append((rollouts, stats, scores))
        if len(kept) >= want or len(batches) >= cfg.max_num_gen_batches:
            break
        rollouts, stats, scores = more()
    chosen, cut = sorted((kept + dropped)[:want]), ray.remote(select_groups).options(num_cpus=0)
    taken = [
        (rollouts[i], groups, st, sc)
        for b, (rollouts, stats, scores) in enumerate(batches)
        for i, groups, st, sc in take_groups(b, stats, scores, chosen, G, response_budget(r))
    ]
    every = [sc for _, _, scores in batches for sc in scores]  # reward work and faults of all that was scored
    first = dataclasses.replace(
        taken[0][3],
        errors=sum(sc.errors for sc in every),
        timeouts=sum(sc.timeouts for sc in every),
        seconds=sum(sc.seconds for sc in every),
    )
    return (
        [cut.remote([groups], G, ref) for ref, groups, _, _ in taken],
        [st for _, _, st, _ in taken],
        [first] + [sc for _, _, _, sc in taken[1:]],
        {
            "filter_groups/num_gen_batches": len(batches),
            "filter_groups/kept_groups": len(kept),
            "filter_groups/dropped_groups": len(dropped),
            "filter_groups/filled_groups": max(0, want - len(kept)),
        },
    )
