"""Rows of prompts with ground truth, in the schema verl users know.

A row is a dict::

    data_source   str                    where it comes from ("gsm8k", "math500", "synthetic/reasoning")
    prompt        list of {role, content} chat messages, rendered with the model's chat template
    ability       str                    e.g. "math"
    reward_model  {style, ground_truth}  ground_truth is what reward functions compare with
    extra_info    dict                   split, index, the original question and answer

``load_rows(spec)`` reads rows from

- a parquet, JSONL or JSON-array file;
- a directory: a dataset saved by ``datasets`` (``save_to_disk``), or a folder of data files ``datasets`` reads,
  with ``?split=train`` (the default) after the path to choose a split;
- a hub dataset, ``hf://openai/gsm8k?name=main&split=train&revision=main`` (``datasets.load_dataset``; the hub
  must answer, or the dataset be in the local cache with HF_HUB_OFFLINE=1);
- a synthetic task's name (``synthetic://select?size=N&seed=S&items=K&split=train`` or
  ``synthetic://reasoning?size=N&seed=S&min_steps=2&max_steps=3&max_value=40&split=test``,
  ``synthetic://products?size=N&seed=S&digits=2&answer_only=0.5``, ``synthetic://shapes?size=N&max_count=4&blank=0``
  (pictures: for a vision-language model), see
  grpo_ray.data.synthetic);
- a library's rows (``grpo_ray.libraries.DATA``, each made by its module in ``grpo_ray.integrations``): a
  reasoning-gym task, ``reasoning_gym://basic_arithmetic?size=N&seed=S&<its config>`` (with its reward
  ``reasoning_gym``); a TextArena game, ``textarena://GuessTheNumber-v0?size=N&seed=S`` (games to play, for
  ``environment.name=textarena``); a verifiers v1 taskset's tasks, ``verifiers://TASKSET?size=N&seed=S&<its
  config>`` (each played by verifiers as an agent program); Harbor tasks, ``harbor://PATH``;

and checks each row, naming the file and row of the first bad one. The prompt and the ground truth may sit under
other keys (``data.prompt_key``, ``data.answer_key``, dotted for nested ones, like verl's ``data.prompt_key``); a
prompt written as plain text becomes one user message, a numeric ground truth its text, and a row without a
data_source takes the file's (or dataset's) name (``normalise``).
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from grpo_ray import libraries
from grpo_ray.errors import UserError

SYNTHETIC_SCHEME = "synthetic://"
HUB_SCHEME = "hf://"
PROMPT_KEY, ANSWER_KEY = "prompt", "reward_model.ground_truth"
SKYRL_ANSWER_KEY = "reward_spec.ground_truth"
"""Where SkyRL's rows keep the ground truth: read at the default data.answer_key's place in rows without it."""


class DataError(UserError):
    """Rows that cannot be used, with the file and row that are wrong."""


def dotted(row: dict, key: str):
    """The value at dotted `key` of `row` (``reward_model.ground_truth``), or None."""
    value = row
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def normalise(row: dict, prompt_key: str = PROMPT_KEY, answer_key: str = ANSWER_KEY, source: str = "") -> dict:
    """Rows as people have them, in the schema: the prompt and ground truth taken from `prompt_key` and
    `answer_key`; a prompt given as plain text is one user message; a ground truth given as a number is its text;
    no data_source: `source`. Without `answer_key` (reward-model rows) there is no ground truth. Rows in SkyRL's
    schema have theirs at ``reward_spec.ground_truth``, found there under the default `answer_key`."""
    prompt, truth = dotted(row, prompt_key), dotted(row, answer_key) if answer_key else None
    if truth is None and answer_key == ANSWER_KEY:
        truth = dotted(row, SKYRL_ANSWER_KEY)
    if isinstance(prompt, str) and prompt.strip():
        prompt = [{"role": "user", "content": prompt}]
    if isinstance(truth, (int, float)) and not isinstance(truth, bool):
        truth = str(truth)
    rm = row.get("reward_model") if isinstance(row.get("reward_model"), dict) else {"style": "rule"}
    row = {**row, "prompt": prompt, "reward_model": {**rm, "ground_truth": truth}}
    if source and row.get("data_source") is None:
        row["data_source"] = source
    return row


def row_problem(row: dict, prompt_key: str = PROMPT_KEY, answer_key: str = ANSWER_KEY) -> str | None:
    """What is wrong with `row` (read with `prompt_key` and `answer_key`, if any), or None when it is usable."""
    prompt = row.get("prompt")
    if prompt is None:
        has = [k for k in row if k not in ("prompt", "reward_model")]  # those two normalise always sets
        return f"'{prompt_key}' (data.prompt_key) is missing; the row has {', '.join(map(repr, has[:8]))}"
    if not isinstance(prompt, list) or not prompt:
        return f"'{prompt_key}' (data.prompt_key) must be text or a non-empty list of chat messages"
    for m in prompt:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            return "each prompt message needs string 'role' and 'content'"
    if not any(m["content"].strip() for m in prompt):
        return "the prompt is empty"
    rm = row.get("reward_model")
    truth = rm.get("ground_truth") if isinstance(rm, dict) else None
    if answer_key and truth is not None and not isinstance(truth, str):
        return f"'{answer_key}' (data.answer_key) must be text or a number, not a {type(truth).__name__}"
    if answer_key and (not isinstance(truth, str) or not truth.strip()):
        return (
            f"'{answer_key}' (data.answer_key) is missing or empty (rows with no ground truth, where the environment "
            "and rewards need none: data.answer_key='')"
        )
    if not isinstance(row.get("data_source"), str):
        return "'data_source' is missing"
    return None


def load_rows(spec: str, prompt_key: str = PROMPT_KEY, answer_key: str = ANSWER_KEY) -> list[dict]:
    """Rows from a parquet / JSONL / JSON file, a dataset directory, an hf:// dataset or a synthetic:// name, the
    prompt at `prompt_key` and the ground truth at `answer_key`; DataError names the first bad row."""
    if spec.startswith(SYNTHETIC_SCHEME):
        return _synthetic(spec)
    if scheme := libraries.scheme(spec):  # a library's rows (reasoning_gym://, textarena://, ...)
        try:
            return libraries.find(libraries.DATA[scheme])(spec)
        except ValueError as e:
            raise DataError(f"{spec}: {e}") from None
    path = Path(spec)
    if (
        spec.startswith(HUB_SCHEME)
        or (not path.exists() and "?" in spec and Path(spec.rpartition("?")[0]).is_dir())
        or path.is_dir()
    ):
        rows, source = _dataset(spec)
    elif not path.is_file():
        raise DataError(
            f"{spec}: no such file or directory (expected a .parquet, .jsonl or .json file, a dataset "
            "directory, hf://<dataset>, or synthetic://select?size=N)"
        )
    else:
        rows, source = _file_rows(spec, path), path.stem
    rows = [normalise(row, prompt_key, answer_key, source) if isinstance(row, dict) else row for row in rows]
    for i, row in enumerate(rows):
        problem = row_problem(row, prompt_key, answer_key) if isinstance(row, dict) else "not a JSON object"
        if problem:
            raise DataError(f"{spec} row {i}: {problem}")
    if not rows:
        raise DataError(f"{spec}: no rows")
    return rows


DATASET_KEYS = ("split", "name", "revision")


def _dataset(spec: str) -> tuple[list[dict], str]:
    """Rows of a hub dataset (hf://name?name=config&split=train&revision=r) or a dataset directory (dir?split=...):
    saved by ``datasets`` (save_to_disk) or data files ``datasets`` reads; and the name rows without a data_source
    take."""
    import datasets

    where, _, query = spec.removeprefix(HUB_SCHEME).partition("?")
    args = dict(parse_qsl(query))
    unknown = set(args) - set(DATASET_KEYS)
    if unknown:
        raise DataError(f"{spec}: unknown key {sorted(unknown)[0]!r}; expected any of {', '.join(DATASET_KEYS)}")
    split = args.get("split", "train")
    try:
        if not spec.startswith(HUB_SCHEME) and any(
            (Path(where) / f).is_file() for f in ("dataset_dict.json", "dataset_info.json", "state.json")
        ):
            data = datasets.load_from_disk(where)
            if isinstance(data, datasets.DatasetDict):
                if split not in data:
                    raise DataError(f"{spec}: no split {split!r}; it has {', '.join(data)} (add ?split=...)")
                data = data[split]
        else:
            data = datasets.load_dataset(where, args.get("name"), split=split, revision=args.get("revision"))
    except DataError:
        raise
    except Exception as e:  # datasets raises many types: no such dataset, no network, a bad split
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DataError(f"{spec}: cannot load the dataset ({first[:300]})") from None
    return data.to_list(), where.rstrip("/").rpartition("/")[2] if not spec.startswith(HUB_SCHEME) else where


def _file_rows(spec: str, path: Path) -> list:
    """The rows of one parquet, JSONL or JSON file, as read (checked by the caller)."""
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
SYNTHETIC_KEYS = {
    "select": {"items": (1, 8), "pairs": (0, 1)},
    "reasoning": {"min_steps": (1, 6), "max_steps": (1, 6), "max_value": (10, 99), "answer_only": (0, 1)},
    "products": {"digits": (1, 4), "answer_only": (0, 1)},
    "shapes": {"max_count": (1, 9), "blank": (0, 1)},
}
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


def prompt_text(
    tokenizer, row: dict, response_prefix: str = "", chat_template_kwargs: dict | None = None, system: str = ""
) -> str:
    """What the generator is given, as text: the chat-templated prompt (`system` as its first message when it has
    no system message of its own), then the response prefix."""
    messages = row["prompt"]
    if system and messages[0].get("role") != "system":
        messages = [{"role": "system", "content": system}, *messages]
    text = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False, **(chat_template_kwargs or {})
    )
    return text + response_prefix


def conversation_text(tokenizer, messages: list[dict], response: str) -> str:
    """A prompt's messages and a response as a reward model reads them: the chat template over the messages and the
    response as the assistant's turn; without a template, the messages' text and the response, a line each."""
    turns = [*messages, {"role": "assistant", "content": response}]
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template(turns, tokenize=False)
    return "\n".join(t["content"] for t in turns)


def prompt_token_ids(
    tokenizer, row: dict, response_prefix: str = "", chat_template_kwargs: dict | None = None
) -> list[int]:
    """Token ids of `prompt_text`."""
    return tokenizer(prompt_text(tokenizer, row, response_prefix, chat_template_kwargs), add_special_tokens=False)[
        "input_ids"
    ]
