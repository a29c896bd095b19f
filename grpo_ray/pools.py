"""The actors of every role: started in their placement groups, joined into their process groups,
and, for generators, replaced when one is lost.

``Pools.start`` reserves the cluster (``placement.reserve``), starts one Ray actor per bundle and
role, sets up the learners' torch.distributed group and connects the weight transport (learner rank 0
and every engine worker: ``grpo_ray.transports``, chosen by ``trainer.weight_transport``).
``recover(pool, i)`` does what the pool's row says of a lost actor: an engine is killed (dead or hung) and a new one
started in the same bundle (the transport then connects again over all engines: a collective group cannot take in
a new member, and the controller pushes the current weights before the new engine serves); a reward model's whole
group is started again.

Elastic engines (generator.max_engines past num_engines): each engine the run may add has a placement group of its
own, asked of the cluster at start and not waited for (Ray places it when a node with room appears; an autoscaler
adds one for it). ``grow`` starts an engine in each one placed and hands on those loaded, between steps; such an
engine lost with its node ``leaves`` (``drop``: its placement group asked for again), the run going on without it.

``wait(refs, what, timeout)`` is the one way the controller waits on a pool: always with a deadline,
and a lost actor or a deadline becomes a ``RunError`` that names the call (``PoolFault`` for calls
the controller knows how to recover from).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import ray
from ray.util.placement_group import remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from grpo_ray import faults, placement, transports
from grpo_ray.config import GENERATOR, JUDGE, KINDS, LEARNER, POOLS, REFERENCE, REWARD_MODEL, RULES, TEACHER, Recipe
from grpo_ray.device import Device
from grpo_ray.errors import RunError, StateLost
from grpo_ray.keeper import Keeper
from grpo_ray.models.dims import ModelDims
from grpo_ray.roles import LOG_FILE_ENV, Seat
from grpo_ray.roles.generator import Generator
from grpo_ray.roles.judge import Judge
from grpo_ray.roles.learner import Learner
from grpo_ray.roles.reference import Reference
from grpo_ray.roles.reward import RewardWorker
from grpo_ray.roles.reward_model import RewardModel
from grpo_ray.telemetry.metrics import since_start

ROLES = {
    GENERATOR: Generator,
    LEARNER: Learner,
    REFERENCE: Reference,
    TEACHER: Reference,  # the same role on the teacher's model
    REWARD_MODEL: RewardModel,
    JUDGE: Judge,
    RULES: RewardWorker,
}
"""The actor class of each pool: each takes the model and the recipe and reads what it needs."""


REDONE = {LEARNER: "step"}
"""What a pool's work done again after a recovery counts (fault/<pool>_redone): the learner's steps trained again;
every other pool's, samples: a lost engine's share generated again on its replacement, a batch or share scored
again."""


class PoolFault(RunError):
    """A call failed: an actor died (`died`), raised, or missed its deadline."""

    def __init__(self, message: str, died: bool = False, timed_out: bool = False):
        super().__init__(message)
        self.died, self.timed_out = died, timed_out


def wait(refs, what: str, timeout_s: float):
    """ray.get with a deadline; the first failed call, a lost actor or the deadline raises PoolFault naming
    the call. A failure is raised as soon as it is known, not after the slowest call: when one learner rank
    dies, the others block in a collective, and waiting for them would wait out their timeout."""
    deadline = time.monotonic() + timeout_s
    pending = list(refs) if isinstance(refs, list) else [refs]
    try:
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise PoolFault(f"{what} did not finish within {timeout_s:g}s", timed_out=True)
            # short slices: back in Python often, so Ctrl-C and SIGTERM are handled at once
            done, pending = ray.wait(pending, num_returns=1, timeout=min(left, 5.0))
            if done:
                ray.get(done, timeout=60)  # ready: raises now if that call failed
        return ray.get(refs, timeout=60)
    # first: an error raised inside the actor (e.g. a collective that timed out) is a RayTaskError, and one raised as
    # it read a lost actor's answer is a RayActorError too; only an actor's own death is ``died``
    except ray.exceptions.RayTaskError as e:
        raise PoolFault(f"{what} failed: {e}") from None
    except ray.exceptions.RayActorError as e:
        raise PoolFault(f"{what}: an actor died ({str(e).splitlines()[0][:300]})", died=True) from None


class Pools:
    def __init__(self, recipe: Recipe, paths: dict[str, str], dims: ModelDims, roles: dict | None = None):
        self.r, self.paths, self.dims = recipe, paths, dims
        """`paths`: each model recipe key's resolved path (``RunInputs.paths``), what the rows' ``model`` names."""
        self.roles = {**ROLES, **(roles or {})}
        """The actor class of each pool: ROLES, with a run's own where it trains another kind of model."""
        self.device = Device.of(recipe)
        self.plans = placement.plan(recipe)
        self.actors: dict[str, list] = {p: [] for p in POOLS}
        self.pgs: dict = {}
        self.transport = transports.build(recipe)
        """The weight transport's driver side (its learner and engine sides live in those actors)."""
        self.threads: dict[str, int] = {}
        """Compute threads per actor of each pool (placement.threads), set when the pools start."""
        self.facts: dict = {}
        self.metas: list = []
        self.restarts = {k.name: 0 for k in KINDS.values() if self.lost_policy(k.name) != "stop"}
        """Per pool that recovers a lost actor, how many times it did (fault/<pool>_restarts)."""
        self.recovery_s = dict.fromkeys(self.restarts, 0.0)
        """Per such pool, the seconds its recoveries took in all (fault/<pool>_recovery_s): new actors started, a
        group joined, a copy of the state taken."""
        self.start_s = dict.fromkeys(self.restarts, 0.0)
        """Per such pool, the part of recovery_s its new actors took to start (fault/<pool>_start_s): each built
        and, in a pool with a group, the group formed; the rest is the copy taken and the transport joined."""
        self.redone = dict.fromkeys(self.restarts, 0)
        """Per such pool, the work done again after its recoveries (fault/<pool>_redone, in ``REDONE``'s units)."""
        self.left = 0
        """Engines past num_engines that left the pool with their node (fault/generator_left)."""
        self.copies: dict[str, list] = {}
        """Per pool whose lost policy is ``copy``: what each actor's newest ``state_copy`` cost (refs); the copies
        themselves are the keeper's."""
        self.keeper, self.copied = None, 0
        """The ``Keeper`` of those copies, on the driver's node, once there are any; how many were sent to it."""
        self.nodes: dict[str, list[str]] = {}
        """Per pool, each actor's node id (placement.json's; a recovery's new actors' once it says where they are)."""
        self.say = print
        """Where a recovery says its line (``start``'s `say`)."""
        self.homes: list[tuple] = []
        """Per engine, its placement group and bundle: the pool's (the first num_engines), or one of its own."""
        self.spare: dict = {}
        """Placement groups asked for engines past num_engines, not holding one yet: each its ready ref."""
        self.joining: list[tuple] = []
        """Engines started in spare placement groups and loading: (placement group, actor, its where ref, start)."""
        self.noticed: set[str] = set()
        """Nodes Ray has marked draining (a preemption notice)."""
        self.notices = 0
        """How many of those held actors of the run (fault/notices)."""

    @property
    def generators(self) -> list:
        """The engines' actors."""
        return self.actors[GENERATOR]

    @property
    def learners(self) -> list:
        """The learner group's actors, rank 0 first."""
        return self.actors[LEARNER]

    def start(self, pools: tuple[str, ...] = POOLS, say=print) -> None:
        """Reserve the cluster, start the pools, form each group's process group (the learner's first) and (with
        generators) the sync group; `say` gets a line as each phase ends, with the seconds since the command began
        (the actors start at once, so a phase's line says when it was ready, not how long it took alone)."""
        self.pgs, self.say = placement.reserve(self.r, pools), say
        # Ray's CPUs are a count the cluster was given (tests give 4 on 2 cores): never more than the cores here
        node_cpus = min(
            [c for n in ray.nodes() if n["Alive"] and (c := n["Resources"].get("CPU", 0)) > 0]
            + [len(os.sched_getaffinity(0))]
        )
        self.threads = placement.threads(self.r, self.plans, node_cpus)
        for pool in POOLS:
            count = self.plans[pool].actors if pool in pools else 0
            self.actors[pool] = [self._new(pool, i) for i in range(count)]
        self.homes = [(self.pgs[GENERATOR][0], i) for i in range(len(self.generators))] if self.generators else []
        if self.generators and self.r.generator.max_engines > len(self.generators):
            self._ask_spares(self.r.generator.max_engines - len(self.generators))
        say(f"{since_start()} {sum(len(a) for a in self.actors.values())} actors placed; loading the model in each")
        self.facts = self._join(LEARNER) or {}
        if self.learners:
            say(f"{since_start()} learner ready: {len(self.learners)} FSDP2 rank(s)")
        for kind in KINDS.values():
            if kind.name in (LEARNER, GENERATOR) or kind.group is None or not self.actors[kind.name]:
                continue
            if kind.group == "fsdp":
                self._join(kind.name)
            else:  # engines of their own (a judge's): each loads its model as it starts
                self.call([a.where.remote() for a in self.actors[kind.name]], f"{kind.name} ready")
            say(f"{since_start()} {kind.name} ready: {len(self.actors[kind.name])} actor(s)")
        if any(self.actors[p] and self.lost_policy(p) == "copy" for p in POOLS):  # started beside the pools
            here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
            self.keeper = ray.remote(Keeper).options(num_cpus=0, scheduling_strategy=here).remote()
        engines = self.generators
        if engines:
            self.call([g.where.remote() for g in engines], "engines ready")
            say(f"{since_start()} engines loaded: {len(engines)} vLLM engine(s)")
        if self.learners and engines:
            wire = self.call(engines[0].weight_dtype.remote(), "engine dtype")
            self.metas = self.call(self.learners[0].weight_metas.remote(wire), "weight metadata")
            self.transport.connect(self)
            say(f"{since_start()} weight transport connected ({self.transport.name})")

    def _new(self, pool: str, i: int, home: tuple | None = None):
        """Actor i of `pool`, in bundle i of the pool's placement group (or `home`'s: a placement group and a
        bundle), as its role starts it (``start_args``)."""
        pg, gpus = self.pgs[pool]
        if pool == GENERATOR and (home or i < len(self.homes)):
            pg, i_bundle = home or self.homes[i]
        else:
            i_bundle = i
        role, threads, kind = self.roles[pool], self.threads[pool], KINDS[pool]
        env = {"OMP_NUM_THREADS": str(threads)}
        env.update({k: os.environ[k] for k in (faults.ENV, faults.DIR_ENV) if k in os.environ})
        if self.r.trainer.log_level == "info":  # the actor's own output to a file, not the console
            env[LOG_FILE_ENV] = str(self.log_dir() / f"{pool}-{i}.log")
        if role.ENGINE:  # a vLLM engine in the actor's process
            env.update(self.device.engine_env(threads, role.eager(self.r)))
        actor = ray.remote(role).options(
            num_cpus=self.plans[pool].cpus,
            num_gpus=gpus,
            resources=self.plans[pool].resources or None,
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i_bundle),
            runtime_env={"env_vars": env},
            max_concurrency=role.concurrency(self.r),
        )
        path = self.paths.get(kind.model, "") if kind.model else ""
        seat = Seat(pool, i, self.plans[pool].actors, threads, path, self.r, self.dims)
        return actor.remote(*role.start_args(seat))

    def log_dir(self) -> Path:
        """Where actors write their output at trainer.log_level=info."""
        return Path(self.r.trainer.output_dir).resolve() / "logs"

    def _join(self, pool: str):
        """Form `pool`'s group (its row's ``group`` is fsdp: every actor sets up together and shards its model over
        the group); rank 0's answer."""
        actors = self.actors[pool]
        if not actors:  # evaluation runs generators and rewards only; kl_coef 0 drops the reference
            return None
        host, port = self.call(actors[0].address.remote(), f"{pool} address")
        return self.call([a.setup.remote(host, port) for a in actors], f"{pool} setup")[0]

    def lost(self, pool: str, e: PoolFault) -> bool:
        """Whether the failed call `e` lost an actor of `pool`: its own death, or another actor's failure heard of
        first (a rank whose collective broke as its peer died is often heard of before the peer's death is): then
        each actor is asked where it is, and one dead says so."""
        if e.died:
            return True
        try:
            self.call([a.where.remote() for a in self.actors[pool]], f"{pool} ping", 60)
            return False
        except PoolFault as again:
            return again.died

    def kept_call(self, pool: str, calls: Callable[[], list], what: str, said: str, redone: int = 0) -> list:
        """The answers of `calls()` (calls to `pool`'s actors), a copy of each actor's state taken first where the
        pool keeps copies (``copy_state``): one of its actors lost in them starts the pool again from those copies
        (saying `said`, counting `redone` of its work done again) and `calls()` is made again, once."""
        self.copy_state(pool)
        try:
            return self.call(calls(), what)
        except PoolFault as e:
            if self.lost_policy(pool) != "copy" or not self.lost(pool, e):
                raise
            self.say(f"{e}; {said}")
            self.recover(pool)
            self.redid(pool, redone)
            return self.call(calls(), f"{what} (again)")

    def lost_policy(self, pool: str) -> str:
        """What losing an actor of `pool` does in this run: its row's ``lost``, as trainer.fault_tolerance allows
        (off: every loss stops the run; a copy to start from is kept only under all)."""
        lost, allowed = KINDS[pool].lost, self.r.trainer.fault_tolerance
        return "stop" if allowed == "off" or (lost == "copy" and allowed != "all") else lost

    def recover(self, pool: str, i: int = 0) -> None:
        """Recover `pool` from losing actor i (dead, or hung past its deadline), as ``lost_policy`` says: a new
        actor in its bundle, or the whole pool started again in its bundles (one actor lost leaves the others in a
        process group that cannot take in a new member), each new actor then taking its predecessor's newest
        ``copy_state`` where the policy is ``copy``. A new learner group is joined to the engines' weight transport."""
        lost = self.lost_policy(pool)
        if lost == "stop":
            allowed = self.r.trainer.fault_tolerance
            raise RunError(f"{pool} lost an actor, which trainer.fault_tolerance={allowed} does not recover")
        actors, start = self.actors[pool], time.perf_counter()
        new = [i] if lost == "replace" else list(range(len(actors)))
        for j in new:
            ray.kill(actors[j])
            actors[j] = self._new(pool, j)
        where = self.call([actors[j].where.remote() for j in new], f"{pool} placed again")
        if lost != "replace" and KINDS[pool].group == "fsdp":
            self._join(pool)
        started = time.perf_counter() - start
        if lost == "copy":
            states = [self.keeper.give.remote((pool, j), self.copied) for j in range(len(actors))]
            try:
                self.call([a.take_state.remote(c) for a, c in zip(actors, states)], f"{pool} state copy taken")
            except PoolFault as e:  # a copy that never reached the keeper, or a new actor lost as it took one
                first = str(e).splitlines()[0][:300]
                raise StateLost(f"{pool}: no copy of its state to start it again from ({first})") from e
        if pool == LEARNER and self.generators:  # the weight transport's sender is new
            self.transport.connect(self)
        self.restarts[pool] += 1
        self.recovery_s[pool] += time.perf_counter() - start
        self.start_s[pool] += started
        self._said(pool, i, dict(zip(new, where)), time.perf_counter() - start, started)

    def _ask_spares(self, n: int) -> None:
        """Ask the cluster for `n` placement groups of one engine's bundle each, without waiting for them."""
        from ray.util.placement_group import placement_group

        bundle = placement.bundles([GENERATOR], self.plans)[0]
        for _ in range(n):
            pg = placement_group([bundle], strategy="PACK")
            self.spare[pg] = pg.ready()

    def grow(self) -> list[int]:
        """Between steps: an engine started in each spare placement group the cluster has placed, and those loaded
        since added to the pool (the caller connects the weight transport and pushes the weights before they
        serve); their indices. An engine that fails as it loads gives its placement group back to the spares."""
        placed = [pg for pg, ready in self.spare.items() if ray.wait([ready], timeout=0)[0]]
        for pg in placed:
            del self.spare[pg]
            actor = self._new(GENERATOR, len(self.generators) + len(self.joining), (pg, 0))
            self.joining.append((pg, actor, actor.where.remote(), time.perf_counter()))
        joined = []
        for entry in [j for j in self.joining if ray.wait([j[2]], timeout=0)[0]]:
            pg, actor, where, started = entry
            self.joining.remove(entry)
            try:
                node = ray.get(where, timeout=60)["node_id"]
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as e:
                self.say(f"an engine joining failed as it loaded ({str(e).splitlines()[0][:200]}); asking again")
                ray.kill(actor)
                self.spare[pg] = pg.ready()
                continue
            self.actors[GENERATOR].append(actor)
            self.homes.append((pg, 0))
            self.nodes.setdefault(GENERATOR, []).append(node)
            joined.append(len(self.generators) - 1)
            self.say(
                f"engine {joined[-1]} joined (node {node[:12]}), now {len(self.generators)} engine(s); it loaded in "
                f"{time.perf_counter() - started:.1f} s"
            )
        return joined

    def drains(self) -> None:
        """The nodes Ray marked draining since the last call noticed, one line each that holds actors of the run
        (which, and the time left). Ray's notice of a node's end: its SIGTERM handler on a node's ``ray start`` (as
        Kubernetes deletes a spot node's pod), an autoscaler's or ``ray drain-node``'s request; Ray refuses to drain
        a node that is not idle unless for preemption, so one holding actors is about to go."""
        from ray._private.state import state  # the drains as Ray's own libraries (Data, Serve) read them

        new = {n: d for n, d in state.get_draining_nodes().items() if n not in self.noticed}  # (deadline: ms, or 0)
        self.noticed |= set(new)
        for node, deadline in new.items():
            ours = [f"{pool} {i}" for pool, ids in self.nodes.items() for i, n in enumerate(ids) if n == node]
            if ours:
                self.notices += 1
                left = f"{max(0.0, deadline / 1000 - time.time()):.0f} s left" if deadline else "no deadline given"
                self.say(f"node {node[:12]} is draining (a preemption notice, {left}); on it: {', '.join(ours)}")

    @property
    def elastic(self) -> bool:
        """Whether the engines may grow past num_engines (generator.max_engines)."""
        return self.r.generator.max_engines > self.r.generator.num_engines

    def leaves(self, i: int) -> bool:
        """Whether engine i leaves the pool when lost (one of the engines past num_engines), not replaced."""
        return self.elastic and i >= self.r.generator.num_engines

    def drop(self, i: int) -> None:
        """Engine i (one that ``leaves``) gone from the pool, its placement group asked for again (Ray places it
        anew when a node has room); the caller connects the weight transport over the engines left."""
        pg, _ = self.homes.pop(i)
        ray.kill(self.actors[GENERATOR].pop(i))
        was = self.nodes.get(GENERATOR, []).pop(i) if i < len(self.nodes.get(GENERATOR, [])) else None
        self.spare[pg] = pg.ready()
        self.left += 1
        self.say(f"engine {i} left (node {(was or '?')[:12]}): now {len(self.generators)} engine(s)")

    def redid(self, pool: str, amount: int) -> None:
        """Count `amount` of `pool`'s work done again after a recovery (in ``REDONE``'s units)."""
        self.redone[pool] += amount

    def fault_metrics(self) -> dict[str, float]:
        """fault/<pool>_restarts, _recovery_s and _redone of each pool that recovers a lost actor."""
        out: dict[str, float] = {}
        for pool, n in self.restarts.items():
            out |= {f"fault/{pool}_restarts": n, f"fault/{pool}_recovery_s": self.recovery_s[pool]}
            out[f"fault/{pool}_start_s"] = self.start_s[pool]
            out[f"fault/{pool}_redone"] = self.redone[pool]
        if self.elastic:
            out |= {"generator/engines": len(self.generators), "fault/generator_left": self.left}
        out["fault/notices"] = self.notices
        return out

    def _said(self, pool: str, i: int, where: dict[int, dict], seconds: float, started: float) -> None:
        """One line for a recovery: which actor was lost on which node, where its replacements are (`where`: each
        new actor's ``where``), how long it took and how much of that they took to start (the run's fault/* metrics
        count them)."""
        was = (self.nodes.get(pool) or [None] * (i + 1))[i]
        self.nodes.setdefault(pool, [None] * len(self.actors[pool]))
        for j, w in where.items():
            self.nodes[pool][j] = w["node_id"]
        now = ", ".join(sorted({w["node_id"][:12] for w in where.values()}))
        again = "its replacement" if list(where) == [i] else f"the pool's {len(where)} new actors"
        self.say(
            f"{pool} actor {i} lost (node {(was or '?')[:12]}); {again} on node {now}, in {seconds:.1f} s "
            f"({started:.1f} s of it starting)"
        )

    def copy_state(self, pool: str) -> None:
        """Each actor of `pool` copies its state and the keeper takes it, for ``recover`` to give the pool started
        again (its lost policy: copy); nothing otherwise. A call queued before the pool's next: the state before it."""
        if self.lost_policy(pool) == "copy" and self.actors[pool]:
            calls = [a.state_copy.options(num_returns=2).remote() for a in self.actors[pool]]
            self.copied += 1  # held on the driver's node, not in the store of the actor's, which its loss would take
            for i, (state, _) in enumerate(calls):
                self.keeper.hold.remote((pool, i), self.copied, [state])
            self.copies[pool] = [cost for _, cost in calls]

    def copy_costs(self) -> dict[str, float]:
        """The newest copies' cost: the slowest actor's seconds and the MB of all (fault/<pool>_copy_s, _copy_mb)."""
        out = {}
        for pool, costs in self.copies.items():
            got = self.call(costs, f"{pool} state copy")
            out[f"fault/{pool}_copy_s"] = max(c["seconds"] for c in got)
            out[f"fault/{pool}_copy_mb"] = sum(c["mb"] for c in got)
        return out

    def unresponsive_generators(self) -> list[int]:
        """Engines that are dead or do not answer within the sync timeout (they may still be leaving a failed
        collective)."""
        lost = []
        for i, gen in enumerate(self.generators):
            try:
                self.call(gen.where.remote(), f"engine {i} ping", self.r.trainer.sync_timeout_s + 10)
            except PoolFault:
                lost.append(i)
        return lost

    def write_placement(self, path) -> None:
        """placement.json: per pool, per actor, its node id, pid, compute threads and resources."""
        out = {}
        for pool, actors in self.actors.items():
            where = self.call([a.where.remote() for a in actors], f"{pool} start")
            self.nodes[pool], p = [w["node_id"] for w in where], self.plans[pool]
            out[pool] = [
                {"actor": i, **w, "resources": {"CPU": p.cpus, "GPU": p.gpus, **p.resources}}
                for i, w in enumerate(where)
            ]
        placement.write_placement(path, out)

    def devices(self) -> float:
        """Devices of all pools for perf/throughput: GPUs on cuda, reserved CPUs on cpu."""
        if self.device.gpu:
            return sum(p.actors * p.gpus for p in self.plans.values())
        return sum(p.actors * p.cpus for p in self.plans.values())

    def ask_memory(self) -> dict[str, list]:
        """Ask every actor for its peak memory so far; ``memory`` reads the answers."""
        return {pool: [a.peak_memory_gb.remote() for a in actors] for pool, actors in self.actors.items() if actors}

    def memory(self, asked: dict[str, list] | None = None) -> dict[str, float]:
        """Peak memory per pool: perf/max_memory_allocated_gb/<pool> (torch on a GPU) or perf/peak_rss_gb/<pool>;
        the answers to `asked` (``ask_memory``), or asked now if none, or if an actor asked has been replaced since.
        A pool with an actor lost and not yet replaced (it is, when the pool is next called) has no figure."""
        pools = asked or self.ask_memory()
        out = {}
        for pool, refs in pools.items():
            try:
                got = self.call(refs, f"{pool} memory")
            except PoolFault:
                if asked is not None:
                    return self.memory()
                continue
            out[f"perf/{got[0][0]}/{pool}"] = max(gb for _, gb in got)
        return out

    def call(self, refs, what: str, timeout_s: float | None = None):
        return wait(refs, what, timeout_s or self.r.trainer.call_timeout_s)

    def shutdown(self) -> None:
        """Stop every actor (each first asked to free what it made outside its process: its environment processes,
        its folders; a few seconds, not waited past) and release the placement groups (by handle, not by name)."""
        closing = [a.close.remote() for actors in self.actors.values() for a in actors]
        ray.wait(closing, num_returns=len(closing), timeout=10)
        for a in [*(a for actors in self.actors.values() for a in actors), *([self.keeper] if self.keeper else [])]:
            ray.kill(a)
        self.keeper = None
        for pg in [*{id(pg): pg for pg, _ in self.pgs.values()}.values(), *self.spare, *(j[0] for j in self.joining)]:
            remove_placement_group(pg)
        for pg, _ in self.homes[self.r.generator.num_engines :]:
            remove_placement_group(pg)
        self.spare, self.joining, self.homes = {}, [], []
        self.actors = {p: [] for p in POOLS}
        self.pgs = {}
