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

std is the unbiased sample std (as verl's torch.std). A group whose rewards are all equal gets zero
advantages under grpo and rloo: it carries no signal. A new estimator is one function here, registered
under its name, and one value of ``algorithm.adv_estimator``.
"""

from __future__ import annotations

from typing import Callable

import torch

ESTIMATORS: dict[str, Callable[..., torch.Tensor]] = {}


def estimator(name: str):
    """Register an estimator: (grouped rewards [P, G], response lengths [P, G], norm_by_std) -> [P, G]."""
    def register(fn):
        ESTIMATORS[name] = fn
        return fn
    return register


@estimator("grpo")
def grpo(grouped: torch.Tensor, lengths: torch.Tensor, norm_by_std: bool, eps: float = 1e-6) -> torch.Tensor:
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    return centred / (grouped.std(dim=1, keepdim=True) + eps) if norm_by_std else centred


@estimator("rloo")
def rloo(grouped: torch.Tensor, lengths: torch.Tensor, norm_by_std: bool) -> torch.Tensor:
    g = grouped.shape[1]
    return (grouped - grouped.mean(dim=1, keepdim=True)) * g / (g - 1)


@estimator("reinforce_plus_plus_baseline")
def reinforce_plus_plus_baseline(grouped: torch.Tensor, lengths: torch.Tensor, norm_by_std: bool) -> torch.Tensor:
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    w = lengths.to(centred.dtype)
    n = w.sum()
    mu = (centred * w).sum() / n
    var = ((centred - mu) ** 2 * w).sum() / (n - 1).clamp(min=1)
    return (centred - mu) / torch.sqrt(var + 1e-8)


def advantages(name: str, rewards: torch.Tensor, group_size: int, lengths: torch.Tensor | None = None,
               norm_by_std: bool = True) -> torch.Tensor:
    """Advantages of `rewards` (length B * group_size, group after group) under estimator `name`; `lengths` are
    the responses' token counts (only batch whitening uses them)."""
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    lengths = torch.ones_like(rewards) if lengths is None else lengths
    grouped = rewards.float().view(-1, group_size)
    return ESTIMATORS[name](grouped, lengths.float().view(-1, group_size), norm_by_std).reshape(-1)


def group_advantages(rewards: torch.Tensor, group_size: int, norm_by_std: bool = True) -> torch.Tensor:
    """GRPO's advantages (the default estimator)."""
    return advantages("grpo", rewards, group_size, norm_by_std=norm_by_std)


def overlong_penalty(lengths: torch.Tensor, max_tokens: int, buffer_len: int, factor: float) -> torch.Tensor:
    """DAPO's soft length penalty of each response: -factor * min(1, max(0, len - (max_tokens - buffer_len)) /
    buffer_len); zeros when buffer_len is 0."""
    if not buffer_len:
        return torch.zeros_like(lengths, dtype=torch.float32)
    over = (lengths.float() - (max_tokens - buffer_len)).clamp(min=0) / buffer_len
    return -factor * over.clamp(max=1)
