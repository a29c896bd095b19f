"""Per-token log-probabilities and entropy of response tokens under a causal LM."""

from __future__ import annotations

import torch

from grpo_ray.algo.batching import Sequences


def token_logprobs(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, temperature: float = 1.0,
    with_entropy: bool = False, position_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(x_t | x_<t) for t = 1..T-1 ([B, T-1]), and the entropy of each of those distributions.

    Logits are divided by the sampling temperature, as the sampler did before drawing.
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   use_cache=False).logits[:, :-1]
    logits = logits.float() / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def sequence_logprobs(model, seqs: Sequences, device, temperature: float = 1.0, with_entropy: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``token_logprobs`` of `seqs` in their [B, L-1] layout, whether the forward runs on them padded or packed
    (``seqs.packed``: then a position past a sequence's end holds 0)."""
    if seqs.packed is None:
        return token_logprobs(model, seqs.input_ids.to(device), seqs.attention_mask.to(device), temperature,
                              with_entropy)
    p = seqs.packed
    logp, entropy = token_logprobs(model, p.input_ids.to(device), None, temperature, with_entropy,
                                   p.position_ids.to(device))
    index = p.index.to(device)
    inside, at = index >= 0, index.clamp(min=0)
    unpack = lambda v: torch.where(inside, v.reshape(-1)[at], 0.0)  # noqa: E731
    return unpack(logp), None if entropy is None else unpack(entropy)
