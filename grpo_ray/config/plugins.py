"""A recipe's ``plugins``: modules imported before the recipe is read, in every process that holds it. A plugin adds
what the package's tables hold (``grpo_ray.extend``: a pool kind's row, its recipe section and role, a use of its
signal); the sections it adds are fields of the recipe class this module builds (``recipe_class``), so their keys
are checked, typed, overridden and written to config.yaml as the package's own are.

A recipe travels to Ray's workers pickled: it is rebuilt there by ``rebuilt``, which imports its plugins first (a
worker finds them where the driver did: Ray starts its workers with the driver's ``sys.path``; under ``ray job
submit``, the job's ``working_dir``)."""

from __future__ import annotations

import copyreg
import functools
import importlib
import sys
import traceback
from dataclasses import field, make_dataclass
from pathlib import Path

from grpo_ray.config.schema import Recipe, RecipeError

SECTIONS: dict[str, type] = {}
"""The recipe sections plugins added: name -> its dataclass (``grpo_ray.extend.add_pool``)."""


def import_plugins(names: list[str], near: tuple[str, ...] = ()) -> None:
    """Import each of `names` (once a process), the folders `near` (the recipe's, the working directory) searched
    first; a module that cannot be imported is a RecipeError naming it and the real cause."""
    for d in near if names else ():  # a recipe without plugins leaves the import path as it was
        if str(Path(d).resolve()) not in sys.path:
            sys.path.insert(0, str(Path(d).resolve()))
    for name in names:
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and (name == e.name or name.startswith(e.name + ".")):  # the plugin, not one it imports
                where = "".join(f"{Path(d).resolve()}, " for d in near)
                raise RecipeError(f"plugins: no module {name!r} (looked in {where}sys.path)") from None
            raise RecipeError(f"plugins: {name!r} failed to import: {_last(e)}") from None
        except Exception as e:  # its own code raised: the line that did, with the error
            raise RecipeError(f"plugins: {name!r} failed to import: {_last(e)}") from None


def _last(e: BaseException) -> str:
    """An exception as its last frame's place and its message."""
    frame = traceback.extract_tb(e.__traceback__)[-1:]
    where = f" ({Path(frame[0].filename).name}:{frame[0].lineno})" if frame else ""
    return f"{type(e).__name__}: {e}{where}"


def recipe_class() -> type[Recipe]:
    """The recipe's schema in this process: ``Recipe``, with a field for each section a plugin added."""
    return _with(tuple(SECTIONS.items()))


@functools.cache
def _with(sections: tuple[tuple[str, type], ...]) -> type[Recipe]:
    if not sections:
        return Recipe
    added = [(name, cls, field(default_factory=cls)) for name, cls in sections]
    cls = make_dataclass("Recipe", added, bases=(Recipe,))
    cls.__module__ = Recipe.__module__
    copyreg.pickle(cls, _reduced)
    return cls


def _reduced(recipe: Recipe):
    """How a recipe pickles: with its plugins' names, imported first where it is unpickled (``rebuilt``)."""
    return rebuilt, (recipe.plugins, dict(recipe.__dict__))


copyreg.pickle(Recipe, _reduced)


def rebuilt(plugins: list[str], state: dict) -> Recipe:
    """A pickled recipe, in the process that unpickles it: its plugins imported, its class this process's."""
    import_plugins(plugins)
    recipe = object.__new__(recipe_class())
    recipe.__dict__.update(state)
    return recipe
