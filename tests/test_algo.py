"""The GRPO math against numbers worked by hand."""

import math

import pytest
import torch

from grpo_ray.algo.advantage import advantages, group_advantages
from grpo_ray.algo.batching import (
    by_length,
    chunks,
    collate,
    micro_batches,
    pack_rows,
    place_values,
    rank_slice,
    response_values,
)
from grpo_ray.algo.loss import VanillaOptions, aggregate, grpo_loss, kept_count, kl_penalty

S = 1 / math.sqrt(2)  # (1 - 0.5) / std([1, 0]) with the unbiased std sqrt(0.5)


def test_group_advantages_by_hand():
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), group_size=2)
    assert adv.tolist() == pytest.approx([S, -S, -S, S], abs=1e-5)
    adv = group_advantages(torch.tensor([3.0, 0.0, 0.0]), group_size=3)  # centred [2,-1,-1], std sqrt(3)
    assert adv.tolist() == pytest.approx([2 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)], abs=1e-5)
    assert group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 2, norm_by_std=False).tolist() == [0.5, -0.5, -0.5, 0.5]
    assert group_advantages(torch.tensor([1.0, 1.0, 0.0, 0.0]), 2).tolist() == [0, 0, 0, 0]  # no signal
    with pytest.raises(ValueError, match="do not split into groups of 4"):
        group_advantages(torch.zeros(6), 4)


def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([-1.0]), torch.tensor([-2.0])
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(1.0)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(math.exp(-1) + 1 - 1)  # e^-1 - (-1) - 1
    assert kl_penalty(ref, ref, "k3").item() == 0.0


@pytest.mark.parametrize(
    "mode, count, expected",
    [
        # two sequences: tokens [1, 2] and [3] (the 100 is padding); a horizon of 4 tokens
        ("token-mean", 3, (1 + 2 + 3) / 3),
        ("seq-mean-token-sum", 2, ((1 + 2) + 3) / 2),
        ("seq-mean-token-mean", 2, (1.5 + 3) / 2),
        ("seq-mean-token-sum-norm", 2 * 4, (1 + 2 + 3) / (2 * 4)),
    ],
)
def test_aggregation_by_hand(mode, count, expected):
    values = torch.tensor([[1.0, 2.0], [3.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    assert kept_count(mode, mask, horizon=4) == count
    assert kept_count(mode, torch.tensor([[1.0, 1.0], [0.0, 0.0]]), horizon=4) == {  # a masked sample
        "token-mean": 2,
        "seq-mean-token-sum-norm": 4,
    }.get(mode, 1)
    assert aggregate(values, mask, mode, normaliser=count).item() == pytest.approx(expected)


def loss_of(ratio, adv, **kw):
    old = torch.zeros(1, 1)
    logp = torch.log(torch.tensor([[ratio]])).requires_grad_()
    args = dict(clip_low=0.2, clip_high=0.2, kl_coef=0.0, kl_estimator="k3", loss_agg="token-mean", normaliser=1.0)
    args.update(kw)
    loss, m = grpo_loss(logp, old, None, torch.tensor([adv]), torch.ones(1, 1), **args)
    return loss, m, logp


@pytest.mark.parametrize(
    "ratio,adv,expected,clipped",
    [
        (1.5, 1.0, -1.2, 1),  # good sample pushed too far up: clipped at 1 + 0.2
        (0.5, -1.0, 0.8, 1),  # bad sample pushed too far down: clipped at 1 - 0.2
        (1.5, -1.0, 1.5, 0),  # bad sample made likelier: the pessimistic (unclipped) term wins
        (1.0, 2.0, -2.0, 0),  # on policy: -A
    ],
)
def test_clipped_surrogate_by_hand(ratio, adv, expected, clipped):
    loss, m, _ = loss_of(ratio, adv)
    assert loss.item() == pytest.approx(expected)
    assert m["pg_clipfrac_sum"] == clipped


def test_separate_low_and_high_clip():
    assert loss_of(1.5, 1.0, clip_high=0.28)[0].item() == pytest.approx(-1.28)
    assert loss_of(0.5, -1.0, clip_low=0.1)[0].item() == pytest.approx(0.9)


def on_policy_loss(logp, advantages, mask, normaliser):
    """The PPO-clip loss of one on-policy update (old = logp), token-mean, without KL."""
    kw = dict(clip_low=0.2, clip_high=0.2, kl_coef=0.0, kl_estimator="k3", loss_agg="token-mean")
    return grpo_loss(logp, logp.detach(), None, advantages, mask, normaliser=normaliser, **kw)


def test_on_policy_gradient_is_minus_advantage_over_normaliser():
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, m = on_policy_loss(logp, torch.tensor([2.0, -1.0]), mask, 3.0)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-2 / 3, -2 / 3], [1 / 3, 0.0]]))
    assert m["tokens"] == 3


def test_distillation_advantages_and_their_gradient_by_hand():
    """Per token: reward_weight * A_i - coef * (student - teacher), 0 off the responses; through the loss, on
    policy, each token's gradient is minus its own advantage over the normaliser: a token the teacher finds
    likelier than the student is raised."""
    from grpo_ray.algo.distill import distill_advantages

    student = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], requires_grad=True)
    teacher = torch.tensor([[-0.5, -2.5], [-1.5, -3.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv, sums = distill_advantages(torch.tensor([2.0, -1.0]), student, teacher, mask, coef=0.5)
    assert torch.allclose(adv, torch.tensor([[2.25, 1.75], [-1.5, 0.0]])) and not adv.requires_grad
    assert sums["reverse_kl_sum"].item() == pytest.approx(-0.5 + 0.5 + 1.0)
    assert sums["distill_abs_sum"].item() == pytest.approx(0.5 * (0.5 + 0.5 + 1.0))
    assert sums["reward_abs_sum"].item() == pytest.approx(2 + 2 + 1)
    alone, _ = distill_advantages(torch.tensor([2.0, -1.0]), student, teacher, mask, coef=1.0, reward_weight=0.0)
    assert torch.allclose(alone, torch.tensor([[0.5, -0.5], [-1.0, 0.0]]))

    logp = student.detach().clone().requires_grad_(True)
    loss, _ = on_policy_loss(logp, alone, mask, 3.0)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-0.5 / 3, 0.5 / 3], [1.0 / 3, 0.0]]))
    assert loss.item() == pytest.approx(-(0.5 - 0.5 - 1.0) / 3)  # on policy: -sum A_t / normaliser


