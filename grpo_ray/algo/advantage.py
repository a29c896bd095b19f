"""Advantage estimators: one pure function each, chosen by ``algorithm.adv_estimator`` (verl's names).

Rewards come laid out group after group (the G responses of a prompt together); every token of response
i gets its A_i (outcome supervision). For a group with rewards r_1..r_G:

    grpo                           A_i = (r_i - mean(r)) / (std(r) + eps)        norm_adv_by_std: true
                                   A_i =  r_i - mean(r)                          false: Dr. GRPO
    rloo                           A_i = r_i - mean_{j != i}(r_j) = G / (G - 1) * (r_i - mean(r))
    reinforce_plus_plus_baseline   a_i = r_i - mean(r), then whitened over every response token of the
                                   batch: A_i = (a_i - mu) / sqrt(var + 1e-8), mu and var (unbiased) taken
                                   over tokens, so sample i counts len_i times

Before any estimator, DAPO's overlong buffer (``overlong_penalty``) can add a length penalty to the reward:
0 up to max_tokens - len tokens, then falling linearly to -penalty_factor at max_tokens.

std is the unbiased sample std (as verl's torch.std). Estimators compute in float64 from the centred rewards
``centred`` gives, exactly 0 for a group whose rewards are all equal: such a group carries no signal, so under grpo
and rloo every one of its responses gets advantage 0. (verl centres in float32, where the group mean of equal
rewards such as 0.9 or 1.2 can be one rounding step off the rewards, and that step over std + eps gives each
response about +-0.06: a steady push, not noise. The formula gives 0, and so do we.) A new estimator is one
function here, registered under its name, and one value of ``algorithm.adv_estimator``; a user's own is named
``module:function`` in the recipe, with the registered ones' signature.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch

from grpo_ray.algo.registry import FunctionError, named

ESTIMATORS: dict[str, Callable[..., torch.Tensor]] = {}


def estimator(name: str):
    """Register an estimator: (grouped rewards [P, G], response lengths [P, G], norm_by_std) -> [P, G]."""

    def register(fn):
        ESTIMATORS[name] = fn
        return fn

    return register


def centred(grouped: torch.Tensor) -> torch.Tensor:
    """r_i - mean(r) of each group (rows of `grouped`), exactly 0 for a group whose rewards are all equal."""
    equal = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)
    return torch.where(equal, 0.0, grouped - grouped.mean(dim=1, keepdim=True))


@estimator("grpo")
def grpo(grouped: torch.Tensor, lengths: torch.Tensor, norm_by_std: bool, eps: float = 1e-6) -> torch.Tensor:
    c = centred(grouped)
    return c / (grouped.std(dim=1, keepdim=True) + eps) if norm_by_std else c


@estimator("rloo")
def rloo(grouped: torch.Tensor, lengths: torch.Tensor, norm_by_std: bool) -> torch.Tensor:
    g = grouped.shape[1]
    return centred(grouped) * g / (g - 1)


@estimator("reinforce_plus_plus_baseline")
def reinforce_plus_plus_baseline(grouped: torch.Tensor, lengths: torch.Tensor, norm_by_std: bool) -> torch.Tensor:
    centred_ = centred(grouped)
    w = lengths.to(centred_.dtype)
    n = w.sum()
    mu = (centred_ * w).sum() / n
    var = ((centred_ - mu) ** 2 * w).sum() / (n - 1).clamp(min=1)
    return (centred_ - mu) / torch.sqrt(var + 1e-8)


TURN_ESTIMATORS: dict[str, Callable[..., list]] = {}
"""Estimators that credit each model turn of a multi-turn trajectory on its own: (per-turn rewards [P][G][turns],
norm_by_std) -> per-turn advantages of the same shape; every token of a turn gets its turn's advantage."""


def turn_estimator(name: str):
    def register(fn):
        TURN_ESTIMATORS[name] = fn
        return fn

    return register


@turn_estimator("grpo_turn")
def grpo_turn(rewards: list[list[list[float]]], norm_by_std: bool, eps: float = 1e-6) -> list[list[list[float]]]:
    """Turn-level GRPO: turn k of a trajectory is credited with its return from that turn on (the sum of its
    rewards at turns k, k + 1, ...), centred (and scaled by the std) among the group's trajectories that had a turn
    k. Turn 0's advantage is GRPO's on the whole return; a turn only one trajectory of the group reached, or whose
    returns are all equal, gets 0."""
    out = []
    for group in rewards:
        returns = [list(itertools.accumulate(reversed(r)))[::-1] for r in group]  # each turn's sum from it on
        adv = [[0.0] * len(r) for r in returns]
        for k in range(max(len(r) for r in returns)):
            at = [i for i, r in enumerate(returns) if len(r) > k]
            if len(at) < 2:
                continue
            scaled = grpo(torch.tensor([[returns[i][k] for i in at]], dtype=torch.float64), None, norm_by_std, eps)
            for i, a in zip(at, scaled[0].tolist()):
                adv[i][k] = a
        out.append(adv)
    return out


