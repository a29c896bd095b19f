"""The algorithm against a reference written from the papers' formulas, one sample and one token at a time, in
float64 (DeepSeekMath's GRPO, Dr. GRPO, RLOO, REINFORCE++, DAPO's clip-higher, GSPO, CISPO; verl's
aggregations, clamps and rollout correction where the papers leave a choice open).

The implementation under test is what the learner runs: ``advantage.advantages`` for a step's rewards, and
``loss.micro_batch_loss`` on each micro batch of each data-parallel rank, the gradients divided by the mini batch's
count as ``Learner.update`` does (each rank's by count / world size, then averaged over ranks as FSDP2 does). The
batches are random: padding, rows with no response token, both signs of advantage, log ratios inside and outside
the clips and past the clamps (+-30).
"""

import itertools
import math
import random

import pytest
import torch

from grpo_ray.algo.advantage import advantages
from grpo_ray.algo.loss import LossInputs, micro_batch_loss
from grpo_ray.config import AlgorithmConfig, RolloutCorrectionConfig, loss_aggregation

# --- the reference -----------------------------------------------------------------------------------------------


def ref_advantages(name: str, rewards: list[float], g: int, lengths: list[int], norm_by_std: bool) -> list[float]:
    out = []
    groups = [rewards[i : i + g] for i in range(0, len(rewards), g)]
    for group in groups:
        mean = sum(group) / g
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / (g - 1))
        equal = all(r == group[0] for r in group)
        for i, r in enumerate(group):
            centred = 0.0 if equal else r - mean
            if name == "grpo":
                out.append(centred / (std + 1e-6) if norm_by_std else centred)
            elif name == "rloo":
                others = [x for j, x in enumerate(group) if j != i]
                out.append(0.0 if equal else r - sum(others) / (g - 1))
            else:
                out.append(centred)
    if name == "reinforce_plus_plus_baseline":  # whitened over the batch's response tokens
        n = sum(lengths)
        mu = sum(a * w for a, w in zip(out, lengths)) / n
        var = sum((a - mu) ** 2 * w for a, w in zip(out, lengths)) / max(n - 1, 1)
        out = [(a - mu) / math.sqrt(var + 1e-8) for a in out]
    return out


def clip(x, lo, hi):
    return min(max(x, lo), hi)


def ref_loss(a: AlgorithmConfig, logp, entropy, old, sampler, ref, adv, mask, horizon):
    """The loss of one mini batch, token by token (logp and entropy: lists of lists of 0-dim float64 tensors with
    gradients; the rest plain floats)."""
    rc, agg = a.rollout_correction, loss_aggregation(a)
    B = len(mask)
    if rc.bypass_mode:
        old = sampler
    elif old is None:
        old = [[x.item() for x in row] for row in logp]
    toks = [[t for t, m in enumerate(mask[i]) if m] for i in range(B)]
    # rollout correction: per-token weights, whole samples kept or masked
    w = [[1.0] * len(mask[i]) for i in range(B)]
    keep = [True] * B
    for i in range(B):
        d = [old[i][t] - sampler[i][t] for t in toks[i]]
        if rc.rollout_is == "token":
            for t, dt in zip(toks[i], d):
                w[i][t] = min(math.exp(clip(dt, -20, 20)), rc.rollout_is_threshold)
        if rc.rollout_rs and toks[i]:
            log_r = sum(d) / (len(d) if rc.rollout_rs == "geometric" else 1)
            lower = rc.rollout_rs_threshold_lower or 1 / rc.rollout_rs_threshold
            keep[i] = math.log(lower) <= log_r <= math.log(rc.rollout_rs_threshold)
    kept = [i for i in range(B) if keep[i] and toks[i]]
    lo, hi = 1 - a.clip_ratio_low, 1 + a.clip_ratio_high

    def pg_term(i, t):
        A, lp = adv[i], logp[i][t]
        if a.loss_mode == "vanilla":
            ratio = torch.exp(torch.clamp(lp - old[i][t], -20, 20))
            term = torch.maximum(-A * ratio, -A * torch.clamp(ratio, lo, hi))
            c = a.loss_options.get("clip_ratio_c", 0.0)
            if c and A < 0:
                term = torch.minimum(term, torch.tensor(-A * c, dtype=torch.float64))
        elif a.loss_mode == "gspo":  # s_i = exp(mean_t log ratio), d s_i / d logp_t = s_i (the paper's token form)
            mean = sum(logp[i][u].item() - old[i][u] for u in toks[i]) / len(toks[i])
            if mean < 10:
                s = math.exp(mean) * torch.exp(lp - lp.detach())
            else:  # verl's clamp: exp(10) and no gradient
                s = torch.tensor(math.exp(10), dtype=torch.float64)
            term = torch.maximum(-A * s, -A * torch.clamp(s, lo, hi))
        else:  # cispo: a clipped, stop-gradient IS weight on the logprob
            weight = clip(math.exp(lp.item() - old[i][t]), lo, hi)
            term = -A * weight * lp
        return term * w[i][t]

    def kl_term(i, t):
        lp = logp[i][t]
        if a.kl_estimator == "k1":
            return lp - ref[i][t]
        d = torch.clamp(ref[i][t] - lp, -20, 20)
        return torch.clamp(torch.exp(d) - d - 1, -10, 10)

    def aggregate(term):
        if not kept:
            return torch.zeros((), dtype=torch.float64)
        sums = {i: sum(term(i, t) for t in toks[i]) for i in kept}
        if agg == "token-mean":
            return sum(sums.values()) / sum(len(toks[i]) for i in kept)
        if agg == "seq-mean-token-sum":
            return sum(sums.values()) / len(kept)
        if agg == "seq-mean-token-mean":
            return sum(sums[i] / len(toks[i]) for i in kept) / len(kept)
        return sum(sums.values()) / (len(kept) * horizon)

    loss = aggregate(pg_term)
    if ref is not None and a.kl_coef > 0:
        loss = loss + a.kl_coef * aggregate(kl_term)
    if a.entropy_coeff > 0:
        loss = loss - a.entropy_coeff * aggregate(lambda i, t: entropy[i][t])
    return loss


