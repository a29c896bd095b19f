"""Do two checkouts write the same metrics? ``run`` trains the quick start and the reward-model, judge, distillation,
agent and streaming twins (fixed seeds, fp32: the recipes' own) into a folder; ``compare`` reads two such folders (or two
metrics.jsonl files) value by value, timings and speeds aside: a behaviour-preserving change leaves every other value
bit for bit the same.

    python benchmarks/same_metrics.py run OUT            # in each checkout (PYTHONPATH=<checkout> for another)
    python benchmarks/same_metrics.py compare BEFORE AFTER [--out RESULT.md]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

TIMED = ("timing_s/", "perf/", "time", "sync/GBps", "sync/gather_s", "sync/cast_s", "sync/load_s")
"""Metrics that are wall-clock times or speeds (keys that start so, or end in /seconds or _s): not compared."""

JOBS = {
    "quick-start": ["recipes/tiny-cpu.yaml", "trainer.total_steps=20", "trainer.test_freq=0"],
    "reward-model": ["recipes/tiny-qwen2.5-1.5b-gsm8k-rm.yaml"],
    "judge": ["recipes/tiny-qwen2.5-1.5b-gsm8k-judge.yaml"],
    "distill": ["recipes/tiny-qwen2.5-1.5b-gsm8k-distill.yaml"],
    "agent": ["recipes/tiny-qwen2.5-7b-gsm8k-agent.yaml"],
    "streaming": ["recipes/tiny-llama3.1-8b-math-4node-streaming.yaml"],
}
"""Each job's recipe and overrides; every one also gets trainer.loggers=[jsonl] and its own output folder."""


def run(out: Path, jobs: list[str]) -> None:
    for name in jobs:
        recipe, *overrides = JOBS[name]
        folder = (out / name).resolve()
        if folder.exists():
            raise SystemExit(f"{folder} exists: give a new folder (runs are never overwritten)")
        cmd = [sys.executable, "-m", "grpo_ray", "train", recipe, *overrides, "trainer.loggers=[jsonl]"]
        start = time.perf_counter()
        done = subprocess.run([*cmd, f"trainer.output_dir={folder}"], capture_output=True, text=True, env=os.environ)
        print(f"{name}: exit {done.returncode} after {time.perf_counter() - start:.0f}s", flush=True)
        if done.returncode:
            raise SystemExit(done.stdout[-3000:] + done.stderr[-3000:])


def compare(before: Path, after: Path) -> tuple[int, list[str]]:
    """(values compared, one line per value that differs or is missing)."""
    rows = [[json.loads(line) for line in p.read_text().splitlines()] for p in (before, after)]
    if len(rows[0]) != len(rows[1]):
        return 0, [f"{len(rows[0])} rows against {len(rows[1])}"]
    compared, differ = 0, []
    for x, y in zip(*rows):
        for key in sorted(set(x) | set(y)):
            if key.startswith(TIMED) or key.endswith(("/seconds", "_s")):
                continue
            compared += 1
            if x.get(key) != y.get(key):
                differ.append(f"step {x.get('step')} {key}: {x.get(key)!r} -> {y.get(key)!r}")
    return compared, differ


def compare_runs(before: Path, after: Path) -> str:
    """One line per job (or for the one file given), then the values that differ."""
    if before.is_file():
        pairs = {"": (before, after)}
    else:
        pairs = {p.name: (p / "metrics.jsonl", after / p.name / "metrics.jsonl") for p in sorted(before.iterdir())}
    lines, differ = [], []
    for name, (x, y) in pairs.items():
        n, d = compare(x, y)
        lines.append(f"{name + ': ' if name else ''}{n} values compared, {len(d)} differ")
        differ += [f"{name} {line}" for line in d]
    return "\n".join(lines) + "".join(f"\n- {d}" for d in differ[:50])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("out", type=Path)
    r.add_argument("--jobs", nargs="+", default=list(JOBS), choices=list(JOBS))
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    c.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.command == "run":
        run(args.out, args.jobs)
        return
    text = compare_runs(args.before, args.after)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
