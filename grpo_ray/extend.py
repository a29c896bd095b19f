"""Adding to the package's tables from outside it: a module a recipe names in ``plugins`` (imported before the recipe
is read, in every process that holds it: ``config.plugins``) calls these at import.

    add_use(name, Use("token", doc), advantage=fn)   a new use of a token signal: fn reshapes each token's advantage
    add_pool(kind, section, role)                    a pool: its row (``config.KINDS``), its recipe section (a
                                                     dataclass), its actor class (``pools.ROLES``)

That is all a new scorer takes: placement, start-up, the scorers' calls, the learner, the loss, metrics, the fit
check and ``plan`` loop over the tables (docs/design.md#plugins; ``tests/prm_plugin.py``, a process reward model).
Each name is added once; adding it again with the same value is a no-op (a module imported twice), with another an
error."""

from __future__ import annotations

from collections.abc import Callable

from grpo_ray.algo.loss import ADVANTAGE_TERMS
from grpo_ray.config import KINDS, SECTIONS, USES, PoolKind, Recipe, Use
from grpo_ray.pools import ROLES


def add_use(name: str, use: Use, advantage: Callable) -> None:
    """A token use: `advantage(advantages, old logprobs, signal, kept tokens, the pool's section) -> (advantages,
    sums)` reshapes each token's advantage before the policy loss, after the package's own terms (``algo.loss``)."""
    if use.per != "token":
        raise ValueError(
            f"use {name!r}: a plugin's use is a token signal (per='token'); a score per sample is a "
            "reward function's or a reward model's (reward.functions, reward_model)"
        )
    _add(USES, name, use, "use")
    _add(ADVANTAGE_TERMS, name, advantage, "use")


def add_pool(kind: PoolKind, section: type, role: type) -> None:
    """A pool kind: its row, the dataclass of its recipe section (named ``kind.section or kind.name``) and its actor
    class (``roles.RoleActor``'s interface; a token scorer answers ``logprobs`` as ``roles.reference.Reference``)."""
    if kind.use and kind.use not in USES:
        raise ValueError(f"pool {kind.name!r}: its use {kind.use!r} is none of {', '.join(USES)} (add_use it first)")
    name = kind.section or kind.name
    if name in Recipe.__dataclass_fields__:
        raise ValueError(f"pool {kind.name!r}: its section {name!r} is the recipe's own")
    _add(SECTIONS, name, section, "section")
    _add(KINDS, kind.name, kind, "pool")
    _add(ROLES, kind.name, role, "pool")


def _add(table: dict, name: str, value, what: str) -> None:
    if table.get(name, value) is not value:
        raise ValueError(f"{what} {name!r} exists")
    table[name] = value
