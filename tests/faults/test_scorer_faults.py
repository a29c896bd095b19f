"""A scorer's actor lost mid-step (issue 78, a first piece): a reference actor (the learner fails as it reads the
missing signal, before it trains; the pool starts again, scores the batch again, and the learner is sent the step
again) and a rule-reward actor (a new one in its place scores its share again). On the quick start (on-policy, fixed
seed, fp32) every metric of every step is the uninterrupted run's, bit for bit, but the restart count."""

import json
import re

import pytest

from grpo_ray import checkpoint
from tests.conftest import ROOT, run_cli
from tests.faults.conftest import differing

pytestmark = pytest.mark.slow

RECIPE = ROOT / "recipes" / "tiny-cpu.yaml"
SAMPLES = 16 * 16  # the quick start's step: train_batch_size x group_size
OVER = ["trainer.total_steps=3", "trainer.val_before_train=false", "trainer.test_freq=0", "trainer.loggers=[jsonl]"]


def run(out, env=None, over=()) -> tuple[list[dict], str]:
    said = run_cli("train", str(RECIPE), *OVER, *over, f"trainer.output_dir={out}", env=env, timeout=900)
    assert said.returncode == 0, said.stdout[-3000:] + said.stderr[-3000:]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()], said.stdout


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The uninterrupted run."""
    return run(tmp_path_factory.mktemp("plain"))[0]


@pytest.mark.parametrize(
    "pool, said",
    [
        ("reference", "a reference actor was lost; started the pool again, scoring the batch again"),
        ("reward", "reward actor 0 was lost; a new one scores its share again"),
    ],
)
def test_a_lost_scorer_actor_is_replaced_and_the_step_trains_as_if_not(plain, tmp_path, pool, said):
    markers = tmp_path / "markers"
    markers.mkdir()
    env = {"GRPO_RAY_FAULTS": f"exit_{pool}@2", "GRPO_RAY_FAULTS_DIR": str(markers)}
    faulted, out = run(tmp_path / "faulted", env)
    key, redone = f"fault/{pool}_restarts", f"fault/{pool}_redone"
    assert [m[key] for m in faulted] == [0, 1, 1] and [m[key] for m in plain] == [0, 0, 0]  # lost once, at step 2
    assert [m[redone] for m in faulted] == [0, SAMPLES, SAMPLES]  # the step's samples (one reward actor: its share)
    assert out.count(said) == 1
    summary = (
        rf"recovered from lost actors \(restarts: {pool} 1\) in [\d.]+ s \([\d.]+ s of it starting new actors\), "
        rf"work done again: {pool} {SAMPLES} samples"
    )
    assert len(re.findall(summary, out)) == 1  # the run's summary
    assert differing(faulted, plain) <= {key, redone}


KEPT = ["trainer.fault_tolerance=all", "learner.mini_batch_size=128"]
"""Copies of the learner's state kept; two optimizer steps a step, so a rank that dies after the first leaves weights
that moved: only the copy taken as the step began gives the uninterrupted run's step."""


@pytest.mark.parametrize(
    "point, said, lost_at, over",
    [
        ("exit_learner@2", "starting the learner group again from the copy of its state as the step began", 2, []),
        # as it pushes step 2's weights: the step trained again from the copy, the engines given the weights again
        ("exit_learner_push@2", "the learner group started again from its copies, the step trained again", 2, []),
        # as it saves step 2's checkpoint (after step 2's metrics): from a copy taken as the save began, no step redone
        (
            "exit_learner_save@2",
            "started again from the copy of the state it was saving, saving again",
            3,
            ["trainer.save_freq=1"],
        ),
    ],
)
def test_a_lost_learner_rank_restarts_the_group_from_its_copy_and_the_step_trains_as_if_not(
    tmp_path, point, said, lost_at, over
):
    plain, _ = run(tmp_path / "plain", over=[*KEPT, *over])
    markers = tmp_path / "markers"
    markers.mkdir()
    env = {"GRPO_RAY_FAULTS": point, "GRPO_RAY_FAULTS_DIR": str(markers)}
    faulted, out = run(tmp_path / "faulted", env, over=[*KEPT, *over])
    key, redone = "fault/learner_restarts", "fault/learner_redone"
    assert [m[key] for m in faulted] == [int(s >= lost_at) for s in (1, 2, 3)] and [m[key] for m in plain] == [0, 0, 0]
    steps = 0 if "save" in point else 1  # the step, trained again
    assert [m[redone] for m in faulted] == [steps * (s >= lost_at) for s in (1, 2, 3)]
    assert out.count(said) == 1
    assert out.count("work done again: learner 1 step (fault/*)") == steps
    assert all(m["fault/learner_copy_mb"] > 0 for m in plain)
    if "push" in point:  # the engine's receive failed as rank 0 closed its end: replaced, as after any failed push
        assert [m["fault/generator_restarts"] for m in faulted] == [0, 1, 1]
    if "save" in point:  # step 2's checkpoint, written again by the new group: whole, its shards the plain run's
        shards = {
            run: {f.name: f.read_bytes() for f in (tmp_path / run / "checkpoints/step_2/learner").glob("*.distcp")}
            for run in ("plain", "faulted")
        }
        assert shards["faulted"] and shards["faulted"] == shards["plain"]
        assert checkpoint.problems(tmp_path / "faulted" / "checkpoints" / "step_2") == []
    assert differing(faulted, plain) <= {key, redone, "fault/generator_restarts"}


@pytest.mark.parametrize(
    "point, saves, steps, start",
    [
        ("exit_learner_copy@2", 1, 3, 1),  # the copy of step 2's checkpoint as its save begins: from step 1's
        ("exit_learner_copy@3", 2, 4, 2),  # the copy as step 4 starts (no save after step 3): from step 2's
    ],
)
def test_a_learner_rank_lost_with_its_copy_starts_the_run_again_in_the_job_from_its_checkpoint(
    tmp_path, point, saves, steps, start
):
    """trainer.fault_tolerance=all: the last rank exits as it copies its state, so that copy never reaches the
    keeper and the group cannot be started from it (``StateLost``). The same job starts the run again from its
    newest whole checkpoint, as a retried job would, and finishes: each step after the checkpoint trained again
    and in metrics.jsonl once, every metric the uninterrupted run's, bit for bit (on-policy, fixed seed, fp32: a
    resumed run trains as the run it resumes)."""
    over = [*KEPT, f"trainer.save_freq={saves}", f"trainer.total_steps={steps}"]
    plain, _ = run(tmp_path / "plain", over=over)
    markers = tmp_path / "markers"
    markers.mkdir()
    env = {"GRPO_RAY_FAULTS": point, "GRPO_RAY_FAULTS_DIR": str(markers)}
    faulted, out = run(tmp_path / "faulted", env, over=over)
    assert (markers / point).exists()  # the rank did exit there
    again = re.findall(
        r"learner: no copy of its state to start it again from \(.*\); starting the run again in this job from (\S+) "
        r"\(step (\d+); steps \d+ on trained again, (\d+) of them done before\)",
        out,
    )
    assert again == [(str(tmp_path / "faulted" / "checkpoints" / f"step_{start}"), str(start), "1")], out[-3000:]
    assert [m["step"] for m in faulted] == list(range(1, steps + 1))
    assert differing(faulted, plain) <= {"fault/learner_restarts"}, differing(faulted, plain)
