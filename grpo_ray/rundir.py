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
    "trackers.json",  # the trackers' run ids: a run started afresh gets new tracker runs
    "wandb",
    "mlflow.db",
    "mlartifacts",
)
"""What a run writes in its output_dir (trainer.overwrite removes these, and nothing else: not KEPT)."""
KEPT = ("wandb", "mlflow.db", "mlartifacts")
"""The trackers' stores in a run's folder: they hold every earlier run's history (an offline W&B run not yet synced,
the MLflow runs of each start), so trainer.overwrite keeps them; the new run is a new run in them."""


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


def prepare(
    output_dir: Path, trainer, config_text: str, say: Callable[[str], None] = print, job: str = "train"
) -> Path | None:
    """The checkpoint to resume from (None: a fresh start), after making `output_dir` ready for the `job` (train,
    sft, rm) whose resolved recipe is `config_text`; raises RecipeError when what is there would be lost, or when
    the checkpoint is another job's or holds another model than the recipe's."""
    if trainer.resume not in ("auto", "disable"):
        return same_model(checkpoint.find_resume(output_dir, trainer.resume), config_text, job)
    root = checkpoint.checkpoints_dir(output_dir)
    if trainer.resume == "auto":
        ckpt = checkpoint.find_resume(output_dir, "auto", say)
        if ckpt:
            return same_model(ckpt, config_text, job)
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
        if "model" in found and not checkpoint.own_export(output_dir / "model"):  # a folder of the user's: aside
            checkpoint.set_aside(output_dir / "model", say)
            found.remove("model")
        removed = [name for name in found if name not in KEPT]
        for name in removed:
            path = output_dir / name
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        kept = [name for name in found if name in KEPT]
        say(
            f"{output_dir}: the previous run's {', '.join(removed)} removed (trainer.overwrite)"
            + (f"; {', '.join(kept)} kept: the trackers' stores hold earlier runs, this one is added" if kept else "")
        )
        return None
    why = "no whole checkpoint to resume" if trainer.resume == "auto" else "trainer.resume=disable"
    raise RecipeError(
        f"trainer.output_dir={str(output_dir)!r} already holds a run ({', '.join(found)}) and {why}; "
        "nothing was changed. Choose another trainer.output_dir, set trainer.set_aside=true to keep it "
        "under a new name, or trainer.overwrite=true to replace it"
    )


SAME_ON_RESUME = ("model.path", "model.lora.rank", "reward_model.model", "reward_model.judge.template", "teacher.model")
"""Keys a resumed run must share with the checkpoint's: the model it trains, and the models whose signals it trained
on (a run that went on with another reward model or teacher is another experiment, and its config.yaml would name
only the new one)."""


def same_model(ckpt: Path, config_text: str, job: str = "train") -> Path:
    """`ckpt`, when the recipe's `job` resumes what it holds (the same job, ``SAME_ON_RESUME`` alike); else
    RecipeError, before anything starts rather than when the learner fails to load it."""
    import yaml

    wrote = checkpoint.load_state(ckpt).get("job", job)  # checkpoints before the record: taken as the job's own
    if wrote != job:
        raise RecipeError(
            f"{ckpt} is a checkpoint of grpo-ray {wrote}, not of grpo-ray {job}; nothing was changed. Choose another "
            "trainer.output_dir (or trainer.resume=disable with trainer.set_aside=true to keep that run aside)"
        )
    theirs = yaml.safe_load((ckpt / "config.yaml").read_text()) or {}
    ours = yaml.safe_load(config_text) or {}
    defaults = {"model.lora.rank": 0}
    for key in SAME_ON_RESUME:
        was, now = (_dotted(d, key, defaults.get(key)) for d in (theirs, ours))
        if (was or None) != (now or None):  # an empty value and an absent key are the same
            raise RecipeError(
                f"{ckpt} holds a run with {key}={was!r}, the recipe has {key}={now!r}: resume with the recipe "
                "that wrote it, or start afresh in another trainer.output_dir"
            )
    return ckpt


def _dotted(d: dict, key: str, default=None):
    for part in key.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return default if d is None else d


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
