"""DAPO's dynamic sampling on a step's groups: which groups carry signal (their rewards differ), which are taken to
fill the batch, and cutting them out of the rollouts (a Ray task: the rollouts never pass through the controller)."""

from __future__ import annotations

import dataclasses
import math

from grpo_ray.types import Rollout, RolloutStats, Scores


def select_groups(picks: list[list[int]], group_size: int, *rollouts: Rollout) -> list[Rollout] | Rollout:
    """Rollouts made of the groups picked out of `rollouts`: picks[i] lists the group indices kept from
    rollouts[i], in order (one output per rollout with picks, each keeping its policy version). Runs as a
    Ray task, so the rollouts go from store to store, never through the controller."""
    out = []
    for chosen, r in zip(picks, rollouts):
        if not chosen:
            continue
        prompts, completions = [], []
        for g in chosen:
            group = r.completions[g * group_size : (g + 1) * group_size]
            prompts.append(r.prompts[group[0].prompt])
            completions += [dataclasses.replace(c, prompt=len(prompts) - 1) for c in group]
        out.append(Rollout(prompts, completions, r.policy_version))
    return out if len(out) > 1 else out[0]


Group = tuple[int, int, int]
"""(batch, rollout, group index within the rollout) of one group of a step's generation."""


def signal_groups(
    batch: int, stats: list[RolloutStats], scores: list[Scores], group_size: int
) -> tuple[list[Group], list[Group]]:
    """The groups of one generated batch whose rewards differ (kept) and those whose rewards are all equal
    (dropped: their advantages would be 0)."""
    totals = [t for sc in scores for t in sc.totals]
    kept, dropped, start = [], [], 0
    for i, st in enumerate(stats):
        for g in range(len(st.response_lengths) // group_size):
            group = totals[start + g * group_size : start + (g + 1) * group_size]
            (kept if max(group) > min(group) else dropped).append((batch, i, g))
        start += len(st.response_lengths)
    return kept, dropped


def take_groups(
    batch: int, stats: list[RolloutStats], scores: list[Scores], chosen: list[Group], group_size: int, max_tokens: int
) -> list[tuple[int, list[int], RolloutStats, Scores]]:
    """For each rollout of `batch` with groups in `chosen`: its index, the groups, and the stats and scores of
    those groups alone (the small side of what ``select_groups`` cuts out of the rollout)."""
    totals = [t for sc in scores for t in sc.totals]
    parts = {k: [v for sc in scores for v in sc.components[k]] for k in scores[0].components}
    extras = {
        k: [v for sc in scores for v in sc.extras.get(k, [math.nan] * len(sc.totals))]
        for k in {k for sc in scores for k in sc.extras}
    }
    out, start = [], 0
    for i, st in enumerate(stats):
        groups = [g for b, r, g in chosen if (b, r) == (batch, i)]
        local = [g * group_size + j for g in groups for j in range(group_size)]
        if local:
            responses = [st.response_lengths[k] for k in local]
            kept = RolloutStats(
                st.seconds,
                st.policy_version,
                [st.prompt_lengths[k] for k in local],
                responses,
                sum(n >= max_tokens for n in responses),
                st.window,
                env={k: [v[j] for j in local] for k, v in st.env.items()},  # the kept trajectories' own
                turn_rewards=[st.turn_rewards[j] for j in local] if st.turn_rewards else [],
            )
            out.append(
                (
                    i,
                    groups,
                    kept,
                    Scores(
                        [totals[start + k] for k in local],
                        {n: [v[start + k] for k in local] for n, v in parts.items()},
                        0,
                        0,
                        0.0,
                        {},
                        {n: [v[start + k] for k in local] for n, v in extras.items()},
                    ),
                )
            )
        start += len(st.response_lengths)
    return out
