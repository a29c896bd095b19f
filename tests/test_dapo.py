"""DAPO's dynamic sampling in a real run: only groups whose rewards differ are trained on, more prompts are
generated until the batch is full (up to a bound), and the counts are reported."""

import json
from collections import defaultdict

import pytest

from grpo_ray.dumps import read_samples
from tests.conftest import run_cli

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
    "algorithm.kl_coef=0",  # no reference actor, one learner rank: the groups' filter is the controller's
    "learner.world_size=1",
]


@pytest.mark.parametrize("schedule", ["batched", "streaming"])
def test_dynamic_sampling_trains_on_groups_with_signal(tmp_path, schedule):
    """Batched, more batches are launched; streaming, more prompts are sent into the stream and as many groups taken
    from it as they finish."""
    # from random init the select task scores about 1 in 100: most groups are all 0, so batches run short
    streaming = ["algorithm.max_staleness=2", "algorithm.rollout_correction.rollout_is=token"]
    res = run_cli(
        "train",
        "recipes/tiny-cpu.yaml",
        *SMALL,
        f"algorithm.schedule={schedule}",
        *(streaming if schedule == "streaming" else []),
        f"trainer.output_dir={tmp_path}",
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.max_num_gen_batches=3",
        "algorithm.overlong_buffer.len=1",
        "algorithm.overlong_buffer.penalty_factor=0.5",
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        gen, kept, dropped = (row[f"filter_groups/{k}"] for k in ("num_gen_batches", "kept_groups", "dropped_groups"))
        assert 1 <= gen <= 3 and kept + dropped == 4 * gen  # every group generated is counted once
        assert gen == 3 or kept >= 4  # more batches only while short, up to the bound
        assert row["filter_groups/filled_groups"] == max(0, 4 - kept)
        assert row["reward/overlong_penalty/mean"] == pytest.approx(-0.5)  # every response is 1 token = max_tokens
        step = read_samples(tmp_path / "rollouts" / f"train_data_step{row['step']}.jsonl")
        groups = defaultdict(list)
        for line in step:
            groups[line["uid"]].append(line["score"])
        assert len(step) == 16 and len(groups) == 4 and all(len(g) == 4 for g in groups.values())
        with_signal = sum(max(g) > min(g) for g in groups.values())
        assert with_signal == min(kept, 4)  # the kept groups first; the rest filled with dropped ones
    # the stream moves past every prompt generated, dropped ones included: no prompt comes back in this run
    seen = [
        sample["uid"] for s in (1, 2, 3) for sample in read_samples(tmp_path / "rollouts" / f"train_data_step{s}.jsonl")
    ]
    assert len(set(seen)) == 12
