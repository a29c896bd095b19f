"""A reference actor lost mid-step (issue 78, a first piece: a token scorer survives losing an actor): the learner
fails as it reads the missing signal, before it trains, the reference pool starts again and scores the batch again,
and the learner is sent the step again. On the quick start (on-policy, fixed seed, fp32) every metric of every step
is the uninterrupted run's, bit for bit, but the restart count."""

import json

import pytest

from benchmarks.same_metrics import TIMED
from tests.conftest import ROOT, run_cli

pytestmark = pytest.mark.slow

RECIPE = ROOT / "recipes" / "tiny-cpu.yaml"
OVER = ["trainer.total_steps=3", "trainer.val_before_train=false", "trainer.test_freq=0", "trainer.loggers=[jsonl]"]


def run(out, env=None) -> tuple[list[dict], str]:
    said = run_cli("train", str(RECIPE), *OVER, f"trainer.output_dir={out}", env=env, timeout=900)
    assert said.returncode == 0, said.stdout[-3000:] + said.stderr[-3000:]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()], said.stdout


def test_a_lost_reference_actor_restarts_its_pool_and_the_step_trains_as_if_not(tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    env = {"GRPO_RAY_FAULTS": "exit_reference@2", "GRPO_RAY_FAULTS_DIR": str(markers)}
    faulted, said = run(tmp_path / "faulted", env)
    plain, _ = run(tmp_path / "plain")
    assert [m["fault/reference_restarts"] for m in faulted] == [0, 1, 1]  # lost at its second call, once
    assert said.count("a reference actor was lost; started the pool again") == 1
    assert [m["fault/reference_restarts"] for m in plain] == [0, 0, 0]
    for a, b in zip(faulted, plain):
        same = [k for k in a if not k.startswith(TIMED) and not k.endswith(("/seconds", "_s"))]
        differ = {k: (a[k], b.get(k)) for k in same if a[k] != b.get(k)}
        assert set(differ) <= {"fault/reference_restarts"}, differ
