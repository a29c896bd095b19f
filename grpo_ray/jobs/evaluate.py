"""``grpo-ray eval``: pass@1 and pass@k of a model on a test set, with the validation code of training.

Only the generator and reward pools start. The data is ``gsm8k`` / ``math500`` (hub names), or a
file: rows in our schema, or raw GSM8K / MATH-500 JSONL (question/answer, problem/answer), converted
as ``prepare-data`` does. A checkpoint directory is exported to a Hugging Face model first.
Writes ``OUT/eval.json`` (metrics and counts) and ``OUT/rollouts/val_data_step0.jsonl`` (per sample).
"""

from __future__ import annotations

import json
from pathlib import Path

from grpo_ray.config import GENERATOR, RULES, Recipe
from grpo_ray.data import DataError, row_problem
from grpo_ray.data.prepare import DATASETS, gsm8k_row, math500_row, source_splits
from grpo_ray.rewards.builtin import AUTO_SOURCES, reward_for_source

DEFAULT_RECIPE = Path(__file__).with_name("eval.yaml")
"""The recipe of an eval without --recipe: one engine, the `auto` reward (by each row's data_source)."""


def device_overrides() -> list[str]:
    """This machine's device for the default eval recipe: its GPUs when torch sees any, else the CPU."""
    import torch

    if not torch.cuda.is_available():
        return []
    gb = torch.cuda.get_device_properties(0).total_memory / 1e9
    return [
        "cluster.device=cuda",
        f"cluster.devices_per_node={torch.cuda.device_count()}",
        f"cluster.device_memory_gb={gb:.0f}",
        "generator.gpu_memory_utilization=0.8",
        "generator.enforce_eager=false",
    ]


def eval_rows(data: str, limit: int = 0) -> list[dict]:
    """Test rows in our schema from a data set name or a file; rows that cannot be used are skipped."""
    if data in DATASETS:
        source, _, hub_config = DATASETS[data]
        records = source_splits(source, hub_config).get("test")
    else:
        records = source_splits(data, None).get("test")
    if records is None:
        raise DataError(f"{data}: no test split found")
    rows, refused = [], []
    for i, (_, raw) in enumerate(records):
        if raw is None:
            refused.append(f"row {i}: not a JSON object")
            continue
        if "reward_model" in raw:
            why = row_problem(raw)
            row = raw if why is None else None
        elif "question" in raw:
            row, why = gsm8k_row(raw, "test", i)
        else:
            row, why = math500_row(raw, "test", i)
        if row is not None:
            rows.append(row)
        else:
            refused.append(f"row {i}: {why}")
        if limit and len(rows) >= limit:
            break
    if not rows:
        first = f"; {refused[0]}" + (f" (and {len(refused) - 1} more)" if len(refused) > 1 else "") if refused else ""
        raise DataError(
            f"{data}: no usable rows{first}; a row needs our schema (prompt, reward_model.ground_truth), "
            "GSM8K's (question, answer) or MATH's (problem, solution)"
        )
    return rows


def evaluate(recipe: Recipe, data: str, out: Path, limit: int = 0) -> dict:
    from grpo_ray import models
    from grpo_ray.config import dump_recipe
    from grpo_ray.jobs.launch import connect
    from grpo_ray.models.dims import model_dims
    from grpo_ray.runner import Runner
    from grpo_ray.setup_run import RunInputs, usable_rows

    out.mkdir(parents=True, exist_ok=True)
    rows_file = out / "eval_rows.jsonl"
    rows_file.write_text("".join(json.dumps(r) + "\n" for r in eval_rows(data, limit)))
    model_path = models.resolve(recipe.model.path)
    tokenizer = models.load_tokenizer(model_path, recipe.model)
    recipe.data.val_files = [str(rows_file)]
    dropped: dict[str, int] = {}
    rows = usable_rows(recipe.data.val_files, tokenizer, recipe, dropped)
    if any(f.name == "auto" for f in recipe.reward.functions):
        unknown = sorted({r["data_source"] for r in rows if reward_for_source(r["data_source"]) is None})
        if unknown:
            raise DataError(
                f"{data}: no built-in reward for data_source {', '.join(map(repr, unknown))} (the auto "
                f"reward knows {', '.join(AUTO_SOURCES)}); pass --recipe with reward.functions"
            )
    dump_recipe(recipe, out / "config.yaml")
    connect(recipe)
    c = Runner(recipe, RunInputs(model_path, model_dims(model_path), [], rows, dropped, out, []))
    try:
        c.start(pools=(GENERATOR, RULES))
        metrics = c.validate(0)
        c.flush_dumps()
    finally:
        c.shutdown()
    result = {
        "model": recipe.model.path,
        "data": data,
        "rows": len(rows),
        "dropped_too_long": sum(dropped.values()),
        "n": recipe.generator.val_n,
        "temperature": recipe.generator.val_temperature,
        "metrics": metrics,
    }
    (out / "eval.json").write_text(json.dumps(result, indent=1))
    return result