# --- the implementation, as the learner runs it ------------------------------------------------------------------


def learner_loss(a: AlgorithmConfig, logp, entropy, old, sampler, ref, adv, mask, horizon, world: int, micro: int):
    """(loss, d loss / d logp, d loss / d entropy) as Learner.update makes them: every rank's micro batches,
    the mini batch's count summed over ranks, each rank's gradient times world / count, averaged over ranks."""
    B = logp.shape[0]
    per = B // world
    counts, losses, grads_lp, grads_ent = [], [], [], []
    for r in range(world):
        lp = logp.detach().clone().requires_grad_()
        ent = entropy.detach().clone().requires_grad_(a.entropy_coeff > 0)
        rows = list(range(r * per, (r + 1) * per))
        loss_sum, count = 0.0, 0.0
        for k in range(0, len(rows), micro):
            idx = rows[k : k + micro]
            x = LossInputs(
                lp[idx],
                sampler[idx],
                adv[idx],
                mask[idx],
                None if old is None else old[idx],
                ent[idx],
                {} if ref is None else {"kl": ref[idx]},
            )
            loss, n, sums, _, _ = micro_batch_loss(x, a, horizon)
            loss.backward()
            loss_sum, count = loss_sum + loss.item(), count + n.item()
        counts.append(count)
        losses.append(loss_sum)
        grads_lp.append(lp.grad)
        grads_ent.append(ent.grad if ent.grad is not None else torch.zeros_like(ent))
    total = sum(counts)  # dist.all_reduce of the count
    scale = world / total if total else 0.0
    loss = sum(x * scale for x in losses) / world
    return loss, sum(g * scale for g in grads_lp) / world, sum(g * scale for g in grads_ent) / world


# --- random batches -----------------------------------------------------------------------------------------------


def batch(rng: random.Random, B: int = 8, T: int = 6, spread: float = 0.5, extreme: bool = False):
    lengths = [rng.choice([0, 1, rng.randint(1, T), T]) for _ in range(B)]
    mask = torch.tensor([[1.0 if t < n else 0.0 for t in range(T)] for n in lengths], dtype=torch.float64)
    base = torch.tensor([[-rng.uniform(0.1, 5) for _ in range(T)] for _ in range(B)], dtype=torch.float64)

    def near(scale):
        noise = torch.tensor([[rng.gauss(0, scale) for _ in range(T)] for _ in range(B)], dtype=torch.float64)
        if extreme:  # some tokens past every clamp
            noise += torch.tensor(
                [[rng.choice([0.0, 0.0, 30.0, -30.0]) for _ in range(T)] for _ in range(B)], dtype=torch.float64
            )
        return (base + noise) * mask

    logp = base * mask
    adv = torch.tensor([rng.choice([-1, 1]) * rng.uniform(0.1, 2) for _ in range(B)], dtype=torch.float64)
    entropy = torch.tensor([[rng.uniform(0, 3) for _ in range(T)] for _ in range(B)], dtype=torch.float64) * mask
    return logp, entropy, near(spread), near(spread), near(1.0), adv, mask


