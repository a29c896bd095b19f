"""Item 5: the whole job SIGKILLed at random points (and once mid-checkpoint), restarted each time with the same
command: it resumes from the last complete checkpoint, and every step runs exactly once with the prompts an
uninterrupted run gets."""

import random
import time

import pytest

from grpo_ray import checkpoint
from tests.faults.conftest import Run, dump, metrics, wait_for_step

pytestmark = pytest.mark.slow

STEPS = 8
ARGS = [f"trainer.total_steps={STEPS}", "trainer.save_freq=1", "trainer.keep_last=0"]


def test_sigkill_at_random_points_loses_and_repeats_nothing(tmp_path, faults_env):
    clean = tmp_path / "clean"
    assert Run(clean, ARGS).wait() == 0

    out = tmp_path / "killed"
    rng = random.Random(7)
    env = {**faults_env, "GRPO_RAY_FAULTS": "exit_mid_checkpoint@2"}
    # 1: dies inside the save of step 2 (shards written, not committed): step 1 is the newest complete checkpoint
    first = Run(out, ARGS, env)
    assert first.wait() == 1
    assert checkpoint.find_resume(out, "auto").name == "step_1"
    assert (out / "checkpoints" / ".tmp_step_2").is_dir() and not (out / "checkpoints" / "step_2").exists()
    kills = 0
    for _ in range(1):  # 2: SIGKILL to the whole process group at a random moment after a step is logged
        done = max((m["step"] for m in metrics(out)), default=0)
        if done >= STEPS - 1:
            break
        run = Run(out, ARGS, env)
        wait_for_step(out, done + 1)
        time.sleep(rng.uniform(0.0, 1.5))
        if run.proc.poll() is None:
            run.kill()
            kills += 1
        else:
            run.wait()
    last = Run(out, ARGS, env)
    assert last.wait() == 0, last.output()[-3000:]
    assert kills >= 1

    steps = [m["step"] for m in metrics(out)]
    assert steps == list(range(1, STEPS + 1))  # each step once in the record
    for step in range(1, STEPS + 1):  # and each with the prompts (and samples) the clean run had
        assert [r["uid"] for r in dump(out, step)] == [r["uid"] for r in dump(clean, step)], step
    assert {p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("step_")} == {
        f"step_{s}" for s in range(1, STEPS + 1)
    }
    assert all(not checkpoint.problems(out / "checkpoints" / f"step_{s}") for s in range(1, STEPS + 1))


def test_learner_rank_lost_stops_the_run_at_once_and_the_rerun_resumes(tmp_path):
    import json
    import os
    import signal

    out = tmp_path / "run"
    run = Run(out, ["trainer.total_steps=40", "trainer.save_freq=2", "learner.world_size=2"])
    wait_for_step(out, 3)
    rank1 = json.loads((out / "placement.json").read_text())["learner"][1]["pid"]
    os.kill(rank1, signal.SIGKILL)  # rank 0 is left blocked in a collective with it
    killed = time.monotonic()
    assert run.wait(timeout=300) == 1, run.output()[-3000:]
    assert time.monotonic() - killed < 60  # the failure is seen at once, not after gloo's 10-minute timeout
    assert "an actor died" in run.output() and "Traceback" not in run.output().split("grpo-ray: run stopped")[-1]
    saved = checkpoint.find_resume(out, "auto")
    assert saved is not None
    again = Run(
        out, [f"trainer.total_steps={int(saved.name.split('_')[1]) + 2}", "trainer.save_freq=2", "learner.world_size=2"]
    )
    assert again.wait() == 0, again.output()[-3000:]
    assert f"resuming from {saved}" in again.output()