def turn_spans(mask: list[int]) -> list[tuple[int, int]]:
    """The model's turns in a trajectory's loss mask: each run of 1s as (start, end)."""
    spans, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    return spans


def turn_rewards(rewards: list[float], mask: list[int]) -> list[float]:
    """A trajectory's environment rewards, one per model turn of its mask: those it has at their turns, 0 at the
    turns it has none for (an episode that failed before its last turn was stepped)."""
    turns = max(1, len(turn_spans(mask)))
    return [*rewards[:turns], *[0.0] * (turns - len(rewards))]


def per_token(advantages: list[list[float]], masks: list[list[int]]) -> list[list[float]]:
    """Per-turn advantages laid on each sample's tokens: its k-th model turn (run of 1s in its mask) gets its k-th
    advantage, every other token 0 (masked out of the loss)."""
    out = []
    for adv, mask in zip(advantages, masks):
        tokens, spans = [0.0] * len(mask), turn_spans(mask)
        if len(spans) != len(adv):
            raise ValueError(f"{len(adv)} per-turn advantages for a trajectory of {len(spans)} model turns")
        for a, (start, end) in zip(adv, spans):
            tokens[start:end] = [a] * (end - start)
        out.append(tokens)
    return out


def per_turn_advantages(
    name: str, totals: list[float], turns: list[list[float]], group_size: int, norm_by_std: bool
) -> list[list[float]]:
    """Each sample's per-turn advantages under turn estimator `name`: its environment's rewards at their turns
    (`turns`; a single-turn sample has one), and the rest of its total (the reward functions' score, DAPO's
    penalty) at its last turn."""
    placed = [[*t[:-1], t[-1] + total - sum(t)] for total, t in zip(totals, turns)]
    grouped = [placed[i : i + group_size] for i in range(0, len(placed), group_size)]
    return [a for group in TURN_ESTIMATORS[name](grouped, norm_by_std) for a in group]


def advantages(
    name: str, rewards: torch.Tensor, group_size: int, lengths: torch.Tensor | None = None, norm_by_std: bool = True
) -> torch.Tensor:
    """Advantages of `rewards` (length B * group_size, group after group) under estimator `name` (a registered name
    or ``module:function``), in float64; `lengths` are the responses' token counts (only batch whitening uses them)."""
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    lengths = torch.ones_like(rewards) if lengths is None else lengths
    grouped = rewards.double().view(-1, group_size)
    out = named(ESTIMATORS, name)(grouped, lengths.double().view(-1, group_size), norm_by_std)
    return torch.as_tensor(out, dtype=torch.float64).reshape(-1)


def group_advantages(rewards: torch.Tensor, group_size: int, norm_by_std: bool = True) -> torch.Tensor:
    """GRPO's advantages (the default estimator)."""
    return advantages("grpo", rewards, group_size, norm_by_std=norm_by_std)


def overlong_penalty(lengths: torch.Tensor, max_tokens: int, buffer_len: int, factor: float) -> torch.Tensor:
    """DAPO's soft length penalty of each response: -factor * min(1, max(0, len - (max_tokens - buffer_len)) /
    buffer_len); zeros when buffer_len is 0."""
    if not buffer_len:
        return torch.zeros_like(lengths, dtype=torch.float64)
    over = (lengths.double() - (max_tokens - buffer_len)).clamp(min=0) / buffer_len
    return -factor * over.clamp(max=1)


def check(name: str) -> None:
    """Try estimator `name` on three groups of four rewards, the last one of equal rewards (a group without signal,
    where a standard deviation is 0: the most common group of a hard task); FunctionError when it cannot be called
    as the registered ones are, or does not give one finite advantage per reward."""
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    try:
        out = advantages(name, rewards, 4, torch.full_like(rewards, 5.0))
    except FunctionError:
        raise
    except Exception as e:
        raise FunctionError(
            f"called as estimators are, fn(rewards [P, G], lengths [P, G], norm_by_std), on 3 "
            f"groups of 4 it raised {type(e).__name__}: {e}"
        ) from None
    if out.shape != rewards.shape:
        raise FunctionError(
            f"on 3 groups of 4 rewards it gave {list(out.shape)} values ({out.tolist()[:12]}): "
            "expected 12 finite advantages, one per reward"
        )
    if not torch.isfinite(out).all():
        equal = not torch.isfinite(out[8:]).all() and torch.isfinite(out[:8]).all()
        raise FunctionError(
            f"on 3 groups of 4 rewards it gave {out.tolist()}: expected 12 finite advantages, one per reward"
            + ("; the non-finite ones are the group of equal rewards (a standard deviation of 0?)" if equal else "")
        )
