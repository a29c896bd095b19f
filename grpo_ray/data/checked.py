"""Checked rows kept between runs: what ``setup_run.usable_rows`` made of one data file, under the cache, found
again by a key of everything it depends on: the file's bytes (a synthetic task: its name), the tokenizer's files
and chat template, the recipe's data keys and limits, and this code. A rerun, a resume or the next job on the same
data and model does not read and tokenize every row again (20,000 rows: 3 of a quick start's 5 s of checks here).

Only local files, dataset directories and synthetic tasks are kept (a hub dataset is ``datasets``' own cache's),
only rows that JSON holds, only for a GRPO run's rows (SFT and reward-model rows carry more of the recipe), and an
entry that cannot be read back whole is made again.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from functools import cache
from pathlib import Path

from grpo_ray.data import SYNTHETIC_SCHEME

HERE = Path(__file__).resolve().parent
CODE = (HERE / "__init__.py", HERE / "synthetic.py", HERE / "checked.py", HERE.parent / "setup_run.py")
"""The code whose rows these are: another version of it makes other keys."""
NOT_TOKENIZER = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5")
"""A model folder's files that are weights: every other file (tokenizer, its config, chat template) is in the key."""


def cache_root() -> Path:
    """grpo-ray's cache: ``$GRPO_RAY_CACHE`` or ``~/.cache/grpo_ray`` (tiny models under ``models/``, checked rows
    under ``data/``)."""
    return Path(os.environ.get("GRPO_RAY_CACHE", Path.home() / ".cache" / "grpo_ray"))


def folder() -> Path:
    """``data/`` beside the tiny models' ``models/``."""
    return cache_root() / "data"


@cache
def _code() -> str:
    return _digest(b"".join(p.read_bytes() for p in CODE))


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _files_digest(path: Path, skip: tuple[str, ...] = ()) -> str:
    """A file's bytes, or a folder's files (names and bytes, in order)."""
    if path.is_file():
        return _digest(path.read_bytes())
    h = hashlib.sha256()
    for p in sorted(q for q in path.rglob("*") if q.is_file() and not q.name.endswith(skip)):
        h.update(str(p.relative_to(path)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def key(spec: str, tokenizer, recipe, command: str) -> str | None:
    """The entry's name for `spec`'s rows, or None where they are not kept."""
    if command not in ("", "train"):
        return None
    if spec.startswith(SYNTHETIC_SCHEME):
        source = spec
    else:
        path = Path(spec.split("?", 1)[0]).expanduser()
        if spec.startswith("hf://") or not path.exists():
            return None
        source = spec + _files_digest(path)
    model = Path(getattr(tokenizer, "name_or_path", ""))
    if not model.is_dir():
        return None
    d = recipe.data
    parts = [
        source,
        _files_digest(model, NOT_TOKENIZER),
        tokenizer.chat_template or "",
        json.dumps(
            [d.prompt_key, d.answer_key, d.response_prefix, d.system_prompt, d.max_prompt_length],
            default=str,
        ),
        json.dumps(recipe.model.chat_template_kwargs, sort_keys=True, default=str),
        _code(),
    ]
    return _digest("\0".join(parts).encode())


def load(name: str | None) -> tuple[list[dict], int, str] | None:
    """The rows kept under `name`, how many were dropped and the first dropped's reason; None when not kept (or
    not readable whole)."""
    if not name:
        return None
    try:
        got = json.loads((folder() / f"{name}.json").read_text())
        return got["rows"], int(got["dropped"]), str(got["first_dropped"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save(name: str | None, rows: list[dict], dropped: int, first_dropped: str) -> None:
    """Keep `rows` under `name` (written aside, then renamed: a reader finds a whole entry or none)."""
    if not name:
        return
    entry = {"rows": rows, "dropped": dropped, "first_dropped": first_dropped}
    try:
        text = json.dumps(entry)
    except (TypeError, ValueError):  # a value JSON does not hold (bytes, a timestamp): not kept
        return
    if json.loads(text) != entry:  # read back as something else (a tuple as a list, a number key as text)
        return
    out = folder()
    out.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, out / f"{name}.json")
