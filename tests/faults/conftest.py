"""Helpers for the fault tests: a small, fast variant of the tiny recipe, and runs of the CLI that a test can kill."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpo_ray.telemetry.dumps import read_samples
from tests.conftest import LEAN, ROOT

RECIPE = ROOT / "recipes" / "tiny-cpu.yaml"
FAST = [
    "data.train_batch_size=4",
    "algorithm.group_size=4",
    "learner.mini_batch_size=16",
    "learner.micro_batch_size=8",
    "trainer.test_freq=0",
    "trainer.val_before_train=false",
    "trainer.loggers=[console,jsonl]",
    "trainer.dump_freq=1",
    # no KL term, no reference actor, one learner rank: two actors' start-up less a run (none of these faults is
    # the reference's; the one of a learner rank's asks for two ranks)
    *LEAN,
]

SCHEDULES = {
    "on-policy": [],
    "one-step-off": ["algorithm.max_staleness=1", "algorithm.rollout_correction.rollout_is=token"],
}
"""The faults that meet a batch in flight are tried under both schedules."""


class Run:
    """`grpo-ray train` in its own process group (so the test can kill the whole job, Ray included)."""

    def __init__(self, out: Path, overrides: list[str], env: dict | None = None):
        self.out = out
        self.log = open(out.parent / f"{out.name}.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "grpo_ray", "train", str(RECIPE), *FAST, f"trainer.output_dir={out}", *overrides],
            cwd=ROOT,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )

    def wait(self, timeout: float = 600) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self.kill()

    def kill(self, sig=signal.SIGKILL) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass
        if sig == signal.SIGKILL:
            self.proc.wait(60)
            self.log.close()

    def output(self) -> str:
        return (self.out.parent / f"{self.out.name}.log").read_text(errors="replace")


def differing(rows: list[dict], plain: list[dict]) -> set[str]:
    """The keys whose value in some step of `rows` is not the uninterrupted run's (`plain`), timings aside
    (benchmarks/same_metrics.py's TIMED); the two runs must have the same steps."""
    from benchmarks.same_metrics import TIMED

    return {
        k
        for a, b in zip(rows, plain, strict=True)
        for k in a
        if not k.startswith(TIMED) and not k.endswith(("/seconds", "_s")) and a[k] != b.get(k)
    }


def metrics(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for_step(out: Path, step: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(m["step"] >= step for m in metrics(out)):
            return
        time.sleep(0.2)
    raise TimeoutError(f"no step {step} in {out} after {timeout}s")


def dump(out: Path, step: int) -> list[dict]:
    return read_samples(out / "rollouts" / f"train_data_step{step}.jsonl")


@pytest.fixture
def faults_env(tmp_path):
    """GRPO_RAY_FAULTS_DIR for the markers that make each injected fault fire once."""
    markers = tmp_path / "fault-markers"
    markers.mkdir()
    return {"GRPO_RAY_FAULTS_DIR": str(markers)}


SECRETS = {
    "HF_TOKEN": "hf_planted-fake-token-0123456789",
    "WANDB_API_KEY": "wandb-planted-key-9876543210",
    "MY_SERVICE_PASSWORD": "planted-password-42",
}
"""Tokens planted in the environment of `nan_run` (tests/faults/test_secrets.py looks for them in every output)."""


@pytest.fixture(scope="session")
def nan_run(tmp_path_factory) -> Iterator[tuple[Path, str, Path]]:
    """One step off, 4 steps, a NaN loss injected at step 2 (tests/faults/test_nonfinite.py), with tokens planted
    in its environment that the recipe passes on to vLLM as a user with a gated model would, and every file logger
    on (tests/faults/test_secrets.py): its folder, its console and the Ray session's folder it ran in."""
    base = tmp_path_factory.mktemp("nan")
    markers = base / "fault-markers"
    markers.mkdir()
    out = base / "run"
    # Ray's folders under one of its own (short: Ray's unix socket paths), so that the session read back is this
    # run's, whatever runs beside it
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    env = {**SECRETS, "GRPO_RAY_FAULTS_DIR": str(markers), "GRPO_RAY_FAULTS": "nan_loss@2", "RAY_TMPDIR": str(ray_tmp)}
    run = Run(
        out,
        [
            "trainer.total_steps=4",
            "trainer.save_freq=4",  # a checkpoint at the end only: the steps' schedule is the one tested
            *SCHEDULES["one-step-off"],
            "trainer.loggers=[console,jsonl,tensorboard]",
            "+generator.vllm_kwargs.hf_token=${oc.env:HF_TOKEN}",
        ],
        env,
    )
    assert run.wait() == 0, run.output()[-3000:]
    yield out, run.output(), (ray_tmp / "ray" / "session_latest").resolve()
    shutil.rmtree(ray_tmp, ignore_errors=True)