def as_lists(t):
    return [[t[i, j] for j in range(t.shape[1])] for i in range(t.shape[0])]


MODES = ["vanilla", "gspo", "cispo"]
AGGS = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm", "auto"]
CORRECTIONS = {
    "none": RolloutCorrectionConfig(),
    "token-is": RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold=1.5),
    "sequence-rs": RolloutCorrectionConfig(rollout_rs="sequence", rollout_rs_threshold=3.0),
    "geometric-rs": RolloutCorrectionConfig(
        rollout_rs="geometric", rollout_rs_threshold=1.3, rollout_rs_threshold_lower=0.9
    ),
    "is+rs": RolloutCorrectionConfig(rollout_is="token", rollout_rs="sequence", rollout_rs_threshold=3.0),
    "bypass": RolloutCorrectionConfig(bypass_mode=True),
}


@pytest.mark.parametrize("mode, agg, correction", list(itertools.product(MODES, AGGS, CORRECTIONS)))
def test_loss_and_gradients_match_the_reference(mode, agg, correction):
    rng = random.Random(hash((mode, agg, correction)) % 2**32)
    checked = 0
    for trial in range(12):
        a = AlgorithmConfig(
            loss_mode=mode,
            loss_agg=agg,
            rollout_correction=CORRECTIONS[correction],
            clip_ratio_low=rng.choice([0.2, 3e-4]),
            clip_ratio_high=rng.choice([0.2, 0.28, 4e-4]),
            loss_options={"clip_ratio_c": rng.choice([0.0, 3.0])} if mode == "vanilla" else {},
            kl_coef=rng.choice([0.0, 0.1]),
            kl_estimator=rng.choice(["k1", "k3"]),
            entropy_coeff=rng.choice([0.0, 0.01]),
        )
        logp, entropy, old, sampler, ref, adv, mask = batch(
            rng, spread=rng.choice([0.01, 0.3, 2.0]), extreme=trial % 4 == 3
        )
        on_policy = trial % 3 == 0
        horizon = 6
        lp_ref = [[x.clone().requires_grad_() for x in row] for row in as_lists(logp)]
        ent_ref = [[x.clone().requires_grad_() for x in row] for row in as_lists(entropy)]
        want = ref_loss(
            a,
            lp_ref,
            ent_ref,
            None if on_policy else old.tolist(),
            sampler.tolist(),
            ref.tolist(),
            adv.tolist(),
            mask.tolist(),
            horizon,
        )
        if want.requires_grad:
            want.backward()
        want_lp = torch.tensor(
            [[0.0 if x.grad is None else x.grad.item() for x in row] for row in lp_ref], dtype=torch.float64
        )
        want_ent = torch.tensor(
            [[0.0 if x.grad is None else x.grad.item() for x in row] for row in ent_ref], dtype=torch.float64
        )
        for world, micro in ((1, 8), (2, 1), (2, 3)):
            got, got_lp, got_ent = learner_loss(
                a, logp, entropy, None if on_policy else old, sampler, ref, adv, mask, horizon, world, micro
            )
            assert got == pytest.approx(want.item(), rel=1e-10, abs=1e-12), (trial, world, micro)
            assert torch.allclose(got_lp * mask, want_lp, rtol=1e-9, atol=1e-12), (trial, world, micro)
            assert torch.allclose(got_ent * mask, want_ent, rtol=1e-9, atol=1e-12), (trial, world, micro)
            assert torch.isfinite(got_lp).all()
            checked += 1
    assert checked == 36


