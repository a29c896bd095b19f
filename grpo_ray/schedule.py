"""The schedule's rules, stated once: when the next batch is launched, when weights are pushed, and when the learner
recomputes the old policy's logprobs. The controller runs them step by step (``controller.py``), the learner applies
the last to each batch it trains (``roles/learner.py``), and ``plan`` simulates the same rules (``speed.py``).

``algorithm.max_staleness`` k says how many versions a sample may lag the learner when it is trained:

    k = 0   on-policy: a batch is generated after the last push, trained, then the weights are pushed
    k >= 1  the next batch is launched before this step waits on anything, so the engines generate it while the
            learner trains; weights are pushed when the next batch would otherwise lag by more than k versions,
            and before validation and checkpoints (a batch launched ahead never crosses a checkpoint: the run
            resumed there generates it with that checkpoint's weights, as the uninterrupted run did)
"""

from __future__ import annotations

from grpo_ray.config import AlgorithmConfig


def overlapping(a: AlgorithmConfig) -> bool:
    """Whether batches are generated while the learner trains (k >= 1), as ``plan`` models a steady run."""
    return a.max_staleness > 0


def launches_ahead(a: AlgorithmConfig, step: int, last_step: int, saving: bool) -> bool:
    """Whether the next batch is launched during `step` (generated while the learner trains this one)."""
    return overlapping(a) and step < last_step and not saving


def push_due(a: AlgorithmConfig, behind: int, validating: bool, saving: bool) -> bool:
    """Whether to push the learner's weights after an update, the engines `behind` versions behind it: when the
    next batch launched would otherwise lag by more than max_staleness versions (at 0: after every update), and
    before validation and checkpoints."""
    return behind > 0 and (behind + 1 > a.max_staleness or validating or saving)


def recomputes_old_policy(a: AlgorithmConfig, mini_batches: int, stale: bool) -> bool:
    """Whether the learner runs a forward for the old policy's logprobs before its update: not in bypass mode (the
    sampler's logprobs are the old policy), nor for one update on samples of the weights being trained (the old
    policy is then the trained forward's own logprobs, detached); for more than one update a step (epochs or mini
    batches), or samples of older weights (`stale`), it does."""
    if a.rollout_correction.bypass_mode:
        return False
    return a.ppo_epochs > 1 or mini_batches > 1 or stale


def keeps_older_weights(a: AlgorithmConfig) -> bool:
    """Whether the learner keeps snapshots of the versions its samples may come from (to recompute their old
    policy): a schedule that trains stale samples and recomputes."""
    return a.max_staleness > 0 and not a.rollout_correction.bypass_mode
