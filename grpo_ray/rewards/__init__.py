"""Reward functions: plain callables, a registry, and a weighted combination.

A reward takes a response and the row's ground truth and returns a number. Two signatures are taken:

- ours, ``fn(response, ground_truth, **extra)``, ``extra`` being the row's ``data_source`` and ``extra_info``
  (a function that names neither gets neither);
- verl's, ``compute_score(data_source, solution_str, ground_truth, extra_info=None)``, told by its
  ``solution_str`` parameter and called by keyword, as verl calls it. It may return a dict with a ``score``
  (verl's form); the score is the reward.

``load(name)`` returns a built-in by name (``gsm8k``, ``math``, ``format``, ``auto``: by the row's data_source),
imports ``"package.module:function"``, or runs a file, ``"path/to/file.py:function"`` (verl's
``custom_reward_function.path`` and ``.name``). A file is read on the driver and its text sent to the reward
actors, so every node has it; a module is imported from the directory the driver found it in (the working
directory and the recipe's folder are searched first), or by Ray's ``working_dir`` under ``ray job submit``.

A reward actor's child process scores one response with every function of the recipe
(``grpo_ray.rewards.runner.score_one``) and keeps each component, so metrics show
``reward/<name>/mean`` as well as the total, the ``weighted_sum``.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import sys
from pathlib import Path
from typing import Protocol

from grpo_ray import libraries
from grpo_ray.errors import UserError
from grpo_ray.rewards.builtin import (
    auto_reward,
    format_reward,
    gsm8k_reward,
    math_reward,
)


class RewardFn(Protocol):
    def __call__(self, response: str, ground_truth: str, **extra) -> float: ...


BUILTIN: dict[str, RewardFn | str] = {
    "gsm8k": gsm8k_reward,
    "math": math_reward,
    "format": format_reward,
    "auto": auto_reward,
    **libraries.REWARDS,  # a library's own scoring of its rows (reasoning_gym): its module:function, imported when used
}


class RewardLoadError(UserError):
    """A reward name that is neither built in, nor an importable ``module:function``, nor a file's function."""


def is_file(name: str) -> bool:
    """Whether `name` is the file form, ``path/to/file.py:function``."""
    return name.rpartition(":")[0].endswith(".py")


