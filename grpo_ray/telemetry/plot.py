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
    ("/pass@1", "validation pass@1 (greedy)"),  # any val/<data_source>/pass@1, step 0 included; a teacher's dashed
]
LEARNED = [  # a row more where a run has a learned reward beside a true (rule) one: reward hacking shows here
    ("reward/reward_model/mean", "learned reward (mean, as trained on)"),
    ("reward_model/score/mean", "learned score (raw mean)"),
    ("reward_model/true_corr", "learned vs true reward: correlation"),
    ("reward_model/gap", "learned minus true reward (means)"),
]


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        from grpo_ray.errors import UserError

        raise UserError(f"{run_dir}: no metrics.jsonl here (is it a run's trainer.output_dir?)")
    lines = path.read_text().splitlines()
    rows = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i < len(lines):
                from grpo_ray.errors import UserError

                raise UserError(f"{path} line {i}: not a JSON object ({line[:60]!r}); the file is damaged") from None
            print(f"{path} line {i}: cut short (the run stopped while writing it); plotted without it")
    return rows


def plot_runs(run_dirs: list[str], out: str | Path) -> Path:
    """Draw every panel against step, one line per run, into `out` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(Path(d).name or str(d), read_metrics(d)) for d in run_dirs]
    learned = any(k.startswith("reward_model/") for _, rows in runs for r in rows for k in r)
    panels = PANELS + (LEARNED if learned else [])
    lines = len(panels) // 4  # rows of panels
    fig, axes = plt.subplots(lines, 4, figsize=(16, 3.5 * lines))
    for ax, (key, title) in zip(axes.flat, panels):
        for name, rows in runs:
            if key.startswith("/"):  # validation: one line per data source
                for source in sorted({k for r in rows for k in r if k.startswith("val/") and k.endswith(key)}):
                    points = [(r["step"], r[source]) for r in rows if source in r]
                    ax.plot(*zip(*points), marker="o", label=f"{name} {source.split('/')[1:-1]}")
                for source in sorted({k for r in rows for k in r if k.startswith("teacher/val/") and k.endswith(key)}):
                    level = next(r[source] for r in rows if source in r)  # measured once, before training
                    ax.axhline(level, linestyle="--", color="gray", label=f"{name} teacher {source.split('/')[2:-1]}")
                continue
            points = [(r["step"], r[key]) for r in rows if key in r and r["step"] > 0]
            if points:
                ax.plot(*zip(*points), label=name)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in axes.flat:  # one legend, on the first panel with lines
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
            break
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out
