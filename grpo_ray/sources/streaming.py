"""The streaming schedule's batches (``schedules/streaming.py``'s rules): prompts sent ahead to engines that never
wait, a step's groups taken as they finish.

Each step's prompts are cut over the engines taking prompts as a batched step's are (engine i gets share i). An
engine is sent the prompts of the steps up to ``steps_sent_ahead`` past the one taken, and a step takes from it the
first of its groups to finish (``Generator.take``), as many as it holds past its share of the steps sent ahead
(``Feed.counts``): in a steady stream that is its share, so what an engine holds stays the same. What each engine
holds is kept here, by its actor (``Feed``: a prompt and the step it was sent for, its seed):

    an engine lost   is replaced, gets the weights, and is sent again what it held (none lost, none twice)
    an engine joins  holds nothing: it is sent its share from then on, and the others are asked for what they hold
                     past their new share first (generator.num_engines: min..max)
    an engine leaves (past num_engines, lost with its node) what it held is sent to the others
    a notice         an engine on a draining node is sent nothing, hands back the groups it has not finished (sent
                     to the others), and is asked for its finished ones first
    a checkpoint     keeps the prompts sent and not yet taken; the resumed run sends them first, under the
                     checkpoint's weights (the groups in flight are generated again, not carried over)

When the schedule launches ahead, the next step's groups are taken, and sent to the scorers, while the learner
trains this one (for the learner's next version).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from grpo_ray.config import GENERATOR
from grpo_ray.engines import Engines, key, sample_seed, split
from grpo_ray.pools import PoolFault
from grpo_ray.sources import BatchSource, Collected
from grpo_ray.types import Prompt


class Left(Exception):
    """An engine past num_engines lost with its node left the pool in a take (its groups go to the others)."""


class Feed:
    """The prompts each engine holds, sent ahead and taken back as groups (the state a streaming run keeps)."""

    def __init__(self, recipe, engines: Engines, next_prompts: Callable[[], list[Prompt]], schedule, say):
        self.r, self.engines, self.next_prompts, self.say = recipe, engines, next_prompts, say
        self.policy, self.ahead = schedule.policy, schedule.steps_sent_ahead()
        self.held: dict[str, list[tuple[Prompt, int]]] = {}
        """Per engine (its actor's id), the prompts it was sent and has not handed back, with the step each was sent
        for."""
        self.sent_through = 0
        """The last step whose prompts were sent."""
        self.sends: dict[str, int] = {}
        """Per engine, the sends to it so far: its take waits until it has them all (an actor's calls may start out
        of order: it serves several at a time)."""
        self.handed: dict[int, list[tuple[Prompt, int]]] = {}
        """Per step taken for, the prompts handed to it (and the step each was sent for): a checkpoint keeps those of
        a step not yet trained."""
        self.taken: list[tuple] = []
        """Shares taken by a take that lost an engine without replacing it, for the next take: (engine index, rollout
        ref, stats)."""
        self.resend: list[tuple[Prompt, int]] = []
        """Prompts a checkpoint held in flight, sent first by a resumed run."""
        self.handed_back: set[str] = set()
        """The engines on a draining node that handed back their unfinished groups (``_hand_back``)."""
        self.tokens = {"generated": 0, "handed": 0, "over": 0}
        """Response tokens generated so far, those handed on to be trained, and of those the ones of samples older than
        max_staleness when trained (goodput: those handed within the bound, over those generated)."""
        engines.holds = lambda engine: bool(self.held.get(engine))  # (an engine on a draining node leaves once empty)

    def take(
        self, step: int, last_step: int, learner_version: int, recover: bool = True
    ) -> tuple[list, list, dict[str, float]]:
        """This step's groups, for a learner at `learner_version`: the rollout refs and stats of each engine's share
        (``counts``), first sending the prompts of the steps up to the schedule's ``steps_sent_ahead``; the stream's
        metrics. Not `recover` (a take while the learner trains, whose weights a new engine could not be given yet):
        a lost engine's PoolFault is raised, and the shares already taken wait for the next take, which replaces
        it."""
        self._follow()
        self._resend()
        while self.sent_through < min(step + self.ahead, last_step):
            self.sent_through += 1
            prompts = self.next_prompts()
            self._send(prompts, [self.sent_through] * len(prompts))
        start, started, oldest = time.perf_counter(), time.time(), self.policy.oldest_kept(learner_version)
        self.handed = {k: v for k, v in self.handed.items() if k >= step - 1}
        done, self.taken = self._collect(step, oldest, recover), []
        rollouts, stats = [rollout for _, rollout, _ in done], [st for _, _, st in done]
        now, discarded = time.perf_counter(), sum(st.discarded for st in stats)
        self.count_tokens(stats, learner_version)
        generated = max(self.tokens["generated"], 1)
        busy = sum(st.seconds for st in stats) / len(stats)  # an engine's since its last take
        idle = sum(st.engine_idle for st in stats) / len(stats)
        return (
            rollouts,
            stats,
            {
                "timing_s/take": now - start,
                "take_window": (started, time.time()),
                "rollout/discarded_tokens/stale": float(discarded),
                "rollout/goodput": (self.tokens["handed"] - self.tokens["over"]) / generated,
                "rollout/over_bound_share": self.tokens["over"] / generated,
                "rollout/buffer_groups": float(sum(st.ready for st in stats)),
                "perf/engine_idle_share": idle / (busy + idle) if busy + idle else 0.0,
            },
        )

    def _collect(self, step: int, oldest: int | None, recover: bool) -> list[tuple]:
        """A batch's worth of groups, taken as ``counts`` says (again, with the groups of an engine that left spread
        over the others, until the batch is whole): (engine index, rollout ref, stats) in the engines' order."""
        done, lost = list(self.taken), None
        while (need := self.r.data.train_batch_size - sum(len(st.uids) for _, _, st in done)) and not lost:
            self._follow()
            calls = [(n, self._take_on(i, n, oldest)) for i, n in enumerate(self.counts(step, need)) if n]
            for n, call in calls:
                i = self.engines.pools.generators.index(call[2])  # (an engine before it may have left since)
                try:
                    rollout, stats = self._wait(i, call, n, oldest, recover)
                except Left:
                    continue
                except PoolFault as e:  # not recovering: the other engines' shares are still taken, and kept
                    lost = lost or e
                    continue
                held = self.held[key(self.engines.pools.generators[i])]
                for uid in stats.uids:  # the first of that prompt it held (a prompt sent twice, two epochs apart)
                    held.remove(handed := next(h for h in held if h[0].uid == uid))
                    self.handed.setdefault(step, []).append(handed)
                done.append((i, rollout, stats))
        if lost:
            self.taken = done
            raise lost
        return sorted(done, key=lambda d: d[0])

    def counts(self, step: int, need: int) -> list[int]:
        """How many groups each engine is asked for, `need` in all: one at a time of the engine holding the most past
        what it should hold after this step's take (its share, over the engines taking prompts, of each step sent
        past `step`), the first of those tied, never more than it holds. In a steady stream each holds that and its
        share of this step, and is asked for its share; an engine that joined holds less, and is asked for none until
        it holds its part; one on a draining node should hold none, and is asked for all it holds first."""
        engines = self.engines.pools.generators
        held, shares = [len(self.held[key(a)]) for a in engines], [0] * len(engines)
        taking = self.engines.taking()
        for i, share in zip(taking, split(list(range(self.r.data.train_batch_size)), len(taking))):
            shares[i] = len(share)
        past = held[:]
        for i, share in enumerate(shares):
            past[i] -= share * (self.sent_through - step)
        counts = [0] * len(engines)
        for _ in range(need):
            free = [i for i in range(len(engines)) if counts[i] < held[i]]
            if not free:
                raise RuntimeError(f"the engines hold {sum(held)} groups, and a take needs {need}")
            i = max(free, key=lambda i: (past[i] - counts[i], -i))
            counts[i] += 1
        return counts

    def count_tokens(self, stats: list, learner_version: int) -> None:
        """Add a take's tokens to the run's counts: generated (handed on, or discarded as stale), handed on, and of
        those handed on the ones of samples older than max_staleness when trained by a learner at
        `learner_version`."""
        handed = sum(sum(st.response_lengths) for st in stats)
        self.tokens["generated"] += handed + sum(st.discarded for st in stats)
        self.tokens["handed"] += handed
        self.tokens["over"] += sum(
            n
            for st in stats
            for n, oldest in zip(st.response_lengths, oldest_versions(st))
            if learner_version - oldest > self.r.algorithm.max_staleness
        )

    def _follow(self) -> None:
        """The feed kept in step with the pool: an engine that joined holds nothing yet; one replaced since (by a push
        or a take that lost it) is sent again what its predecessor held; what one that left held (past num_engines,
        lost with its node) is sent to the engines taking prompts. Each group sent again is generated again."""
        engines = self.engines.pools.generators
        now = [key(a) for a in engines]
        for k in now:
            self.held.setdefault(k, [])
        for k in [k for k in self.held if k not in now]:
            held, after = self.held.pop(k), self.engines.successor(k)
            self.sends.pop(k, None)
            self.engines.pools.redid(GENERATOR, len(held) * self.r.algorithm.group_size)
            if after in now:
                self.say(f"engine {now.index(after)} was replaced: sending again the {len(held)} groups it held")
                self._send_to(now.index(after), held)
            elif held:
                self.say(f"an engine left: sending the {len(held)} groups it held to the others")
                self._send([p for p, _ in held], [s for _, s in held])
        self._hand_back()

    def _hand_back(self) -> None:
        """Each engine on a node Ray marked draining (not ``taking`` prompts) stops the groups it holds and has not
        finished, once (``Generator.hand_back``): they are sent to the others, generated again there, and its
        finished ones are taken first (``counts``). One already gone is the take's to find."""
        engines, taking = self.engines.pools.generators, self.engines.taking()
        for i, actor in enumerate(engines):
            if i in taking or key(actor) in self.handed_back:
                continue
            self.handed_back.add(key(actor))
            try:
                uids = self.engines.pools.call(actor.hand_back.remote(), f"hand back on engine {i}")
            except PoolFault:
                continue
            held, back = self.held[key(actor)], []
            for uid in uids:  # (the first of that prompt it held, as a take's)
                held.remove(h := next(h for h in held if h[0].uid == uid))
                back.append(h)
            if back:
                self.say(f"engine {i} is on a draining node: it handed back the {len(back)} groups it had not finished")
                self.engines.pools.redid(GENERATOR, len(back) * self.r.algorithm.group_size)
                self._send([p for p, _ in back], [s for _, s in back])

    def _resend(self) -> None:
        """What a checkpoint held, sent again: steps' worth, each engine taking prompts getting its share of every
        step held."""
        taking = self.engines.taking()
        at = 0
        for i, share in zip(taking, split(list(range(self.r.data.train_batch_size)), len(taking))):
            n = len(share) * len(self.resend) // self.r.data.train_batch_size
            self._send_to(i, self.resend[at : at + n])
            at += n
        self.resend = []

    def _send(self, prompts: list[Prompt], steps: list[int]) -> None:
        """Cut `prompts` (each sent for its step in `steps`) over the engines taking prompts and send each its
        share."""
        taking = self.engines.taking()
        for i, idx in zip(taking, split(list(range(len(prompts))), len(taking))):
            self._send_to(i, [(prompts[j], steps[j]) for j in idx])

    def _send_to(self, i: int, held: list[tuple[Prompt, int]]) -> None:
        if not held:
            return
        actor = self.engines.pools.generators[i]
        self.held[key(actor)].extend(held)
        self.sends[key(actor)] = self.sends.get(key(actor), 0) + 1
        seeds = [sample_seed(self.r.trainer.seed, s, p.uid) for p, s in held]
        actor.submit.remote([p for p, _ in held], self.r.algorithm.group_size, seeds)

    def send_more(self, step: int) -> None:
        """DAPO's dynamic sampling: one more batch of the stream's prompts sent for `step` (a take for it follows, so
        what the engines hold stays the same)."""
        prompts = self.next_prompts()
        self._send(prompts, [step] * len(prompts))

    def _take_on(self, i: int, n: int, oldest: int | None) -> tuple:
        actor = self.engines.pools.generators[i]
        return (*actor.take.options(num_returns=2).remote(n, oldest, self.sends.get(key(actor), 0)), actor)

    def _wait(self, i: int, call: tuple, n: int, oldest: int | None, recover: bool) -> tuple:
        """Engine i's take; an engine lost is replaced, sent again what it held, and asked again
        (``Engines.answer``); one past num_engines leaves instead (``Left``), what it held sent to the others."""

        def again(i: int, call: tuple, e) -> tuple:
            if self.engines.pools.leaves(i):
                self.say(f"engine {i} lost ({e}); it leaves")
                self.engines.leave(i)
                self._follow()
                raise Left
            self.say(f"engine {i} lost ({e}); replacing it")
            self.engines.recover([i])
            self._follow()
            return self._take_on(i, n, oldest)

        return self.engines.answer(i, call, "take", recover, again)

    def state(self, trained: int) -> dict:
        """What a checkpoint after step `trained` keeps: the prompts sent and not yet trained (their uid and the step
        each was sent for: those the engines hold, and those taken for a later step), and how far the stream was
        sent."""
        later = [h for step, handed in self.handed.items() if step > trained for h in handed]
        order = [key(a) for a in self.engines.pools.generators]
        held = [
            h
            for k in sorted(self.held, key=lambda k: order.index(k) if k in order else len(order))
            for h in self.held[k]
        ]
        held += later
        return {"sent_through": self.sent_through, "held": [[p.uid, s] for p, s in held]}

    def restore(self, state: dict, prompt_of: Callable[[int], Prompt]) -> None:
        """A resumed run's feed: what the checkpoint held is sent again first."""
        self.sent_through = state.get("sent_through", 0)
        self.resend = [(prompt_of(uid), s) for uid, s in state.get("held", [])]


