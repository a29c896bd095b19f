"""The policy loss: a policy-gradient term chosen by ``algorithm.loss_mode``, plus a KL-to-reference term and
an entropy bonus, aggregated as ``algorithm.loss_agg`` says (verl's names for both).

Per response token t of sample i (A_i its advantage, ratio = exp(logp - logp_old), w_t the rollout-correction
weight of grpo_ray.algo.correction, 1 without one):

    vanilla   ratio = exp(clamp(logp - logp_old, -20, 20))                                  (verl's clamp)
              pg = max(-A_i * ratio, -A_i * clip(ratio, 1 - clip_low, 1 + clip_high)) * w_t      (PPO clip)
              with loss_options.clip_ratio_c > 1 (dual clip) a negative advantage's term is also capped:
              min(pg, -A_i * c)
    gspo      s_i = exp(min(mean_t (logp - logp_old), 10)) (the sequence's length-normalised ratio; verl's clamp at
              10), used for every token of the sequence with the gradient of its own logp:
              pg = max(-A_i * s, -A_i * clip(s, ...)) * w_t
    cispo     pg = -A_i * sg(clip(ratio, 1 - clip_low, 1 + clip_high)) * logp * w_t   (the clipped IS weight
              carries no gradient, so no token ever loses its gradient to the clip)
    kl        k1: logp - logp_ref
              k3: clamp(exp(d) - d - 1, -10, 10), d = clamp(logp_ref - logp, -20, 20)  (Schulman's, >= 0; verl's
              clamps: past a log gap of about 2.5 the value stops at 10 and its gradient at 0, where unclamped a gap
              of 4 gave 49.6 and a gradient of -53.6)
    loss_t    pg + kl_coef * kl - entropy_coef * entropy_t

Each clamp bounds what a float32 step could otherwise blow up (a log ratio past about 88 overflows exp); a token
or sequence past it keeps a finite loss and no gradient through the clamped quantity.

Aggregation over a mini batch of S sequences and T tokens in all, counting only what the loss keeps (rollout
rejection masks whole samples out: S and T count the kept ones, as verl divides by the kept tokens;
``micro_batch_loss`` returns each micro batch's sums and counts, and the learner divides by the mini batch's
total over ranks once it is known):

    token-mean                sum_{i,t} loss / T
    seq-mean-token-sum        sum_i (sum_t loss) / S
    seq-mean-token-mean       sum_i (mean_t loss) / S
    seq-mean-token-sum-norm   sum_{i,t} loss / (S * L), L = generator.sampling.max_tokens (Dr. GRPO's constant;
                              verl divides by the padded length of the batch instead, which varies)

so that accumulating micro batches, and averaging over data-parallel ranks with each
rank's loss multiplied by the world size, equals one pass over the whole mini batch.
A new policy loss is one function registered with ``policy_loss(name, options)`` (its value of
``algorithm.loss_mode``), and the options it alone reads one dataclass beside it (``algorithm.loss_options``,
checked before start). A user's own is named ``module:function`` in the recipe, with the registered ones'
signature; it gets ``algorithm.loss_options`` as a dict.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from grpo_ray.algo.correction import SUM_KEYS, rollout_correction
from grpo_ray.algo.distill import distill_advantages
from grpo_ray.algo.registry import FunctionError, named
from grpo_ray.config import DISTILL, KL, AlgorithmConfig, TeacherConfig, loss_aggregation

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def kept_count(mode: str, keep: torch.Tensor, horizon: int) -> torch.Tensor:
    """What `mode` divides by, counted over the tokens `keep` ([B, T], 1 where the loss keeps a token) of a micro
    batch: tokens, sequences with a kept token, or those sequences x the response-length horizon. The learner adds
    it up over micro batches and ranks into the mini batch's normaliser."""
    seqs = (keep.sum(dim=1) > 0).sum().to(torch.float64)
    if mode == "token-mean":
        return keep.sum().to(torch.float64)
    if mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        return seqs
    if mode == "seq-mean-token-sum-norm":
        return seqs * horizon
    raise ValueError(f"unknown loss aggregation {mode!r}")


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str, normaliser: float) -> torch.Tensor:
    """Sum of masked per-token `values` ([B, T]) under `mode` (each sequence's mean for seq-mean-token-mean,
    its tokens' sum otherwise), divided by `normaliser`."""
    mask = mask.to(values.dtype)
    if mode == "seq-mean-token-mean":
        per_seq = (values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
        return per_seq.sum() / normaliser
    if mode in AGG_MODES:
        return (values * mask).sum() / normaliser
    raise ValueError(f"unknown loss aggregation {mode!r}")


POLICY_LOSSES: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {}
LOSS_OPTIONS: dict[str, type] = {}
"""The options dataclass of each registered policy loss that has options of its own."""


@dataclass(frozen=True)
class NoOptions:
    """A policy loss with no options of its own."""

    def problems(self) -> list[str]:
        return []


def policy_loss(name: str, options: type = NoOptions):
    """Register a policy-gradient term: (logp, old_logp, advantages [B, 1], mask, clip_low, clip_high, options) ->
    (per-token term [B, T], where the clip was active [B, T]); `options` is the dataclass of what it alone reads
    (``algorithm.loss_options``), with a ``problems()`` method that says what is wrong with the values."""

    def register(fn):
        POLICY_LOSSES[name], LOSS_OPTIONS[name] = fn, options
        return fn

    return register


def loss_options(name: str, given: dict[str, Any]) -> Any:
    """Policy loss `name`'s options from ``algorithm.loss_options``: its dataclass filled in, or for a user's
    ``module:function`` the dict as given. ValueError naming the key when one is unknown or its value wrong."""
    if ":" in name:
        return dict(given)
    kind = LOSS_OPTIONS.get(name, NoOptions)
    known = [f.name for f in fields(kind)]
    for key in given:
        if key not in known:
            has = f"its options are {', '.join(known)}" if known else "it has no options"
            raise ValueError(f"algorithm.loss_options.{key}: loss_mode {name} has no option {key!r}; {has}")
    defaults, values = kind(), {}
    for key, value in given.items():
        want = type(getattr(defaults, key))
        try:
            if isinstance(value, bool) and want is not bool:  # bool is an int: true would pass as 1
                raise TypeError
            values[key] = want(value)
        except (TypeError, ValueError):
            raise ValueError(f"algorithm.loss_options.{key}={value!r}: expected a {want.__name__}") from None
    options = kind(**values)
    problems = options.problems()
    if problems:
        raise ValueError("; ".join(problems))
    return options


@dataclass(frozen=True)
class VanillaOptions:
    clip_ratio_c: float = 0.0
    """Dual clip: with c > 1, a negative advantage's term is capped at -A * c; 0 turns it off (verl's default
    is 3)."""

    def problems(self) -> list[str]:
        c = self.clip_ratio_c
        if c < 0 or 0 < c <= 1 or c != c:
            return [f"algorithm.loss_options.clip_ratio_c={c:g}: dual clip needs a value above 1 (or 0 for none)"]
        return []


@policy_loss("vanilla", VanillaOptions)
def vanilla(logp, old_logp, adv, mask, clip_low, clip_high, options=VanillaOptions()):
    ratio = (logp - old_logp).clamp(-20, 20).exp()
    unclipped, clipped = -adv * ratio, -adv * ratio.clamp(1 - clip_low, 1 + clip_high)
    pg = torch.maximum(unclipped, clipped)
    if options.clip_ratio_c:
        pg = torch.where(adv < 0, torch.minimum(pg, -adv * options.clip_ratio_c), pg)
    return pg, clipped > unclipped


@policy_loss("gspo")
def gspo(logp, old_logp, adv, mask, clip_low, clip_high, options=None):
    m = mask.to(logp.dtype)
    seq = ((logp - old_logp) * m).sum(dim=1, keepdim=True) / m.sum(dim=1, keepdim=True).clamp(min=1)
    s = (seq.detach() + logp - logp.detach()).clamp(max=10).exp()  # the sequence's ratio, each token's gradient
    unclipped, clipped = -adv * s, -adv * s.clamp(1 - clip_low, 1 + clip_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


@policy_loss("cispo")
def cispo(logp, old_logp, adv, mask, clip_low, clip_high, options=None):
    ratio = (logp - old_logp).detach().exp()
    weight = ratio.clamp(1 - clip_low, 1 + clip_high)
    return -adv * weight * logp, weight != ratio


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate from sampled tokens."""
    if estimator == "k1":
        return logp - ref_logp
    if estimator == "k3":
        delta = (ref_logp - logp).clamp(-20, 20)
        return (delta.exp() - delta - 1).clamp(-10, 10)
    raise ValueError(f"unknown KL estimator {estimator!r}")


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    kl_coef: float,
    kl_estimator: str,
    loss_agg: str,
    normaliser: float,
    is_weights: torch.Tensor | None = None,
    loss_mode: str = "vanilla",
    options: Any = None,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss of one micro batch ([B, T] tensors, advantages [B], or [B, T] per token: ``algo.distill``) and its
    metrics (sums over masked tokens, 0-dim tensors on the device: read them once a step, not per micro batch).
    `options`: the loss's own (``loss_options``), its defaults when None."""
    adv = (advantages.unsqueeze(1) if advantages.dim() == 1 else advantages).to(logp.dtype)
    options = loss_options(loss_mode, {}) if options is None else options
    pg, was_clipped = named(POLICY_LOSSES, loss_mode)(logp, old_logp, adv, mask, clip_low, clip_high, options)
    if is_weights is not None:
        pg = pg * is_weights
    pg_loss = aggregate(pg, mask, loss_agg, normaliser)
    loss = pg_loss
    kl_loss = torch.zeros((), dtype=logp.dtype, device=logp.device)  # on the device: stacked with the others
    if ref_logp is not None and kl_coef > 0:
        kl_loss = aggregate(kl_penalty(logp, ref_logp, kl_estimator), mask, loss_agg, normaliser)
        loss = loss + kl_coef * kl_loss
    if entropy is not None and entropy_coef > 0:
        loss = loss - entropy_coef * aggregate(entropy, mask, loss_agg, normaliser)
    m = mask.to(logp.dtype)
    metrics = {
        "pg_loss": pg_loss.detach(),
        "kl_loss": kl_loss.detach(),
        "pg_clipfrac_sum": (was_clipped.to(logp.dtype) * m).sum(),
        "ppo_kl_sum": (-(logp - old_logp).detach() * m).sum(),
        "tokens": m.sum(),
    }
    return loss, metrics


@dataclass
class LossInputs:
    """One micro batch of the learner's update: [B, T] tensors on one device, 0 off the responses."""

    logp: torch.Tensor
    """The learner's logprobs of the sampled tokens, with their gradient."""
    sampler: torch.Tensor
    """The sampler's (vLLM's) logprobs of the same tokens."""
    advantages: torch.Tensor
    """[B] one per sample."""
    mask: torch.Tensor
    """1 on response tokens."""
    old: torch.Tensor | None = None
    """The old policy's logprobs: the learner's at the version that generated each sample; None when that is the
    weights being trained (one on-policy update: logp itself, detached)."""
    entropy: torch.Tensor | None = None
    """The learner's entropy at each position (with a gradient only when the loss has an entropy term)."""
    signals: dict[str, torch.Tensor] = field(default_factory=dict)
    """The frozen scorers' logprobs of the sampled tokens by their use (``config.USES``; ``token_uses()``): ``kl``'s
    for the KL term, ``distill``'s for each token's advantage."""


def _distill(advantages: torch.Tensor, old: torch.Tensor, signal: torch.Tensor, keep: torch.Tensor, section):
    """On-policy distillation (``algo.distill``), its coefficients the teacher section's."""
    t = section or TeacherConfig()
    return distill_advantages(advantages, old, signal, keep, t.kl_coef, t.reward_weight)


ADVANTAGE_TERMS = {DISTILL: _distill}
"""Token uses whose signal reshapes each token's advantage (a signal that is a reward; a plugin adds its own,
``grpo_ray.extend.add_use``), applied in this order before the policy loss: ``fn(advantages, old logprobs, signal,
kept tokens, the pool's section) -> (advantages, sums)``."""
LOSS_TERMS = {KL: "the policy loss's KL term against the signal (grpo_loss's ref; algorithm.kl_coef)"}
"""Token uses whose signal is a term of the policy loss."""


def token_uses() -> tuple[str, ...]:
    """Every token use the loss applies, a plugin's too (the learner refuses a signal of another, before any
    forward)."""
    return (*ADVANTAGE_TERMS, *LOSS_TERMS)


LOSS_SUMS = (
    "pg_loss",
    "kl_loss",
    "pg_clipfrac_sum",
    "ppo_kl_sum",
    "entropy_sum",
    "tokens",
    "reverse_kl_sum",
    "distill_abs_sum",
    "reward_abs_sum",
)
"""The metric sums ``micro_batch_loss`` returns, in this order: the first two to be divided by the mini batch's
normaliser like the loss, the others per kept token (the last three: distillation's, 0 without a teacher)."""


def micro_batch_loss(
    x: LossInputs, a: AlgorithmConfig, horizon: int, sections: dict | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The whole loss of one micro batch, before normalisation: the old policy (the sampler's in bypass mode),
    rollout correction, each token signal by its use (``token_uses()``; `sections`: each use's pool section, its
    coefficients: a teacher's distillation reshapes the per-token advantages), the policy-gradient term, KL and
    entropy, aggregated as ``a.loss_agg`` says (auto:
    ``config.loss_aggregation``) with a
    normaliser of 1. Returns (loss sum, its count for the normaliser (``kept_count``), LOSS_SUMS as one float64
    tensor, the correction's sums (``correction.SUM_KEYS``), the largest token ratio). The learner divides the
    gradient and the first two sums by the mini batch's count over every micro batch and rank."""
    rc, agg = a.rollout_correction, loss_aggregation(a)
    old = x.sampler if rc.bypass_mode else (x.logp.detach() if x.old is None else x.old)
    weights, keep, corr, top = rollout_correction(
        old,
        x.sampler,
        x.mask,
        rc.rollout_is,
        rc.rollout_is_threshold,
        rc.rollout_rs,
        rc.rollout_rs_threshold,
        rc.rollout_rs_threshold_lower,
    )
    advantages, distilled = x.advantages.to(x.logp.device), {}
    for use, term in ADVANTAGE_TERMS.items():
        if use in x.signals:
            advantages, sums = term(advantages, old, x.signals[use], keep, (sections or {}).get(use))
            distilled.update(sums)
    loss, m = grpo_loss(
        x.logp,
        old,
        x.signals.get(KL),
        advantages,
        keep,
        clip_low=a.clip_ratio_low,
        clip_high=a.clip_ratio_high,
        kl_coef=a.kl_coef,
        kl_estimator=a.kl_estimator,
        loss_agg=agg,
        normaliser=1.0,
        is_weights=weights if rc.rollout_is else None,
        loss_mode=a.loss_mode,
        options=loss_options(a.loss_mode, a.loss_options),
        entropy=x.entropy,
        entropy_coef=a.entropy_coeff,
    )
    entropy = torch.zeros((), device=keep.device) if x.entropy is None else (x.entropy.detach() * keep).sum()
    m["entropy_sum"] = entropy.to(m["tokens"].dtype)
    zero = torch.zeros((), dtype=m["tokens"].dtype, device=m["tokens"].device)
    for k in ("reverse_kl_sum", "distill_abs_sum", "reward_abs_sum"):
        m[k] = distilled.get(k, zero).to(zero)
    sums = torch.stack([m[k] for k in LOSS_SUMS]).double()
    return loss, kept_count(agg, keep, horizon), sums, corr, top


def sft_loss(logp: torch.Tensor, mask: torch.Tensor, normaliser: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Negative log-likelihood of the target tokens of one micro batch ([B, T]), token-mean over `normaliser`
    tokens, and its metrics (sums over masked tokens, 0-dim tensors on the device)."""
    m = mask.to(logp.dtype)
    nll = -(logp * m)
    return aggregate(nll, mask, "token-mean", normaliser), {"nll_sum": nll.detach().sum(), "tokens": m.sum()}


def reward_model_loss(
    scores: torch.Tensor, targets: torch.Tensor | None, normaliser: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """A reward model's loss over one micro batch, summed and divided by `normaliser` (the mini batch's rows), and
    its rows' sums [loss, correct, margin, rows] (float64, no gradient). Preference pairs (`targets` None): `scores`
    is [2B], the B chosen responses' then their rejected ones'; Bradley-Terry's -log sigmoid(s_chosen - s_rejected),
    correct when the chosen scores higher, margin s_chosen - s_rejected. Pointwise rows: `scores` [B] and their
    labels in [0, 1] as `targets`; binary cross-entropy on sigmoid(s), correct when s > 0 is label > 0.5, margin
    s where the label is over 0.5 and -s under it."""
    if targets is None:
        chosen, rejected = scores.float().chunk(2)
        margin = chosen - rejected
        per_row = -torch.nn.functional.logsigmoid(margin)
        correct = margin > 0
    else:
        s, y = scores.float(), targets.float()
        per_row = torch.nn.functional.binary_cross_entropy_with_logits(s, y, reduction="none")
        margin = torch.where(y > 0.5, s, -s)
        correct = (s > 0) == (y > 0.5)
    sums = torch.stack([per_row.sum(), correct.sum(), margin.sum(), per_row.new_tensor(float(len(per_row)))])
    return per_row.sum() / normaliser, sums.detach().double()


@dataclass
class StepSums:
    """A step's loss and metric sums over its updates, kept on the device until the step's end (no host sync per
    micro batch); the learner reduces them over ranks, ``step_metrics`` turns them into the step's metrics."""

    losses: torch.Tensor
    """LOSS_SUMS over every update, the first two scaled as their gradients (by each mini batch's normaliser)."""
    corr: torch.Tensor
    """The rollout correction's sums (``correction.SUM_KEYS``), over the first epoch."""
    top: torch.Tensor
    """The largest token ratio of the first epoch."""

    @classmethod
    def zeros(cls, device) -> StepSums:
        z = torch.zeros((), dtype=torch.float64, device=device)
        return cls(
            torch.zeros(len(LOSS_SUMS), dtype=torch.float64, device=device),
            torch.zeros(len(SUM_KEYS), dtype=torch.float64, device=device),
            z,
        )

    def add_losses(self, mini: torch.Tensor, scale: float) -> None:
        """One mini batch's LOSS_SUMS; `scale` is world size / what the loss kept over every rank."""
        mini[:2] *= scale
        self.losses += mini

    def add_correction(self, corr: torch.Tensor, top: torch.Tensor) -> None:
        self.corr += corr
        self.top = torch.maximum(self.top, top)

    def all_reduce(self) -> None:
        """Sum over the ranks of the default process group (the largest ratio: its maximum)."""
        import torch.distributed as dist

        dist.all_reduce(self.losses)
        dist.all_reduce(self.corr)
        dist.all_reduce(self.top, op=dist.ReduceOp.MAX)


def step_metrics(sums: StepSums, updates: int, distilled: bool = False) -> dict[str, float]:
    """The loss and rollout-correction metrics of a step from its sums reduced over ranks; `updates` is world size x
    PPO epochs x mini batches (each update's loss summed over ranks is world size x its value). `distilled`: with
    distillation's, the reverse KL per token and the share of the advantage's size that is the teacher's signal."""
    per_update = sums.losses / updates
    per_token = sums.losses / sums.losses[LOSS_SUMS.index("tokens")].clamp(min=1)
    c = dict(zip(SUM_KEYS, sums.corr.tolist()))
    tokens = max(c["corr_tokens"], 1)
    return {
        "actor/pg_loss": per_update[0].item(),
        "actor/kl_loss": per_update[1].item(),
        "actor/pg_clipfrac": per_token[2].item(),
        "actor/ppo_kl": per_token[3].item(),
        "actor/entropy": per_token[4].item(),
        "rollout_corr/kl": c["corr_kl_sum"] / tokens,
        "rollout_corr/k3_kl": c["corr_k3_sum"] / tokens,
        "rollout_corr/rollout_is_mean": c["corr_ratio_sum"] / tokens,
        "rollout_corr/rollout_is_max": sums.top.item(),
        "rollout_corr/rollout_rs_masked_fraction": c["corr_masked_tokens"] / tokens,
        "rollout_corr/rollout_rs_seq_masked_fraction": c["corr_masked_seqs"] / max(c["corr_seqs"], 1),
    } | (_distill_metrics(dict(zip(LOSS_SUMS, sums.losses.tolist()))) if distilled else {})


def _distill_metrics(s: dict[str, float]) -> dict[str, float]:
    both = s["distill_abs_sum"] + s["reward_abs_sum"]
    return {
        "distill/reverse_kl": s["reverse_kl_sum"] / max(s["tokens"], 1),
        "distill/advantage_share": s["distill_abs_sum"] / both if both else 0.0,
    }


def check(name: str, options: dict[str, Any] | None = None) -> None:
    """Try policy loss `name` on a batch of 2 x 3 tokens with `options` (``algorithm.loss_options``); FunctionError
    when it cannot be called as the registered ones are, gives the wrong shapes, or no gradient to the learner's
    logprobs."""
    options = options or {}
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -0.7]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    fn = named(POLICY_LOSSES, name)
    try:
        pg, clipped = fn(
            logp, logp.detach() - 0.1, torch.tensor([[1.0], [-1.0]]), mask, 0.2, 0.28, loss_options(name, options)
        )
    except Exception as e:
        raise FunctionError(
            "called as policy losses are, fn(logp, old_logp, advantages [B, 1], mask, clip_low, clip_high, options) "
            f"-> (per-token loss, clipped), on 2 x 3 tokens it raised {type(e).__name__}: {e}"
        ) from None
    shapes = [getattr(x, "shape", type(x).__name__) for x in (pg, clipped)]
    if shapes != [logp.shape, logp.shape]:
        raise FunctionError(f"on 2 x 3 tokens it gave {shapes}: expected (per-token loss, clipped), two [2, 3] tensors")
    if pg.requires_grad:
        (pg * mask).sum().backward()
    if logp.grad is None or not torch.isfinite(logp.grad).all() or not logp.grad.abs().sum():
        raise FunctionError("its loss carries no finite gradient to the learner's logprobs (logp)")