def test_the_learners_loss_takes_the_teachers_signal_and_reports_it():
    """micro_batch_loss with a teacher's logprobs: the loss is the on-policy loss of distillation's per-token
    advantages (the student's side is the old policy: logp itself, on policy), and the step's metrics carry the
    reverse KL per token and the teacher's share of the advantage, by hand."""
    from grpo_ray.algo.loss import LOSS_SUMS, LossInputs, StepSums, micro_batch_loss, step_metrics
    from grpo_ray.config import AlgorithmConfig, TeacherConfig

    logp = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], requires_grad=True)
    teacher = torch.tensor([[-0.5, -2.5], [-1.5, -3.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    a = AlgorithmConfig(kl_coef=0.0, loss_agg="token-mean")
    x = LossInputs(logp, logp.detach(), torch.tensor([2.0, -1.0]), mask, signals={"distill": teacher})
    section = TeacherConfig(model="t", kl_coef=0.5, reward_weight=1.0)
    loss, counted, sums, _, _ = micro_batch_loss(x, a, 2, {"distill": section})
    assert counted.item() == 3
    assert loss.item() == pytest.approx(-(2.25 + 1.75 - 1.5))  # -sum of per-token advantages, normaliser 1
    plain = micro_batch_loss(LossInputs(logp, logp.detach(), torch.tensor([2.0, -1.0]), mask), a, 2)
    assert plain[0].item() == pytest.approx(-(2 + 2 - 1)) and plain[2][LOSS_SUMS.index("reverse_kl_sum")] == 0
    step = StepSums.zeros("cpu")
    step.add_losses(sums, 1.0)
    m = step_metrics(step, 1, distilled=True)
    assert m["distill/reverse_kl"] == pytest.approx(1.0 / 3)
    assert m["distill/advantage_share"] == pytest.approx(1.0 / (1.0 + 5.0))
    assert "distill/reverse_kl" not in step_metrics(step, 1)


def test_kl_term_is_added_with_its_coefficient():
    logp = torch.tensor([[-1.0]])
    ref = torch.tensor([[-2.0]])
    loss, m = grpo_loss(
        logp,
        logp,
        ref,
        torch.tensor([0.0]),
        torch.ones(1, 1),
        clip_low=0.2,
        clip_high=0.2,
        kl_coef=0.5,
        kl_estimator="k1",
        loss_agg="token-mean",
        normaliser=1.0,
    )
    assert m["kl_loss"] == pytest.approx(1.0) and loss.item() == pytest.approx(0.5)


def test_collate_masks_line_up_with_next_token_logprobs():
    seqs = collate([([1, 2, 3], [4, 5]), ([6], [7, 8, 9])], pad_id=0)
    assert seqs.input_ids.tolist() == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 0]]
    assert seqs.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    # logprob position t predicts token t+1: the responses are tokens 3..4 and 1..3
    assert seqs.response_mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 0]]
    values = [[0.25, 0.5], [1.0, 2.0, 4.0]]
    placed = place_values(values, seqs.response_mask)
    assert placed.tolist() == [[0, 0, 0.25, 0.5], [1.0, 2.0, 4.0, 0]]
    assert response_values(placed, seqs.response_mask) == values
    as_tensors = place_values([torch.tensor(v) for v in values], seqs.response_mask)  # the old policy's form
    assert torch.equal(as_tensors, placed)


def test_micro_batches_are_cut_longest_first():
    pairs = [([1], [2]), ([1, 2], [3, 4, 5]), ([1], [2, 3]), ([1, 2, 3], [4, 5]), ([1], [2, 3, 4])]
    assert by_length([0, 1, 2, 3, 4], pairs) == [1, 3, 4, 2, 0]  # 5, 5 (ties in order), 4, 3, 2 tokens
    assert by_length([4, 0, 2], pairs) == [4, 2, 0]
    # two micro batches of 2 pad to 5 and 3 tokens (16 positions), against 5 and 5 (20) in the given order
    cut = [collate([pairs[i] for i in micro], 0) for micro in chunks(by_length([0, 1, 2, 3], pairs), 2)]
    assert [s.input_ids.shape for s in cut] == [(2, 5), (2, 3)]


def test_packed_rows_by_hand():
    # lengths 5, 2, 4, 1, 3 into rows of 5: first fit, longest first
    assert pack_rows([5, 2, 4, 1, 3], 5) == [[0], [2, 3], [4, 1]]
    # lengths 3, 4, 2 into rows of 4: no two fit together
    seqs = collate([([1, 2], [3]), ([4], [5, 6, 7]), ([8], [9])], pad_id=0, capacity=4)
    p = seqs.packed
    assert p.input_ids.tolist() == [[4, 5, 6, 7], [1, 2, 3, 0], [8, 9, 0, 0]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3]]
    # next-token position t of sample b sits at row * (width - 1) + start + t of the packed [3, 3] logprobs
    assert p.index.tolist() == [[3, 4, -1], [0, 1, 2], [6, -1, -1]]
    two = collate([([1, 2], [3]), ([8], [9])], pad_id=0, capacity=5)  # 3 + 2 tokens: one row
    assert two.packed.input_ids.tolist() == [[1, 2, 3, 8, 9]]
    assert two.packed.position_ids.tolist() == [[0, 1, 2, 0, 1]]
    assert two.packed.index.tolist() == [[0, 1], [3, -1]]


