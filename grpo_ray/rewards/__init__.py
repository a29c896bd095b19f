"""Reward functions: plain callables, a registry, and a weighted combination.

A reward is ``fn(response: str, ground_truth: str, **extra) -> float``. ``extra``
carries the row's ``data_source`` and ``extra_info``; a function takes what it
needs and ignores the rest. ``load(name)`` returns a built-in by name (``gsm8k``,
``math``, ``format``) or imports ``"package.module:function"``.

``combine`` scores one response with several weighted functions and keeps every
component, so metrics can show ``reward/<name>/mean`` as well as the total.
"""

from __future__ import annotations

import importlib
from typing import Callable, Protocol

from grpo_ray.errors import UserError
from grpo_ray.rewards.builtin import format_reward, gsm8k_reward, math_reward


class RewardFn(Protocol):
    def __call__(self, response: str, ground_truth: str, **extra) -> float: ...


BUILTIN: dict[str, RewardFn] = {
    "gsm8k": gsm8k_reward,
    "math": math_reward,
    "format": format_reward,
}


class RewardLoadError(UserError):
    """A reward name that is neither built in nor an importable ``module:function``."""


def load(name: str) -> RewardFn:
    """The reward function called `name`: a built-in, or ``"module:function"``."""
    if name in BUILTIN:
        return BUILTIN[name]
    if ":" not in name:
        raise RewardLoadError(
            f"unknown reward {name!r}: expected a built-in ({', '.join(sorted(BUILTIN))}) or 'module:function'"
        )
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise RewardLoadError(f"reward {name!r}: cannot import module {module_name!r} ({e})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise RewardLoadError(f"reward {name!r}: module {module_name!r} has no callable {attr!r}")
    return fn


def weighted_sum(components: dict[str, float], weights: list[tuple[str, float]]) -> float:
    """The combined reward: sum of weight x component over (name, weight) pairs."""
    return sum(weight * components[name] for name, weight in weights)


def combine(
    fns: list[tuple[str, Callable[..., float], float]], response: str, ground_truth: str, **extra
) -> tuple[float, dict[str, float]]:
    """Weighted sum of `fns` ((name, fn, weight) triples) on one response, and each component unweighted."""
    components = {name: float(fn(response, ground_truth, **extra)) for name, fn, _ in fns}
    return weighted_sum(components, [(name, weight) for name, _, weight in fns]), components
