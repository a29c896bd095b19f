"""Per-token log-probabilities and entropy of response tokens under a causal LM."""

from __future__ import annotations

import torch


def token_logprobs(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(x_t | x_<t) for t = 1..T-1 ([B, T-1]), and the entropy of each of those distributions.

    Logits are divided by the sampling temperature, as the sampler did before drawing.
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, :-1]
    logits = logits.float() / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy
