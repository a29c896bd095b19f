"""The batched schedule (``algorithm.schedule: batched``, the default): a batch a step, generated, scored and trained
whole. ``algorithm.max_staleness`` k says how many versions a sample may lag the learner when it is trained:

    k = 0   on-policy: a batch is generated after the last push, trained, then the weights are pushed
    k >= 1  the next batch is launched before this step waits on anything, so the engines generate it while the
            learner trains; weights are pushed when the next batch would otherwise lag by more than k versions,
            and before validation and checkpoints (a batch launched ahead never crosses a checkpoint: the run
            resumed there generates it with that checkpoint's weights, as the uninterrupted run did)
"""

from __future__ import annotations

from grpo_ray.schedules.base import Schedule


class Batched(Schedule):
    def overlapping(self) -> bool:
        """k >= 1."""
        return self.a.max_staleness > 0

    def launches_ahead(self, step: int, last_step: int, saving: bool) -> bool:
        """Overlapping, but for the last step and before a checkpoint."""
        return self.overlapping() and step < last_step and not saving

    def push_due(self, behind: int, validating: bool, saving: bool) -> bool:
        """When the next batch launched would otherwise lag by more than max_staleness versions (at 0: after every
        update), and before validation and checkpoints."""
        return behind > 0 and (behind + 1 > self.a.max_staleness or validating or saving)

    def recomputes_old_policy(self, mini_batches: int, stale: bool) -> bool:
        """Not in bypass mode (the sampler's logprobs are the old policy), nor for one update on samples of the
        weights being trained (the old policy is then the trained forward's own logprobs, detached); for more than
        one update a step (epochs or mini batches), or samples of older weights, it does."""
        if self.a.rollout_correction.bypass_mode:
            return False
        return self.a.ppo_epochs > 1 or mini_batches > 1 or stale

    def keeps_older_weights(self) -> bool:
        """Samples of older weights are trained and their old policy recomputed."""
        return self.a.max_staleness > 0 and not self.a.rollout_correction.bypass_mode
