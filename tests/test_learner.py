"""The FSDP2 learner over 2 gloo ranks against 1 process on the same batch."""

import dataclasses

import pytest
import torch

from grpo_ray import models
from grpo_ray.algo.batching import flatten, forward_work
from grpo_ray.config import load_recipe
from grpo_ray.models.dims import model_dims
from grpo_ray.roles.learner import Learner
from grpo_ray.telemetry import perf
from tests.conftest import ROOT, TINY, tiny_rollouts

pytestmark = pytest.mark.slow


def run_learner(ray, path, world_size, overrides, rollouts, ref_lps, advantages, teacher_lps=None):
    recipe = load_recipe(ROOT / "recipes" / "tiny-cpu.yaml", [f"learner.world_size={world_size}", *overrides])
    actors = [ray.remote(Learner).options(num_cpus=0.5).remote(path, recipe, i, world_size) for i in range(world_size)]
    host, port = ray.get(actors[0].address.remote())
    ray.get([a.setup.remote(host, port) for a in actors])
    refs = [ray.put(r) for r in rollouts]
    signals = {"kl": [ray.put(x) for x in ref_lps]} if ref_lps else {}
    probe = [t for c in rollouts[0].prompts for t in c.ids]  # the weights, seen through the sync probe's path
    before = ray.get([a.probe_logprobs.remote(probe) for a in actors])[0]
    if teacher_lps:
        signals["distill"] = [ray.put(x) for x in teacher_lps]
    updates = ray.get([a.train.remote(refs, advantages, 0, signals, None, probe) for a in actors])
    after = ray.get([a.probe_logprobs.remote(probe) for a in actors])[0]
    for u in updates:  # the update's own probe, which the controller's sync checks the engines against
        assert u.probe == pytest.approx(after, abs=1e-6)
    metrics = [u.metrics for u in updates]
    for a in actors:
        ray.kill(a)
    return metrics, torch.tensor(before), torch.tensor(after)


# CI's tier runs the two richest: several mini batches and epochs, KL, dual clip, entropy, two aggregations
@pytest.mark.parametrize(
    "overrides",
    [
        # one mini batch, one epoch: on policy
        ["learner.mini_batch_size=16", "learner.micro_batch_size=4", "algorithm.kl_coef=0.0"],
        # two mini batches, two epochs, KL to a reference: old logprobs come from the learner
        pytest.param(
            [
                "learner.mini_batch_size=8",
                "learner.micro_batch_size=2",
                "algorithm.ppo_epochs=2",
                "algorithm.kl_coef=0.1",
                "algorithm.loss_agg=seq-mean-token-mean",
                "algorithm.loss_options.clip_ratio_c=3",  # vanilla's dual clip
            ],
            marks=pytest.mark.smoke,
        ),
        # every other aggregation, each with another policy loss
        pytest.param(
            [
                "learner.mini_batch_size=8",
                "learner.micro_batch_size=2",
                "algorithm.ppo_epochs=2",
                "algorithm.kl_coef=0.0",
                "algorithm.loss_agg=seq-mean-token-sum",
                "algorithm.loss_mode=gspo",
                "algorithm.entropy_coeff=0.01",
            ],
            marks=pytest.mark.smoke,
        ),
        [
            "learner.mini_batch_size=8",
            "learner.micro_batch_size=2",
            "algorithm.ppo_epochs=2",
            "algorithm.kl_coef=0.0",
            "algorithm.loss_agg=seq-mean-token-sum-norm",
            "algorithm.loss_mode=cispo",
        ],
    ],
    ids=["on-policy", "seq-mean-token-mean", "seq-mean-token-sum+gspo", "seq-mean-token-sum-norm+cispo"],
)
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


