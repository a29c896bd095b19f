"""Rows of prompts with ground truth, in the schema verl users know.

A row is a dict::

    data_source   str                    where it comes from ("gsm8k", "math500", "synthetic/reasoning")
    prompt        list of {role, content} chat messages, rendered with the model's chat template
    ability       str                    e.g. "math"
    reward_model  {style, ground_truth}  ground_truth is what reward functions compare with
    extra_info    dict                   split, index, the original question and answer

``load_rows(spec)`` reads rows from a parquet, JSONL or JSON-array file or from a synthetic task's name
(``synthetic://select?size=N&seed=S&items=K&split=train`` or
``synthetic://reasoning?size=N&seed=S&min_steps=2&max_steps=3&max_value=40&split=test``, see
grpo_ray.data.synthetic), and checks each row, naming the file and row of the first bad one. A prompt
written as plain text becomes one user message, a numeric ground truth its text (``normalise``).
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from grpo_ray.errors import UserError

SYNTHETIC_SCHEME = "synthetic://"


class DataError(UserError):
    """Rows that cannot be used, with the file and row that are wrong."""


def normalise(row: dict) -> dict:
    """Forms people write by hand, in the schema: a prompt given as plain text is one user message; a ground truth
    given as a number is its text."""
    prompt, rm = row.get("prompt"), row.get("reward_model")
    if isinstance(prompt, str) and prompt.strip():
        row = {**row, "prompt": [{"role": "user", "content": prompt}]}
    if isinstance(rm, dict) and isinstance(rm.get("ground_truth"), (int, float)) and not isinstance(rm["ground_truth"], bool):
        row = {**row, "reward_model": {**rm, "ground_truth": str(rm["ground_truth"])}}
    return row


def row_problem(row: dict) -> str | None:
    """What is wrong with `row`, or None when it is usable."""
    prompt = row.get("prompt")
    if not isinstance(prompt, list) or not prompt:
        return "'prompt' must be a non-empty list of chat messages"
    for m in prompt:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            return "each prompt message needs string 'role' and 'content'"
    if not any(m["content"].strip() for m in prompt):
        return "the prompt is empty"
    rm = row.get("reward_model")
    truth = rm.get("ground_truth") if isinstance(rm, dict) else None
    if truth is not None and not isinstance(truth, str):
        return f"'reward_model.ground_truth' must be text or a number, not a {type(truth).__name__}"
    if not isinstance(truth, str) or not truth.strip():
        return "'reward_model.ground_truth' is missing or empty"
    if not isinstance(row.get("data_source"), str):
        return "'data_source' is missing"
    return None


def load_rows(spec: str) -> list[dict]:
    """Rows from a parquet / JSONL file or a synthetic:// name; DataError names the first bad row."""
    if spec.startswith(SYNTHETIC_SCHEME):
        return _synthetic(spec)
    path = Path(spec)
    if not path.is_file():
        raise DataError(f"{spec}: no such file (expected a .parquet or .jsonl file, or synthetic://select?size=N)")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as e:  # pyarrow raises several types for unreadable files
            raise DataError(f"{spec}: not a readable parquet file ({e})") from None
    elif path.suffix in (".jsonl", ".json"):
        rows = _json_rows(spec, path)
    else:
        raise DataError(f"{spec}: unknown file type {path.suffix!r}; expected .parquet, .jsonl or .json")
    rows = [normalise(row) if isinstance(row, dict) else row for row in rows]
    for i, row in enumerate(rows):
        problem = row_problem(row) if isinstance(row, dict) else "not a JSON object"
        if problem:
            raise DataError(f"{spec} row {i}: {problem}")
    if not rows:
        raise DataError(f"{spec}: no rows")
    return rows


def _json_rows(spec: str, path: Path) -> list:
    """A JSON array of rows (a .json file whose text starts with '['), or one JSON object per line; UTF-8, with or
    without a byte-order mark, blank lines skipped."""
    data = path.read_bytes().removeprefix(b"\xef\xbb\xbf")
    if path.suffix == ".json" and data.lstrip().startswith(b"["):
        try:
            return json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise DataError(f"{spec}: not a JSON array of rows in UTF-8 ({e})") from None
    rows = []
    for n, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line.decode("utf-8")))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise DataError(f"{spec} line {n}: not a JSON object in UTF-8 ({e})") from None
    return rows


# the keys of each synthetic task, beyond size, seed and split, with their least and greatest values
SYNTHETIC_KEYS = {"select": {"items": (1, 8)},
                  "reasoning": {"min_steps": (1, 6), "max_steps": (1, 6), "max_value": (10, 99), "answer_only": (0, 1)}}
FLOAT_KEYS = {"answer_only"}


def _synthetic(spec: str) -> list[dict]:
    from grpo_ray.data import synthetic

    parts = urlsplit(spec)
    task = parts.netloc or parts.path.strip("/")
    if task not in SYNTHETIC_KEYS:
        raise DataError(f"{spec}: unknown synthetic task {task!r}; expected one of {', '.join(SYNTHETIC_KEYS)}")
    args = dict(parse_qsl(parts.query))
    bounds = SYNTHETIC_KEYS[task]
    allowed = ["size", "seed", "split", *bounds]
    unknown = set(args) - set(allowed)
    if unknown:
        raise DataError(f"{spec}: unknown key {sorted(unknown)[0]!r}; expected any of {', '.join(allowed)}")
    split = args.pop("split", "train")
    try:
        values = {k: float(v) if k in FLOAT_KEYS else int(v) for k, v in args.items()}
    except ValueError as e:
        raise DataError(f"{spec}: {e}") from None
    size, seed = values.pop("size", 1000), values.pop("seed", 0)
    if size <= 0 or seed < 0:
        raise DataError(f"{spec}: size must be positive and seed >= 0")
    for key, v in values.items():
        low, high = bounds[key]
        if not low <= v <= high:
            raise DataError(f"{spec}: {key}={v} must be between {low} and {high}")
    if values.get("min_steps", 2) > values.get("max_steps", 3):
        raise DataError(f"{spec}: min_steps must not exceed max_steps")
    return synthetic.make_rows(size, seed=seed, split=split, task=task, **values)


def prompt_text(tokenizer, row: dict, response_prefix: str = "", chat_template_kwargs: dict | None = None) -> str:
    """What the generator is given, as text: the chat-templated prompt, then the response prefix."""
    text = tokenizer.apply_chat_template(
        row["prompt"], add_generation_prompt=True, tokenize=False, **(chat_template_kwargs or {})
    )
    return text + response_prefix


def prompt_token_ids(tokenizer, row: dict, response_prefix: str = "", chat_template_kwargs: dict | None = None) -> list[int]:
    """Token ids of `prompt_text`."""
    return tokenizer(prompt_text(tokenizer, row, response_prefix, chat_template_kwargs), add_special_tokens=False)["input_ids"]
