"""The best validation so far, for early stopping (``trainer.early_stop``) and keeping the best checkpoint
(``trainer.keep_best``).

After each validation ``Best.update`` says whether the metric improved by at least ``min_delta`` (in the direction
``mode`` says) and counts the validations since the last improvement; ``stop`` is true once ``patience`` of them
went by without one. Without a metric named, keep_best follows the mean pass@1 over the validation sets. The state
goes into each checkpoint, so a resumed run counts on where it left off.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path


def headline(metrics: dict[str, float]) -> float:
    """A validation's one number: the mean pass@1 over the validation sets (a reward model's: its accuracy)."""
    return statistics.fmean(
        v for k, v in metrics.items() if k.startswith("val/") and k.endswith(("/pass@1", "/rm/accuracy"))
    )


@dataclass
class Best:
    metric: str
    """The validation metric followed; empty: the mean of every val/*/pass@1 (``headline``)."""
    mode: str = "max"
    patience: int = 0
    """Validations without improvement before ``stop``; 0 never stops."""
    min_delta: float = 0.0
    value: float | None = None
    step: int = 0
    """The step whose validation was best."""
    since: int = 0
    """Validations since the best one."""

    @classmethod
    def of(cls, trainer, state: dict | None = None) -> Best:
        e = trainer.early_stop
        best = cls(e.metric, e.mode, e.patience if e.metric else 0, e.min_delta)
        for key, value in (state or {}).items():
            setattr(best, key, value)
        return best

    def read(self, metrics: dict[str, float]) -> float:
        return metrics[self.metric] if self.metric else headline(metrics)

    def update(self, step: int, metrics: dict[str, float]) -> bool:
        """Take a validation's metrics; whether it is the best so far."""
        value = self.read(metrics)
        better = (
            self.value is None or (value - self.value if self.mode == "max" else self.value - value) > self.min_delta
        )
        if better:
            self.value, self.step, self.since = value, step, 0
        else:
            self.since += 1
        return better

    @property
    def stop(self) -> bool:
        return bool(self.patience) and self.since >= self.patience

    def state(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k in ("value", "step", "since")}

    def line(self) -> str:
        name = self.metric or "mean val pass@1"
        return f"best {name} {self.value:.4g} at step {self.step}"


def export(best: Best, trainer, output_dir: Path, step: int, say: Callable[[str], None]) -> Path:
    """The run stops early after `step`: export the best checkpoint (with keep_best; else the one just saved) to
    <output_dir>/model, say so, and return the model's path."""
    from grpo_ray import checkpoint

    root = checkpoint.checkpoints_dir(output_dir)
    ckpt = root / f"step_{best.step if trainer.keep_best else step}"
    model = checkpoint.run_export(ckpt, output_dir, say)
    say(
        f"early stop after step {step}: {trainer.early_stop.metric} has not improved by "
        f"{trainer.early_stop.min_delta:g} in {best.patience} validations; {best.line()} "
        f"(checkpoint {root / f'step_{best.step}'} {'kept' if trainer.keep_best else 'not kept'}); "
        f"model exported to {model}"
    )
    return model
