"""The generator side of a step, for the controller: batches out to the engines, weights in, lost engines replaced.

An engine runs its calls in the order they were sent, so a batch is generated with the weights of the last push
sent before it (``Launched.version``), and a push waits for the generation queued ahead of it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable

import ray

from grpo_ray.config import GENERATOR, LEARNER
from grpo_ray.errors import RunError
from grpo_ray.pools import PoolFault, Pools
from grpo_ray.types import Prompt


class LearnerLost(RunError):
    """A learner rank died in a push: its shard of the state is gone with it (`cause`: the failed call)."""

    def __init__(self, cause: str):
        super().__init__(f"{cause}; resume from the last checkpoint")
        self.cause = cause


@dataclasses.dataclass
class Launched:
    """One step's generation, launched and not yet collected."""

    step: int
    prompts: list[Prompt]
    version: int
    """The engines' weights when it was launched: the version that generates it."""
    n: int
    """Samples per prompt."""
    sampling: object
    """SamplingConfig, or None for the training sampling."""
    calls: dict[int, tuple]
    """Share index -> (rollout ref, stats ref, the actor called)."""
    shares: list[list[Prompt]]
    """The prompts cut over the engines present at launch, share i engine i's (empty for one on a draining node)."""


class Engines:
    def __init__(
        self, recipe, pools: Pools, probe_ids: list[int], learner_version: Callable[[], int], say: Callable[[str], None]
    ):
        self.r, self.pools, self.probe_ids, self.learner_version, self.say = (
            recipe,
            pools,
            probe_ids,
            learner_version,
            say,
        )
        self.version = 0
        """The weights the engines hold (the last push)."""
        self.fresh: set[int] = set()
        """Engines replaced that have not answered a generate call yet: their first one may hold one-time warm-up
        (kernel selection, allocator growth), so its deadline is twice generator.timeout_s."""
        self.receives: list = []
        """The engines' receive calls of the last push (``failed_receives``)."""
        self.successors: dict[str, str] = {}
        """Per engine replaced (its actor's ``key``), its replacement's."""
        self.pending: dict[str, int] = {}
        """Per engine (its ``key``), its generate calls not yet answered."""
        self.holds: Callable[[str], bool] = lambda engine: False
        """Whether an engine (its ``key``) holds work that no call of ours waits on: a streaming source's groups sent
        ahead (``Feed``)."""

    def launch(self, step: int, prompts: list[Prompt], n: int = 0, sampling=None) -> Launched:
        """Send `prompts` to the engines, cut evenly over them, `n` samples each (default: the group size)."""
        taking, shares = self.taking(), [[] for _ in self.pools.generators]
        for i, share in zip(taking, split(prompts, len(taking))):
            shares[i] = share
        batch = Launched(step, prompts, self.version, n or self.r.algorithm.group_size, sampling, {}, shares)
        for i, shard in enumerate(shares):
            if shard:
                batch.calls[i] = self._generate_on(i, shard, batch.n, step, sampling)
        return batch

    def collect(self, batch: Launched, recover: bool = True) -> tuple[list, list]:
        """The batch's rollout refs (for the pools) and stats (for the controller). An engine that dies or misses
        generator.timeout_s is replaced (unless that happened already, e.g. in a push) and its share alone is
        generated again, with the seeds it had and the weights the engines hold now (a new engine's first answer
        has twice the deadline; an engine past num_engines leaves instead, and its share goes to another). Not
        `recover`: its PoolFault is raised, `batch` unchanged."""
        shards = batch.shares

        def again(i: int, call: tuple, e: PoolFault) -> tuple:
            at = next((k for k, g in enumerate(self.pools.generators) if g is call[2]), None)  # (None: gone already)
            if at is not None and self.pools.leaves(at):
                self.say(f"engine {at} lost ({e}); it leaves, its share generated on another")
                self.leave(at)
            elif at is not None:
                self.say(f"engine {at} lost ({e}); replacing it")
                self.recover([at])
            self.pools.redid(GENERATOR, len(shards[i]) * batch.n)  # its share's samples, generated again
            taking = self.taking()
            return self._generate_on(taking[i % len(taking)], shards[i], batch.n, batch.step, batch.sampling)

        done = {i: self.answer(i, call, "generate", recover, again) for i, call in batch.calls.items()}
        return [done[i][0] for i in sorted(done)], [done[i][1] for i in sorted(done)]

    def answer(self, i: int, call: tuple, what: str, recover: bool, again: Callable[[int, tuple, PoolFault], tuple]):
        """Engine i's answer to `call` (rollout ref, stats ref, the actor called): the rollout ref and the stats. An
        engine lost (dead, or past generator.timeout_s; twice that for a new engine's first answer) is replaced by
        `again`, which sends the call anew, generator.max_restarts times a step. Not `recover`: its PoolFault."""
        g = self.r.generator
        for attempt in range(g.max_restarts + 1):
            try:
                deadline = g.timeout_s * (2 if i in self.fresh else 1)
                got = call[0], self.pools.call(call[1], f"{what} on engine {i}", deadline)
                self.fresh.discard(i)
                if what == "generate":
                    self.pending[key(call[2])] -= 1
                return got
            except PoolFault as e:
                if not recover:
                    raise
                if attempt == g.max_restarts:
                    raise RunError(
                        f"{e}; engine {i} was replaced {g.max_restarts} times in this step (generator.max_restarts)"
                    ) from None
                call = again(i, call, e)
        raise AssertionError("unreachable")

    def generate(self, prompts: list[Prompt], n: int, step: int, sampling=None) -> tuple[list, list]:
        """Generate `n` samples of each prompt now, and wait for them (validation)."""
        return self.collect(self.launch(step, prompts, n, sampling))

    def _generate_on(self, i: int, shard: list[Prompt], n: int, step: int, sampling) -> tuple:
        seeds = [sample_seed(self.r.trainer.seed, step, p.uid) for p in shard]
        actor = self.pools.generators[i]
        self.pending[key(actor)] = self.pending.get(key(actor), 0) + 1
        return (*actor.generate.options(num_returns=2).remote(shard, n, seeds, sampling), actor)

    def probe(self) -> float:
        """Mean absolute difference of generator and learner logprobs on a fixed sequence (worst engine)."""
        gens = [g.prompt_logprobs.remote(self.probe_ids) for g in self.pools.generators]
        learners = [l.probe_logprobs.remote(self.probe_ids) for l in self.pools.learners]  # both at once
        gens = self.pools.call(gens, "generator probe", self.r.generator.timeout_s)
        return probe_diff(gens, self.pools.call(learners, "learner probe")[0])

    def push(self, version: int, probe: bool | list[float] = False) -> tuple[list[dict], list[dict]]:
        """Learner rank 0 sends through the weight transport (all ranks gather), every engine receives and loads;
        the workers' timings.
        With `probe`, both sides' probe logprobs too (their "probe"): each engine's at the end of its receive
        call; the learner's as given (a list: from the update that made these weights, ``Learner.train``) or
        else asked for once its ranks have sent, so it runs while the engines still load. (Not inside the
        learner's push call: a rank whose send failed would leave the others alone in the probe's collective
        forward.)"""
        bucket, metas, learners = self.r.trainer.bucket_mb << 20, self.pools.metas, self.pools.learners
        sends = [l.push_weights.remote(metas, bucket, version) for l in learners]
        receives = self.receives = [
            g.receive_weights.remote(metas, bucket, version, self.probe_ids if probe else None)
            for g in self.pools.generators
        ]
        timeout = self.r.trainer.sync_timeout_s + self.r.generator.timeout_s
        try:
            pushed = self.pools.call(sends, "weight send", timeout)
        except PoolFault as e:
            if self.pools.lost(LEARNER, e):  # a rank gone with its shard of the state (``sync`` may start it again)
                raise LearnerLost(str(e)) from None
            raise
        asked = [l.probe_logprobs.remote(self.probe_ids) for l in learners] if probe is True else []
        received = self.pools.call(receives, "weight receive", timeout)
        if probe:
            pushed[0]["probe"] = self.pools.call(asked, "learner probe")[0] if asked else probe
        self.pools.transport.done(version)
        self.version = version
        return pushed, received

    def sync(self, learner_probe: list[float] | None = None, again: Callable[[], list] | None = None) -> dict:
        """Push the learner's weights to every engine and check them with the probe, whose logprobs each side
        computes as part of the push (``push``): the learner's are `learner_probe` when its update computed them,
        else computed while the engines load. A push that fails (a receiver lost mid-broadcast) replaces the lost
        engines and pushes again, once. A learner rank lost in it, where the run keeps copies of the ranks' state
        (trainer.fault_tolerance=all): the group started again from the copies taken as the step began, the step
        trained again (`again`: the learner's train calls), the engines whose receive failed replaced, and the
        push made again, once. It starts on an engine when the generation sent before it ends:
        sync/seconds is the push as the engines see it, timing_s/sync_weights the controller's wait, that
        generation and the probe included."""
        start, version = time.perf_counter(), self.learner_version()
        self.retire()
        try:
            pushed, received = self.push(version, learner_probe or True)
        except LearnerLost as e:
            if again is None or self.pools.lost_policy(LEARNER) != "copy":
                raise
            self.say(f"{e.cause}; the learner group started again from its copies, the step trained again")
            lost = self.failed_receives()  # (the receivers fail as rank 0 closes its end)
            self.pools.recover(LEARNER)
            self.pools.redid(LEARNER, 1)
            update = self.pools.call(again(), "learner train (again)")[0]
            pushed, received = self.recover(lost, update.probe or True)
        except PoolFault as e:
            lost = self.pools.unresponsive_generators()
            lost += [i for i in self.failed_receives() if i not in lost]
            self.say(f"weight sync to version {version} failed ({e}); replacing engines {lost}")
            pushed, received = self.recover(lost, learner_probe or True)
        diff = probe_diff([r.pop("probe") for r in received], pushed[0].pop("probe"))
        bound = self.r.trainer.max_sync_logprob_diff
        fresh = [r.pop("fresh") for r in received]
        for i, f in enumerate(fresh):
            if f["stale_tokens"]:
                raise RunError(
                    f"weight sync to version {version}: engine {i} served {f['stale_tokens']:.0f} prompt tokens "
                    "from its prefix cache whose keys and values were computed under the weights before the push "
                    f"(the next token's logprobs after them differ from the new weights' by {f['diff']:.3g}); a "
                    "request after a push must never see them (the cache is reset after every load)"
                )
        if diff > bound:
            raise RunError(
                f"weight sync to version {version}: generator and learner logprobs differ by "
                f"{diff:.3g} on the probe, over trainer.max_sync_logprob_diff={bound}"
            )
        sent, slowest = pushed[0], max(received, key=lambda t: t["seconds"])
        seconds = slowest["seconds"]  # from the engines' start of the push until the last one has loaded
        return {
            "sync/logprob_diff": diff,
            "sync/seconds": seconds,
            "sync/bytes": sent["bytes"],
            "sync/GBps": sent["bytes"] / seconds / 1e9,
            **{f"sync/{phase}_s": sent.get(phase, 0.0) for phase in ("gather", "cast", "delta")},
            **delta_metrics(sent),
            "sync/load_s": slowest["load"],
            "sync/pause_s": slowest.get("pause", 0.0),
            "sync/fresh_check_s": max(f["seconds"] for f in fresh),
            "timing_s/sync_weights": time.perf_counter() - start,
        }

    def failed_receives(self) -> list[int]:
        """The engines whose receive of the push that failed raised: replaced too, so that the push again starts from
        engines in a known state. (With the delta transport a surviving engine's next receive was seen to fail with
        the failed receive's error, its cause not found; vLLM's in-place reload itself takes a push after a failed
        one: tried alone, the weights then load as on a fresh engine.)"""
        failed = []
        for i, ref in enumerate(self.receives):
            try:
                ray.get(ref, timeout=self.r.trainer.sync_timeout_s + 10)
            except Exception:  # raised, lost, or still hung past the sync timeout
                failed.append(i)
        return failed

    def recover(self, engines: list[int], probe: bool | list[float] = False) -> tuple[list[dict], list[dict]]:
        """Replace `engines` (one past num_engines leaves instead: ``leave``), connect the weight transport again over
        all engines, load the learner's weights into all (`probe`: as in push)."""
        for i in sorted(engines, reverse=True):  # (one leaving moves those after it)
            if self.pools.leaves(i):
                self.leave(i, connect=False)
            else:
                self.replace(i)
        self.pools.transport.connect(self.pools)
        return self.push(self.learner_version(), probe)

    def replace(self, i: int) -> None:
        """Engine i replaced by a new actor (``Pools.recover``), noted as its predecessor's successor."""
        before = key(self.pools.generators[i])
        self.pools.recover(GENERATOR, i)
        self.successors[before] = key(self.pools.generators[i])
        self.fresh.add(i)

    def successor(self, engine: str) -> str:
        """The engine that now stands for `engine` (an actor's ``key``): its replacement's, or its own."""
        while engine in self.successors:
            engine = self.successors[engine]
        return engine

    def leave(self, i: int, connect: bool = True) -> None:
        """Engine i (past num_engines) gone from the pool with its node; the weight transport connected over the
        engines left (a group with a member gone would fail the next push)."""
        self.pools.drop(i)
        self.fresh = {k - (k > i) for k in self.fresh if k != i}
        if connect:
            self.pools.transport.connect(self.pools)

    def grow(self, learner_version: int) -> None:
        """Between steps, with the engines at the learner's weights (`learner_version`): the engines that joined
        (``Pools.grow``: placed as nodes with room appeared, and loaded) connected to the weight transport and given
        the weights, so that the next batch is cut over them too. Then the nodes Ray marked draining since said
        (``Pools.drains``): an engine on one takes no more prompts (``taking``), and one past num_engines leaves once
        it holds no work (``retire``)."""
        if self.pools.elastic and learner_version == self.version:
            if self.pools.grow():
                self.pools.transport.connect(self.pools)
                self.push(self.version)
        self.pools.drains()
        self.retire()

    def retire(self) -> None:
        """Engines past num_engines on a node Ray marked draining leave now, while alive, once they hold no work
        (they are sent none: ``taking``): the node's end then costs no samples, and no push fails on them (as its
        loss found by a push would: the engines whose receive failed with it are replaced too)."""
        nodes, engines = self.pools.nodes.get(GENERATOR, []), self.pools.generators
        for i in reversed(range(min(len(nodes), len(engines)))):
            busy = self.pending.get(key(engines[i])) or self.holds(key(engines[i]))
            if nodes[i] in self.pools.noticed and self.pools.leaves(i) and not busy:
                self.say(f"engine {i} is on a draining node and holds no work: it leaves now")
                self.leave(i)

    def taking(self) -> list[int]:
        """The engines a batch is cut over: those not on a node Ray marked draining (a preemption notice: the node
        goes soon, and a share it held would be generated again), or all where every one is. One on such a node
        stays until a call finds it gone (a push, each step), then is replaced as any lost engine is, or leaves."""
        nodes = self.pools.nodes.get(GENERATOR, [])
        every = range(len(self.pools.generators))
        return [i for i in every if i >= len(nodes) or nodes[i] not in self.pools.noticed] or list(every)


