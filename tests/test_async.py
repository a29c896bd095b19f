"""The one-step-off schedule (algorithm.max_staleness=1): the next batch is generated while this one trains,
no sample older than the bound is trained on, and a killed run resumes exactly."""

import json

import pytest

from tests.conftest import run_cli
from tests.test_checkpoint import assert_same_metrics, whole_and_resumed

pytestmark = pytest.mark.slow

ASYNC = ["algorithm.max_staleness=1", "algorithm.rollout_correction.rollout_is=token"]
# responses of up to 24 tokens (the task's EOS ends most sooner): generation takes long enough to overlap
SHORT = ["trainer.total_steps=5", "trainer.test_freq=0", "trainer.val_before_train=false",
         "trainer.loggers=[console,jsonl]", "generator.sampling.max_tokens=24"]


def rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def schedules(tmp_path_factory):
    """The same short run on-policy and one step off."""
    out = {}
    for name, extra in (("on-policy", []), ("async", ASYNC)):
        out[name] = tmp_path_factory.mktemp(name)
        res = run_cli("train", "recipes/tiny-cpu.yaml", *SHORT, *extra, f"trainer.output_dir={out[name]}",
                      timeout=900)
        assert res.returncode == 0, res.stderr[-3000:]
    return out


def test_next_batch_is_generated_while_this_one_trains(schedules):
    """From the engines' and the learner's clocks: batch k+1's generation starts before step k's update ends
    one step off, and only after it (and the push) on policy."""
    on, off = rows(schedules["on-policy"]), rows(schedules["async"])
    assert all(r["perf/gen_ahead_s"] < 0 for r in on[1:])
    assert all(r["perf/gen_ahead_s"] > 0 for r in off[1:])
    assert all(r["perf/gen_overlap_s"] == 0 for r in on)


def test_no_sample_is_older_than_the_bound(schedules):
    on, off = rows(schedules["on-policy"]), rows(schedules["async"])
    assert [r["rollout/staleness"] for r in on] == [0] * 5
    assert [r["rollout/staleness"] for r in off] == [0, 1, 1, 1, 1]
    assert [r["rollout/policy_version"] for r in off] == [0, 0, 1, 2, 3]
    assert [r["actor/policy_version"] for r in off] == [0, 1, 2, 3, 4]
    # the old policy of a stale batch is the learner at the version that generated it, not logp.detach()
    assert [r["actor/old_log_prob_recomputed"] for r in off] == [0, 1, 1, 1, 1]
    for r in on + off:  # fp32 on CPU: sampler and learner agree on the sampled tokens at the same weights
        assert abs(r["rollout_corr/kl"]) < 1e-5 and r["rollout_corr/rollout_is_max"] < 1.001
    for step, version in ((2, 0), (5, 3)):  # each dumped sample names the weights that generated it
        dump = (schedules["async"] / "rollouts" / f"train_data_step{step}.jsonl").read_text().splitlines()
        assert {json.loads(line)["policy_version"] for line in dump} == {version}


def test_async_dump_of_the_first_step_replays(schedules):
    out = schedules["async"]
    res = run_cli("replay", "recipes/tiny-cpu.yaml", str(out / "rollouts" / "train_data_step1.jsonl"), *ASYNC,
                  f"trainer.output_dir={out}")
    assert res.returncode == 0, res.stderr[-4000:]
    replayed = json.loads(res.stdout[res.stdout.index("{"):])
    for key in ("actor/grad_norm", "actor/pg_loss", "actor/entropy", "rollout_corr/kl"):
        assert replayed[key] == pytest.approx(rows(out)[0][key], rel=1e-4, abs=1e-7), key


def test_async_resume_after_sigkill_repeats_the_uninterrupted_run(tmp_path_factory):
    """Before a scheduled checkpoint the next batch waits for the step's weights, so the run resumed from it
    generates that batch with the same seeds and the same version as the uninterrupted run did."""
    whole, killed = whole_and_resumed(tmp_path_factory, ASYNC)
    assert_same_metrics(whole, killed)
    assert [r["rollout/policy_version"] for r in rows(whole)] == [0, 0, 2, 2]  # step 3 after the save: fresh