def test_packed_micro_batches_hold_their_rows_and_every_sample_once():
    import random

    # a rank's share of a step as the peer benchmark has it: about half the responses cut at the limit
    rng = random.Random(0)
    pairs = [
        ([1] * rng.randint(30, 40), [2] * (128 if rng.random() < 0.55 else rng.randint(1, 127))) for _ in range(32)
    ]
    micros, capacity = micro_batches(list(range(32)), pairs, 16, packing=True)
    assert capacity == max(len(p) + len(r) for p, r in pairs)
    assert sorted(i for m in micros for i in m) == list(range(32))
    for micro in micros:  # packing a micro batch again gives the rows it was cut with, none over capacity
        p = collate([pairs[i] for i in micro], 0, capacity).packed
        assert p.input_ids.shape[0] <= 16 and p.input_ids.shape[1] <= capacity
    padded = sum(
        collate([pairs[i] for i in m], 0).input_ids.numel()
        for m in micro_batches(list(range(32)), pairs, 16, packing=False)[0]
    )
    packed = sum(collate([pairs[i] for i in m], 0, capacity).packed.input_ids.numel() for m in micros)
    real = sum(len(p) + len(r) for p, r in pairs)
    assert packed < 0.92 * padded and packed < 1.1 * real


def test_mini_batch_shares_and_chunks():
    assert rank_slice(list(range(8)), 1, 2) == [4, 5, 6, 7]
    for n in range(12):  # a share a rank, every index once: none dropped where the count does not divide
        for world in (1, 2, 3, 4):
            shares = [rank_slice(list(range(n)), r, world) for r in range(world)]
            assert [i for s in shares for i in s] == list(range(n)), (n, world)
            assert max(map(len, shares)) - min(map(len, shares)) <= 1
    assert [rank_slice(list(range(5)), r, 2) for r in range(2)] == [[0, 1, 2], [3, 4]]
    assert chunks([0, 1, 2, 3, 4], 2) == [[0, 1], [2, 3], [4]]


def test_sample_seeds_depend_only_on_run_step_and_prompt():
    from grpo_ray.engines import sample_seed

    assert sample_seed(0, 3, 17) == sample_seed(0, 3, 17)
    seeds = {sample_seed(0, step, uid) for step in range(50) for uid in range(200)}
    assert len(seeds) == 50 * 200 and all(0 <= s < 2**32 for s in seeds)
    assert sample_seed(1, 3, 17) != sample_seed(0, 3, 17)


