"""Rollout correction: the sampler (vLLM) and the learner disagree a little on a sample's logprobs, even at
the same weights (another kernel, bf16 on GPU), so the loss can weight or mask the samples by how much.

Per response token t of sample i, ``old`` the learner's logprob at the version that generated the sample and
``sampler`` vLLM's logprob of the same token:

    d_t     = old_t - sampler_t
    ratio_t = exp(clamp(d_t, -20, 20))          (verl's clamp: the exponential stays finite in float32)

    rollout_is = token:      w_t = min(ratio_t, threshold)          truncated IS (TIS), a weight on the
                                                                     policy-gradient term, no gradient through it
    rollout_rs = sequence:   log r_i = sum_t d_t                    sample i is masked out of the loss when
                 geometric:  log r_i = mean_t d_t                   log r_i is outside [log lower, log upper]

The sequence's log ratio adds up the tokens' unclamped differences (as verl, which clamps the sum): a sample with
token differences [30, -20] is far off the sampler (log r = 10) and is masked, where clamping each token first
would call it exact. The comparison is made in log space, so nothing overflows.

Metrics, named as verl's ``rollout_corr/*`` (sums here; the learner divides them):

    kl         KL(sampler || old) from the sampled tokens, k1: mean of -d_t
    k3_kl      the same, k3: mean of exp(d_t) - d_t - 1 (>= 0, lower variance)

Both use the unclamped d_t, as verl's ``compute_offpolicy_metrics`` does, with the exponential taken in float64 (exact
past a gap of 88, where float32's would overflow); they are metrics only, never in the loss.
    rollout_is_mean / _max       the token ratio before any cap
    rollout_rs_masked_fraction / rollout_rs_seq_masked_fraction    tokens / samples masked
"""

from __future__ import annotations

import math

import torch

SUM_KEYS = (
    "corr_tokens",
    "corr_kl_sum",
    "corr_k3_sum",
    "corr_ratio_sum",
    "corr_masked_tokens",
    "corr_masked_seqs",
    "corr_seqs",
)
"""The sums ``rollout_correction`` returns, in this order."""


def rollout_correction(
    old: torch.Tensor,
    sampler: torch.Tensor,
    mask: torch.Tensor,
    rollout_is: str | None,
    is_threshold: float,
    rollout_rs: str | None,
    rs_upper: float,
    rs_lower: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """For one micro batch ([B, T] tensors, `mask` 1 on response tokens): the per-token weights of the
    policy-gradient term, the mask of the tokens kept in the loss, the metric sums (SUM_KEYS, one float64
    tensor) and the largest token ratio (0 without tokens). Tensors on the inputs' device: nothing here waits
    for the device. `rs_lower` 0 means 1 / `rs_upper`."""
    dtype = torch.promote_types(old.dtype, torch.float32)  # at least float32 (float64 inputs stay float64)
    m = mask.to(dtype)
    raw = (old.to(dtype) - sampler.to(dtype)) * m
    d = raw.clamp(-20, 20)
    ratio = d.exp()
    weights = ratio.clamp(max=is_threshold) if rollout_is == "token" else torch.ones_like(ratio)
    has_tokens = m.sum(dim=1) > 0
    keep_seq = torch.ones_like(has_tokens, dtype=dtype)
    if rollout_rs is not None:
        log_r = raw.sum(dim=1)
        if rollout_rs == "geometric":
            log_r = log_r / m.sum(dim=1).clamp(min=1)
        lower = rs_lower or 1 / rs_upper
        keep_seq = ((log_r >= math.log(lower)) & (log_r <= math.log(rs_upper))).to(dtype)
    keep = m * keep_seq.unsqueeze(1)
    raw64 = raw.double()  # 0 off the mask, where exp(0) - 0 - 1 = 0
    sums = torch.stack(
        [
            m.sum().double(),
            -raw64.sum(),
            (raw64.exp() - raw64 - 1).sum(),
            (ratio * m).sum().double(),
            (m - keep).sum().double(),
            ((1 - keep_seq) * has_tokens).sum().double(),
            has_tokens.sum().double(),
        ]
    )
    largest = (ratio * m).amax() if m.numel() else torch.zeros((), device=m.device)  # ratios are > 0
    return weights.detach(), keep, sums.detach(), largest.detach().double()