def test_ranks_whose_shares_cut_into_different_micro_batch_counts_pair_their_collectives(ray_local):
    """Each rank cuts its own share: packed into rows as long as its own longest sample, rank 0's four samples of 9
    tokens make 4 micro batches of one row, rank 1's of 13, 5, 5, 5 tokens 3 (13 | 5 + 5 | 5). FSDP2's forwards and
    backwards are collectives, so rank 1 runs one on a filler (a loss of 0); before, rank 0 waited in an all-gather
    for a forward rank 1 never ran (found hung one step off in benchmarks/speed.py). The update equals one
    process's on all eight samples."""
    from grpo_ray.types import Completion, Prompt, Rollout

    path = models.resolve(TINY.format(arch="qwen2"))
    rollouts = [
        Rollout(
            [Prompt([11, 12, 13, 14], "1", "test")],
            [Completion(0, [20 + j] * n, "", [-4.0 - 0.1 * j] * n, "stop") for j, n in enumerate(lengths)],
            0,
        )
        for lengths in ([5, 5, 5, 5], [9, 1, 1, 1])
    ]
    advantages = [1.0, -1.0, 0.5, -0.5, 1.0, -1.0, 0.5, -0.5]
    common = [
        "data.train_batch_size=2",
        "algorithm.group_size=4",
        "learner.mini_batch_size=8",
        "learner.micro_batch_size=1",
        "algorithm.kl_coef=0.0",
        "model.shared_prompt=false",
    ]
    one, before1, after1 = run_learner(ray_local, path, 1, common, rollouts, None, advantages)
    two, before2, after2 = run_learner(ray_local, path, 2, common, rollouts, None, advantages)
    for key in ("actor/grad_norm", "actor/pg_loss", "actor/entropy"):
        assert two[0][key] == pytest.approx(one[0][key], rel=1e-4, abs=1e-6), key
    assert torch.allclose(before1, before2, atol=1e-6) and torch.allclose(after1, after2, atol=1e-5)
    assert (after1 - before1).abs().max() > 1e-4


def test_distillation_in_the_learner_is_the_same_packed_padded_shared_and_over_ranks(ray_local):
    """The teacher's per-token signal in the learner actors: the step's reverse KL and update are the same with
    padded rows, packed rows and shared prompts, and on 2 gloo ranks as in 1 process; with LoRA it trains the
    adapters on the same signal (the teacher is a pool of its own, not the adapters-off model)."""
    path = models.resolve(TINY.format(arch="qwen2"))
    rollouts = tiny_rollouts(vocab=300, prompts=4, group=4)
    advantages = torch.linspace(-1.5, 1.5, 16).tolist()
    teacher = [[[-7.0 + 0.2 * (j % 3) for j in range(len(c.token_ids))] for c in r.completions] for r in rollouts]
    common = [
        "data.train_batch_size=4",
        "algorithm.group_size=4",
        "learner.mini_batch_size=8",
        "learner.micro_batch_size=2",
        "algorithm.kl_coef=0.0",
        "teacher.kl_coef=0.5",
        "teacher.reward_weight=1.0",
    ]
    layouts = {
        "packed": (2, ["model.sequence_packing=true", "model.shared_prompt=false"]),
        "padded": (2, ["model.sequence_packing=false", "model.shared_prompt=false"]),
        "shared prompts": (2, ["model.shared_prompt=true"]),
        "one process": (1, ["model.sequence_packing=true", "model.shared_prompt=false"]),
    }
    got = {
        name: run_learner(ray_local, path, w, [*common, *extra], rollouts, None, advantages, teacher)
        for name, (w, extra) in layouts.items()
    }
    packed = got["packed"][0][0]
    assert packed["distill/reverse_kl"] > 0.5  # random weights sit near uniform (about -6); the teacher about -7
    assert 0 < packed["distill/advantage_share"] < 1
    for name, (metrics, _, after) in got.items():
        for key in ("distill/reverse_kl", "distill/advantage_share", "actor/pg_loss", "actor/grad_norm"):
            assert metrics[0][key] == pytest.approx(packed[key], rel=1e-4), (name, key)
        assert torch.allclose(after, got["packed"][2], atol=1e-5), name
    lora, before, after = run_learner(
        ray_local, path, 2, [*common, "model.lora.rank=8"], rollouts, None, advantages, teacher
    )
    assert lora[0]["distill/reverse_kl"] == pytest.approx(packed["distill/reverse_kl"], rel=1e-4)  # adapters start at 0
    assert (after - before).abs().max() > 1e-5