def test_balanced_ranges_cut_contiguous_shares_of_near_equal_cost():
    from grpo_ray.algo.batching import balanced_ranges

    assert balanced_ranges([1] * 10, 3) == [(0, 3), (3, 7), (7, 10)]
    assert balanced_ranges([1] * 256, 8) == [(i * 32, i * 32 + 32) for i in range(8)]
    # by cost: one long sample is a share of its own
    assert balanced_ranges([10, 1, 1, 1, 1, 1, 1, 1, 1, 1], 2) == [(0, 1), (1, 10)]
    assert balanced_ranges([3, 3, 1, 1, 1, 1, 1, 1], 2) == [(0, 2), (2, 8)]
    # every actor gets an item while there are items; the rest get empty shares at the end
    assert balanced_ranges([5, 5, 5, 100], 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert balanced_ranges([1, 1], 3) == [(0, 1), (1, 2), (2, 2)]
    assert balanced_ranges([], 2) == [(0, 0), (0, 0)] and balanced_ranges([1, 2], 0) == []


def test_spans_of_a_share_cross_rollouts():
    from grpo_ray.algo.batching import spans_of

    # rollouts of 4, 4 and 4 completions; flat samples 3..8 are the last of the first, all of the second, one more
    assert spans_of([4, 4, 4], (3, 9)) == [(0, 3, 4), (1, 0, 4), (2, 0, 1)]
    assert spans_of([4, 4, 4], (4, 8)) == [(1, 0, 4)]
    assert spans_of([4, 4], (8, 8)) == []


def test_samples_of_spans_keep_order():
    from grpo_ray.algo.batching import flatten, samples
    from grpo_ray.types import Completion, Prompt, Rollout

    r = Rollout(
        [Prompt([1], "1", "x"), Prompt([2], "2", "x")],
        [Completion(0, [10], "", [], "stop"), Completion(0, [11], "", [], "stop"), Completion(1, [12], "", [], "stop")],
        0,
    )
    assert flatten([r, r], [(1, 3), (0, 1)]) == [([1], [11]), ([2], [12]), ([1], [10])]
    assert [c.token_ids for _, c in samples([r])] == [[10], [11], [12]]


# --- rollout correction (grpo_ray.algo.correction), worked by hand --------------------------------------------


def _correction(old, sampler, mask, **kw):
    """weights, keep, the sums by name, the largest ratio (the function returns them as tensors)."""
    from grpo_ray.algo.correction import SUM_KEYS, rollout_correction

    args = dict(rollout_is=None, is_threshold=2.0, rollout_rs=None, rs_upper=3.0, rs_lower=0.0) | kw
    weights, keep, sums, largest = rollout_correction(
        torch.tensor(old), torch.tensor(sampler), torch.tensor(mask), **args
    )
    assert sums.dtype == largest.dtype == torch.float64 and sums.shape == (len(SUM_KEYS),) and largest.dim() == 0
    return weights, keep, dict(zip(SUM_KEYS, sums.tolist())), largest.item()


def test_token_tis_caps_the_ratio_of_old_to_sampler_and_reports_the_mismatch():
    # token ratios 1.5 and 3.0 (old - sampler = log 1.5, log 3); the third position is padding (a large value
    # there must count nowhere)
    old = [[math.log(1.5) - 1.0, math.log(3.0) - 2.0, 5.0]]
    sampler = [[-1.0, -2.0, 0.0]]
    weights, keep, sums, largest = _correction(old, sampler, [[1.0, 1.0, 0.0]], rollout_is="token")
    assert weights[0, :2].tolist() == pytest.approx([1.5, 2.0])  # 3.0 capped at the threshold
    assert keep.tolist() == [[1.0, 1.0, 0.0]]
    assert largest == pytest.approx(3.0)
    assert sums["corr_tokens"] == 2 and sums["corr_ratio_sum"] == pytest.approx(4.5)
    assert sums["corr_kl_sum"] == pytest.approx(-(math.log(1.5) + math.log(3.0)))  # k1 of KL(sampler || old)
    assert sums["corr_k3_sum"] == pytest.approx((1.5 - math.log(1.5) - 1) + (3.0 - math.log(3.0) - 1))
    weights, _, _, _ = _correction(old, sampler, [[1.0, 1.0, 0.0]])
    assert weights[0, :2].tolist() == [1.0, 1.0]  # rollout_is=null: no weights


def test_equal_logprobs_give_ratio_one_and_zero_kl():
    lp = [[-0.3, -2.0], [-1.0, 0.0]]
    weights, keep, sums, largest = _correction(
        lp, lp, [[1.0, 1.0], [1.0, 0.0]], rollout_is="token", rollout_rs="sequence"
    )
    assert largest == 1.0 and sums["corr_kl_sum"] == 0 and sums["corr_k3_sum"] == 0
    assert sums["corr_masked_tokens"] == 0 and keep.tolist() == [[1.0, 1.0], [1.0, 0.0]]


def test_mismatch_metrics_are_verls_unclamped_definitions_past_20_and_88():
    """verl's compute_offpolicy_metrics: kl = mean(sampler - old), k3_kl = mean(exp(d) - d - 1) with d = old - sampler,
    no clamp; float32 inputs with gaps of 30, -25, 95 and -100 against the same sums in float64."""
    old = [[-1.0, -30.0, 0.0, -100.0, 7.0]]
    sampler = [[-31.0, -5.0, -95.0, 0.0, 0.0]]  # gaps 30, -25, 95, -100; the last position is padding
    mask = [[1.0, 1.0, 1.0, 1.0, 0.0]]
    _, _, sums, _ = _correction(old, sampler, mask)
    gaps = [o - s for o, s, m in zip(old[0], sampler[0], mask[0]) if m]
    assert sums["corr_kl_sum"] == pytest.approx(sum(-g for g in gaps), rel=1e-12)
    k3 = sum(math.exp(g) - g - 1 for g in gaps)  # exp(95) ~ 1.8e41: past float32's range
    assert math.isfinite(sums["corr_k3_sum"]) and sums["corr_k3_sum"] == pytest.approx(k3, rel=1e-9)


@pytest.mark.parametrize(
    "mode, lower, kept",
    [
        # sample 0: two tokens of ratio 2 -> product 4 (over 3), geometric mean 2 (inside); sample 1: one token of 0.5
        ("sequence", 0.0, [0.0, 1.0]),  # lower bound 1/3: 0.5 is inside
        ("geometric", 0.0, [1.0, 1.0]),
        ("geometric", 0.6, [1.0, 0.0]),  # an explicit lower bound over 0.5
    ],
)
def test_sequence_masking_by_hand(mode, lower, kept):
    old = [[math.log(2.0), math.log(2.0)], [math.log(0.5), 0.0]]
    sampler = [[0.0, 0.0], [0.0, 9.0]]  # sample 1 has one token; its padding's values must not count
    mask = [[1.0, 1.0], [1.0, 0.0]]
    _, keep, sums, _ = _correction(old, sampler, mask, rollout_rs=mode, rs_lower=lower)
    assert keep.tolist() == [[k * m for m in row] for k, row in zip(kept, mask)]
    assert sums["corr_masked_seqs"] == kept.count(0.0) and sums["corr_seqs"] == 2
    assert sums["corr_masked_tokens"] == sum((1 - k) * sum(row) for k, row in zip(kept, mask))


def test_is_weights_scale_the_policy_gradient_and_masked_samples_get_none():
    """On policy (ratio 1): d loss / d logp_t = -A_i * w_t / normaliser on kept tokens, 0 on masked samples."""
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.5]], requires_grad=True)
    adv, weights = torch.tensor([1.0, -2.0]), torch.tensor([[1.5, 2.0], [0.5, 1.0]])
    keep = torch.tensor([[1.0, 1.0], [0.0, 0.0]])  # sample 1 masked by rollout_rs
    loss, m = grpo_loss(
        logp,
        logp.detach(),
        None,
        adv,
        keep,
        clip_low=0.2,
        clip_high=0.2,
        kl_coef=0.0,
        kl_estimator="k3",
        loss_agg="token-mean",
        normaliser=4.0,
        is_weights=weights,
    )
    loss.backward()
    assert loss.item() == pytest.approx(-(1.5 + 2.0) / 4)
    assert logp.grad.flatten().tolist() == pytest.approx([-1.5 / 4, -2.0 / 4, 0.0, 0.0])
    assert m["tokens"] == 2


# --- estimators and policy losses of the registries, worked by hand ------------------------------------------------


