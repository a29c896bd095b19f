"""The schedules side by side on a task that learns, in one experiment: greedy pass@1 and trained tokens/s at equal
samples, with repeats.

    python benchmarks/streaming_learning.py --steps 60 --seeds 0 1 2 --out benchmarks/results/streaming-learning

The task: the reasoning showcase (``recipes/tiny-cpu-reasoning.yaml``, multi-step word problems) from its SFT warm
start (``sft://recipes/tiny-cpu-reasoning-sft.yaml``, trained once in the model cache), 16 prompts x 16 samples a step.
Each pool on cores of its own, as ``benchmarks/streaming.py`` lays them out (``cluster.cpu_threads: reserved``: the
generator on one core, the learner, one rank, on the other), so that the schedules can overlap what they overlap.
Five schedules, each run --steps steps with each seed in --seeds (the seeds' runs in turn, every schedule once per
round, so that a slower minute falls on all):

- on-policy (``max_staleness: 0``), one step off and two steps off (batched, ``max_staleness`` 1 and 2),
- streaming at ``max_staleness`` 1 and 2 (``algorithm.schedule: streaming``),

the stale ones corrected by token-level importance weights (``rollout_correction.rollout_is: token``). Reported per
schedule, the median over the seeds with the least and most: greedy pass@1 on the 256 held-out problems after the
last step (every run trains on the same number of samples), and trained tokens/s (the response tokens of the
samples trained in steps 3 to the last, over those steps' wall time: the first two steps warm up); goodput and the
share trained past the bound for the streaming runs. Writes streaming-learning.json and .md to --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench import machine, rows_of, write_report  # noqa: E402
from benchmarks.distill_showcase import cli  # noqa: E402

RECIPE = "recipes/tiny-cpu-reasoning.yaml"
KEY = "val/synthetic/reasoning/pass@1"
SAMPLES = 16 * 16
LAYOUT = [
    "generator.num_cpus=1",
    "learner.world_size=1",
    "learner.num_cpus=0.99",
    "learner.mini_batch_size=256",
    "learner.micro_batch_size=64",
    "reward.num_cpus=0.01",
    "cluster.cpu_threads=reserved",
    "trainer.val_before_train=true",
    "trainer.save_freq=0",
    "trainer.loggers=[jsonl]",
    "trainer.overwrite=true",
]
CORRECTED = ["algorithm.rollout_correction.rollout_is=token"]
SCHEDULES = {
    "on-policy": ["algorithm.max_staleness=0"],
    "one step off": ["algorithm.max_staleness=1", *CORRECTED],
    "two steps off": ["algorithm.max_staleness=2", *CORRECTED],
    "streaming, max_staleness 1": ["algorithm.schedule=streaming", "algorithm.max_staleness=1", *CORRECTED],
    "streaming, max_staleness 2": ["algorithm.schedule=streaming", "algorithm.max_staleness=2", *CORRECTED],
}


def one_run(name: str, seed: int, steps: int, work: Path, env: dict) -> dict:
    out = work / f"{name.replace(' ', '-').replace(',', '')}-seed{seed}"
    overrides = [*LAYOUT, *SCHEDULES[name], f"trainer.seed={seed}", f"trainer.total_steps={steps}"]
    overrides += [f"trainer.test_freq={steps}", f"trainer.output_dir={out}"]
    start = time.perf_counter()
    cli(out.name, ["train", RECIPE, *overrides], work, env)
    rows = rows_of(out / "metrics.jsonl")
    timed = [r for r in rows if r["step"] >= 3 and "timing_s/step" in r]
    tokens = sum(r["response_length/mean"] for r in timed) * SAMPLES
    last = rows[-1]
    return {
        "schedule": name,
        "seed": seed,
        "start": rows[0][KEY],  # step 0: the warm start's, before any update
        "seconds": time.perf_counter() - start,
        "pass_at_1": last[KEY],
        "trained_tokens_per_s": tokens / sum(r["timing_s/step"] for r in timed),
        "step_s": statistics.median(r["timing_s/step"] for r in timed),
        "goodput": last.get("rollout/goodput"),
        "over_bound_share": last.get("rollout/over_bound_share"),
        "staleness_max": max(r.get("rollout/staleness/max", 0) for r in rows),
    }


def spread(xs: list[float], fmt: str) -> str:
    return f"{statistics.median(xs):{fmt}} ({min(xs):{fmt}} to {max(xs):{fmt}})"


def markdown(report: dict) -> str:
    m, runs = report["machine"], report["runs"]
    base = statistics.median(r["trained_tokens_per_s"] for r in runs if r["schedule"] == "on-policy")
    lines = [
        f"# The schedules on a task that learns ({m['date']}, {m['cpu']}, {m['cores']} cores)",
        "",
        f"`{report['command']}`: `{RECIPE}` from its SFT warm start (greedy pass@1 {report['start']:.3f} before "
        f"GRPO), {report['steps']} steps of {SAMPLES} samples each, seeds {report['seeds']}; the generator and the "
        "learner (one rank) on a core each. The median over the seeds, the least and most in brackets.",
        "",
        "| schedule | greedy pass@1 after the last step | trained tokens/s | against on-policy's | step (s) | "
        "goodput | trained past the bound |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in SCHEDULES:
        mine = [r for r in runs if r["schedule"] == name]
        good = [r["goodput"] for r in mine if r["goodput"] is not None]
        over = [r["over_bound_share"] for r in mine if r["over_bound_share"] is not None]
        lines.append(
            f"| {name} | {spread([r['pass_at_1'] for r in mine], '.3f')} | "
            f"{spread([r['trained_tokens_per_s'] for r in mine], '.0f')} | "
            f"{spread([r['trained_tokens_per_s'] / base for r in mine], '.2f')}x | "
            f"{spread([r['step_s'] for r in mine], '.2f')} | "
            f"{spread(good, '.3f') if good else '-'} | {spread(over, '.3f') if over else '-'} |"
        )
    lines += ["", "Each run:", "", "```", *[json.dumps(r) for r in runs], "```", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--only", nargs="*", default=[], help="schedules to run (all by default)")
    ap.add_argument("--out", default="benchmarks/results/streaming-learning")
    ap.add_argument("--work", default="runs/streaming-learning")
    args = ap.parse_args()
    import os

    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    names = [n for n in SCHEDULES if not args.only or n in args.only]
    runs = [one_run(name, seed, args.steps, work, env) for seed in args.seeds for name in names]
    report = {
        "machine": machine(),
        "command": "python benchmarks/streaming_learning.py " + " ".join(sys.argv[1:]),
        "steps": args.steps,
        "seeds": args.seeds,
        "start": runs[0]["start"],
        "runs": runs,
    }
    write_report(args.out, "streaming-learning", report, markdown(report))


if __name__ == "__main__":
    main()
