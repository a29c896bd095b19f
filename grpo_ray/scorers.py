"""The scorer side: every pool whose row gives a signal (``config.pools.KINDS``), called from one place. A row's
use (``config.USES``) says where its signal goes: a sequence score is a component of the reward, summed here; a
per-token logprob goes to the learner, keyed by its use.

    send(rollouts, samples)   a batch to every scorer at once, each actor an even share (every actor of a group is
                              called, with or without a share: their forwards are collective); refs back
    rewards(sent)             the step's rewards in one call: the rule rewards' scores with the reward model's
                              joined (``rewards.learned.with_model``), what their users should see said once and
                              counted (``telemetry.failures``: a reward function's first failure, a judge's unread
                              replies)
    learned(sent, deadline)   the reward model's values under its row's fault policy: a lost or failing actor
                              starts the pool again and the batch is scored again, once; a judge past its deadline
                              scores the default
    signals(tokens)           the token scorers' (reference, teacher) logprob refs, by use, for the learner
    token_work(tokens)        their work, waited for (for metrics)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from grpo_ray.algo.batching import Samples, balanced_ranges, spans_of
from grpo_ray.config import KINDS, RULES, PoolKind, Recipe, Unscored
from grpo_ray.pools import PoolFault, Pools
from grpo_ray.rewards.learned import fill_unread, with_model
from grpo_ray.telemetry.failures import Failures
from grpo_ray.types import Work

CALLS = {"token": "logprobs", "sequence": "score"}
"""A model scorer's call by the signal it gives: (rollout refs, spans) in, (its signal, Work) out, every actor of its
group called (``roles.frozen``)."""


@dataclass
class Sent:
    """A batch sent to the scorers: their refs, and what to send again."""

    rollouts: list
    samples: Samples
    rules: list = field(default_factory=list)
    """A ``Scores`` ref per reward actor with a share."""
    learned: list = field(default_factory=list)
    """(values ref, Work ref) per reward-model actor."""
    tokens: dict[str, list] = field(default_factory=dict)
    """Per token scorer, (logprobs ref, Work ref) per actor."""


@dataclass
class Learned:
    """The reward model's values for a batch, one per sample (NaN: no score), and its work."""

    values: list[float]
    work: list[Work]
    timed_out: bool = False
    """A judge missed reward_model.judge.timeout_s: every value is NaN (the default is the caller's)."""