def test_rloo_baseline_is_the_mean_of_the_other_samples():
    adv = advantages("rloo", torch.tensor([3.0, 0.0, 0.0, 1.0, 1.0, 1.0]), group_size=3)
    assert adv.tolist() == pytest.approx([3 - 0, 0 - 1.5, 0 - 1.5, 0, 0, 0])  # equal rewards: no signal


def test_reinforce_plus_plus_baseline_whitens_over_the_batch_tokens():
    # group-centred: [1, -1] and [0.5, -0.5]; lengths 1, 3, 2, 2 weigh them by tokens
    rewards, lengths = torch.tensor([2.0, 0.0, 1.0, 0.0]), torch.tensor([1.0, 3.0, 2.0, 2.0])
    a = torch.tensor([1.0, -1.0, 0.5, -0.5])
    mu = (a * lengths).sum() / 8  # (1 - 3 + 1 - 1) / 8 = -0.25
    var = ((a - mu) ** 2 * lengths).sum() / 7
    adv = advantages("reinforce_plus_plus_baseline", rewards, group_size=2, lengths=lengths)
    assert adv.tolist() == pytest.approx(((a - mu) / torch.sqrt(var + 1e-8)).tolist())
    assert float((adv * lengths).sum()) == pytest.approx(0.0, abs=1e-6)  # mean 0 over tokens


def test_estimators_match_the_config_choices():
    from grpo_ray.algo.advantage import ESTIMATORS, TURN_ESTIMATORS
    from grpo_ray.algo.loss import AGG_MODES, POLICY_LOSSES
    from grpo_ray.config import CHOICES

    assert set(CHOICES["algorithm.adv_estimator"]) == set(ESTIMATORS) | set(TURN_ESTIMATORS)
    assert set(CHOICES["algorithm.loss_mode"]) == set(POLICY_LOSSES)
    assert set(CHOICES["algorithm.loss_agg"]) == set(AGG_MODES) | {"auto"}


def test_gspo_takes_its_own_aggregation_unless_the_recipe_names_one():
    """verl forces seq-mean-token-mean for GSPO; with token-mean each sequence would weigh by its length."""
    from grpo_ray.config import AlgorithmConfig, loss_aggregation, notices
    from tests.conftest import ROOT

    assert loss_aggregation(AlgorithmConfig(loss_mode="gspo")) == "seq-mean-token-mean"
    assert loss_aggregation(AlgorithmConfig()) == "token-mean"
    assert loss_aggregation(AlgorithmConfig(loss_mode="gspo", loss_agg="token-mean")) == "token-mean"
    from grpo_ray.config import load_recipe

    auto = load_recipe(ROOT / "recipes" / "tiny-cpu.yaml", ["algorithm.loss_mode=gspo"])
    assert "seq-mean-token-mean" in notices(auto)[0]
    explicit = load_recipe(
        ROOT / "recipes" / "tiny-cpu.yaml", ["algorithm.loss_mode=gspo", "algorithm.loss_agg=token-mean"]
    )
    assert "not GSPO's objective" in notices(explicit)[0]
    assert notices(load_recipe(ROOT / "recipes" / "tiny-cpu.yaml")) == []


def _pg(mode, logp, old, adv, mask, **kw):
    logp = torch.tensor(logp, requires_grad=True)
    args = (
        dict(
            clip_low=0.2,
            clip_high=0.2,
            kl_coef=0.0,
            kl_estimator="k3",
            loss_agg="token-mean",
            normaliser=float(sum(map(sum, mask))),
        )
        | kw
    )
    loss, m = grpo_loss(logp, torch.tensor(old), None, torch.tensor(adv), torch.tensor(mask), loss_mode=mode, **args)
    loss.backward()
    return loss.item(), logp.grad, m


def test_dual_clip_caps_a_negative_advantage_under_a_large_ratio():
    # ratio e^2 = 7.39, A = -1: PPO's term is max(7.39, 1.2) = 7.39; dual clip c = 3 caps it at 3, no gradient
    loss, grad, _ = _pg("vanilla", [[2.0]], [[0.0]], [-1.0], [[1.0]], options=VanillaOptions(clip_ratio_c=3.0))
    assert loss == pytest.approx(3.0) and grad.item() == 0.0
    loss, _, _ = _pg("vanilla", [[2.0]], [[0.0]], [-1.0], [[1.0]])
    assert loss == pytest.approx(math.exp(2.0))
    loss, _, _ = _pg("vanilla", [[2.0]], [[0.0]], [1.0], [[1.0]], options=VanillaOptions(clip_ratio_c=3.0))  # A > 0
    assert loss == pytest.approx(-1.2)


def test_gspo_uses_the_sequence_ratio_for_every_token():
    # sequence 0: token log ratios 0.1 and 0.3 -> s = exp(0.2); the padded third token must not count
    logp, old = [[0.1, 0.3, 5.0]], [[0.0, 0.0, 0.0]]
    loss, grad, m = _pg("gspo", logp, old, [1.0], [[1.0, 1.0, 0.0]], clip_low=0.5, clip_high=0.5)
    s = math.exp(0.2)
    assert loss == pytest.approx(-s)  # token-mean of -A * s over 2 tokens
    assert grad[0, :2].tolist() == pytest.approx([-s / 2, -s / 2]) and grad[0, 2].item() == 0.0
    loss, grad, m = _pg("gspo", logp, old, [1.0], [[1.0, 1.0, 0.0]], clip_low=3e-4, clip_high=4e-4)
    assert loss == pytest.approx(-(1 + 4e-4)) and m["pg_clipfrac_sum"] == 2  # clipped: no gradient
    assert grad.abs().sum().item() == 0.0


