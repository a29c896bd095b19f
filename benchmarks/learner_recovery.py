"""What keeping the learner's state costs and what it saves (issue 78, trainer.fault_tolerance=all). On the quick start
(two FSDP2 ranks, a reference, one engine; two optimizer steps a step), per repeat, in one process one after another:

    plain     3 steps, a copy of each rank's state taken as each step starts, a checkpoint after each step
    lost      the same, learner rank 1 exiting mid step 2 (after its first optimizer step): the group is started
              again from the copies and step 2 is trained again, in the same job
    from disk the restart the loss costs without the copies: the same command resuming from step 1's checkpoint
              (a job retried after the loss, on a cluster of its own: Ray's start, every pool's, the reload),
              timed from its start to its end, step 2 trained

Reported (min / median / max over the repeats): the copy's seconds and MB a step, step 2's seconds as is and in the
job that lost a rank (its extra is the recovery), the part of that the new group took to start (its ranks built and
the group formed: fault/learner_start_s) and the whole recovery before the step is sent again (fault/learner_recovery_s),
and the resumed job's seconds, whose extra over the plain step 2 is what the restart from disk costs. A restart from disk here redoes one step only (a checkpoint every step): its best case.

    python benchmarks/learner_recovery.py OUT [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

COMMON = [
    "recipes/tiny-cpu.yaml",
    "trainer.fault_tolerance=all",
    "learner.mini_batch_size=128",
    "trainer.save_freq=1",
    "trainer.val_before_train=false",
    "trainer.test_freq=0",
    "trainer.loggers=[jsonl]",
]


def train(folder: Path, steps: int, env: dict | None = None) -> tuple[float, list[dict]]:
    """The command's wall seconds and its metrics rows."""
    cmd = [sys.executable, "-m", "grpo_ray", "train", *COMMON, f"trainer.total_steps={steps}"]
    start = time.perf_counter()
    done = subprocess.run(
        [*cmd, f"trainer.output_dir={folder}"], capture_output=True, text=True, env={**os.environ, **(env or {})}
    )
    seconds = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(done.stdout[-3000:] + done.stderr[-3000:])
    return seconds, [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def repeat(out: Path) -> dict[str, float]:
    _, plain = train(out / "plain", 3)
    markers = out / "markers"
    markers.mkdir()
    faults = {"GRPO_RAY_FAULTS": "exit_learner@2", "GRPO_RAY_FAULTS_DIR": str(markers)}
    _, lost = train(out / "lost", 3, faults)
    train(out / "disk", 1)
    resumed_s, resumed = train(out / "disk", 2)  # resumes from step 1's checkpoint
    assert [m["step"] for m in resumed] == [1, 2] and lost[-1]["fault/learner_restarts"] == 1
    step2 = {m["step"]: m for m in plain}[2]
    return {
        "copy_s": statistics.median(m["fault/learner_copy_s"] for m in plain),
        "copy_mb": plain[-1]["fault/learner_copy_mb"],  # (step 1's holds no optimizer moments yet)
        "step2_s": step2["timing_s/step"],
        "step2_lost_s": {m["step"]: m for m in lost}[2]["timing_s/step"],
        "recovery_s": lost[-1]["fault/learner_recovery_s"],
        "start_s": lost[-1]["fault/learner_start_s"],
        "resumed_job_s": resumed_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    if a.out.exists():
        raise SystemExit(f"{a.out} exists: give a new folder (results are never overwritten)")
    from benchmarks.bench import machine

    runs = []
    for i in range(a.repeats):
        runs.append(repeat(a.out / f"repeat{i}"))
        print(json.dumps(runs[-1]), flush=True)
    spread = {
        k: [min(r[k] for r in runs), statistics.median(r[k] for r in runs), max(r[k] for r in runs)] for k in runs[0]
    }
    record = {
        "machine": machine(),
        "command": "python benchmarks/learner_recovery.py " + " ".join(sys.argv[1:]),
        "recipe": COMMON,
        "repeats": runs,
        "min_median_max": spread,
    }
    (a.out / "learner_recovery.json").write_text(json.dumps(record, indent=1) + "\n")
    for sub in a.out.glob("repeat*/*"):  # the runs' checkpoints and weights: not results
        if sub.is_dir():
            for big in ("checkpoints", "weights", "model"):
                shutil.rmtree(sub / big, ignore_errors=True)
    print(json.dumps(spread))


if __name__ == "__main__":
    main()