def key(actor) -> str:
    """An engine's actor's id: what it holds is kept by it, as engines join, leave and are replaced."""
    return actor._actor_id.hex()


def delta_metrics(sent: dict) -> dict[str, float]:
    """A delta push's (``transports/delta.py``): its bytes against a whole push's, the elements and tensors it
    changed; nothing for other transports."""
    if "dense_bytes" not in sent:
        return {}
    return {
        "sync/bytes_share": sent["bytes"] / max(sent["dense_bytes"], 1),
        "sync/changed_share": sent["changed"] / max(sent["elements"], 1),
        "sync/tensors_touched": float(sent["tensors_touched"]),
    }


def probe_diff(engines: list[list[float]], learner: list[float]) -> float:
    """Mean absolute difference of each engine's probe logprobs from the learner's; the worst engine's. Probes of
    different lengths are not the same tokens scored: a RuntimeError, never a difference over the shorter."""
    for i, gen in enumerate(engines):
        if len(gen) != len(learner) or not gen:
            raise RuntimeError(f"sync probe: engine {i} scored {len(gen)} tokens, the learner {len(learner)}")
    return max(sum(abs(a - b) for a, b in zip(gen, learner, strict=True)) / len(gen) for gen in engines)


def sample_seed(seed: int, step: int, uid: int) -> int:
    """The sampling seed of one prompt at one step: a hash of (run seed, step, prompt), so it needs no history."""
    return int.from_bytes(hashlib.blake2b(f"{seed}/{step}/{uid}".encode(), digest_size=4).digest(), "little")


def split(items: list, parts: int) -> list[list]:
    """`items` cut into `parts` contiguous shares as even as can be."""
    out, start = [], 0
    for k in range(parts):
        n = len(items) // parts + (k < len(items) % parts)
        out.append(items[start : start + n])
        start += n
    return out