def test_cispo_keeps_the_gradient_of_clipped_tokens():
    # ratio e^1 = 2.72 with A = 1: PPO clips it (no gradient); CISPO weighs the logprob by the clipped 1.2
    loss, grad, m = _pg("cispo", [[1.0]], [[0.0]], [1.0], [[1.0]])
    assert loss == pytest.approx(-1.2 * 1.0) and grad.item() == pytest.approx(-1.2)
    assert m["pg_clipfrac_sum"] == 1
    _, grad, _ = _pg("vanilla", [[1.0]], [[0.0]], [1.0], [[1.0]])
    assert grad.item() == 0.0


def test_entropy_bonus_is_subtracted_with_its_coefficient():
    logp = torch.zeros(1, 2, requires_grad=True)
    entropy = torch.tensor([[1.0, 3.0]], requires_grad=True)
    args = dict(clip_low=0.2, clip_high=0.2, kl_coef=0.0, kl_estimator="k3", loss_agg="token-mean", normaliser=2.0)
    loss, _ = grpo_loss(
        logp, logp.detach(), None, torch.tensor([0.0]), torch.ones(1, 2), entropy=entropy, entropy_coef=0.1, **args
    )
    loss.backward()
    assert loss.item() == pytest.approx(-0.1 * 2.0) and entropy.grad.flatten().tolist() == pytest.approx([-0.05, -0.05])


def test_overlong_penalty_by_hand():
    from grpo_ray.algo.advantage import overlong_penalty

    # max 20 tokens, a buffer of the last 8: no penalty up to 12, then -0.5 * (len - 12) / 8, -0.5 at 20
    lengths = torch.tensor([5, 12, 16, 20])
    assert overlong_penalty(lengths, 20, 8, 0.5).tolist() == pytest.approx([0.0, 0.0, -0.25, -0.5])
    assert overlong_penalty(lengths, 20, 0, 0.5).tolist() == [0.0] * 4  # off


