"""``grpo-ray prepare-data``: GSM8K, MATH-500 or any data of yours into train/test parquet in the verl schema.

The source is a hub name (``openai/gsm8k``, ``HuggingFaceH4/MATH-500``, read with
``datasets``) or a local path: a directory holding ``train.jsonl`` / ``test.jsonl``
(or parquet files of those names), or one file, taken as the ``--split`` split (test by default).
``custom`` reads the prompt and answer from the keys given (dotted keys reach into nested fields), keeps a row's
images (``--image-key``) as verl's ``images`` column of image features, and appends the instruction, if any, to the
prompt; gsm8k and math500 have an instruction of their own, which
``--instruction`` replaces.

Bad rows (missing question or answer, empty prompt, not UTF-8, prompt longer than
the limit) are dropped and counted; when more than ``max_bad_fraction`` of a split
is bad, nothing is written and the error names examples (file and line).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from grpo_ray.errors import UserError

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


class PrepareError(UserError):
    """The source cannot be prepared: unreadable, or too many bad rows."""


@dataclass
class SplitReport:
    """What happened to one split."""

    split: str
    read: int = 0
    kept: int = 0
    dropped: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)

    def line(self) -> str:
        why = ", ".join(f"{k} {v}" for k, v in sorted(self.dropped.items())) or "none"
        return f"{self.split}: {self.read} rows read, {self.kept} kept, {self.read - self.kept} dropped ({why})"


def gsm8k_row(
    raw: dict, split: str, index: int, instruction: str = GSM8K_INSTRUCTION
) -> tuple[dict | None, str | None]:
    question, answer = raw.get("question"), raw.get("answer")
    if not isinstance(question, str) or not question.strip():
        return None, "empty prompt"
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = f"{answer:g}" if isinstance(answer, float) else str(answer)
    if not isinstance(answer, str) or not answer.strip():
        return None, "missing answer"
    if "####" not in answer and "\n" in answer.strip():
        return None, "answer is a worked solution without GSM8K's '#### <final answer>'"
    truth = answer.rsplit("####", 1)[-1].strip().replace(",", "")  # GSM8K's 'solution #### 42', or the answer alone
    if not truth:
        return None, "missing answer"
    return {
        "data_source": "gsm8k",
        "prompt": [{"role": "user", "content": f"{question.strip()} {instruction}".strip()}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"split": split, "index": index, "question": question, "answer": answer},
    }, None


def math500_row(
    raw: dict, split: str, index: int, instruction: str = MATH_INSTRUCTION
) -> tuple[dict | None, str | None]:
    problem, answer = raw.get("problem"), raw.get("answer")
    if not isinstance(problem, str) or not problem.strip():
        return None, "empty prompt"
    if not isinstance(answer, str) or not answer.strip():
        return None, "missing answer"
    return {
        "data_source": "math500",
        "prompt": [{"role": "user", "content": f"{problem.strip()} {instruction}".strip()}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer.strip()},
        "extra_info": {
            "split": split,
            "index": index,
            "question": problem,
            "answer": raw.get("solution", ""),
            "subject": raw.get("subject", ""),
            "level": raw.get("level", 0),
            "unique_id": raw.get("unique_id", ""),
        },
    }, None


def custom_rows(
    prompt_key: str, answer_key: str, source_name: str, image_key: str = "images", folder: Path | None = None
) -> Callable:
    """A row builder for data of any shape: the prompt (text, or chat messages) at `prompt_key`, the ground
    truth at `answer_key`; data_source the row's own or `source_name`; its images at `image_key` (paths relative to
    `folder`) at ``images``, each as a ``datasets`` Image feature holds it (``images.as_feature``), as verl's
    Geometry3K parquet has them; the row's other fields in extra_info."""
    from grpo_ray.data import images, normalise, row_problem

    def build(raw: dict, split: str, index: int, instruction: str = "") -> tuple[dict | None, str | None]:
        row = normalise(raw, prompt_key, answer_key, source_name)
        why = row_problem(row, prompt_key, answer_key)
        pictures = images.images_of(raw, image_key)
        why = why or (images.problem(row, image_key, 999, folder, "--image-key") if pictures else None)
        if why:
            return None, why
        prompt = [dict(m) for m in row["prompt"]]
        last = next((i for i in reversed(range(len(prompt))) if prompt[i]["role"] == "user"), len(prompt) - 1)
        prompt[last]["content"] = f"{prompt[last]['content'].strip()} {instruction}".strip()
        used = {
            prompt_key.split(".")[0],
            answer_key.split(".")[0],
            image_key.split(".")[0],
            "prompt",
            "reward_model",
            "data_source",
            "extra_info",
        }
        extra = {k: v for k, v in raw.items() if k not in used}
        return {
            "data_source": row["data_source"],
            "prompt": prompt,
            "ability": raw.get("ability", ""),
            "reward_model": row["reward_model"],
            "extra_info": {**extra, **(raw.get("extra_info") or {}), "split": split, "index": index},
            **({"images": [images.as_feature(p, folder) for p in pictures]} if pictures else {}),
        }, None

    return build


DATASETS: dict[str, tuple[str, Callable, str | None]] = {
    # name: (default hub source, row builder (its instruction the default of its last argument), hub config name)
    "gsm8k": ("openai/gsm8k", gsm8k_row, "main"),
    "math500": ("HuggingFaceH4/MATH-500", math500_row, None),
}


