"""A run's directory: what a new start does with what is already there. Nothing of a run is lost unless asked.

``prepare(output_dir, trainer, config_text, say)`` decides, before any actor starts:

    a whole checkpoint (trainer.resume: auto)   resume from the newest one; a damaged newer one is named and
                                                passed over
    checkpoints, none whole (auto)              refused: the run is not silently started afresh over them
    the same run, stopped before its first      started afresh (its steps are redone, as steps after a checkpoint
    checkpoint (save_freq > 0, config.yaml as   are on resume): a retried job that was killed early
    now)
    any other run (metrics, dumps, TensorBoard) refused in one line, unless trainer.overwrite (its files are
                                                removed) or trainer.set_aside (the directory is moved to
                                                <output_dir>.<N>, the next free N)
    nothing                                     a fresh start

``trainer.resume`` as a path resumes from that checkpoint (checked whole) into output_dir, whatever is there.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from grpo_ray import checkpoint
from grpo_ray.config import RecipeError

RUN_FILES = (
    "metrics.jsonl",
    "tensorboard",
    "rollouts",
    "checkpoints",
    "logs",
    "placement.json",
    "config.yaml",
    "model",
    "replay",
)
"""What a run writes in its output_dir (trainer.overwrite removes these, and nothing else)."""


def run_files(output_dir: Path) -> list[str]:
    """The run's own files in `output_dir` that hold something (config.yaml alone is not a run)."""
    found = []
    for name in RUN_FILES:
        path = output_dir / name
        if name == "config.yaml" or not path.exists():
            continue
        if path.is_dir() and not any(path.iterdir()):
            continue
        if path.is_file() and path.stat().st_size == 0:
            continue
        found.append(name)
    return found


def prepare(output_dir: Path, trainer, config_text: str, say: Callable[[str], None] = print) -> Path | None:
    """The checkpoint to resume from (None: a fresh start), after making `output_dir` ready for the run whose
    resolved recipe is `config_text`; raises RecipeError when what is there would be lost, or when the checkpoint
    holds another model than the recipe's."""
    if trainer.resume not in ("auto", "disable"):
        return same_model(checkpoint.find_resume(output_dir, trainer.resume), config_text)
    root = checkpoint.checkpoints_dir(output_dir)
    if trainer.resume == "auto":
        ckpt = checkpoint.find_resume(output_dir, "auto", say)
        if ckpt:
            return same_model(ckpt, config_text)
        steps = checkpoint.complete_steps(root)
        if steps and not (trainer.overwrite or trainer.set_aside):
            raise RecipeError(
                f"trainer.resume=auto: {root} holds checkpoints {steps} and none is whole (see above); "
                "nothing was started. Resume from one by path (trainer.resume=...), or set "
                "trainer.overwrite=true (or trainer.set_aside=true) to start afresh"
            )
    found = run_files(output_dir)
    if not found:
        return None
    config = output_dir / "config.yaml"
    if (
        trainer.resume == "auto"
        and trainer.save_freq > 0
        and config.is_file()
        and config.read_text() == config_text
        and not checkpoint.complete_steps(root)
    ):
        say(f"{output_dir}: the same run stopped before its first checkpoint: starting it again from step 0")
        return None
    if trainer.set_aside:
        aside = next(p for n in range(1, 10_000) if not (p := output_dir.with_name(f"{output_dir.name}.{n}")).exists())
        output_dir.rename(aside)
        output_dir.mkdir(parents=True)
        say(f"{output_dir} held a run ({', '.join(found)}): moved to {aside} (trainer.set_aside)")
        return None
    if trainer.overwrite:
        for name in found:
            path = output_dir / name
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        say(f"{output_dir}: the previous run's {', '.join(found)} removed (trainer.overwrite)")
        return None
    why = "no whole checkpoint to resume" if trainer.resume == "auto" else "trainer.resume=disable"
    raise RecipeError(
        f"trainer.output_dir={str(output_dir)!r} already holds a run ({', '.join(found)}) and {why}; "
        "nothing was changed. Choose another trainer.output_dir, set trainer.set_aside=true to keep it "
        "under a new name, or trainer.overwrite=true to replace it"
    )


def same_model(ckpt: Path, config_text: str) -> Path:
    """`ckpt`, when it holds the model the recipe trains (model.path and LoRA rank alike); else RecipeError, before
    anything starts rather than when the learner fails to load it."""
    import yaml

    theirs = (yaml.safe_load((ckpt / "config.yaml").read_text()) or {}).get("model", {})
    ours = (yaml.safe_load(config_text) or {}).get("model", {})
    for key, of in (("path", lambda m: m.get("path")), ("lora.rank", lambda m: (m.get("lora") or {}).get("rank", 0))):
        if of(theirs) != of(ours):
            raise RecipeError(
                f"{ckpt} holds model.{key}={of(theirs)!r}, the recipe trains model.{key}={of(ours)!r}: "
                "resume with the recipe that wrote it, or start afresh in another trainer.output_dir"
            )
    return ckpt


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
