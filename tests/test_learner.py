"""The FSDP2 learner over 2 gloo ranks against 1 process on the same batch."""

import pytest
import torch

from grpo_ray import models
from grpo_ray.config import load_recipe
from grpo_ray.roles.learner import Learner
from tests.conftest import ROOT, TINY, tiny_rollouts

pytestmark = pytest.mark.slow


def run_learner(ray, path, world_size, overrides, rollouts, ref_lps, advantages):
    recipe = load_recipe(ROOT / "recipes" / "tiny-cpu.yaml", [f"learner.world_size={world_size}", *overrides])
    actors = [ray.remote(Learner).options(num_cpus=0.5).remote(path, recipe, i, world_size) for i in range(world_size)]
    host, port = ray.get(actors[0].address.remote())
    ray.get([a.setup.remote(host, port) for a in actors])
    refs = [ray.put(r) for r in rollouts]
    ref_refs = [ray.put(x) for x in ref_lps] if ref_lps else None
    probe = [t for c in rollouts[0].prompts for t in c.ids]  # the weights, seen through the sync probe's path
    before = ray.get([a.probe_logprobs.remote(probe) for a in actors])[0]
    metrics = ray.get([a.train.remote(refs, ref_refs, advantages) for a in actors])
    after = ray.get([a.probe_logprobs.remote(probe) for a in actors])[0]
    for a in actors:
        ray.kill(a)
    return metrics, torch.tensor(before), torch.tensor(after)


@pytest.mark.parametrize("overrides", [
    # one mini batch, one epoch: on policy
    ["learner.mini_batch_size=16", "learner.micro_batch_size=4", "algorithm.kl_coef=0.0"],
    # two mini batches, two epochs, KL to a reference: old logprobs come from the learner
    ["learner.mini_batch_size=8", "learner.micro_batch_size=2", "algorithm.ppo_epochs=2", "algorithm.kl_coef=0.1",
     "algorithm.loss_agg=seq-mean"],
])
def test_two_gloo_ranks_match_one_process(ray_local, overrides):
    path = models.resolve(TINY.format(arch="qwen2"))
    rollouts = tiny_rollouts(vocab=300, prompts=4, group=4)
    advantages = torch.linspace(-1.5, 1.5, 16).tolist()
    n = [len(c.token_ids) for r in rollouts for c in r.completions]
    ref_lps = [[[-5.0 - 0.1 * j for j in range(len(c.token_ids))] for c in r.completions] for r in rollouts]
    common = ["data.train_batch_size=4", "algorithm.group_size=4", *overrides]
    one, before1, after1 = run_learner(ray_local, path, 1, common, rollouts, ref_lps, advantages)
    two, before2, after2 = run_learner(ray_local, path, 2, common, rollouts, ref_lps, advantages)
    assert sum(n) > 16
    same = [k for k in two[0] if not k.startswith("timing_s/")]
    assert {k: two[0][k] for k in same} == {k: two[1][k] for k in same}  # both ranks report the reduced metrics
    for key in ("actor/grad_norm", "actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/pg_clipfrac"):
        assert two[0][key] == pytest.approx(one[0][key], rel=1e-4, abs=1e-6), key
    assert one[0]["actor/grad_norm"] > 0
    assert torch.allclose(before1, before2, atol=1e-6)
    assert torch.allclose(after1, after2, atol=1e-5)  # the same update on 1 and on 2 ranks
    assert (after1 - before1).abs().max() > 1e-4  # the step really changed the weights
