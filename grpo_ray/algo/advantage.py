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
