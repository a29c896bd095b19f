"""Per-token log-probabilities and entropy of response tokens under a causal LM."""

from __future__ import annotations

import contextlib

import torch

from grpo_ray.algo.batching import Sequences


def token_logprobs(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, temperature: float = 1.0,
    with_entropy: bool = False, position_ids: torch.Tensor | None = None, keep: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(x_t | x_<t) for t = 1..T-1 ([B, T-1]), and the entropy of each of those distributions.

    Logits are divided by the sampling temperature, as the sampler did before drawing. With `keep` ([B, T-1]
    bool), only those positions get logits (the LM head runs on their hidden states alone); the others hold 0.
    """
    with head_on(model, keep):
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                       use_cache=False).logits
    if keep is None:
        logits, targets = logits[:, :-1], input_ids[:, 1:]
    else:
        targets = input_ids[:, 1:][keep]
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
    if keep is not None:
        place = lambda v: torch.zeros(keep.shape, dtype=v.dtype, device=v.device).masked_scatter(keep, v)  # noqa: E731
        logp, entropy = place(logp), None if entropy is None else place(entropy)
    return logp, entropy


@contextlib.contextmanager
def head_on(model, keep: torch.Tensor | None):
    """While open, `model`'s LM head sees the hidden states of the `keep` positions only ([B, T-1] bool: position
    t predicts token t+1), flattened to [N, hidden]. With a vocabulary of 150K the head is the largest layer,
    and its logits ([tokens, vocab], in fp32 for the softmax) the largest activation; prompt positions need
    neither."""
    if keep is None:
        yield
        return
    handle = model.get_output_embeddings().register_forward_pre_hook(lambda _, args: (args[0][:, :-1][keep],))
    try:
        yield
    finally:
        handle.remove()


def sequence_logprobs(model, seqs: Sequences, device, temperature: float = 1.0, with_entropy: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``token_logprobs`` of the response tokens of `seqs` in their [B, L-1] layout (0 off ``response_mask``),
    whether the forward runs on them padded or packed (``seqs.packed``)."""
    keep = seqs.response_mask.to(device).bool()
    if seqs.packed is None:
        return token_logprobs(model, seqs.input_ids.to(device), seqs.attention_mask.to(device), temperature,
                              with_entropy, keep=keep)
    p = seqs.packed
    index = p.index.to(device)
    rows, width = p.input_ids.shape
    packed_keep = torch.zeros(rows * (width - 1), dtype=torch.bool, device=device)
    packed_keep[index[keep]] = True
    logp, entropy = token_logprobs(model, p.input_ids.to(device), None, temperature, with_entropy,
                                   p.position_ids.to(device), packed_keep.view(rows, width - 1))
    inside, at = index >= 0, index.clamp(min=0)
    unpack = lambda v: torch.where(inside, v.reshape(-1)[at], 0.0)  # noqa: E731
    return unpack(logp), None if entropy is None else unpack(entropy)
