"""The same task and budget under GRPO, Dr. GRPO, DAPO, GSPO and RLOO, in one run: learning curves overlaid
and final greedy pass@1 in a table.

    python benchmarks/algorithms.py --steps 200 --out benchmarks/results/algorithms

Every run is `recipes/tiny-cpu-reasoning.yaml` (SFT warm start, then GRPO on multi-step arithmetic) with
the same seed, data, sampling and step count; only the algorithm keys below change. Writes each run's
metrics (<name>.jsonl), curves.png (`grpo-ray plot` of all runs) and algorithms.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench import machine, write_report  # noqa: E402

RECIPE = "recipes/tiny-cpu-reasoning.yaml"
ALGORITHMS = {
    "grpo": [],
    "dr-grpo": ["algorithm.norm_adv_by_std=false", "algorithm.loss_agg=seq-mean-token-sum-norm"],
    "dapo": [
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.max_num_gen_batches=3",
        "algorithm.overlong_buffer.len=8",
        "algorithm.overlong_buffer.penalty_factor=1.0",
        "algorithm.clip_ratio_high=0.28",
        "algorithm.loss_agg=token-mean",
    ],
    "gspo": [
        "algorithm.loss_mode=gspo",
        "algorithm.clip_ratio_low=3e-4",
        "algorithm.clip_ratio_high=4e-4",
        "algorithm.loss_agg=seq-mean-token-mean",
    ],
    "rloo": ["algorithm.adv_estimator=rloo"],
}
KEY = "val/synthetic/reasoning/pass@1"


def run(name: str, overrides: list[str], steps: int, work: Path) -> dict:
    out = work / name
    start = time.perf_counter()
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_ray",
            "train",
            RECIPE,
            *overrides,
            f"trainer.output_dir={out}",
            f"trainer.total_steps={steps}",
            "trainer.overwrite=true",
            "trainer.loggers=[jsonl]",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if res.returncode:
        raise SystemExit(f"{name}: exit {res.returncode}\n{res.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    val = {r["step"]: r[KEY] for r in rows if KEY in r}
    train = [r for r in rows if r["step"] > 0]
    return {
        "name": name,
        "overrides": overrides,
        "seconds": time.perf_counter() - start,
        "val": val,
        "final": val[max(val)],
        "best": max(val.values()),
        "score_last10": sum(r["critic/score/mean"] for r in train[-10:]) / 10,
        "dir": str(out),
    }


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [
        f"# Algorithms on the reasoning task ({m['date']}, {m['cpu']}, {m['cores']} cores)",
        "",
        f"`python benchmarks/algorithms.py --steps {report['steps']}`: `{RECIPE}`, the same warm start, seed, "
        "data and budget for each; greedy pass@1 on the 256 held-out problems.",
        "",
        "| algorithm | keys | pass@1 at the end | best | train score (last 10 steps) | minutes |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in report["runs"]:
        lines.append(
            f"| {r['name']} | `{' '.join(r['overrides']) or '(recipe)'}` | {r['final']:.3f} | {r['best']:.3f} "
            f"| {r['score_last10']:.3f} | {r['seconds'] / 60:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out", default="benchmarks/results/algorithms")
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    out, work = Path(args.out), Path("runs") / "algorithms"
    runs = [run(n, o, args.steps, work) for n, o in ALGORITHMS.items() if not args.only or n in args.only]
    out.mkdir(parents=True, exist_ok=True)
    for r in runs:
        shutil.copy(Path(r["dir"]) / "metrics.jsonl", out / f"{r['name']}.jsonl")
    subprocess.run(
        [sys.executable, "-m", "grpo_ray", "plot", *[r["dir"] for r in runs], "--out", str(out / "curves.png")],
        cwd=ROOT,
        check=True,
    )
    report = {"machine": machine(), "steps": args.steps, "runs": runs}
    write_report(out, "algorithms", report, markdown(report))


if __name__ == "__main__":
    main()
