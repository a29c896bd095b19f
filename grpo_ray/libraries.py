"""The outside libraries grpo-ray plays with no glue, found by name.

Each library is one module of ``grpo_ray.integrations`` holding its rows, its adapter, its reward and their options
(``harbor``, ``openenv``, ``reasoning_gym``, ``skyrl_gym``, ``textarena``, ``verifiers``). The tables below name
what each gives as ``module:name`` strings, as a recipe names a user's own: the data, environment and reward layers
look a name up here and import the module when a recipe uses it, and nothing below the integrations imports one.
A new library is its module and its lines here.
"""

from __future__ import annotations

import importlib

DATA = {
    "harbor://": "grpo_ray.integrations.harbor:rows",
    "reasoning_gym://": "grpo_ray.integrations.reasoning_gym:rows",
    "textarena://": "grpo_ray.integrations.textarena:rows",
    "verifiers://": "grpo_ray.integrations.verifiers:rows",
}
"""A data spec's scheme -> the function making its rows (``rows(spec) -> list[dict]``; ValueError saying why not)."""

ENVIRONMENTS = {
    "harbor": "grpo_ray.integrations.harbor:Harbor",
    "openenv": "grpo_ray.integrations.openenv:OpenEnv",
    "skyrl_gym": "grpo_ray.integrations.skyrl_gym:SkyRLGym",
    "textarena": "grpo_ray.integrations.textarena:TextArena",
}
"""An ``environment.name`` -> its adapter, an ``Environment`` class."""

REWARDS = {"reasoning_gym": "grpo_ray.integrations.reasoning_gym:reward"}
"""A reward function's name (``reward.functions``) -> the function."""


def find(name: str):
    """What ``module:name`` names, its module imported."""
    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(module), attr)


def scheme(spec: str) -> str | None:
    """The scheme of a data spec a library makes rows of (``textarena://``), or None."""
    return next((s for s in DATA if spec.startswith(s)), None)
