"""Scoring one response in a child process of a reward actor (light imports: no Ray, no torch)."""

from __future__ import annotations

import math

_LOADED: dict = {}


def score_one(functions: list[tuple[str, float]], response: str, ground_truth: str,
              extra: dict) -> tuple[dict[str, float], int, bool]:
    """Each function's score of one response, how many failed (raised or returned a non-finite number:
    those score 0), and whether one ran out of memory (the child is then replaced)."""
    from grpo_ray.rewards import load

    components, errors, out_of_memory = {}, 0, False
    for name, _ in functions:
        fn = _LOADED.get(name) or _LOADED.setdefault(name, load(name))
        try:
            value = float(fn(response, ground_truth, **extra))
        except MemoryError:
            value, out_of_memory = math.nan, True
        except Exception:  # user code may raise anything: the sample scores 0, the step goes on
            value = math.nan
        if not math.isfinite(value):
            value, errors = 0.0, errors + 1
        components[name] = value
    return components, errors, out_of_memory
