"""Every recipe key with its type, default and doc, read from ``grpo_ray.config``'s dataclasses and the docstring
under each field: what ``grpo-ray config`` prints and the JSON Schema editors complete from."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import typing
from dataclasses import MISSING, dataclass, fields, is_dataclass
from functools import cache
from typing import Any

from omegaconf import OmegaConf

from grpo_ray import config
from grpo_ray.config import envs, jobs, schema, scorers


@dataclass
class Key:
    path: str
    type: str
    default: Any
    doc: str


@cache
def field_docs() -> dict[tuple[str, str], str]:
    """(class name, field name) -> the docstring written under the field in grpo_ray/config/ (schema.py, scorers.py,
    jobs.py, envs.py)."""
    docs = {}
    trees = [ast.parse(inspect.getsource(m)) for m in (schema, scorers, jobs, envs)]
    for cls in (n for tree in trees for n in tree.body if isinstance(n, ast.ClassDef)):
        body = cls.body
        for a, b in itertools.pairwise(body):
            if (
                isinstance(a, ast.AnnAssign)
                and isinstance(a.target, ast.Name)
                and isinstance(b, ast.Expr)
                and isinstance(b.value, ast.Constant)
                and isinstance(b.value.value, str)
            ):
                docs[(cls.name, a.target.id)] = " ".join(b.value.value.split())
    return docs


def type_name(tp) -> str:
    if is_dataclass(tp):
        return "section"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union or str(origin) == "types.UnionType":
        return " | ".join("null" if a is type(None) else type_name(a) for a in args)
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(type_name(a) for a in args)}]"
    return getattr(tp, "__name__", str(tp))


def default_of(f: dataclasses.Field) -> Any:
    if f.default is not MISSING:
        return "(required)" if f.default == "???" else f.default
    if f.default_factory is not MISSING:
        value = f.default_factory()
        return None if is_dataclass(value) else OmegaConf.to_container(OmegaConf.create({"v": value}))["v"]
    return "(required)"


def keys(schema: type = config.Recipe, prefix: str = "") -> list[Key]:
    """Every key of `schema` (sections too), depth first, in the order the dataclasses declare them."""
    hints, docs, out = typing.get_type_hints(schema), field_docs(), []
    for f in fields(schema):
        tp = hints[f.name]
        doc = next((docs[(c.__name__, f.name)] for c in schema.__mro__ if (c.__name__, f.name) in docs), "")
        out.append(Key(prefix + f.name, type_name(tp), default_of(f), doc))
        item = typing.get_args(tp)[0] if typing.get_origin(tp) is list and typing.get_args(tp) else None
        if is_dataclass(tp):
            out += keys(tp, prefix + f.name + ".")
        elif is_dataclass(item):
            out += keys(item, prefix + f.name + "[].")
    return out


def json_schema(schema: type = config.Recipe, path: str = "") -> dict:
    """A JSON Schema (draft 2020-12) of the recipe: types, defaults, choices and docs, for editor completion."""
    hints, docs = typing.get_type_hints(schema), field_docs()
    props = {}
    for f in fields(schema):
        key = f"{path}.{f.name}" if path else f.name
        node = _schema_of(hints[f.name], key)
        doc = docs.get((schema.__name__, f.name))
        if doc:
            node["description"] = doc
        default = default_of(f)
        if default is not None and default != "(required)" and not is_dataclass(hints[f.name]):
            node["default"] = default
        props[f.name] = node
    out = {"type": "object", "properties": props, "additionalProperties": False}
    if not path:
        out = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "grpo-ray recipe", **out}
    return out


def _schema_of(tp, key: str) -> dict:
    if is_dataclass(tp):
        return json_schema(tp, key)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union or str(origin) == "types.UnionType":
        return {"anyOf": [{"type": "null"} if a is type(None) else _schema_of(a, key) for a in args]}
    if origin is list:
        return {"type": "array", "items": _schema_of(args[0], key) if args else {}}
    if origin is dict:
        return {"type": "object"}
    simple = {str: "string", int: "integer", float: "number", bool: "boolean"}.get(tp)
    node = {"type": simple} if simple else {}
    if key in config.FUNCTION_KEYS:  # a registered name, or a user's module:function
        return {
            "anyOf": [{**node, "enum": list(config.CHOICES[key])}, {**node, "pattern": f"^{config.FUNCTION_NAME}$"}]
        }
    if key in config.CHOICES:
        node["enum"] = list(config.CHOICES[key])
    if key == "generator.num_engines":  # or a range of them, min..max (config/load.py)
        return {"anyOf": [node, {"type": "string", "pattern": r"^\s*\d+\s*\.\.\s*\d+\s*$"}]}
    return node


def text(recipe: config.Recipe | None) -> str:
    """Every key: its path, type and default, the value `recipe` gives it (when it differs), and its doc."""
    lines = []
    for k in keys():
        value = _value(recipe, k.path) if recipe is not None and k.type != "section" and "[]" not in k.path else None
        shown = "" if k.type == "section" else f"  [{k.type}] default: {_fmt(k.default)}"
        if value is not None and _fmt(value) != _fmt(k.default):
            shown += f"  value: {_fmt(value)}"
        lines.append(f"{k.path}{shown}")
        if k.doc:
            lines.append(f"    {k.doc}")
    return "\n".join(lines)


def _value(recipe, path: str):
    obj = recipe
    for part in path.split("."):
        obj = getattr(obj, part)
    plain = [dataclasses.asdict(o) if is_dataclass(o) else o for o in obj] if isinstance(obj, list) else obj
    return config.redact(plain)


def _fmt(v) -> str:
    if v == "(required)":
        return v
    return "null" if v is None else repr(v) if isinstance(v, str) else str(v).replace("'", "")
