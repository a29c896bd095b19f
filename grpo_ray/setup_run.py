"""Everything `train` checks and builds before any actor starts.

Recipe problems, unknown rewards, unreadable data and prompts that are too long
are found here, on the driver, so a mistake costs seconds, not a cluster start.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from grpo_ray import models, rewards
from grpo_ray.config import Recipe, RecipeError, dump_recipe
from grpo_ray.data import DataError, load_rows, prompt_text


@dataclass
class RunInputs:
    """What the controller needs to start the pools."""

    model_path: str
    """Loadable by transformers and vLLM (a tiny model is built by now)."""
    train_rows: list[dict]
    """Usable training rows, each with 'prompt_ids' and 'prompt_text' added."""
    val_rows: list[dict]
    """Usable validation rows, each with 'prompt_ids' and 'prompt_text' added."""
    dropped: dict[str, int]
    """Rows dropped per file for a prompt over data.max_prompt_length."""
    output_dir: Path
    """The run's directory, holding config.yaml."""
    probe_ids: list[int]
    """A fixed token sequence scored by a generator and the learner after each weight sync."""


def usable_rows(files: list[str], tokenizer, recipe: Recipe, dropped: dict[str, int]) -> list[dict]:
    rows = []
    for spec in files:
        n = 0
        for row in load_rows(spec):
            text = prompt_text(tokenizer, row, recipe.data.response_prefix, recipe.model.chat_template_kwargs)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(ids) > recipe.data.max_prompt_length:
                n += 1
                continue
            rows.append({**row, "prompt_ids": ids, "prompt_text": text})
        dropped[spec] = n
        if n and not rows:
            raise DataError(f"{spec}: every prompt is longer than data.max_prompt_length={recipe.data.max_prompt_length}")
    return rows


def writable_dir(path: str, key: str) -> Path:
    """`path` as a directory this process can write in (made if missing), or a RecipeError naming `key`."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".grpo-ray-write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise RecipeError(f"{key}={path!r}: cannot write there ({e.strerror or e})") from None
    return out


def setup_run(recipe: Recipe) -> RunInputs:
    """Check the output directory, rewards, build or locate the model, load and tokenize data, write config.yaml."""
    from transformers import AutoTokenizer

    output_dir = writable_dir(recipe.trainer.output_dir, "trainer.output_dir")
    for i, fn in enumerate(recipe.reward.functions):
        try:
            rewards.load(fn.name)
        except rewards.RewardLoadError as e:
            raise RecipeError(f"reward.functions[{i}].name: {e}") from None
    model_path = models.resolve(recipe.model.path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=recipe.model.trust_remote_code)
    except (OSError, ValueError) as e:
        raise RecipeError(f"model.path={recipe.model.path!r}: cannot load a tokenizer ({str(e).splitlines()[0]})") from None
    if not tokenizer.chat_template:
        raise RecipeError(f"model.path={recipe.model.path!r}: the tokenizer has no chat template")
    dropped: dict[str, int] = {}
    train_rows = usable_rows(recipe.data.train_files, tokenizer, recipe, dropped)
    val_rows = usable_rows(recipe.data.val_files, tokenizer, recipe, dropped)
    if len(train_rows) < recipe.data.train_batch_size:
        raise DataError(
            f"data.train_files give {len(train_rows)} usable rows, fewer than data.train_batch_size={recipe.data.train_batch_size}"
        )
    if (output_dir / "metrics.jsonl").exists() and recipe.trainer.resume == "disable":
        if not recipe.trainer.overwrite:
            raise RecipeError(f"trainer.output_dir={str(output_dir)!r} already holds a run (metrics.jsonl) and "
                              "trainer.resume=disable; resume it (trainer.resume=auto), choose another "
                              "trainer.output_dir, or set trainer.overwrite=true to replace it")
        (output_dir / "metrics.jsonl").unlink()
    dump_recipe(recipe, output_dir / "config.yaml")
    return RunInputs(model_path, train_rows, val_rows, dropped, output_dir, train_rows[0]["prompt_ids"])
