"""The tool-use showcase, in one command: SFT warm start on tool-use traces, then GRPO with the calculator tool and
the same GRPO without it, from the same warm start, seed, data and budget.

    python benchmarks/agent_showcase.py --out benchmarks/results/agent-showcase

`recipes/tiny-cpu-agent.yaml` (its warm start `recipes/tiny-cpu-agent-sft.yaml` trains first, in a fresh model
cache under the work directory, so the command's time includes it); the run without the tool is the same recipe
with ``~environment.name`` (its default: none; single-turn rollouts, the same reward). Writes each run's metrics
(<name>.jsonl), the warm start's (sft.jsonl), curves.png and agent-showcase.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench import machine, rows_of, run_curves, sft_summary, val_table, write_report  # noqa: E402

RECIPE = "recipes/tiny-cpu-agent.yaml"
RUNS = {
    "with-tool": [],
    "without-tool": ["~environment.name"],
    "with-tool-streaming": [  # the streaming schedule (--runs with-tool,with-tool-streaming: the two side by side)
        "algorithm.schedule=streaming",
        "algorithm.max_staleness=2",
        "algorithm.rollout_correction.rollout_is=token",
    ],
}
KEY = "val/synthetic/products/pass@1"


def run(name: str, overrides: list[str], args, work: Path, env: dict) -> dict:
    out = work / name
    start = time.perf_counter()
    command = [
        sys.executable,
        "-m",
        "grpo_ray",
        "train",
        RECIPE,
        *overrides,
        f"trainer.output_dir={out}",
        f"trainer.total_steps={args.steps}",
        f"trainer.test_freq={args.test_freq}",
        "trainer.overwrite=true",
        "trainer.loggers=[jsonl]",
    ]
    res = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env)
    (work / f"{name}.log").write_text(res.stdout + res.stderr)
    if res.returncode:
        raise SystemExit(f"{name}: exit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
    rows = rows_of(out / "metrics.jsonl")
    val = {r["step"]: r[KEY] for r in rows if KEY in r}
    train = [r for r in rows if r["step"] > 0 and "critic/score/mean" in r]
    last = train[-10:]
    mean = lambda key: sum(r.get(key, 0.0) for r in last) / len(last)  # noqa: E731
    warm = res.stdout.split("SFT warm start: model at ")
    return {
        "name": name,
        "overrides": overrides,
        "seconds": time.perf_counter() - start,
        "val": val,
        "start": val[0],
        "final": val[max(val)],
        "best": max(val.values()),
        "score_last10": mean("critic/score/mean"),
        "tool_calls_last10": mean("env/tool_calls/mean"),
        "turns_last10": mean("env/turns/mean"),
        "step_s_last10": mean("timing_s/step"),
        "warm_start": warm[1].split()[0] if len(warm) > 1 else None,
        "dir": str(out),
    }


def plot(runs: list[dict], out: Path) -> None:
    panels = [
        (KEY, "validation pass@1 (greedy, 256 held-out problems)"),
        ("critic/score/mean", "train score (T=1)"),
        ("env/tool_calls/mean", "tool calls per trajectory"),
    ]
    run_curves(runs, panels, out, "GRPO step")


def markdown(report: dict) -> str:
    m, runs = report["machine"], report["runs"]
    sft = report["sft"]
    lines = [
        f"# Tool-use showcase ({m['date']}, {m['cpu']}, {m['cores']} cores)",
        "",
        f"`python benchmarks/agent_showcase.py --steps {report['steps']} --runs {','.join(r['name'] for r in runs)}`: **{report['seconds'] / 60:.1f} min in "
        "all**, the warm start included. `recipes/tiny-cpu-agent.yaml` from its SFT warm start "
        "(`recipes/tiny-cpu-agent-sft.yaml`), each run from the same warm start, seed, data and budget: "
        + "; ".join(f"{r['name']} ({' '.join(r['overrides']) or 'the recipe as it is'})" for r in runs)
        + ". Greedy pass@1 on 256 held-out problems (products of two 2-digit numbers in "
        "word problems), validated with the tool in the run that has it.",
        "",
        f"Warm start: {sft['steps']} SFT steps of 64 traces, loss {sft['loss_first10']:.2f} over the first 10 steps "
        f"-> {sft['loss_last10']:.2f} over the last 10 (assistant tokens only); greedy pass@1 "
        + " -> ".join(f"{v:.3f} (step {s})" for s, v in sorted(sft["val"].items()))
        + ".",
        "",
        "| run | pass@1 at step 0 | at the end | best | train score (last 10 steps) | tool calls a trajectory "
        "(last 10) | step (s) | minutes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in runs:
        lines.append(
            f"| {r['name']} | {r['start']:.3f} | {r['final']:.3f} | {r['best']:.3f} | {r['score_last10']:.3f} | "
            f"{r['tool_calls_last10']:.2f} | {r['step_s_last10']:.2f} | {r['seconds'] / 60:.1f} |"
        )
    lines += ["", *val_table(runs)]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--test-freq", type=int, default=2)
    ap.add_argument("--runs", default="with-tool,without-tool", help=f"of {', '.join(RUNS)}")
    ap.add_argument("--out", default="benchmarks/results/agent-showcase")
    ap.add_argument("--work", default="runs/agent-showcase", help="runs and the fresh model cache go here")
    args = ap.parse_args()
    out, work = Path(args.out), Path(args.work).resolve()
    shutil.rmtree(work / "cache", ignore_errors=True)  # the warm start trains in this command
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GRPO_RAY_CACHE": str(work / "cache")}
    start = time.perf_counter()
    runs = [run(name, RUNS[name], args, work, env) for name in args.runs.split(",")]
    seconds = time.perf_counter() - start
    sft = sft_summary(Path(runs[0]["warm_start"]).parent, KEY)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(runs[0]["warm_start"]).parent / "metrics.jsonl", out / "sft.jsonl")
    for r in runs:
        shutil.copy(Path(r["dir"]) / "metrics.jsonl", out / f"{r['name']}.jsonl")
    plot(runs, out / "curves.png")
    report = {"machine": machine(), "steps": args.steps, "seconds": seconds, "sft": sft, "runs": runs}
    write_report(out, "agent-showcase", report, markdown(report))


if __name__ == "__main__":
    main()
