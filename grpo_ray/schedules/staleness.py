"""What the streaming schedule does with a group older than ``algorithm.max_staleness`` (``algorithm.staleness``):
one class per policy, a user's own as ``module:Class`` (a subclass of ``Staleness``, checked before start).

    keep  (the default) every group is trained: its tokens of older weights are corrected by the token-level
          importance weights against the sampler's logprobs (``rollout_correction``). max_staleness bounds how far
          ahead prompts are sent; a group slower than that is still trained, and counted
          (``rollout/over_max_staleness``; its tokens' share of those generated ``rollout/over_bound_share``, not
          counted in ``rollout/goodput``). Nothing generated is thrown away.
    drop  a group whose oldest token is older than max_staleness versions is dropped when it finishes (its tokens
          counted in ``rollout/discarded_tokens/stale``) and its prompt generated again under the weights then.

A policy answers one question, asked by the engines when they hand on finished groups. A group wholly of the weights
its engine holds is kept whatever the answer: nothing fresher can be generated, so a policy can never stall a step.
"""

from __future__ import annotations


class Staleness:
    """A staleness policy for algorithm section `a`."""

    def __init__(self, a):
        self.a = a

    def oldest_kept(self, learner_version: int) -> int | None:
        """The oldest weight version a token of a group handed on to the learner (at `learner_version`) may have;
        None: any."""
        raise NotImplementedError


class Keep(Staleness):
    def oldest_kept(self, learner_version: int) -> int | None:
        """Any: every group is trained, corrected."""
        return None


class Drop(Staleness):
    def oldest_kept(self, learner_version: int) -> int | None:
        """max_staleness versions behind the learner."""
        return learner_version - self.a.max_staleness


POLICIES = {"keep": Keep, "drop": Drop}
"""The staleness policies by name."""
