"""The schedule: when a step's batch is launched, when weights are pushed, how stale a trained sample may be, and
whether the learner recomputes the old policy's logprobs, stated once. The controller runs a schedule's rules step by
step (``controller.py``), the learner applies ``recomputes_old_policy`` to each batch it trains
(``roles/learner.py``), and ``plan`` simulates the same rules (``planner/speed.py``).

A schedule is one file here and one name in the recipe (``algorithm.schedule``; a user's own as ``module:Class``, a
subclass of ``Schedule``, checked before start):

    batched   a batch a step, generated, scored and trained whole; at algorithm.max_staleness k >= 1 the next batch
              is launched ahead, generated while this one trains (``batched.py``)
"""

from __future__ import annotations

from grpo_ray.algo.registry import FunctionError, imported
from grpo_ray.config import AlgorithmConfig, RecipeError
from grpo_ray.schedules.base import Schedule
from grpo_ray.schedules.batched import Batched

SCHEDULES = {"batched": Batched}
"""The schedules by name."""


def of(a: AlgorithmConfig) -> Schedule:
    """The schedule ``algorithm.schedule`` names, for `a`; RecipeError when a ``module:Class`` cannot be imported or
    is not a Schedule (the planner asks first, so before anything starts)."""
    if a.schedule in SCHEDULES:
        return SCHEDULES[a.schedule](a)
    try:
        cls = imported(a.schedule, tuple(SCHEDULES))
    except FunctionError as e:
        raise RecipeError(f"algorithm.schedule={a.schedule!r}: {e}") from None
    if not (isinstance(cls, type) and issubclass(cls, Schedule)):
        raise RecipeError(
            f"algorithm.schedule={a.schedule!r}: a {type(cls).__name__}, not a subclass of grpo_ray.schedules.Schedule"
        )
    return cls(a)


__all__ = ["SCHEDULES", "Schedule", "of"]
