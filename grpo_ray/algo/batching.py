"""Turning rollouts into padded tensors, and cutting sample indices into mini / micro batches."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo_ray.types import Rollout


@dataclass
class Sequences:
    """Prompt + response token sequences, right-padded; masks line up with next-token logprobs."""

    input_ids: torch.Tensor
    """[B, L] prompt then response, then padding."""
    attention_mask: torch.Tensor
    """[B, L] 1 on real tokens."""
    response_mask: torch.Tensor
    """[B, L-1] 1 where logprob position t predicts a response token (token t+1)."""


def flatten(rollouts: list[Rollout]) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) of every completion, rollout after rollout."""
    return [(r.prompts[c.prompt].ids, c.token_ids) for r in rollouts for c in r.completions]


def collate(pairs: list[tuple[list[int], list[int]]], pad_id: int) -> Sequences:
    length = max(len(p) + len(r) for p, r in pairs)
    ids = torch.full((len(pairs), length), pad_id, dtype=torch.long)
    attn = torch.zeros((len(pairs), length), dtype=torch.long)
    resp = torch.zeros((len(pairs), length - 1), dtype=torch.float32)
    for i, (p, r) in enumerate(pairs):
        ids[i, : len(p) + len(r)] = torch.tensor(p + r, dtype=torch.long)
        attn[i, : len(p) + len(r)] = 1
        resp[i, len(p) - 1 : len(p) + len(r) - 1] = 1
    return Sequences(ids, attn, resp)


def response_values(per_position: torch.Tensor, mask: torch.Tensor) -> list[list[float]]:
    """Per-sample lists of the values at response positions (e.g. logprobs of response tokens)."""
    return [row[m.bool()].tolist() for row, m in zip(per_position, mask)]


def place_values(values: list[list[float]], mask: torch.Tensor) -> torch.Tensor:
    """Inverse of response_values: a tensor shaped like `mask` with each sample's values at its response positions."""
    out = torch.zeros_like(mask, dtype=torch.float32)
    out[mask.bool()] = torch.tensor([v for row in values for v in row], dtype=torch.float32)
    return out


def chunks(indices: list[int], size: int) -> list[list[int]]:
    return [indices[i : i + size] for i in range(0, len(indices), size)]


def rank_slice(indices: list[int], rank: int, world_size: int) -> list[int]:
    """The contiguous share of `indices` that data-parallel rank `rank` takes."""
    per = len(indices) // world_size
    return indices[rank * per : (rank + 1) * per]