@pytest.mark.parametrize("name", ["grpo", "rloo", "reinforce_plus_plus_baseline"])
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_advantages_match_the_reference(name, norm_by_std):
    rng = random.Random(7)
    for _ in range(200):
        g = rng.choice([2, 3, 4, 8])
        groups = rng.randint(1, 6)
        rewards = []
        for _ in range(groups):  # equal groups of non-binary rewards (0.9, 1.2: format + answer), mixed ones
            kind = rng.random()
            if kind < 0.3:
                rewards += [rng.choice([0.9, 1.2, 0.2, 0.1 + 0.2, 1 / 3])] * g
            elif kind < 0.6:
                rewards += [rng.choice([0.0, 0.2, 1.0, 1.2]) for _ in range(g)]
            else:
                rewards += [rng.uniform(-2, 2) for _ in range(g)]
        lengths = [rng.randint(1, 50) for _ in rewards]
        want = ref_advantages(name, rewards, g, lengths, norm_by_std)
        got = advantages(name, torch.tensor(rewards, dtype=torch.float64), g, torch.tensor(lengths), norm_by_std)
        assert got.tolist() == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_an_all_equal_group_gets_exactly_zero_advantage():
    """[0.9, 0.9, 0.9] gave +-0.056 each in float32 (the mean one rounding step off, divided by std + eps); an
    all-correct group of the Gemma MATH-500 recipe (format 0.2 + math 1.0 = 1.2) got +0.106 on every token."""
    for value in (0.9, 1.2, 0.2, 0.1 + 0.2):
        for g in (3, 5, 8, 16):
            rewards = torch.tensor([value] * g + [0.0, 1.0] * (g // 2) + [0.0] * (g % 2), dtype=torch.float32)
            for name in ("grpo", "rloo"):
                adv = advantages(name, rewards, g)
                assert adv[:g].tolist() == [0.0] * g, (name, value, g)
                assert adv[g:].abs().max() > 0.5


def test_rejected_samples_leave_the_denominator():
    """verl divides by the kept tokens: a sample masked by rollout rejection neither adds to the loss nor counts
    in its normaliser, so the kept samples' gradient does not shrink with the kept fraction."""
    a = AlgorithmConfig(rollout_correction=RolloutCorrectionConfig(rollout_rs="sequence", rollout_rs_threshold=2.0))
    logp = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]], dtype=torch.float64, requires_grad=True)
    sampler = torch.tensor([[-1.0, -1.0], [-5.0, -5.0]], dtype=torch.float64)  # sample 1: log ratio 8, masked
    x = LossInputs(logp, sampler, torch.tensor([1.0, 1.0], dtype=torch.float64), torch.ones(2, 2, dtype=torch.float64))
    loss, count, *_ = micro_batch_loss(x, a, horizon=2)
    (loss / count).backward()
    assert count.item() == 2  # the kept sample's two tokens, not four
    assert logp.grad[0].tolist() == pytest.approx([-0.5, -0.5]) and logp.grad[1].tolist() == [0.0, 0.0]


def test_sequence_rejection_sums_the_tokens_before_any_clamp():
    """Token log ratios [30, -20] are far off (log r = 10): clamping each token first called it exact."""
    a = AlgorithmConfig(rollout_correction=RolloutCorrectionConfig(rollout_rs="sequence", rollout_rs_threshold=2.0))
    old = torch.tensor([[0.0, 0.0]], dtype=torch.float64)
    sampler = torch.tensor([[-30.0, 20.0]], dtype=torch.float64)
    x = LossInputs(
        old.clone().requires_grad_(),
        sampler,
        torch.tensor([1.0], dtype=torch.float64),
        torch.ones(1, 2, dtype=torch.float64),
        old,
    )
    _, count, *_ = micro_batch_loss(x, a, horizon=2)
    assert count.item() == 0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("gap", [-100.0, -30.0, 30.0, 100.0])
def test_extreme_log_ratios_give_a_finite_float32_loss_and_gradient(mode, gap):
    """verl's clamps: the log ratio at +-20 (vanilla), GSPO's sequence ratio at 10, k3 at [-10, 10]. Without them
    a log ratio of 25 gave a loss of 7e10 and, past about 88 in float32, a NaN gradient (a skipped step)."""
    a = AlgorithmConfig(loss_mode=mode, kl_coef=0.1, kl_estimator="k3")
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = logp.detach() - gap
    x = LossInputs(logp, old, torch.tensor([-1.0]), torch.ones(1, 2), old, signals={"kl": logp.detach() + gap})
    loss, *_ = micro_batch_loss(x, a, horizon=2)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert loss.item() < 1e10


def test_k3_is_clamped_as_verl_does():
    from grpo_ray.algo.loss import kl_penalty

    logp = torch.tensor([[-5.0]], requires_grad=True)
    value = kl_penalty(logp, torch.tensor([[-1.0]]), "k3")  # a log gap of 4: exp(4) - 4 - 1 = 49.6 unclamped
    value.sum().backward()
    assert value.item() == 10.0 and logp.grad.item() == 0.0
