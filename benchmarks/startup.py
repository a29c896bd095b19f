"""Where a run's start goes: the quick start (`grpo-ray train recipes/tiny-cpu.yaml`) timed from the command's
start to each of its start-up lines and to its first step line, warm (this checkout, and an earlier commit, run in
turns on the same machine in the same hour) and cold (a fresh clone set up in a new venv, its first run).

    python benchmarks/startup.py [--before REV] [--without-bytecode] [--runs 3] [--cold 2] [--steps 150]
        [--out benchmarks/results/startup]

Warm: the quick start run --runs times in this checkout (its byte code, tiny model and checked rows from earlier
runs). The earlier commit is checked out in a temporary git worktree and run with this checkout's virtual environment
(its own `grpo_ray` package first on the path). --without-bytecode adds this checkout run as if its venv had
no byte code (PYTHONPYCACHEPREFIX an empty folder and PYTHONDONTWRITEBYTECODE set, so every process compiles what
it imports from source: a venv made by `pip install --no-compile` where that variable is set). Cold (--cold N): N fresh clones of HEAD, each set up by
``bash scripts/setup.sh`` (a new .venv, pip from its cache; the set-up's seconds reported) and run once with an
empty model and data cache, as a new user's first step. Seconds are the wall clock as each line reached this
script; the whole run's wall time is given beside them; each phase as the median of its runs and their least and
most. Each run starts its own local Ray cluster, as a user's does.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
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


def one_run(checkout: Path, steps: int, out: Path, python: str = sys.executable, env: dict | None = None) -> dict:
    """The quick start in `checkout`, for `steps` steps: seconds from the command's start to each phase's line."""
    env = {**(env or os.environ), "PYTHONPATH": str(checkout), "PYTHONUNBUFFERED": "1"}
    cmd = [python, "-m", "grpo_ray", "train", "recipes/tiny-cpu.yaml"]
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


def cold_run(work: Path, i: int, steps: int) -> dict:
    """A fresh clone of HEAD set up in a new venv, then its first run with an empty cache: the set-up's seconds and
    the run's phases."""
    clone = work / f"cold-{i}"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    subprocess.run(["git", "checkout", "-q", sha], cwd=clone, check=True)
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["GRPO_RAY_CACHE"] = str(clone / "cache")
    start = time.monotonic()
    subprocess.run(["bash", "scripts/setup.sh"], cwd=clone, env=env, check=True, capture_output=True)
    setup = round(time.monotonic() - start, 2)
    try:
        got = one_run(clone, steps, work / f"cold-{i}-run", python=str(clone / ".venv" / "bin" / "python"), env=env)
    finally:
        shutil.rmtree(clone, ignore_errors=True)  # its venv: gigabytes
    return {"set-up": setup, **got}


def table(results: dict[str, list[dict]]) -> str:
    """Seconds of each phase per version (the median, and the least and most of its runs), as markdown."""
    names = list(results)
    rows = ["| phase ends at | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    for phase in ["set-up", *PHASES, "whole run"]:
        cells = []
        for name in names:
            got = [r[phase] for r in results[name] if phase in r]
            spread = f" ({min(got):.1f}-{max(got):.1f})" if len(got) > 1 else ""
            cells.append(f"{statistics.median(got):.1f} s{spread}" if got else "-")
        if any(c != "-" for c in cells):
            rows.append(f"| {phase} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", default="", help="an earlier commit to time beside this checkout")
    ap.add_argument("--without-bytecode", action="store_true", help="also this checkout with no byte code found")
    ap.add_argument("--runs", type=int, default=3, help="warm runs of each version")
    ap.add_argument("--cold", type=int, default=0, help="fresh clones of HEAD, each set up and run once")
    ap.add_argument("--steps", type=int, default=150, help="the quick start's own 150 by default")
    ap.add_argument("--out", default="benchmarks/results/startup")
    args = ap.parse_args()

    from benchmarks.bench import machine

    work = Path(tempfile.mkdtemp(prefix="grpo-startup-"))
    versions = {"this checkout": (ROOT, None)}
    if args.without_bytecode:
        (work / "no-bytecode").mkdir()
        bare = {**os.environ, "PYTHONPYCACHEPREFIX": str(work / "no-bytecode"), "PYTHONDONTWRITEBYTECODE": "1"}
        versions = {"without byte code": (ROOT, bare), **versions}
    if args.before:
        rev = subprocess.run(["git", "rev-parse", "--short", args.before], cwd=ROOT, capture_output=True, text=True)
        tree = work / "before"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), args.before], cwd=ROOT, check=True)
        versions = {f"before ({rev.stdout.strip()})": (tree, None), **versions}
    results: dict[str, list[dict]] = {name: [] for name in versions}
    if args.cold:
        results = {"cold (fresh clone and venv)": [], **results}
    try:
        logs = Path(args.out) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for i in range(args.cold):
            got = cold_run(work, i, args.steps)
            (logs / f"cold-{i}.log").write_text((work / f"cold-{i}-run.log").read_text())
            print("cold", json.dumps(got), flush=True)
            results["cold (fresh clone and venv)"].append(got)
        for i in range(args.runs):  # in turns, so a busier minute falls on both
            for name, (checkout, env) in versions.items():
                run = work / f"{name.split(' ')[0]}-{i}"
                got = one_run(checkout, args.steps, run, env=env)
                (logs / f"{run.name}.log").write_text((work / f"{run.name}.log").read_text())
                print(name, json.dumps(got), flush=True)
                results[name].append(got)
    finally:
        if args.before:
            subprocess.run(["git", "worktree", "remove", "--force", str(work / "before")], cwd=ROOT)
        shutil.rmtree(work, ignore_errors=True)  # the runs' folders (their logs copied to --out)
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
        " plus the working tree). Seconds from the command's start to the line that ends each phase (set-up: its own), "
        f"the median of {args.runs} warm runs each, taken in turns, and of {args.cold} cold ones, the least and most "
        f"in brackets; `{args.steps}` steps.",
        "",
        table(results),
        "",
    ]
    (out / "startup.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