def test_a_users_own_policy_loss_runs_in_the_learner_actors(ray_local):
    """algorithm.loss_mode=module:function, imported inside the learner actors (2 gloo ranks): a third of PPO's
    clipped term gives a third of vanilla's loss and of its gradient's norm (before clipping), and a step. (Not
    a third of the weights' move: Adam's first step is about the gradient's sign.)"""
    path = models.resolve(TINY.format(arch="qwen2"))
    rollouts = tiny_rollouts(vocab=300, prompts=4, group=4)
    advantages = torch.linspace(-1.5, 1.5, 16).tolist()
    common = [
        "data.train_batch_size=4",
        "algorithm.group_size=4",
        "learner.mini_batch_size=16",
        "learner.micro_batch_size=4",
        "algorithm.kl_coef=0.0",
    ]
    mine, _, after_mine = run_learner(
        ray_local,
        path,
        2,
        [*common, "algorithm.loss_mode=tests.helpers.my_algo:scaled_vanilla", "algorithm.loss_options.scale=0.25"],
        rollouts,
        None,
        advantages,
    )
    ppo, before, after_ppo = run_learner(ray_local, path, 2, common, rollouts, None, advantages)
    assert mine[0]["actor/pg_loss"] == pytest.approx(ppo[0]["actor/pg_loss"] / 4, rel=1e-5)  # its option reached it
    assert mine[0]["actor/grad_norm"] == pytest.approx(ppo[0]["actor/grad_norm"] / 4, rel=1e-4)
    assert (after_mine - before).abs().max() > 1e-4 and (after_ppo - before).abs().max() > 1e-4


def test_stale_samples_take_the_old_policy_from_the_version_that_generated_them(ray_local):
    """max_staleness=1: a batch generated by version 0 and trained by a learner at version 1 has as old policy
    the learner's logprobs at version 0 (a snapshot swapped in), not its current ones. The 'sampler' logprobs
    here are the learner's own at version 0, so the mismatch metrics read ~0 only if the snapshot is right."""
    from grpo_ray.types import Rollout

    path = models.resolve(TINY.format(arch="qwen2"))
    recipe = load_recipe(
        ROOT / "recipes" / "tiny-cpu.yaml",
        [
            "learner.world_size=2",
            "data.train_batch_size=4",
            "algorithm.group_size=4",
            "learner.mini_batch_size=16",
            "learner.micro_batch_size=4",
            "algorithm.kl_coef=0.0",
            "algorithm.max_staleness=1",
            "algorithm.rollout_correction.rollout_is=token",
        ],
    )
    actors = [ray_local.remote(Learner).options(num_cpus=0.5).remote(path, recipe, i, 2) for i in range(2)]
    try:
        host, port = ray_local.get(actors[0].address.remote())
        ray_local.get([a.setup.remote(host, port) for a in actors])
        rollouts = tiny_rollouts(vocab=300, prompts=4, group=4, split=2)  # learner rank i trains on rollout i

        def sample_with_the_learner(rollout):  # the sampler = the learner at its version now (temperature 1)
            for c in rollout.completions:
                p = rollout.prompts[c.prompt].ids
                lp = ray_local.get([a.probe_logprobs.remote(p + c.token_ids) for a in actors])[0]
                c.sampler_logprobs = lp[len(p) - 1 :]

        for r in rollouts:
            sample_with_the_learner(r)
        refs = [ray_local.put(r) for r in rollouts]
        advantages = torch.linspace(-1.5, 1.5, 16).tolist()
        first = ray_local.get([a.train.remote(refs, advantages, 0) for a in actors])[0].metrics
        assert first["actor/old_log_prob_recomputed"] == 0  # on policy: logp.detach() is the old policy
        assert abs(first["rollout_corr/kl"]) < 1e-6 and first["rollout_corr/rollout_is_max"] < 1 + 1e-5
        second = ray_local.get([a.train.remote(refs, advantages, 1) for a in actors])[0].metrics
        assert second["actor/old_log_prob_recomputed"] == 1 and second["actor/policy_version"] == 1
        assert abs(second["rollout_corr/kl"]) < 1e-6 and second["rollout_corr/rollout_is_max"] < 1 + 1e-5
        # mixed versions: rank 0's samples are of version 2 (the learner's now), rank 1's of version 0 (a
        # snapshot): both ranks must swap in each version together, or the all-gathers mix weights
        sample_with_the_learner(rollouts[0])
        mixed = [Rollout(rollouts[0].prompts, rollouts[0].completions, 2), rollouts[1]]
        third = ray_local.get(
            [a.train.remote([ray_local.put(r) for r in mixed], advantages, 2, None, 1) for a in actors]
        )[0].metrics
        assert abs(third["rollout_corr/kl"]) < 1e-6 and third["rollout_corr/rollout_is_max"] < 1 + 1e-5
        # the same batch claimed by version 1's weights: their logprobs are not version 0's
        refs = [ray_local.put(Rollout(r.prompts, r.completions, 3)) for r in rollouts]
        moved = ray_local.get([a.train.remote(refs, advantages, 3) for a in actors])[0].metrics
        assert moved["rollout_corr/k3_kl"] > 1e-4 and moved["rollout_corr/rollout_is_max"] > 1.01
        # a version with no snapshot left (dropped once no batch can need it) is refused, not guessed
        refs = [ray_local.put(Rollout(r.prompts, r.completions, 0)) for r in rollouts]
        with pytest.raises(ray_local.exceptions.RayTaskError, match="no weights of it here"):
            ray_local.get([a.train.remote(refs, advantages, 4, None, 4) for a in actors])
        # a signal the learner does not read is refused by name, before any forward (not silently dropped)
        with pytest.raises(ray_local.exceptions.RayTaskError, match=r"reads no signal of use \['critic'\]"):
            ray_local.get([a.train.remote(refs, advantages, 4, {"critic": []}) for a in actors])
    finally:
        for a in actors:
            ray_local.kill(a)


