"""Soak: the quick start's recipe for many steps, the resident memory of every actor against step.

    python benchmarks/soak.py --steps 1000 --out benchmarks/results

It runs ``grpo-ray train recipes/tiny-cpu.yaml trainer.total_steps=N`` and, while it runs, reads each
actor's current resident set (``VmRSS`` of the pids in ``placement.json``) once a second, tagged with
the last step in ``metrics.jsonl``. Per pool (the largest actor of it) it reports RSS at a few steps and
the slope over the second half of the run (least squares, MB per step); the bound is 0.05 MB a step.
Writes soak.json, soak.md and soak.png to --out.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BOUND_MB_PER_STEP = 0.05


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def last_step(metrics: Path) -> int:
    try:
        lines = metrics.read_text().splitlines()
        return json.loads(lines[-1])["step"] if lines else -1
    except (OSError, ValueError, KeyError):
        return -1


def slope(points: list[tuple[int, float]]) -> float:
    """Least-squares MB per step."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def run(steps: int, out_dir: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "grpo_ray",
        "train",
        str(ROOT / "recipes" / "tiny-cpu.yaml"),
        f"trainer.total_steps={steps}",
        f"trainer.output_dir={out_dir}",
        "trainer.loggers=[jsonl]",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    samples: dict[str, dict[int, float]] = {}  # pool -> step -> largest actor's RSS (MB), last reading of the step
    start = time.time()
    while proc.poll() is None:
        time.sleep(1.0)
        step = last_step(out_dir / "metrics.jsonl")
        if step < 1 or not (out_dir / "placement.json").exists():
            continue
        for pool, actors in json.loads((out_dir / "placement.json").read_text()).items():
            readings = [rss_mb(a["pid"]) for a in actors]
            readings = [r for r in readings if r is not None]
            if readings:
                samples.setdefault(pool, {})[step] = max(readings)
    if proc.returncode != 0:
        raise SystemExit(f"the soak run failed (exit {proc.returncode}); see {out_dir}/logs")
    result = {"steps": steps, "wall_s": time.time() - start, "bound_mb_per_step": BOUND_MB_PER_STEP, "pools": {}}
    for pool, by_step in samples.items():
        points = sorted(by_step.items())
        half = [(s, mb) for s, mb in points if s > steps // 2]
        at = {k: min(points, key=lambda p: abs(p[0] - k))[1] for k in (10, 50, 150, steps // 2, steps)}
        result["pools"][pool] = {"points": points, "rss_mb_at": at, "slope_mb_per_step_second_half": slope(half)}
    return result


def write(result: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    (out / "soak.json").write_text(json.dumps(result, indent=1))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for pool, p in result["pools"].items():
        ax.plot([s for s, _ in p["points"]], [mb for _, mb in p["points"]], label=pool)
    ax.set_xlabel("step")
    ax.set_ylabel("resident memory of the largest actor (MB)")
    ax.set_title(f"tiny-cpu recipe, {result['steps']} steps")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "soak.png", dpi=100)
    keys = list(next(iter(result["pools"].values()))["rss_mb_at"])
    lines = [
        f"# Soak: tiny-cpu recipe, {result['steps']} steps ({result['wall_s'] / 60:.1f} min)",
        "",
        f"{result['machine']}, {result['date']}. RSS (MB) of the largest actor of each pool at a step; slope: "
        f"least squares over steps > {result['steps'] // 2}, bound {BOUND_MB_PER_STEP} MB a step.",
        "",
        "| pool | " + " | ".join(f"step {k}" for k in keys) + " | slope, 2nd half (MB/step) | within bound |",
        "| --- |" + " --- |" * (len(keys) + 2),
    ]
    for pool, p in result["pools"].items():
        s = p["slope_mb_per_step_second_half"]
        lines.append(
            f"| {pool} | "
            + " | ".join(f"{p['rss_mb_at'][k]:.0f}" for k in keys)
            + f" | {s:.4f} | {'yes' if abs(s) <= BOUND_MB_PER_STEP else 'NO'} |"
        )
    (out / "soak.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="grpo-soak-") as tmp:
        result = run(args.steps, Path(tmp) / "run")
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.machine(),
    )
    mem = int(Path("/proc/meminfo").read_text().split()[1]) / 1024**2
    result["machine"] = f"{cpu}, {subprocess.getoutput('nproc')} cores, {mem:.0f} GiB, no GPU"
    result["date"] = str(date.today())
    write(result, Path(args.out))
    print((Path(args.out) / "soak.md").read_text())


if __name__ == "__main__":
    main()
