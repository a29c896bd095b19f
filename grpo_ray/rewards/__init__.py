"""Reward functions: plain callables, a registry, and a weighted combination.

A reward is ``fn(response: str, ground_truth: str, **extra) -> float``. ``extra``
carries the row's ``data_source`` and ``extra_info``; a function takes what it
needs and ignores the rest. ``load(name)`` returns a built-in by name (``gsm8k``,
``math``, ``format``, ``auto``: by the row's data_source) or imports ``"package.module:function"``.

A reward actor's child process scores one response with every function of the recipe
(``grpo_ray.rewards.runner.score_one``) and keeps each component, so metrics show
``reward/<name>/mean`` as well as the total, the ``weighted_sum``.
"""

from __future__ import annotations

import importlib
from typing import Protocol

from grpo_ray.errors import UserError
from grpo_ray.rewards.builtin import auto_reward, format_reward, gsm8k_reward, math_reward


class RewardFn(Protocol):
    def __call__(self, response: str, ground_truth: str, **extra) -> float: ...


BUILTIN: dict[str, RewardFn] = {
    "gsm8k": gsm8k_reward,
    "math": math_reward,
    "format": format_reward,
    "auto": auto_reward,
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
    except Exception as e:  # the module itself fails: a syntax error, or code that raises at import
        raise RewardLoadError(f"reward {name!r}: importing {module_name!r} failed: {type(e).__name__}: {e}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise RewardLoadError(f"reward {name!r}: module {module_name!r} has no callable {attr!r}")
    return fn


def weighted_sum(components: dict[str, float], weights: list[tuple[str, float]]) -> float:
    """The combined reward: sum of weight x component over (name, weight) pairs."""
    return sum(weight * components[name] for name, weight in weights)
