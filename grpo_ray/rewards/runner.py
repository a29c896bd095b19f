"""Scoring one response in a child process of a reward actor (light imports: no Ray, no torch)."""

from __future__ import annotations

_LOADED: dict = {}


def score_one(functions: list[tuple[str, float]], response: str, ground_truth: str, extra: dict) -> tuple[dict[str, float], int]:
    """Each function's score of one response, and how many raised (those score 0)."""
    from grpo_ray.rewards import load

    components, errors = {}, 0
    for name, _ in functions:
        fn = _LOADED.get(name) or _LOADED.setdefault(name, load(name))
        try:
            components[name] = float(fn(response, ground_truth, **extra))
        except Exception:  # user code may raise anything: the sample scores 0, the step goes on
            components[name] = 0.0
            errors += 1
    return components, errors
