"""The one-step-off schedule (algorithm.max_staleness=1): the next batch is generated while this one trains,
no sample older than the bound is trained on, and a killed run resumes exactly.

One uninterrupted 4-step run and the same run SIGKILLed after its step-2 checkpoint and resumed (the pair
tests/test_checkpoint.py uses too); the on-policy side of each comparison is checked in tests/test_learning.py."""

import json

import pytest

from grpo_ray.telemetry.dumps import read_samples
from tests.conftest import ONE_STEP_OFF as ASYNC
from tests.conftest import run_cli
from tests.test_checkpoint import assert_same_metrics

pytestmark = pytest.mark.slow


def rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def runs(resumed_runs):
    return resumed_runs


@pytest.mark.smoke
def test_next_batch_is_generated_while_this_one_trains(runs):
    """From the engines' and the learner's clocks: batch k+1's generation starts before step k's update ends (it is
    sent before the update is), except after a checkpoint (step 2's), which the next batch waits for."""
    off = rows(runs[0])
    assert [r["perf/gen_ahead_s"] > 0 for r in off[1:]] == [True, False, True]


def test_the_reference_scores_the_next_batch_during_the_update(runs):
    """Once generated, batch k+1's reference logprobs are computed during step k's update (collected ahead), never
    across a checkpoint. Whether a given step's generation ends before its update does depends on the machine's
    load, so of the two steps that may overlap, one must."""
    off = rows(runs[0])
    overlaps = [r["perf/frozen_overlap_s"] > 0 for r in off]
    assert overlaps[0::2] == [False, False] and any(overlaps[1::2])


@pytest.mark.smoke
def test_no_sample_is_older_than_the_bound(runs):
    off = rows(runs[0])
    assert [r["rollout/staleness"] for r in off] == [0, 1, 0, 1]
    assert [r["rollout/policy_version"] for r in off] == [0, 0, 2, 2]  # step 3 after the save: fresh
    assert [r["actor/policy_version"] for r in off] == [0, 1, 2, 3]
    # the old policy of a stale batch is the learner at the version that generated it, not logp.detach()
    assert [r["actor/old_log_prob_recomputed"] for r in off] == [0, 1, 0, 1]
    for r in off:  # fp32 on CPU: sampler and learner agree on the sampled tokens at the same weights
        assert abs(r["rollout_corr/kl"]) < 1e-5 and r["rollout_corr/rollout_is_max"] < 1.001
    for step, version in ((2, 0), (4, 2)):  # each dumped sample names the weights that generated it
        dump = read_samples(runs[0] / "rollouts" / f"train_data_step{step}.jsonl")
        assert {sample["policy_version"] for sample in dump} == {version}


# the slow tier's: a dump's replay is CI's in tests/test_observability.py
def test_async_dump_of_the_first_step_replays(runs):
    out = runs[0]
    res = run_cli(
        "replay",
        "recipes/tiny-cpu.yaml",
        str(out / "rollouts" / "train_data_step1.jsonl"),
        *ASYNC,
        f"trainer.output_dir={out}",
    )
    assert res.returncode == 0, res.stderr[-4000:]
    replayed = json.loads(res.stdout[res.stdout.index("{") :])
    for key in ("actor/grad_norm", "actor/pg_loss", "actor/entropy", "rollout_corr/kl"):
        assert replayed[key] == pytest.approx(rows(out)[0][key], rel=1e-4, abs=1e-7), key


@pytest.mark.smoke
def test_async_resume_after_sigkill_repeats_the_uninterrupted_run(runs):
    """Before a scheduled checkpoint the next batch waits for the step's weights, so the run resumed from it
    generates that batch with the same seeds and the same version as the uninterrupted run did."""
    assert_same_metrics(*runs)
