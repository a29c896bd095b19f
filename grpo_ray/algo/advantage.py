"""Group-relative advantages.

For the G responses of one prompt with rewards r_1..r_G:

    A_i = (r_i - mean(r)) / (std(r) + eps)     norm_by_std=True (GRPO, DeepSeekMath)
    A_i =  r_i - mean(r)                        norm_by_std=False (Dr. GRPO)

std is the unbiased sample std (as verl's torch.std). A group whose rewards are
all equal gets zero advantages: it carries no signal. Every token of response i
gets the same A_i (outcome supervision).
"""

from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, group_size: int, norm_by_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Advantages for `rewards` laid out group after group (length B * group_size)."""
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    grouped = rewards.float().view(-1, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if norm_by_std:
        centred = centred / (grouped.std(dim=1, keepdim=True) + eps)
    return centred.reshape(-1)
