"""The schedule: when a step's batch is launched, when weights are pushed, how stale a trained sample may be, and
whether the learner recomputes the old policy's logprobs, stated once. The controller runs a schedule's rules step by
step (``controller.py``), the learner applies ``recomputes_old_policy`` to each batch it trains
(``roles/learner.py``), and ``plan`` simulates the same rules (``planner/speed.py``).

A schedule is one file here and one name in the recipe (``algorithm.schedule``; a user's own as ``module:Class``, a
subclass of ``Schedule``, checked before start):

    batched    a batch a step, generated, scored and trained whole; at algorithm.max_staleness k >= 1 the next batch
               is launched ahead, generated while this one trains (``batched.py``)
    streaming  the engines generate without a break, fed prompts up to max_staleness steps ahead; a step trains the
               first groups to finish, and weights are pushed into the generation in flight (``streaming.py``),
               groups older than max_staleness getting what ``algorithm.staleness`` says (``staleness.py``)
"""

from __future__ import annotations

from grpo_ray.config import AlgorithmConfig
from grpo_ray.schedules.base import Schedule, named
from grpo_ray.schedules.batched import Batched
from grpo_ray.schedules.staleness import POLICIES, Staleness
from grpo_ray.schedules.streaming import Streaming

SCHEDULES = {"batched": Batched, "streaming": Streaming}
"""The schedules by name."""


def of(a: AlgorithmConfig) -> Schedule:
    """The schedule ``algorithm.schedule`` names, for `a`; RecipeError when a ``module:Class`` cannot be imported or
    is not a Schedule (the planner asks first, so before anything starts)."""
    return named("algorithm.schedule", a.schedule, SCHEDULES, Schedule)(a)


__all__ = ["POLICIES", "SCHEDULES", "Schedule", "Staleness", "of"]
