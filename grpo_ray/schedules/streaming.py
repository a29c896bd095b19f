"""The streaming schedule (``algorithm.schedule: streaming``): the engines never wait for a step boundary.

Each engine runs its own loop (``engine_loop.py``) and is sent the prompts of the next
``algorithm.max_staleness`` steps ahead of the step that trains them; a step takes, from each engine, its share of
the first groups to finish, whichever step they were sent for (a long group is trained at a later step, the short
ones behind it are not held up); at max_staleness >= 2 the next step's groups are taken and scored while the
learner trains (``launches_ahead``). Weights are pushed after every update *into* the generation in flight: each engine
pauses between two of its steps (a token boundary), loads, and goes on; a trajectory in flight then has tokens of
two versions, each labelled (``Completion.versions``), and its staleness counts from its oldest token.

    engines   │ gen ····························│p│ gen ·························│p│ gen ···
    learner   │ train s ······················│   │ train s+1 ··················│   │
    controller  take s+1, score it               push s (in flight)   take s+2, score it

The old policy is the learner's weights before the update (decoupled PPO's proximal policy), not those that
sampled each token: the gap to the sampler's logprobs, of whatever versions, is what ``rollout_correction``'s token
weights correct (``rollout_is: token``, as the streaming recipes set). What a group older than max_staleness gets is
the staleness policy's (``algorithm.staleness``, ``schedules/staleness.py``).
"""

from __future__ import annotations

from grpo_ray.config import AlgorithmConfig
from grpo_ray.schedules.base import Schedule, named
from grpo_ray.schedules.staleness import POLICIES, Staleness


class Streaming(Schedule):
    timing = "streaming"
    driver = "loop"
    source = "grpo_ray.sources.streaming:Streaming"

    def __init__(self, a: AlgorithmConfig):
        super().__init__(a)
        self.policy: Staleness = named("algorithm.staleness", a.staleness, POLICIES, Staleness)(a)
        """What a group older than max_staleness gets (``algorithm.staleness``)."""

    def overlapping(self) -> bool:
        """Always: the engines generate while the learner trains."""
        return True

    def launches_ahead(self, step: int, last_step: int, saving: bool) -> bool:
        """At max_staleness >= 2, the next step's groups are taken, and scored, while the learner trains this one
        (not at the last step, nor before a checkpoint): taken before this step's push, they are one version older
        when trained, so it costs a step of the bound (``steps_sent_ahead``)."""
        return self.a.max_staleness >= 2 and step < last_step and not saving

    def steps_sent_ahead(self) -> int:
        """How many steps past the one taken the engines hold prompts of: max_staleness, less the one a take ahead
        costs. A group's oldest token is then at most max_staleness versions older than the learner that trains it."""
        return self.a.max_staleness - (self.a.max_staleness >= 2)

    def bounds_staleness(self) -> bool:
        """No: a group slower than the bound is the staleness policy's (``algorithm.staleness``)."""
        return False

    def push_due(self, behind: int, validating: bool, saving: bool) -> bool:
        """After every update that changed the weights: the push goes into the generation in flight."""
        return behind > 0

    def recomputes_old_policy(self, mini_batches: int, stale: bool) -> bool:
        """Not in bypass mode; otherwise always (the proximal policy: the learner's weights before the update)."""
        return not self.a.rollout_correction.bypass_mode

    def keeps_older_weights(self) -> bool:
        """No: the old policy is the learner's current weights."""
        return False

    def old_policy_version(self, sample_version: int, learner_version: int) -> int:
        """The learner's: a trajectory may span versions, and its old policy is the proximal one."""
        return learner_version
