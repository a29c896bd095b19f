"""DAPO's dynamic sampling in a real run: only groups whose rewards differ are trained on, more prompts are
generated until the batch is full (up to a bound), and the counts are reported.

CI's tier runs it streaming, and the same run carries three more paths a user takes, each checked on it: the delta
weight transport (a bfloat16 engine at a small learning rate: every push after the first sends only what changed,
the engine's logprobs the learner's), and rows of two sources, the synthetic task's and reasoning-gym's (its own
code, its rows and score): a user's reward scores every row (it pays half the answers, so that groups differ from
random weights), reasoning-gym's its own rows alone (routed by data_source, as verl routes them)."""

import json
from collections import defaultdict

import pytest

from grpo_ray.telemetry.dumps import read_samples
from tests.conftest import LEAN, run_cli

pytestmark = pytest.mark.slow

SMALL = [
    "data.train_batch_size=4",
    "algorithm.group_size=4",
    "learner.mini_batch_size=16",
    "learner.micro_batch_size=8",
    "trainer.test_freq=0",
    "trainer.val_before_train=false",
    "trainer.loggers=[jsonl]",
    "trainer.total_steps=3",
    "trainer.dump_freq=1",
    # no reference actor, one learner rank: the groups' filter is the controller's
    *LEAN,
]
DAPO = [
    "algorithm.filter_groups.enable=true",
    "algorithm.filter_groups.max_num_gen_batches=3",
    "algorithm.overlong_buffer.len=1",
    "algorithm.overlong_buffer.penalty_factor=0.5",
]
STREAMING = ["algorithm.max_staleness=2", "algorithm.rollout_correction.rollout_is=token"]
RG = "reasoning_gym/basic_arithmetic"
HALF = "tests.helpers.varied_rewards:half"
TWO_SOURCES = [
    "data.train_files=[synthetic://select?size=200&seed=0,reasoning_gym://basic_arithmetic?size=200&seed=0&max_terms=2]",
    f"reward.functions=[{{name: '{HALF}'}}, {{name: reasoning_gym, sources: [{RG}]}}]",
]
DELTA = [
    "trainer.weight_transport=delta",
    "generator.dtype=bfloat16",  # the wire's dtype: at a small learning rate most bf16 values do not change a step
    "learner.optim.lr=1e-5",
    "trainer.max_sync_logprob_diff=1e-2",
]


def run_dapo(out, schedule: str, *more: str) -> list[dict]:
    res = run_cli(
        "train",
        "recipes/tiny-cpu.yaml",
        *SMALL,
        *DAPO,
        f"algorithm.schedule={schedule}",
        *(STREAMING if schedule == "streaming" else []),
        f"trainer.output_dir={out}",
        *more,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def streamed(tmp_path_factory):
    """Three streaming DAPO steps, weights pushed as deltas, rows of two sources."""
    out = tmp_path_factory.mktemp("dapo-streamed")
    return out, run_dapo(out, "streaming", *DELTA, *TWO_SOURCES)


def check_dynamic_sampling(out, rows: list[dict]) -> None:
    for row in rows:
        gen, kept, dropped = (row[f"filter_groups/{k}"] for k in ("num_gen_batches", "kept_groups", "dropped_groups"))
        assert 1 <= gen <= 3 and kept + dropped == 4 * gen  # every group generated is counted once
        assert gen == 3 or kept >= 4  # more batches only while short, up to the bound
        assert row["filter_groups/filled_groups"] == max(0, 4 - kept)
        assert row["reward/overlong_penalty/mean"] == pytest.approx(-0.5)  # every response is 1 token = max_tokens
        step = read_samples(out / "rollouts" / f"train_data_step{row['step']}.jsonl")
        groups = defaultdict(list)
        for line in step:
            groups[line["uid"]].append(line["score"])
        assert len(step) == 16 and len(groups) == 4 and all(len(g) == 4 for g in groups.values())
        with_signal = sum(max(g) > min(g) for g in groups.values())
        assert with_signal == min(kept, 4)  # the kept groups first; the rest filled with dropped ones


@pytest.mark.smoke
def test_dynamic_sampling_trains_on_groups_with_signal_streaming(streamed):
    """Streaming, more prompts are sent into the stream and as many groups taken from it as they finish; the
    stream moves past every prompt generated, dropped ones included: no prompt comes back in this run."""
    out, rows = streamed
    check_dynamic_sampling(out, rows)
    seen = [sample["uid"] for s in (1, 2, 3) for sample in read_samples(out / "rollouts" / f"train_data_step{s}.jsonl")]
    assert len(set(seen)) == 12


@pytest.mark.smoke
def test_delta_pushes_send_only_what_changed_and_the_engine_matches(streamed):
    """The delta transport in a run: the first push whole; each after it a share of the elements, sent as fewer
    bytes than a whole push, as the step's update changed them; the probe's logprobs the learner's within what bf16
    rounding gives (the bound the recipe takes)."""
    _, rows = streamed
    assert rows[0]["sync/changed_share"] == 1.0 and rows[0]["sync/bytes_share"] >= 0.999  # the first push: whole
    for r in rows[1:]:
        assert r["actor/grad_norm"] > 0 and 0 < r["sync/changed_share"] < 0.5, r
        assert r["sync/bytes_share"] < 1, r
    assert all(r["sync/logprob_diff"] < 1e-2 for r in rows)


@pytest.mark.smoke
def test_rows_of_two_sources_are_each_scored_by_their_own_reward(streamed):
    """reasoning-gym's rows (its library's generator) are scored by its reward (its library's score_answer) beside the
    user's, the synthetic task's by the user's alone; both sources trained."""
    out, _ = streamed
    sources = defaultdict(int)
    for step in (1, 2, 3):
        for sample in read_samples(out / "rollouts" / f"train_data_step{step}.jsonl"):
            source, scores = sample["data_source"], sample["rewards"]
            sources[source] += 1
            assert scores[HALF] in (0.0, 1.0), scores
            if source == RG:  # (a function that does not score the row's source has no score there)
                assert 0 <= scores["reasoning_gym"] <= 1, scores
            else:
                assert "reasoning_gym" not in scores, scores
    assert sources[RG] > 0 and sources["synthetic/select"] > 0, dict(sources)


def test_dynamic_sampling_trains_on_groups_with_signal_batched(tmp_path):
    """Batched, more batches are launched (from random init the select task scores about 1 in 100: most groups are
    all 0, so batches run short)."""
    check_dynamic_sampling(tmp_path, run_dapo(tmp_path, "batched"))