def test_shared_prompts_make_the_same_update_as_packed_samples(ray_local):
    """model.shared_prompt: each prompt run once, its keys and values serving its responses, on 2 gloo ranks (two
    FSDP2 forwards a micro batch before one backward), with old logprobs recomputed over 2 mini batches x 2 epochs
    and a KL term: the same metrics and weights after the step as 1 process with packed samples. Under ``auto``
    (prompts of 4-9 tokens, responses of 1-5: half the slots) the ranks choose shared prompts."""
    path = models.resolve(TINY.format(arch="qwen2"))
    rollouts = tiny_rollouts(vocab=300, prompts=4, group=4)
    advantages = torch.linspace(-1.5, 1.5, 16).tolist()
    ref_lps = [[[-5.0 - 0.1 * j for j in range(len(c.token_ids))] for c in r.completions] for r in rollouts]
    common = [
        "data.train_batch_size=4",
        "algorithm.group_size=4",
        "learner.mini_batch_size=8",
        "learner.micro_batch_size=2",
        "algorithm.ppo_epochs=2",
        "algorithm.kl_coef=0.1",
    ]
    packed, before1, after1 = run_learner(
        ray_local, path, 1, [*common, "model.shared_prompt=false"], rollouts, ref_lps, advantages
    )
    shared, before2, after2 = run_learner(
        ray_local, path, 2, [*common, "model.shared_prompt=auto"], rollouts, ref_lps, advantages
    )
    assert packed[0]["actor/shared_prompt"] == 0 and [m["actor/shared_prompt"] for m in shared] == [1, 1]
    # the FLOPs each layout really ran (MFU's numerator): two training passes (3 forwards' worth each) and the
    # old-policy forward; packed, every sequence whole; shared, each prompt once a micro batch: at least once a mini
    # batch, and less than packed
    dims, pairs = model_dims(path), flatten(rollouts)
    assert packed[0]["actor/flops"] == pytest.approx(7 * perf.forward_flops(dims, *forward_work(pairs, False)))
    once = sum(perf.forward_flops(dims, *forward_work(mini, True)) for mini in (pairs[:8], pairs[8:]))
    assert 7 * once <= shared[0]["actor/flops"] < packed[0]["actor/flops"]
    for key in ("actor/grad_norm", "actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/ppo_kl"):
        assert shared[0][key] == pytest.approx(packed[0][key], rel=1e-4, abs=1e-6), key
    assert torch.allclose(before1, before2, atol=1e-6)
    assert torch.allclose(after1, after2, atol=1e-5)
    assert (after1 - before1).abs().max() > 1e-4