class Scorers:
    def __init__(self, recipe: Recipe, pools: Pools, failures: Failures, say=print):
        self.r, self.pools, self.failures, self.say = recipe, pools, failures, say
        self.token_pools = [k.name for k in KINDS.values() if k.signal == "token"]
        """The pools that score every sampled token (reference, teacher), in the table's order."""
        self.learned_pool = next(
            (k.name for k in KINDS.values() if k.signal == "sequence" and k.model and k.count(recipe)), ""
        )
        """The learned reward's pool, the sequence scorer with a model the recipe turns on: the reward model (a
        classifier) or the judge; empty: none (the rule rewards' is RULES)."""

    def spread(self, pool: str, rollouts: list, samples: Samples, by_tokens: bool) -> list[tuple]:
        """The step's samples cut into contiguous shares of near-equal tokens (or samples) over every actor of
        `pool`: (actor, rollout refs, spans) per actor with a share, in sample order."""
        actors = self.pools.actors[pool]
        costs = samples.costs if by_tokens else [1] * len(samples.costs)
        shares = [spans_of(samples.counts, share) for share in balanced_ranges(costs, len(actors))]
        return [
            (actor, [rollouts[i] for i, _, _ in pieces], [(a, b) for _, a, b in pieces])
            for actor, pieces in zip(actors, shares)
            if pieces
        ]

    def _every_actor(self, pool: str, rollouts: list, samples: Samples) -> list:
        """(signal ref, Work ref) from every actor of `pool`'s group, each with its share of the tokens (or none),
        through the call its signal names (``CALLS``)."""
        shares = {id(a): (refs, spans) for a, refs, spans in self.spread(pool, rollouts, samples, True)}
        call = CALLS[KINDS[pool].signal]
        return [
            getattr(a, call).options(num_returns=2).remote(*shares.get(id(a), ([], [])))
            for a in self.pools.actors[pool]
        ]

    def send(self, rollouts: list, samples: Samples, tokens: bool = True) -> Sent:
        """Send the batch to the sequence scorers and, with `tokens`, to the token scorers."""
        sent = Sent(rollouts, samples, self.rules(rollouts, samples))
        sent.learned = self._every_actor(self.learned_pool, rollouts, samples) if self.learned_pool else []
        if tokens:
            sent.tokens = self.send_tokens(rollouts, samples)
        return sent

    def rules(self, rollouts: list, samples: Samples) -> list:
        """Scores refs, one per reward actor: every actor scores an even share of the samples."""
        return [a.score.remote(refs, spans) for a, refs, spans in self.spread(RULES, rollouts, samples, False)]

    def rule_scores(self, sent: Sent) -> list:
        """The reward actors' Scores of `sent`, in order: a share whose actor was lost is scored again by a new actor
        in its place (its row's ``lost``: replace), so each sample is scored once."""
        try:
            return self.pools.call(sent.rules, RULES)
        except PoolFault as e:
            if not e.died:
                raise
        shares = self.spread(RULES, sent.rollouts, sent.samples, False)  # as they were sent
        out = []
        for ref, (actor, refs, spans) in zip(sent.rules, shares):
            try:
                out.append(self.pools.call(ref, RULES))
            except PoolFault as e:
                if not e.died:
                    raise
                i = self.pools.actors[RULES].index(actor)
                self.pools.recover(RULES, i)
                self.say(f"reward actor {i} was lost; a new one scores its share again")
                self.pools.redid(RULES, sum(end - start for start, end in spans))
                out.append(self.pools.call(self.pools.actors[RULES][i].score.remote(refs, spans), f"{RULES} (again)"))
        return out

    def send_tokens(self, rollouts: list, samples: Samples) -> dict[str, list]:
        """Per token scorer (none without a KL term, none without distillation), its (logprobs ref, Work ref) per
        actor."""
        return {pool: self._every_actor(pool, rollouts, samples) for pool in self.token_pools}

    def learned(self, sent: Sent, policy: Unscored | None) -> Learned | None:
        """The learned reward's values for `sent` (None without one), under its row's fault policy: an actor lost, or
        one whose collective it broke (the group is gone either way), starts the pool again and the batch is scored
        again, once (a second failure stops the run); a call past the deadline of its `policy` (the row's
        ``unscored``: a judge's timeout) starts the pool again and scores NaN."""
        if not sent.learned:
            return None
        pool, deadline = self.learned_pool, policy.deadline_s if policy else None
        try:
            got = self.pools.call([ref for pair in sent.learned for ref in pair], pool, deadline)
        except PoolFault as e:
            self.pools.recover(pool)
            if deadline is not None and e.timed_out:
                self.say(f"{e} ({policy.keys}.timeout_s): this step's samples score the default")
                return Learned([math.nan] * len(sent.samples.costs), [Work(deadline, 0)], timed_out=True)
            self.say(f"a {pool} actor was lost ({e}); started the pool again, scoring the batch again")
            self.pools.redid(pool, len(sent.samples.costs))
            again = self._every_actor(pool, sent.rollouts, sent.samples)
            got = self.pools.call([ref for pair in again for ref in pair], f"{pool} (again)", deadline)
        return Learned([v for share in got[0::2] for v in share], got[1::2])

    def rewards(self, sent: Sent, counted: bool = True) -> tuple[list, dict[str, float], list[Work]]:
        """The scores of what was `sent`: the reward functions' (their first failures shown, a training batch's
        failing steps `counted`), the learned reward's (``learned``) added as the component ``reward_model``
        (``rewards.learned.with_model``); its metrics and work. What the learned reward leaves unscored is its row's
        ``unscored`` policy's (``unscored``)."""
        scores = self.failures.rewards(self.rule_scores(sent), counted)
        rm, rules = self.r.reward_model, [(f.name, f.weight) for f in self.r.reward.functions]
        kind = KINDS.get(self.learned_pool)
        policy = kind.unscored(self.r) if kind and kind.unscored else None
        got = self.learned(sent, policy)
        if got is None:
            return scores, {}, []
        values, counts = (got.values, {}) if policy is None else self.unscored(got, kind, policy, counted)
        scores, metrics = with_model(scores, values, rm.weight, rm.normalize, rules, rm.sigmoid)
        return scores, {**metrics, **counts, "timing_s/reward_model": max(w.seconds for w in got.work)}, got.work

    def unscored(self, got: Learned, kind: PoolKind, policy: Unscored, counted: bool) -> tuple[list, dict]:
        """`got`'s values with what was left unscored scoring the policy's default, and the counts
        (``<section>/<pool>_unread``, ``_timeouts``): the first such sample said once, a training batch's (`counted`)
        share counted as the scorer's failures."""
        values, unread = fill_unread(got.values, policy.default)
        what, prefix = f"the {kind.name}", f"{kind.section or kind.name}/{kind.name}"
        counts = {
            f"{prefix}_unread": 0.0 if got.timed_out else unread / len(values),
            f"{prefix}_timeouts": float(got.timed_out),
        }
        if unread and not got.timed_out:
            self.failures.show_first(
                what,
                f"counted in {prefix}_unread",
                kind.name,
                f"{unread} of {len(values)} {policy.why}, scored {policy.keys}.default={policy.default:g}; the first "
                "such reply is in the log",
            )
        if counted:
            self.failures.count(what, counts[f"{prefix}_unread"], what)
        return values, counts

    @staticmethod
    def signals(tokens: dict[str, list]) -> dict[str, list]:
        """The token scorers' logprob refs by their use (their row's, ``config.USES``: ``kl``, ``distill``), of what
        ``send_tokens`` sent (the learner waits for them)."""
        return {KINDS[pool].use: [lp for lp, _ in refs] for pool, refs in tokens.items() if refs}

    def rescored(self, tokens: dict[str, list], rollouts: list, samples: Samples) -> dict[str, list] | None:
        """After the learner failed on `tokens` (``send_tokens``' refs for `rollouts`): the token scorers' pools that
        lost an actor meanwhile started again (their row's ``lost``: restart) and the batch sent to them again, the
        others' refs kept; None when none was lost (the learner's failure is its own) or one that was cannot
        recover."""
        lost = [pool for pool, refs in tokens.items() if refs and self._lost(pool, refs)]
        if not lost or any(self.pools.lost_policy(pool) == "stop" for pool in lost):
            return None
        out = dict(tokens)
        for pool in lost:
            self.pools.recover(pool)
            self.say(f"a {pool} actor was lost; started the pool again, scoring the batch again")
            self.pools.redid(pool, len(samples.costs))
            out[pool] = self._every_actor(pool, rollouts, samples)
        return out

    def _lost(self, pool: str, refs: list) -> bool:
        """Whether `pool`'s calls of `refs` lost an actor."""
        try:
            self.pools.call([w for _, w in refs], pool)
        except PoolFault as e:
            return e.died
        return False

    def token_work(self, tokens: dict[str, list]) -> dict[str, list[Work]]:
        """The token scorers' work, of what ``send_tokens`` sent, waited for."""
        return {pool: self.pools.call([w for _, w in refs], pool) if refs else [] for pool, refs in tokens.items()}
