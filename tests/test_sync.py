"""Weight sync learner -> vLLM generator over a gloo group: a round trip through the real pools."""

import json

import pytest
import torch

from grpo_ray import sync
from grpo_ray.config import load_recipe
from grpo_ray.controller import Controller
from grpo_ray.setup_run import setup_run
from grpo_ray.types import Prompt
from tests.conftest import ROOT, TINY, tiny_rollouts


def test_bucket_plan_is_shared_by_sender_and_receiver():
    metas = [sync.WeightMeta("a", (4, 4), "float32"), sync.WeightMeta("b", (4,), "float32"),
             sync.WeightMeta("c", (8,), "bfloat16"), sync.WeightMeta("d", (100,), "float32")]
    # 64 + 16 bytes fit in 96; the dtype changes at c; d alone is larger than a bucket
    assert sync.plan_buckets(metas, 96) == [[0, 1], [2], [3]]
    assert sync.backend_for("cpu") == "gloo" and sync.backend_for("cuda") == "nccl"


@pytest.mark.slow
def test_sync_round_trip_through_the_pools(ray_local, tmp_path):
    recipe = load_recipe(ROOT / "recipes" / "tiny-cpu.yaml", [
        f"model.path={TINY.format(arch='qwen2')}", f"trainer.output_dir={tmp_path}", "data.train_batch_size=4",
        "algorithm.group_size=4", "learner.mini_batch_size=16", "learner.micro_batch_size=8",
        "data.max_prompt_length=200", "trainer.bucket_mb=1"])
    c = Controller(recipe, setup_run(recipe))
    try:
        c.start()
        assert c.probe() < 1e-5  # the same checkpoint on both sides
        rollouts = [ray_local.put(r) for r in tiny_rollouts(vocab=300, prompts=4, group=4)]
        ray_local.get([l.train.remote(rollouts, None, torch.linspace(-2, 2, 16).tolist()) for l in c.pools.actors["learner"]])
        before = c.probe()
        assert before > 1e-3  # the learner moved, the generator did not yet
        synced = c.sync_weights()
        assert synced["sync/logprob_diff"] < 1e-5 and synced["sync/GBps"] > 0
        rollout, stats = c.generate([Prompt(c.inputs.probe_ids, "1", "test")], 2, step=1)
        rollout, stats = rollout[0], stats[0]
        assert stats.policy_version == 1 == ray_local.get(rollout).policy_version
        placement = json.loads((tmp_path / "placement.json").read_text())
        assert {p: len(a) for p, a in placement.items()} == {"generator": 1, "learner": 2, "reference": 1, "reward": 1}
        pids = [a["pid"] for actors in placement.values() for a in actors]
        assert len(set(pids)) == 5  # every actor is its own process
    finally:
        c.shutdown()