def test_observation_tokens_are_masked_out_of_the_loss(ray_local):
    """Multi-turn samples (``Completion.mask``): tokens under mask 0 (an observation's) do not count. With the
    sampler's logprobs as the old policy (bypass mode), garbage there (+30, a ratio of ~0) leaves the update
    exactly as a plausible value does; the same samples unmasked update otherwise."""
    import copy

    path = models.resolve(TINY.format(arch="qwen2"))
    rollouts = tiny_rollouts(vocab=300, prompts=4, group=4)
    for r in rollouts:
        for c in r.completions:
            c.mask = [0 if 0 < j < len(c.token_ids) - 1 else 1 for j in range(len(c.token_ids))]
    masked = sum(m == 0 for r in rollouts for c in r.completions for m in c.mask)
    garbage, plausible = copy.deepcopy(rollouts), copy.deepcopy(rollouts)
    for g, p in zip(garbage, plausible):
        for cg, cp in zip(g.completions, p.completions):
            cg.sampler_logprobs = [lp if m else 30.0 for lp, m in zip(cg.sampler_logprobs, cg.mask)]
            cp.sampler_logprobs = [lp if m else -2.0 for lp, m in zip(cp.sampler_logprobs, cp.mask)]
    unmasked = copy.deepcopy(plausible)
    for r in unmasked:
        for c in r.completions:
            c.mask = None
    advantages = torch.linspace(-1.5, 1.5, 16).tolist()
    common = [
        "data.train_batch_size=4",
        "algorithm.group_size=4",
        "learner.mini_batch_size=16",
        "learner.micro_batch_size=4",
        "algorithm.kl_coef=0.0",
        "algorithm.rollout_correction.bypass_mode=true",
    ]
    a, before, after_a = run_learner(ray_local, path, 2, common, garbage, None, advantages)
    b, _, after_b = run_learner(ray_local, path, 2, common, plausible, None, advantages)
    c, _, after_c = run_learner(ray_local, path, 2, common, unmasked, None, advantages)
    shared, _, after_shared = run_learner(
        ray_local, path, 2, [*common, "model.shared_prompt=true"], garbage, None, advantages
    )
    assert masked >= 8
    for key in ("actor/grad_norm", "actor/pg_loss", "actor/pg_clipfrac", "actor/entropy"):
        assert a[0][key] == pytest.approx(b[0][key], rel=1e-5, abs=1e-7), key
        assert shared[0][key] == pytest.approx(a[0][key], rel=1e-4, abs=1e-6), key  # each prompt run once
    assert torch.allclose(after_a, after_b, atol=1e-6) and (after_a - before).abs().max() > 1e-4
    assert torch.allclose(after_shared, after_a, atol=1e-5)
    assert c[0]["actor/pg_loss"] != pytest.approx(b[0]["actor/pg_loss"], rel=1e-3)
    assert (after_c - after_b).abs().max() > 1e-5


def test_sft_trains_only_on_the_tokens_its_masks_keep(ray_local):
    """Multi-turn SFT traces (``sft_train(pairs, masks)``): tokens under mask 0 are not trained on. Here they
    trail the trained ones (an observation is context for what follows it), so other tokens there leave the loss
    and the update exactly as they are; the same targets without masks train on them."""
    import random

    path = models.resolve(TINY.format(arch="qwen2"))
    recipe = load_recipe(
        ROOT / "recipes" / "tiny-cpu.yaml",
        ["learner.world_size=2", "learner.mini_batch_size=8", "learner.micro_batch_size=2"],
    )
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 300) for _ in range(rng.randint(3, 7))] for _ in range(8)]
    masks = [[1] * rng.randint(2, 5) + [0] * rng.randint(2, 5) for _ in prompts]

    def targets(seed):
        r = random.Random(seed)
        return [[10 + j if m else r.randrange(3, 300) for j, m in enumerate(mask)] for mask in masks]

    def update(pairs, masks):
        actors = [ray_local.remote(Learner).options(num_cpus=0.5).remote(path, recipe, i, 2) for i in range(2)]
        host, port = ray_local.get(actors[0].address.remote())
        ray_local.get([a.setup.remote(host, port) for a in actors])
        probe = prompts[0] + [10, 11, 12]  # the same tokens in every run
        metrics = ray_local.get([a.sft_train.remote(pairs, masks) for a in actors])[0]
        after = torch.tensor(ray_local.get([a.probe_logprobs.remote(probe) for a in actors])[0])  # every rank: FSDP2
        for a in actors:
            ray_local.kill(a)
        return metrics, after

    one, two = list(zip(prompts, targets(1))), list(zip(prompts, targets(2)))
    a, after_a = update(one, masks)
    b, after_b = update(two, masks)
    c, after_c = update(two, None)
    assert a["sft/tokens"] == sum(map(sum, masks)) == b["sft/tokens"] < c["sft/tokens"]
    assert a["sft/loss"] == pytest.approx(b["sft/loss"], rel=1e-6)
    assert torch.allclose(after_a, after_b, atol=1e-6)
    assert (after_c - after_b).abs().max() > 1e-4


