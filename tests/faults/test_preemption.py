"""Item 7: SIGTERM (a preemption notice) finishes the step, writes a checkpoint within the grace period and exits
143, which a RayJob counts as a failed attempt and submits again; the same command then resumes."""

import random
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


def test_sigterm_while_streaming_keeps_every_prompt_in_flight(tmp_path):
    """Streaming, the next step's groups taken ahead (max_staleness 2): a SIGTERM checkpoint keeps the prompts the
    engines hold and those taken for the next step; the resumed run sends them first, so every prompt sent is
    trained once, none twice, none skipped, each group whole."""
    from collections import Counter

    from grpo_ray.telemetry.dumps import read_samples

    streaming = [
        "algorithm.schedule=streaming",
        "algorithm.max_staleness=2",
        "algorithm.rollout_correction.rollout_is=token",
    ]
    out = tmp_path / "run"
    run = Run(out, ["trainer.total_steps=200", "trainer.save_freq=0", "trainer.preemption_grace_s=20", *streaming])
    wait_for_step(out, 3)
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait(timeout=60) == 143, run.output()[-3000:]
    last = max(m["step"] for m in metrics(out))
    again = Run(out, [f"trainer.total_steps={last + 3}", *streaming])
    assert again.wait() == 0, again.output()[-3000:]
    assert [m["step"] for m in metrics(out)] == list(range(1, last + 4))
    uids = Counter(
        s["uid"] for step in range(1, last + 4) for s in read_samples(out / "rollouts" / f"train_data_step{step}.jsonl")
    )
    assert len(uids) == (last + 3) * 4 and set(uids.values()) == {4}  # 4 prompts x 4 samples a step, none twice
    # and none skipped: the last step takes what is left, so steps 1 to N train the stream's first N batches (its
    # order: the rows shuffled by the run's seed, 0, for epoch 0)
    order = list(range(20000))
    random.Random("0/0").shuffle(order)
    assert set(uids) == set(order[: (last + 3) * 4])
