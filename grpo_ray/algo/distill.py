"""On-policy distillation's per-token signal; the teacher pool (``teacher`` in the recipe) supplies ``teacher``.

The student samples; a frozen teacher scores each sampled token; the student's log ratio to the teacher at its
own sample estimates the reverse KL there (k1), and its negative is a per-token advantage the policy-gradient
term climbs, beside the task reward's advantage or alone:

    A_{i,t} = reward_weight * A_i - coef * (logp_student_{i,t} - logp_teacher_{i,t})   on response tokens, else 0

``logp_student`` is the old policy's (the logprobs the loss's ratio starts from), detached like the teacher's:
the signal is a reward, not a term with its own gradient. A token the teacher finds likelier than the student
gets a positive advantage, so the update raises it.
"""

from __future__ import annotations

import torch


def distill_advantages(
    advantages: torch.Tensor,
    student: torch.Tensor,
    teacher: torch.Tensor,
    mask: torch.Tensor,
    coef: float,
    reward_weight: float = 1.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token advantages [B, T] from the samples' advantages [B] and the student's and teacher's logprobs of
    the sampled tokens [B, T] (`mask` 1 on response tokens); with sums over those tokens for the step's metrics:
    the reverse KL estimate (``reverse_kl_sum``), the sizes of the two parts of the advantage (``distill_abs_sum``:
    the teacher's, ``reward_abs_sum``: the reward's)."""
    m = mask.to(student.dtype)
    reverse_kl = (student.detach() - teacher.detach()) * m
    from_reward = reward_weight * advantages.to(student.dtype).unsqueeze(1) * m
    per_token = from_reward - coef * reverse_kl
    return per_token, {
        "reverse_kl_sum": reverse_kl.sum(),
        "distill_abs_sum": (coef * reverse_kl).abs().sum(),
        "reward_abs_sum": from_reward.abs().sum(),
    }
