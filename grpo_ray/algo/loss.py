"""The GRPO loss: clipped surrogate plus a KL-to-reference term, aggregated over tokens.

Per response token t of sample i (A_i its group-relative advantage):

    ratio   = exp(logp - logp_old)
    pg      = max(-A_i * ratio, -A_i * clip(ratio, 1 - clip_low, 1 + clip_high)) * w_t
              (w_t: the rollout-correction weight, grpo_ray.algo.correction; 1 without one)
    kl      = k1: logp - logp_ref
              k3: exp(logp_ref - logp) - (logp_ref - logp) - 1   (Schulman's low-variance, >= 0)
    loss_t  = pg + kl_coef * kl

Aggregation (``normaliser`` makes micro batches and ranks add up to the mini batch):

    token-mean: sum over all response tokens of loss_t / normaliser (= tokens in the mini batch)
    seq-mean:   sum over sequences of mean_t(loss_t)  / normaliser (= sequences in the mini batch)

so that accumulating micro batches, and averaging over data-parallel ranks with each
rank's loss multiplied by the world size, equals one pass over the whole mini batch.
"""

from __future__ import annotations

import torch


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate from sampled tokens."""
    if estimator == "k1":
        return logp - ref_logp
    if estimator == "k3":
        delta = (ref_logp - logp).clamp(-20, 20)
        return delta.exp() - delta - 1
    raise ValueError(f"unknown KL estimator {estimator!r}")


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str, normaliser: float) -> torch.Tensor:
    """Sum of masked per-token `values` ([B, T]) under `mode`, divided by `normaliser`."""
    mask = mask.to(values.dtype)
    if mode == "token-mean":
        return (values * mask).sum() / normaliser
    if mode == "seq-mean":
        per_seq = (values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
        return per_seq.sum() / normaliser
    raise ValueError(f"unknown loss aggregation {mode!r}")


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    kl_coef: float,
    kl_estimator: str,
    loss_agg: str,
    normaliser: float,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss of one micro batch ([B, T] tensors, advantages [B]) and its metrics (sums over masked tokens)."""
    adv = advantages.unsqueeze(1).to(logp.dtype)
    log_ratio = logp - old_logp
    ratio = log_ratio.exp()
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1 - clip_low, 1 + clip_high)
    pg = torch.maximum(unclipped, clipped)
    if is_weights is not None:
        pg = pg * is_weights
    pg_loss = aggregate(pg, mask, loss_agg, normaliser)
    loss = pg_loss
    kl_loss = torch.zeros((), dtype=logp.dtype)
    if ref_logp is not None and kl_coef > 0:
        kl_loss = aggregate(kl_penalty(logp, ref_logp, kl_estimator), mask, loss_agg, normaliser)
        loss = loss + kl_coef * kl_loss
    m = mask.to(logp.dtype)
    metrics = {
        "pg_loss": pg_loss.item(),
        "kl_loss": kl_loss.item(),
        "pg_clipfrac_sum": ((clipped > unclipped).to(logp.dtype) * m).sum().item(),
        "ppo_kl_sum": (-log_ratio.detach() * m).sum().item(),
        "tokens": m.sum().item(),
    }
    return loss, metrics


def sft_loss(logp: torch.Tensor, mask: torch.Tensor, normaliser: float) -> tuple[torch.Tensor, dict[str, float]]:
    """Negative log-likelihood of the target tokens of one micro batch ([B, T]), token-mean over `normaliser`
    tokens, and its metrics (sums over masked tokens)."""
    m = mask.to(logp.dtype)
    nll = -(logp * m)
    return aggregate(nll, mask, "token-mean", normaliser), {"nll_sum": nll.sum().item(), "tokens": m.sum().item()}
