"""Checkpoints: kill after a saved step and resume exactly; another world size; bad checkpoints refused."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from grpo_ray import checkpoint
from tests.conftest import ROOT, run_cli

pytestmark = pytest.mark.slow
COMMON = ["trainer.total_steps=4", "trainer.save_freq=2", "trainer.test_freq=0", "trainer.val_before_train=false",
          "trainer.dump_rollouts=false"]
SAME = ("critic/score/mean", "actor/grad_norm", "actor/pg_loss", "actor/entropy", "actor/kl_loss",
        "response_length/mean", "rollout/policy_version")


def metrics(out):
    return [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An uninterrupted 4-step run, and the same run SIGKILLed after step 2's checkpoint, then restarted."""
    whole, killed = tmp_path_factory.mktemp("whole"), tmp_path_factory.mktemp("killed")
    res = run_cli("train", "recipes/tiny-cpu.yaml", *COMMON, f"trainer.output_dir={whole}", timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    cmd = [sys.executable, "-m", "grpo_ray", "train", "recipes/tiny-cpu.yaml", *COMMON, f"trainer.output_dir={killed}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    try:
        deadline = time.time() + 600
        for line in proc.stdout:
            if line.startswith("step:3 ") or time.time() > deadline:
                break
        assert line.startswith("step:3 ")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver, its local Ray cluster and every actor
        proc.wait()
    assert checkpoint.complete_steps(killed / "checkpoints") == [2]
    resumed = run_cli("train", "recipes/tiny-cpu.yaml", *COMMON, f"trainer.output_dir={killed}", timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stdout and "(step 2)" in resumed.stdout
    return whole, killed


def test_resume_after_sigkill_repeats_the_uninterrupted_run(runs):
    whole, killed = runs
    a, b = metrics(whole), metrics(killed)
    assert [r["step"] for r in b] == [1, 2, 3, 4]  # nothing repeated, nothing skipped
    for ra, rb in zip(a, b):
        for key in SAME:
            assert rb[key] == pytest.approx(ra[key], rel=1e-6, abs=1e-9), (ra["step"], key)
    assert checkpoint.complete_steps(killed / "checkpoints") == [2, 4]
    state = checkpoint.load_state(killed / "checkpoints" / "step_4")
    assert state["step"] == 4 and state["version"] == 4 and state["data"] == {"epoch": 0, "index": 64}
    info = json.loads((killed / "checkpoints" / "step_4" / "training_info.json").read_text())
    assert info["consumed_samples"] == 64
    assert (killed / "checkpoints" / "step_4" / "tokenizer.json").is_file()


def test_resume_into_another_learner_world_size(runs, tmp_path):
    whole, killed = runs
    res = run_cli("train", "recipes/tiny-cpu.yaml", *COMMON, "trainer.total_steps=3", "learner.world_size=1",
                  f"trainer.resume={killed / 'checkpoints' / 'step_2'}", f"trainer.output_dir={tmp_path}", timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    step3 = metrics(tmp_path)[-1]
    assert step3["step"] == 3
    for key in SAME:  # one rank adds up in another order than two: equal to float precision
        assert step3[key] == pytest.approx(metrics(whole)[2][key], rel=1e-4, abs=1e-6), key


def test_half_written_and_corrupted_checkpoints_are_refused(runs, tmp_path):
    _, killed = runs
    out = tmp_path / "run"
    shutil.copytree(killed, out)
    root = out / "checkpoints"
    (root / ".tmp_step_6" / "learner").mkdir(parents=True)  # a save killed mid-write
    (root / ".tmp_step_6" / "learner" / "__0_0.distcp").write_bytes(b"partial")
    said = []
    assert checkpoint.find_resume(out, "auto", said.append) == root / "step_4"
    shard = sorted((root / "step_4" / "learner").glob("*.distcp"))[0]
    shard.write_bytes(shard.read_bytes()[:100])  # truncated
    assert checkpoint.find_resume(out, "auto", said.append) == root / "step_2"
    assert "checkpoint step_4 is not whole" in said[-1] and shard.name in said[-1] and "truncated" in said[-1]
    with pytest.raises(checkpoint.CheckpointError, match=rf"cannot be loaded: .*{shard.name} is truncated"):
        checkpoint.find_resume(out, str(root / "step_4"))
    (root / "step_2" / "learner" / ".metadata").unlink()
    assert checkpoint.find_resume(out, "auto", said.append) is None
    assert ".metadata is missing" in said[-1]
    res = run_cli("train", "recipes/tiny-cpu.yaml", *COMMON, f"trainer.output_dir={out}",
                  f"trainer.resume={root / 'step_4'}")
    assert res.returncode == 2 and "Traceback" not in res.stderr and shard.name in res.stderr
