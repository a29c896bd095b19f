"""Functions by name: the advantage estimators (``advantage.ESTIMATORS``) and policy losses (``loss.POLICY_LOSSES``)
are registries, and a recipe may name a user's own function instead as ``module:function``
(``algorithm.adv_estimator``, ``algorithm.loss_mode``). It is imported where it runs: on the driver the working
directory and the recipe's folder are searched first (Ray's workers on the same machine inherit that path; under
``ray job submit`` the job's ``working_dir`` carries the module). Each registry's module tries a user's function
on a small batch before anything starts (``advantage.check``, ``loss.check``)."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable


class FunctionError(ValueError):
    """A ``module:function`` that cannot be imported or called as its registry's functions are."""


def named(registry: dict[str, Callable], name: str) -> Callable:
    """The function `name` names: a registered one, or a user's ``module:function`` (FunctionError otherwise)."""
    return registry[name] if name in registry else imported(name, tuple(registry))


@functools.cache
def imported(name: str, known: tuple[str, ...] = ()) -> Callable:
    """A user's ``module:function``, imported once per process."""
    module, _, attr = name.partition(":")
    if not (module and attr):
        raise FunctionError(f"expected one of {', '.join(known)}, or module:function")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except ImportError as e:
        raise FunctionError(f"cannot import {module} ({e})") from None
    except AttributeError:
        raise FunctionError(f"module {module} has no {attr}") from None
    if not callable(fn):
        raise FunctionError(f"{name} is a {type(fn).__name__}, not a function")
    return fn