def _jsonl(path: Path) -> Iterator[tuple[str, dict | None]]:
    """(where, record) per line; record None for a line that is not UTF-8 JSON."""
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield f"{path}:{n}", json.loads(line.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                yield f"{path}:{n}", None


def _parquet(path: Path) -> Iterator[tuple[str, dict | None]]:
    import pyarrow.parquet as pq

    for n, rec in enumerate(pq.read_table(path).to_pylist()):
        yield f"{path} row {n}", rec


def _read_file(path: Path):
    if path.suffix == ".parquet":
        return _parquet(path)
    if path.suffix in (".jsonl", ".json"):
        return _jsonl(path)
    raise PrepareError(f"{path}: unknown file type; expected .jsonl or .parquet")


def source_splits(
    source: str, hub_config: str | None, file_split: str = "test"
) -> dict[str, Iterator[tuple[str, dict | None]]]:
    """split name -> (where, record) iterator, from a local path or a hub name (one file: `file_split`)."""
    path = Path(source)
    if path.is_dir():
        found = {}
        for split in ("train", "test"):
            for suffix in (".jsonl", ".parquet"):
                if (path / f"{split}{suffix}").is_file():
                    found[split] = _read_file(path / f"{split}{suffix}")
                    break
        if not found:
            raise PrepareError(f"{source}: no train.jsonl / test.jsonl (or .parquet) in this directory")
        return found
    if path.is_file():
        return {file_split: _read_file(path)}
    if source.startswith((".", "/")) or source.count("/") != 1:
        raise PrepareError(f"{source}: no such file or directory")
    try:
        import datasets

        loaded = datasets.load_dataset(source, hub_config)
    except Exception as e:  # offline, gated, misspelt: say which and how to work around
        raise PrepareError(
            f"cannot load {source!r} from the hub ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
            "pass a local path with --source instead"
        ) from None
    return {split: ((f"{source}[{split}] row {i}", dict(r)) for i, r in enumerate(ds)) for split, ds in loaded.items()}


def _split_rows(split, records, build, own, tokenizer, max_prompt_tokens, chat_template_kwargs):
    """One split's rows built from its records, and its report: each row dropped is counted by its reason (not UTF-8
    JSON, what the data set's builder refused, a prompt over `max_prompt_tokens`), the first five named."""
    from grpo_ray.data import prompt_token_ids

    report, rows = SplitReport(split), []
    for where, raw in records:
        report.read += 1
        row, why = (None, "not UTF-8 JSON") if raw is None else build(raw, split, report.read - 1, **own)
        if row is not None and max_prompt_tokens and tokenizer is not None:
            if len(prompt_token_ids(tokenizer, row, "", chat_template_kwargs)) > max_prompt_tokens:
                row, why = None, f"prompt over {max_prompt_tokens} tokens"
        if row is None:
            report.dropped[why] += 1
            if len(report.examples) < 5:
                report.examples.append(f"{where}: {why}")
            continue
        rows.append(row)
    report.kept = len(rows)
    return report, rows


def prepare(
    name: str,
    source: str | None,
    out: str | Path,
    *,
    tokenizer=None,
    max_prompt_tokens: int = 0,
    max_bad_fraction: float = 0.05,
    chat_template_kwargs: dict | None = None,
    overwrite: bool = False,
    instruction: str | None = None,
    prompt_key: str = "question",
    answer_key: str = "answer",
    file_split: str = "test",
    image_key: str = "images",
) -> list[SplitReport]:
    """Write ``OUT/{split}.parquet`` for every split of `name` (gsm8k, math500, or custom: any source, read with
    `prompt_key` and `answer_key`, its images at `image_key`) found at `source`; return one report per split.
    `instruction` replaces the data set's own (custom has none); a single file is the split `file_split`. A split
    file already in OUT is an error (nothing written) unless `overwrite`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if name == "custom":
        if not source:
            raise PrepareError("custom data needs --source: a hub name, a directory or a file")
        name_of = Path(source).stem if Path(source).is_file() else Path(source).name
        folder = Path(source).parent if Path(source).is_file() else Path(source)
        build = custom_rows(prompt_key, answer_key, name_of, image_key, folder)
        default_source, hub_config = source, None
    elif name in DATASETS:
        default_source, build, hub_config = DATASETS[name]
    else:
        raise PrepareError(f"unknown data set {name!r}; expected one of {', '.join(DATASETS)}, custom")
    own = {} if instruction is None else {"instruction": instruction}  # none given: the data set's own
    splits = source_splits(source or default_source, hub_config, file_split)
    reports, tables = [], {}
    for split, records in splits.items():
        report, rows = _split_rows(split, records, build, own, tokenizer, max_prompt_tokens, chat_template_kwargs)
        bad = report.read - report.kept
        if report.read == 0 or bad > max_bad_fraction * report.read:
            raise PrepareError(
                f"{split}: {bad} of {report.read} rows are bad (more than {max_bad_fraction:.0%}); e.g.\n  "
                + "\n  ".join(report.examples or ["no rows at all"])
            )
        reports.append(report)
        tables[split] = pa.Table.from_pylist(rows)
    out = Path(out)
    there = [str(out / f"{split}.parquet") for split in tables if (out / f"{split}.parquet").exists()]
    if there and not overwrite:
        raise PrepareError(f"{', '.join(there)} already exist; nothing was written (--overwrite replaces them)")
    out.mkdir(parents=True, exist_ok=True)
    for split, table in tables.items():
        tmp = out / f".{split}.parquet.tmp"
        pq.write_table(table, tmp)
        tmp.rename(out / f"{split}.parquet")  # whole or not at all
    return reports
