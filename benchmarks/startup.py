"""Where a run's start goes: the quick start (`grpo-ray train recipes/tiny-cpu.yaml`) timed from the command's
start to each of its start-up lines and to its first step line, for this checkout and for an earlier commit, run
in turns on the same machine in the same hour.

    python benchmarks/startup.py [--before REV] [--runs 2] [--steps 150] [--out benchmarks/results/startup]

The earlier commit is checked out in a temporary git worktree and run with this checkout's virtual environment
(its own `grpo_ray` package first on the path). Seconds are the wall clock as each line reached this script; the
whole run's wall time is given beside them. Each run starts its own local Ray cluster, as a user's does.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PHASES = {
    "recipe checked": r"recipe valid",
    "data checked": r"recipe, data and rewards checked",
    "Ray up": r"Ray up:",
    "actors placed": r"\d+ actors placed",
    "learner ready": r"learner ready",
    "reference ready": r"reference ready",
    "engines loaded": r"engines loaded",
    "transport connected": r"weight transport connected",
    "first probe": r"first probe",
    "first step": r"step:1 ",
}
"""Each phase's end: the line that says it (a phase's line says when it was ready), after the command's own stamp."""
STAMP = re.compile(r"^\[\s*[0-9.]+s\]\s*")


def one_run(checkout: Path, steps: int, out: Path) -> dict:
    """The quick start in `checkout`, for `steps` steps: seconds from the command's start to each phase's line."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "grpo_ray", "train", "recipes/tiny-cpu.yaml"]
    cmd += [f"trainer.total_steps={steps}", f"trainer.output_dir={out}"]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=checkout, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: dict[str, float] = {}
    lines = []
    for line in proc.stdout:
        lines.append(line)
        for phase, pattern in PHASES.items():
            if phase not in seen and re.match(pattern, STAMP.sub("", line)):
                seen[phase] = round(time.monotonic() - start, 2)
    rc = proc.wait()
    (out.parent / f"{out.name}.log").write_text("".join(lines))
    if rc != 0:
        raise SystemExit(f"{checkout}: the run failed (exit {rc}):\n{''.join(lines[-30:])}")
    seen["whole run"] = round(time.monotonic() - start, 2)
    return seen


def table(results: dict[str, list[dict]]) -> str:
    """Median seconds of each phase per version, as markdown."""
    names = list(results)
    rows = ["| phase ends at | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    for phase in [*PHASES, "whole run"]:
        cells = []
        for name in names:
            got = [r[phase] for r in results[name] if phase in r]
            cells.append(f"{statistics.median(got):.1f} s" if got else "-")
        rows.append(f"| {phase} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", default="", help="an earlier commit to time beside this checkout")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=150, help="the quick start's own 150 by default")
    ap.add_argument("--out", default="benchmarks/results/startup")
    args = ap.parse_args()

    from benchmarks.bench import machine

    work = Path(tempfile.mkdtemp(prefix="grpo-startup-"))
    versions = {"this checkout": ROOT}
    if args.before:
        rev = subprocess.run(["git", "rev-parse", "--short", args.before], cwd=ROOT, capture_output=True, text=True)
        tree = work / "before"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), args.before], cwd=ROOT, check=True)
        versions = {f"before ({rev.stdout.strip()})": tree, **versions}
    results: dict[str, list[dict]] = {name: [] for name in versions}
    try:
        for i in range(args.runs):  # in turns, so a busier minute falls on both
            for name, checkout in versions.items():
                run = work / f"{'before' if checkout != ROOT else 'after'}-{i}"
                got = one_run(checkout, args.steps, run)
                logs = Path(args.out) / "logs"
                logs.mkdir(parents=True, exist_ok=True)
                (logs / f"{run.name}.log").write_text((work / f"{run.name}.log").read_text())
                print(name, json.dumps(got), flush=True)
                results[name].append(got)
    finally:
        if args.before:
            subprocess.run(["git", "worktree", "remove", "--force", str(work / "before")], cwd=ROOT)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    here = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    record = {
        "machine": machine(),
        "command": "python benchmarks/startup.py " + " ".join(sys.argv[1:]),
        "this_checkout": here.stdout.strip(),
        "runs": results,
    }
    (out / "startup.json").write_text(json.dumps(record, indent=1) + "\n")
    m = record["machine"]
    md = [
        "# The quick start's start-up, phase by phase",
        "",
        f"`{record['command']}` on {m['cpu']}, {m['cores']} cores, {m['date']} (commit {record['this_checkout']}"
        " plus the working tree). Seconds from the command's start to the line that ends each phase, the median of "
        f"{args.runs} runs each, taken in turns; `{args.steps}` steps.",
        "",
        table(results),
        "",
    ]
    (out / "startup.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
