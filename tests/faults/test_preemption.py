"""Item 7: SIGTERM (a preemption notice) finishes the step, writes a checkpoint within the grace period and exits
143, which a RayJob counts as a failed attempt and submits again; the same command then resumes."""

import signal
import time

import pytest

from grpo_ray import checkpoint
from tests.faults.conftest import SCHEDULES, Run, metrics, wait_for_step

pytestmark = pytest.mark.slow


def test_sigterm_checkpoints_and_exits_for_a_retry(tmp_path):
    """One step off (on-policy has no batch in flight: the same path without one): the batch in flight at the
    SIGTERM is generated again after the resume, with the checkpoint's weights."""
    schedule = "one-step-off"
    out = tmp_path / "run"
    args = ["trainer.total_steps=200", "trainer.save_freq=0", "trainer.preemption_grace_s=20", *SCHEDULES[schedule]]
    run = Run(out, args)
    wait_for_step(out, 3)
    sent = time.monotonic()
    run.proc.send_signal(signal.SIGTERM)  # the driver only, as the kubelet does to the job's process
    code = run.wait(timeout=60)
    assert code == 143, run.output()[-3000:]
    assert time.monotonic() - sent < 20  # inside the grace period
    last = max(m["step"] for m in metrics(out))
    ckpt = checkpoint.find_resume(out, "auto")
    assert ckpt is not None and ckpt.name == f"step_{last}" and not checkpoint.problems(ckpt)
    assert f"SIGTERM: stopped with a checkpoint of step {last}" in run.output()

    again = Run(out, [f"trainer.total_steps={last + 2}", *SCHEDULES[schedule]])
    assert again.wait() == 0, again.output()[-3000:]
    assert f"resuming from {ckpt}" in again.output()
    assert [m["step"] for m in metrics(out)] == list(range(1, last + 3))
    assert all(m["rollout/staleness"] <= (schedule != "on-policy") for m in metrics(out))
