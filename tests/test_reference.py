"""The reference pool as one FSDP2 group: sharded over 3 actors (uneven rows, one actor with no share) it scores
what one unsharded actor scores."""

import pytest
import torch

from grpo_ray import models
from grpo_ray.algo.batching import flatten, use_shared
from grpo_ray.config import load_recipe
from grpo_ray.roles.reference import Reference
from tests.conftest import ROOT, TINY, tiny_rollouts

pytestmark = pytest.mark.slow


def reference_pool(ray, path, n, shared: bool | str = False):
    flags = ["reference.micro_batch_size=3", "learner.dtype=float32", f"model.shared_prompt={shared}"]
    recipe = load_recipe(ROOT / "recipes" / "tiny-cpu.yaml", ["generator.sampling.temperature=1.0", *flags])
    actors = [ray.remote(Reference).options(num_cpus=0.25).remote(path, recipe, i, n) for i in range(n)]
    host, port = ray.get(actors[0].address.remote())
    ray.get([a.setup.remote(host, port) for a in actors])
    return actors


@pytest.mark.parametrize("shared", [False, True, "auto"], ids=["packed", "shared-prompts", "auto"])
def test_sharded_reference_matches_one_actor(ray_local, shared):
    """Three actors, packed or with each prompt run once (model.shared_prompt), against one actor packed. Under
    ``auto`` the actors weigh the slots of all their shares together: the actor with no share, which alone would
    choose packed rows, runs the shared layout's forwards with the others (or the group's all-gathers would not
    pair up)."""
    path = models.resolve(TINY.format(arch="qwen2"))
    rollouts = tiny_rollouts(vocab=300, prompts=4, group=4)
    if shared == "auto":
        assert use_shared("auto", flatten(rollouts), 3, True) and not use_shared("auto", [], 3, True)
    refs = [ray_local.put(r) for r in rollouts]
    one = reference_pool(ray_local, path, 1)
    whole, work = ray_local.get(one[0].logprobs.options(num_returns=2).remote(refs))
    three = reference_pool(ray_local, path, 3, shared)
    # shares as the controller cuts them: 7 samples (3 micro batches), 9 samples (3), none (only filler forwards)
    calls = [
        three[0].logprobs.options(num_returns=2).remote([refs[0]], [(0, 7)]),
        three[1].logprobs.options(num_returns=2).remote([refs[0], refs[1]], [(7, 8), (0, 8)]),
        three[2].logprobs.options(num_returns=2).remote([], []),
    ]
    got = ray_local.get([lp for lp, _ in calls])
    shards = ray_local.get(
        three[0].__ray_call__.remote(  # parameters this actor holds, and the model's
            lambda a: (
                sum(p.to_local().numel() for p in a.model.parameters()),
                sum(p.numel() for p in a.model.parameters()),
            )
        )
    )
    for a in one + three:
        ray_local.kill(a)
    assert [len(g) for g in got] == [7, 9, 0] and work.samples == 16
    flat = [x for g in got for lp in g for x in lp]
    assert torch.allclose(torch.tensor(flat), torch.tensor([x for lp in whole for x in lp]), atol=1e-5)
    assert shards[0] < 0.4 * shards[1]  # each actor holds about a third of the weights