def oldest_versions(stats) -> list[int]:
    """Each completion's oldest token's weight version (of a share whose tokens were not all labelled: the share's
    policy version for each)."""
    if len(stats.versions) == len(stats.response_lengths):
        return [oldest for oldest, _ in stats.versions]
    return [stats.policy_version] * len(stats.response_lengths)


class Streaming(BatchSource):
    def __init__(self, hooks):
        super().__init__(hooks)
        self.feed = Feed(hooks.recipe, hooks.engines, hooks.prompts, hooks.schedule, hooks.say)
        self.flows: dict[int, dict[str, float]] = {}
        """The stream's metrics of a step's take."""

    def next(self, step: int, version: int, last_update: tuple[float, float]) -> tuple[Collected, dict[str, float]]:
        """The groups taken during the last step (the learner waited only past its update's end), or now; the
        stream's metrics, with how long the learner waited on the engines (``timing_s/learner_wait``)."""
        batch = self.inflight.pop(step, None) or self.take(step, version)
        flow = self.flows.pop(step)
        started, ended = flow.pop("take_window")
        flow["timing_s/learner_wait"] = max(0.0, ended - max(started, last_update[1]))
        return batch, flow

    def ahead(self, step: int, version: int) -> None:
        """The next step's groups taken while the learner trains (for its next version), when the schedule says;
        an engine lost then is replaced when that step starts, after the update, so that it gets the weights of a
        finished one."""
        if self.launches_ahead(step):
            try:
                self.inflight[step + 1] = self.take(step + 1, version + 1, recover=False)
            except PoolFault as e:
                self.h.say(f"{e}; the engine is replaced after the update")

    def more(self, step: int, version: int) -> tuple[list, list]:
        """One more batch of prompts sent into the stream for `step`, and the first groups to finish taken."""
        self.feed.send_more(step)
        rollouts, stats, _ = self.feed.take(step, self.h.last_step(), version)
        return rollouts, stats

    def state(self, step: int) -> dict:
        return {"feed": self.feed.state(step)}

    def restore(self, state: dict) -> None:
        if "feed" in state:
            self.feed.restore(state["feed"], self.h.prompt_of)

    def take(self, step: int, version: int, recover: bool = True) -> Collected:
        """The step's groups for a learner at `version` (``Feed.take``), sent to the scorers; the stream's metrics
        kept for the step."""
        rollouts, stats, self.flows[step] = self.feed.take(step, self.h.last_step(), version, recover)
        return self.h.send(rollouts, stats, min(s.policy_version for s in stats))