def load(name: str, source: str | None = None) -> RewardFn:
    """The reward function called `name`: a built-in, ``"module:function"`` or ``"file.py:function"`` (run from
    `source`, the file's text, when given: the driver reads it for actors on other nodes)."""
    if name in BUILTIN:
        return BUILTIN[name] if callable(BUILTIN[name]) else libraries.find(BUILTIN[name])
    if ":" not in name:
        raise RewardLoadError(
            f"unknown reward {name!r}: expected a built-in ({', '.join(sorted(BUILTIN))}), "
            "'module:function' or 'path/to/file.py:function'"
        )
    module_name, _, attr = name.rpartition(":")
    try:
        module = _from_file(module_name, source) if is_file(name) else importlib.import_module(module_name)
    except ImportError as e:
        missing = getattr(e, "name", None) or ""
        if is_file(name) or not (module_name == missing or module_name.startswith(missing + ".")):
            # the file or module was found, and its own import of something else failed: say that, not where
            # modules are looked for
            raise RewardLoadError(
                f"reward {name!r}: {module_name} was found, and its own import failed: {type(e).__name__}: {e}"
            ) from None
        raise RewardLoadError(
            f"reward {name!r}: cannot import module {module_name!r} ({e}); a module of your own "
            "is found in the working directory or the recipe's folder"
        ) from None
    except OSError as e:
        raise RewardLoadError(f"reward {name!r}: cannot read {module_name} ({e.strerror or e})") from None
    except Exception as e:  # the module itself fails: a syntax error, or code that raises at import
        raise RewardLoadError(f"reward {name!r}: importing {module_name!r} failed: {type(e).__name__}: {e}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise RewardLoadError(f"reward {name!r}: {module_name!r} has no callable {attr!r}")
    return fn


def _from_file(path: str, source: str | None):
    """The module made by running the file at `path` (or `source`, its text), importable by its siblings' name."""
    import types

    text = Path(path).read_text() if source is None else source
    module = types.ModuleType(Path(path).stem)
    module.__file__ = path
    folder = str(Path(path).parent)
    if folder not in sys.path:
        sys.path.append(folder)  # the file's own imports of modules beside it (where the folder exists)
    exec(compile(text, path, "exec"), module.__dict__)
    return module


def caller(fn: RewardFn):
    """`fn` as ``call(response, ground_truth, data_source, extra_info, **kwargs)``, in the signature it was written
    in (`kwargs`: the recipe's for it, passed as they are)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # no signature to read (a C function): ours, with everything
        return lambda response, truth, source, info, **kw: fn(
            response, truth, data_source=source, extra_info=info, **kw
        )
    takes_all = any(p.kind is p.VAR_KEYWORD for p in params.values())

    def wanted(**kw):
        return kw if takes_all else {k: v for k, v in kw.items() if k in params}

    if "solution_str" in params:  # verl's compute_score, called by keyword as verl calls it
        return lambda response, truth, source, info, **kw: fn(
            **wanted(data_source=source, solution_str=response, ground_truth=truth, extra_info=info), **kw
        )
    return lambda response, truth, source, info, **kw: fn(
        response, truth, **wanted(data_source=source, extra_info=info), **kw
    )


def calls(functions: list) -> list[tuple[str, list[str], dict]]:
    """What a reward child runs for the recipe's reward.functions (``runner.score_one``): each one's name, the data
    sources it scores ([]: all) and its keyword arguments."""
    return [(f.name, list(f.sources), dict(f.kwargs)) for f in functions]


def as_score(value) -> float:
    """A reward function's answer as a number: a number, or verl's dict with a 'score'; TypeError otherwise."""
    if isinstance(value, dict) and "score" in value:
        value = value["score"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise TypeError(
            f"returned {type(value).__name__} {str(value)[:80]!r}: expected a number, or a dict with "
            "a 'score' (verl's form)"
        )
    return float(value)


def search_here(*dirs: str | Path) -> None:
    """Put `dirs` (the working directory, the recipe's folder) first where modules are imported from."""
    for d in reversed([str(Path(d).resolve()) for d in dirs]):
        if d not in sys.path:
            sys.path.insert(0, d)


def resolve_file(name: str, dirs: list[Path]) -> str:
    """The file form with its path made absolute: relative paths are looked for in each of `dirs` in turn."""
    path, _, attr = name.rpartition(":")
    found = (
        next((d / path for d in [Path(), *dirs] if (d / path).is_file()), None)
        if not Path(path).is_absolute()
        else (Path(path) if Path(path).is_file() else None)
    )
    if found is None:
        where = " or ".join(str(d.resolve()) for d in [Path(), *dirs]) if not Path(path).is_absolute() else ""
        raise RewardLoadError(f"reward {name!r}: no file {path}" + (f" (looked in {where})" if where else ""))
    return f"{found.resolve()}:{attr}"


def shipped(names: list[str]) -> tuple[dict[str, str], list[str]]:
    """What reward actors need to load `names` wherever they run: each file form's text, and the directories the
    driver imported the module forms from."""
    sources = {n: Path(n.rpartition(":")[0]).read_text() for n in names if is_file(n)}
    dirs = []
    for n in names:
        if n in BUILTIN or is_file(n):
            continue
        top = n.rpartition(":")[0].split(".")[0]
        spec = importlib.util.find_spec(top)
        origin = spec and (next(iter(spec.submodule_search_locations or []), None) or spec.origin)
        if origin:
            home = str(Path(origin).parent)
            if home not in dirs and "site-packages" not in home:
                dirs.append(home)
    return sources, dirs


def weighted_sum(components: dict[str, float], weights: list[tuple[str, float]]) -> float:
    """The combined reward: sum of weight x component over (name, weight) pairs, but for components that are NaN
    (a function that does not score the row's data source)."""
    return sum(weight * components[name] for name, weight in weights if not math.isnan(components[name]))