def test_a_step_whose_count_does_not_divide_over_the_ranks_trains_every_sample(ray_local):
    """Five SFT pairs on two ranks: rank 0 takes three, rank 1 two (before, the fifth was dropped without a word),
    their micro batch counts paired (rank 1 runs a filler); the tokens counted and the update equal one process's."""
    import random

    path = models.resolve(TINY.format(arch="qwen2"))
    rng = random.Random(3)
    pairs = [([rng.randrange(3, 300) for _ in range(4)], [rng.randrange(3, 300) for _ in range(3)]) for _ in range(5)]
    probe = pairs[0][0] + pairs[0][1]

    def update(world):
        recipe = load_recipe(
            ROOT / "recipes" / "tiny-cpu.yaml",
            [f"learner.world_size={world}", "learner.mini_batch_size=8", "learner.micro_batch_size=1"],
        )
        actors = [ray_local.remote(Learner).options(num_cpus=0.5).remote(path, recipe, i, world) for i in range(world)]
        host, port = ray_local.get(actors[0].address.remote())
        ray_local.get([a.setup.remote(host, port) for a in actors])
        before = torch.tensor(ray_local.get([a.probe_logprobs.remote(probe) for a in actors])[0])
        metrics = ray_local.get([a.sft_train.remote(pairs) for a in actors])[0]
        after = torch.tensor(ray_local.get([a.probe_logprobs.remote(probe) for a in actors])[0])
        for a in actors:
            ray_local.kill(a)
        return metrics, before, after

    one, before1, after1 = update(1)
    two, before2, after2 = update(2)
    assert one["sft/tokens"] == two["sft/tokens"] == 15
    assert two["sft/loss"] == pytest.approx(one["sft/loss"], rel=1e-5)
    assert torch.allclose(before1, before2, atol=1e-6) and torch.allclose(after1, after2, atol=1e-5)
    assert (after1 - before1).abs().max() > 1e-4


def test_a_group_started_again_takes_the_copy_and_trains_the_step_as_the_lost_one_would_have(ray_local):
    """trainer.fault_tolerance=all (issue 78): two gloo ranks train a step, copy their state (``state_copy``: the
    shards of the weights and of Adam's moments, the scheduler, the counts) and train the next; a new group of two
    takes the copy and trains that next step again: the same metrics and weights, bit for bit."""
    path = models.resolve(TINY.format(arch="qwen2"))
    recipe = load_recipe(
        ROOT / "recipes" / "tiny-cpu.yaml",
        ["data.train_batch_size=4", "algorithm.group_size=4", "learner.mini_batch_size=8", "learner.micro_batch_size=2"]
        + ["algorithm.kl_coef=0", "algorithm.ppo_epochs=2"],
    )
    rollouts = tiny_rollouts(vocab=300, prompts=4, group=4)
    batches = [[ray_local.put(dataclasses.replace(r, policy_version=v)) for r in rollouts] for v in (0, 1)]
    advantages = torch.linspace(-1.5, 1.5, 16).tolist()
    probe = [3, 17, 42, 99, 250, 7]

    def group():
        actors = [ray_local.remote(Learner).options(num_cpus=0.5).remote(path, recipe, i, 2) for i in range(2)]
        host, port = ray_local.get(actors[0].address.remote())
        ray_local.get([a.setup.remote(host, port) for a in actors])
        return actors

    def step(actors, version):
        refs = batches[version]  # sampled by the weights it trains: on policy
        metrics = ray_local.get([a.train.remote(refs, advantages, version, {}, None) for a in actors])[0].metrics
        probed = ray_local.get([a.probe_logprobs.remote(probe) for a in actors])[0]  # a forward of the whole group
        return {k: v for k, v in metrics.items() if not k.startswith("timing_s/")}, probed

    lost = group()
    first, _ = step(lost, 0)
    copies = [a.state_copy.options(num_returns=2).remote() for a in lost]
    states, costs = [s for s, _ in copies], ray_local.get([c for _, c in copies])
    second, after = step(lost, 1)
    for a in lost:
        ray_local.kill(a)
    again = group()
    ray_local.get([a.take_state.remote(s) for a, s in zip(again, states)])
    third, after_again = step(again, 1)
    assert second == third and after == after_again
    assert second != first  # the step after moved on from the first: the copy holds the state the first left
    assert all(c["mb"] > 0 for c in costs)
    for a in again:
        ray_local.kill(a)
