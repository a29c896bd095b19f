"""What every schedule answers (``grpo_ray.schedules``)."""

from __future__ import annotations

from grpo_ray.config import AlgorithmConfig


class Schedule:
    """The rules a schedule answers, for the recipe's algorithm section ``a``."""

    def __init__(self, a: AlgorithmConfig):
        self.a = a

    def overlapping(self) -> bool:
        """Whether batches are generated while the learner trains, as ``plan`` models a steady run."""
        raise NotImplementedError

    def launches_ahead(self, step: int, last_step: int, saving: bool) -> bool:
        """Whether the next batch is launched during `step` (generated while the learner trains this one)."""
        raise NotImplementedError

    def push_due(self, behind: int, validating: bool, saving: bool) -> bool:
        """Whether to push the learner's weights after an update, the engines `behind` versions behind it."""
        raise NotImplementedError

    def recomputes_old_policy(self, mini_batches: int, stale: bool) -> bool:
        """Whether the learner runs a forward for the old policy's logprobs before an update of `mini_batches` on
        samples of older weights (`stale`) or of its own."""
        raise NotImplementedError

    def keeps_older_weights(self) -> bool:
        """Whether the learner keeps snapshots of the versions its samples may come from (to recompute their old
        policy)."""
        raise NotImplementedError
