"""A user's own estimator and policy losses, named in recipes as tests.helpers.my_algo:NAME."""

import torch

from grpo_ray.algo.loss import vanilla


def scaled_vanilla(logp, old_logp, adv, mask, clip_low, clip_high, options):
    """PPO's clipped term at options["scale"] of its size (a third by default): the update of vanilla with that
    share of the gradient."""
    pg, clipped = vanilla(logp, old_logp, adv, mask, clip_low, clip_high)
    return pg * options.get("scale", 1 / 3), clipped


def centred_only(grouped, lengths, norm_by_std):
    """Dr. GRPO's advantage: the group-centred reward, never divided by the std."""
    return grouped - grouped.mean(dim=1, keepdim=True)


def no_gradient(logp, old_logp, adv, mask, clip_low, clip_high, options):
    return (-adv * torch.ones_like(logp)), torch.zeros_like(logp, dtype=torch.bool)


def two_arguments(logp, old_logp):
    return logp, logp


def one_per_group(grouped, lengths, norm_by_std):
    return grouped.mean(dim=1)


NOT_A_FUNCTION = 3


def std_without_epsilon(grouped, lengths, norm_by_std):
    """A z-score without an epsilon: NaN for a group of equal rewards (0 / 0)."""
    return (grouped - grouped.mean(dim=1, keepdim=True)) / grouped.std(dim=1, keepdim=True)
