"""``grpo-ray plot``: the curves users steer by, from one or more runs' metrics.jsonl, in one PNG."""

from __future__ import annotations

import json
from pathlib import Path

PANELS = [
    ("critic/score/mean", "score"),
    ("response_length/mean", "response length"),
    ("actor/kl_loss", "KL to reference"),
    ("actor/entropy", "entropy"),
    ("actor/grad_norm", "grad norm"),
    ("timing_s/step", "step time (s)"),
    ("perf/throughput", "throughput (tokens/s/device)"),
]


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        from grpo_ray.errors import UserError

        raise UserError(f"{run_dir}: no metrics.jsonl here (is it a run's trainer.output_dir?)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_runs(run_dirs: list[str], out: str | Path) -> Path:
    """Draw every panel against step, one line per run, into `out` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(16, 7))
    runs = [(Path(d).name or str(d), [r for r in read_metrics(d) if r["step"] > 0]) for d in run_dirs]
    for ax, (key, title) in zip(axes.flat, PANELS):
        for name, rows in runs:
            points = [(r["step"], r[key]) for r in rows if key in r]
            if points:
                ax.plot(*zip(*points), label=name)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes.flat[0].legend()
    axes.flat[-1].axis("off")
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out