def test_select_groups_keeps_the_picked_groups_in_order():
    from grpo_ray.algo.groups import select_groups
    from grpo_ray.types import Completion, Prompt, Rollout

    prompts = [Prompt([p], str(p), "x") for p in (1, 2, 3)]
    r = Rollout(prompts, [Completion(i // 2, [10 + i], "", [-float(i)], "stop") for i in range(6)], 7)
    out = select_groups([[0, 2]], 2, r)
    assert [p.ids for p in out.prompts] == [[1], [3]] and out.policy_version == 7
    assert [(c.prompt, c.token_ids, c.sampler_logprobs) for c in out.completions] == [
        (0, [10], [-0.0]),
        (0, [11], [-1.0]),
        (1, [14], [-4.0]),
        (1, [15], [-5.0]),
    ]


def test_signal_groups_and_take_groups_by_hand():
    from grpo_ray.algo.groups import signal_groups, take_groups
    from grpo_ray.types import RolloutStats, Scores

    # two rollouts of groups of 2: rollout 0 holds groups [1, 0] and [0, 0]; rollout 1 holds [1, 1]
    stats = [RolloutStats(1.0, 3, [5, 5, 6, 6], [1, 2, 3, 4], 0), RolloutStats(2.0, 3, [7, 7], [5, 6], 0)]
    scores = [
        Scores([1.0, 0.0, 0.0], {"f": [1.0, 0.0, 0.0]}, 0, 0, 0.1),
        Scores([0.0, 1.0, 1.0], {"f": [0.0, 1.0, 1.0]}, 0, 0, 0.1),
    ]
    kept, dropped = signal_groups(4, stats, scores, 2)
    assert kept == [(4, 0, 0)] and dropped == [(4, 0, 1), (4, 1, 0)]
    taken = take_groups(4, stats, scores, [(4, 0, 0), (4, 1, 0)], 2, max_tokens=6)
    assert [(i, groups) for i, groups, _, _ in taken] == [(0, [0]), (1, [0])]
    assert taken[0][2].response_lengths == [1, 2] and taken[1][2].response_lengths == [5, 6]
    assert (
        taken[1][2].truncated == 1 and taken[1][3].totals == [1.0, 1.0] and taken[0][3].components == {"f": [1.0, 0.0]}
    )
    # a verl dict's other numbers (one actor had them, one not) go with their samples, and into the metrics
    # over the samples that had them
    from grpo_ray.telemetry.metrics import rollout_metrics

    scores[0].extras = {"f/acc": [1.0, 0.0, 0.0]}
    taken = take_groups(4, stats, scores, [(4, 0, 0), (4, 1, 0)], 2, max_tokens=6)
    assert taken[0][3].extras == {"f/acc": [1.0, 0.0]} and all(math.isnan(v) for v in taken[1][3].extras["f/acc"])
    assert rollout_metrics(stats, scores)["reward/f/acc/mean"] == pytest.approx(1 / 3)
    assert "reward/f/acc/mean" not in rollout_metrics(stats, [taken[1][3]])


def test_dynamic_sampling_keeps_the_env_metrics_of_the_trajectories_it_keeps():
    """DAPO's group filter on multi-turn rollouts: the env/* metrics are those of the kept trajectories alone
    (their turns, tool calls, masked tokens), not the whole generated batch's."""
    from grpo_ray.algo.groups import take_groups
    from grpo_ray.rollouts.episodes import episode_values
    from grpo_ray.telemetry.metrics import env_metrics
    from grpo_ray.types import Completion, Episode, RolloutStats, Scores

    def trajectory(prompt, calls):  # `calls` tool calls: 2 x calls + 1 turns of text, 3 model tokens a turn
        turns = ["call", "result"] * calls + ["#### 1"]
        mask = ([1, 1, 1] + [0, 0]) * calls + [1, 1, 1]
        episode = Episode(turns, 0.0, tool_calls=calls, ended="turns" if calls == 2 else "done", seconds=0.5)
        return Completion(prompt, [7] * len(mask), "", [0.0] * len(mask), "stop", mask=mask, episode=episode)

    completions = [trajectory(0, 2), trajectory(0, 2), trajectory(1, 0), trajectory(1, 1)]
    stats = [RolloutStats(1.0, 0, [4] * 4, [len(c.token_ids) for c in completions], 0, env=episode_values(completions))]
    scores = [Scores([1.0, 1.0, 0.0, 1.0], {"f": [1.0, 1.0, 0.0, 1.0]}, 0, 0, 0.1)]
    whole = env_metrics([stats[0].env])
    assert whole["env/tool_calls/mean"] == 5 / 4 and whole["env/turns/mean"] == 9 / 4
    assert whole["env/masked_share"] == pytest.approx(10 / 37) and whole["env/ended_by_turns"] == 0.5
    ((_, groups, kept, _),) = take_groups(0, stats, scores, [(0, 0, 1)], 2, max_tokens=64)
    assert groups == [1]
    assert env_metrics([kept.env]) == {
        **env_metrics([episode_values(completions[2:])]),
        "env/tool_calls/mean": 0.5,
        "env/turns/mean": 1.5,
    }
    assert env_metrics([kept.env])["env/masked_share"] == pytest.approx(2 / 11)


def test_shared_prompt_micro_batches_keep_order_and_the_token_budget():
    """model.shared_prompt: micro batches are runs of the samples in order, each laid out (prompts once, responses
    packed per prompt, padding included) within micro_batch_size x the longest sample's tokens, as a packed
    micro batch is; so a group shares its prompt's forward."""
    from grpo_ray.algo.batching import collate, micro_batches

    prompts = [[1] * 10, [2] * 30, [3] * 5]
    pairs = [(prompts[k // 4], [7] * (3 + 5 * (k % 4))) for k in range(12)]  # 3 groups of 4
    micros, capacity = micro_batches(list(range(12)), pairs, 2, packing=True, shared=True)
    assert capacity == 0 and [i for m in micros for i in m] == list(range(12))
    budget = 2 * max(len(p) + len(r) for p, r in pairs)
    for m in micros:
        s = collate([pairs[i] for i in m], 0, shared=True).shared
        assert s.prompt_ids.numel() + s.input_ids.numel() <= budget
    # 2 x 48 slots: prompt 10 and its 4 responses (3 + 8 + 13 + 18) in 3 rows of 18 = 64, then prompt 30 with its
    # first response (30 x 2 + 3 rows x 18 = 114) would not fit
    assert micros[0] == [0, 1, 2, 3] and micros[1][0] == 4


def test_shared_prompt_micro_batches_are_cut_where_the_next_sample_would_pass_the_budget():
    """The incremental count (``SharedCount``) that cuts them is shared_tokens of the run so far, sample by sample,
    on random runs (responses of 0-40 tokens, prompts repeated in any order), and each micro batch is as long as the
    budget allows."""
    import random

    from grpo_ray.algo.batching import SharedCount, shared_micro_batches, shared_tokens

    rng = random.Random(0)
    for _ in range(100):
        prompts = [[rng.randrange(3, 50) for _ in range(rng.randint(1, 30))] for _ in range(rng.randint(1, 5))]
        pairs = [(rng.choice(prompts), [1] * rng.randint(0, 40)) for _ in range(rng.randint(1, 40))]
        count = SharedCount()
        for k, pair in enumerate(pairs):
            assert count.with_pair(pair)[0] == shared_tokens(pairs[: k + 1])
            count.add(pair)
        size = rng.randint(1, 4)
        micros = shared_micro_batches(list(range(len(pairs))), pairs, size)
        budget = size * max(len(p) + len(r) for p, r in pairs)
        assert [i for m in micros for i in m] == list(range(len(pairs)))
        for m, after in zip(micros, micros[1:]):
            assert shared_tokens([pairs[i] for i in m]) <= budget < shared_tokens([pairs[i] for i in m + after[:1]])


def test_shared_prompt_auto_weighs_the_work_of_both_layouts():
    """model.shared_prompt: auto counts each layout's token slots (padding included) and model calls exactly as
    collate lays the micro batches out, and runs each prompt once where that saves work (long prompts, short
    responses), not where it does not (short prompts, long responses); true and false force the layout."""
    from grpo_ray.algo.batching import LayoutWork, collate, layout_work, micro_batches, shared_pays, use_shared

    long_prompts = [([g + 1] * 40, [7] * (1 + k % 3)) for g in range(3) for k in range(8)]
    short_prompts = [([g + 1] * 3, [7] * (20 + 7 * k)) for g in range(3) for k in range(4)]
    for pairs in (long_prompts, short_prompts):
        for packing in (True, False):
            micros, capacity = micro_batches(list(range(len(pairs))), pairs, 2, packing)
            laid = [collate([pairs[i] for i in m], 0, capacity) for m in micros]
            plain = LayoutWork(sum((s.packed.input_ids if packing else s.input_ids).numel() for s in laid), len(laid))
            micros, _ = micro_batches(list(range(len(pairs))), pairs, 2, packing, shared=True)
            laid = [collate([pairs[i] for i in m], 0, shared=True).shared for m in micros]
            shared = LayoutWork(sum(s.prompt_ids.numel() + s.input_ids.numel() for s in laid), 2 * len(laid))
            assert layout_work(pairs, 2, packing) == (plain, shared)
    # packed: 24 samples of 41-43 tokens, one to a row, 2 rows a micro batch as wide as its longer row (6 rows at
    # 43, 10 at 42, 8 at 41); shared: each group in a micro batch of its own (two calls), its prompt of 40 and its
    # responses (two of 3 tokens, three of 2, three of 1) in 5 rows of 3
    assert layout_work(long_prompts, 2, True) == (LayoutWork(6 * 43 + 10 * 42 + 8 * 41, 12), LayoutWork(165, 6))
    assert use_shared("auto", long_prompts, 2, True)
    plain, shared = layout_work(short_prompts, 2, True)
    assert shared.slots > plain.slots and shared.forwards > plain.forwards  # more of both: never worth it
    assert not shared_pays(plain, shared) and not use_shared("auto", short_prompts, 2, True)
    assert use_shared(True, short_prompts, 2, True) and not use_shared(False, long_prompts, 2, True)


def test_a_users_own_estimator_is_named_module_function():
    from grpo_ray.algo.advantage import advantages, check

    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    mine = advantages("tests.helpers.my_algo:centred_only", rewards, 3)
    assert mine.tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3, 2 / 3, -1 / 3, -1 / 3])
    assert torch.allclose(mine, advantages("grpo", rewards, 3, norm_by_std=False))  # Dr. GRPO is grpo without std
    check("tests.helpers.my_algo:centred_only")


def test_a_policy_loss_declares_its_own_options():
    """A loss and the options it alone reads are one function and one dataclass (algorithm.loss_options): filled
    from the recipe's values, unknown keys and wrong values refused naming the key, and handed to the loss."""
    from dataclasses import dataclass

    from grpo_ray.algo import loss

    @dataclass(frozen=True)
    class TemperedOptions:
        beta: float = 1.0
        """Scale of the advantage."""

        def problems(self) -> list[str]:
            return [] if self.beta > 0 else [f"algorithm.loss_options.beta={self.beta:g}: must be positive"]

    @loss.policy_loss("tempered", TemperedOptions)
    def tempered(logp, old_logp, adv, mask, clip_low, clip_high, options):
        return -adv * options.beta * logp, torch.zeros_like(logp, dtype=torch.bool)

    try:
        assert loss.loss_options("tempered", {"beta": 2}) == TemperedOptions(beta=2.0)
        assert loss.loss_options("tempered", {}) == TemperedOptions()
        for given, said in [
            (
                {"gamma": 1},
                "algorithm.loss_options.gamma: loss_mode tempered has no option 'gamma'; its options are beta",
            ),
            ({"beta": "x"}, "algorithm.loss_options.beta='x': expected a float"),
            ({"beta": -1}, "algorithm.loss_options.beta=-1: must be positive"),
        ]:
            with pytest.raises(ValueError) as e:
                loss.loss_options("tempered", given)
            assert str(e.value) == said
        with pytest.raises(ValueError, match="loss_mode gspo has no option 'clip_ratio_c'; it has no options"):
            loss.loss_options("gspo", {"clip_ratio_c": 3})
        logp = torch.tensor([[-1.0, -2.0]])
        args = dict(clip_low=0.2, clip_high=0.2, kl_coef=0.0, kl_estimator="k3", loss_agg="token-mean", normaliser=2.0)
        one, _ = grpo_loss(logp, logp, None, torch.tensor([1.0]), torch.ones(1, 2), loss_mode="tempered", **args)
        two, _ = grpo_loss(
            logp, logp, None, torch.tensor([1.0]), torch.ones(1, 2), loss_mode="tempered",
            options=TemperedOptions(2.0), **args,
        )  # fmt: skip
        assert one.item() == pytest.approx(1.5) and two.item() == pytest.approx(3.0)
        loss.check("tempered")
    finally:
        del loss.POLICY_LOSSES["tempered"], loss.LOSS_OPTIONS["tempered"]


def test_dual_clip_is_vanillas_option_and_keeps_its_old_and_verl_names():
    from grpo_ray.config import RecipeError, load_recipe
    from tests.conftest import ROOT

    for key in ("algorithm.clip_ratio_c=3", "algorithm.loss_options.clip_ratio_c=3"):
        r = load_recipe(ROOT / "recipes" / "tiny-cpu.yaml", [key])
        assert r.algorithm.loss_options == {"clip_ratio_c": 3}
    with pytest.raises(RecipeError, match="algorithm.loss_options.clip_ratio_c"):
        load_recipe(ROOT / "recipes" / "tiny-cpu.yaml", ["actor_rollout_ref.actor.clip_ratio_c=3"])


@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_the_loss_keeps_every_tensor_on_the_logprobs_device(kl_coef):
    """Without a KL term (kl_coef 0, no reference: the DAPO-style recipes) the KL metric was made on the CPU and the
    loss's sums failed to stack on a GPU ("Expected all tensors to be on the same device", found on an H200). The
    meta device stands in for a GPU here: every tensor the loss returns is on the logprobs' device."""
    from grpo_ray.algo.loss import LossInputs, micro_batch_loss
    from grpo_ray.config import Recipe

    meta = torch.device("meta")
    z = lambda: torch.zeros(2, 3, device=meta)  # noqa: E731
    a = Recipe().algorithm
    a.kl_coef = kl_coef
    ref = z() if kl_coef else None
    signals = {"kl": ref} if kl_coef else {}
    x = LossInputs(z(), z(), torch.zeros(2, device=meta), torch.ones(2, 3, device=meta), None, None, signals)
    loss, counted, sums, _, _ = micro_batch_loss(x, a, 3)
    assert {loss.device, counted.device, sums.device} == {meta}


def test_reward_metric_names_carry_a_files_stem_never_its_path():
    from grpo_ray.telemetry.metrics import reward_label

    assert reward_label("/home/u/proj/my_reward.py:compute_score") == "my_reward:compute_score"
    assert reward_label("/home/u/proj/my_reward.py:compute_score/acc") == "my_reward:compute_score/acc"  # verl's dict
    assert reward_label("pkg.mod:fn") == "pkg.mod:fn" and reward_label("gsm8k") == "gsm8k"
