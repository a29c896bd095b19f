"""The schedules' batch sources (``grpo_ray/sources/``) on fake engines (Ray actors that answer ``generate``,
``submit`` and ``take`` as the generator does, without a model): every prompt the data stream gives is trained
once, in the order the schedule says, across a checkpoint's restore and with an engine lost mid-run."""

import pytest

from grpo_ray import schedules, sources
from grpo_ray.config import GENERATOR, load_recipe
from grpo_ray.engines import Engines, key
from grpo_ray.pools import PoolFault, wait
from grpo_ray.sources import Collected, Hooks
from grpo_ray.types import Prompt
from tests.conftest import ROOT
from tests.helpers.fake_engine import FakeGenerator

pytestmark = pytest.mark.usefixtures("ray_local")


class FakePools:
    """What the sources and ``Engines`` use of ``Pools``: the generators, calls with a deadline, an engine replaced,
    the work done again counted; with engines past the first `fixed` (generator.max_engines), those joining at the
    next ``grow`` (`waiting`) and one that leaves when lost; each engine's node (a new one for each engine started),
    those marked draining (`noticed`)."""

    def __init__(self, ray, engines: int, fixed: int | None = None, elastic: bool = False, actor=None):
        """`actor`: the engines' actor class (default FakeGenerator's)."""
        self.ray, self.actor = ray, actor or ray.remote(FakeGenerator).options(num_cpus=0)
        self.generators = [self.actor.remote() for _ in range(engines)]
        self.transport = type("Transport", (), {"connect": lambda self, pools: None})()
        self.replaced, self.redone, self.fixed, self.waiting, self.left = 0, 0, fixed or engines, 0, 0
        self.elastic = elastic
        self.nodes, self.noticed, self.started = {GENERATOR: [f"node-{k}" for k in range(engines)]}, set(), engines

    def node(self) -> str:
        self.started += 1
        return f"node-{self.started - 1}"

    def grow(self):
        joined = [self.actor.remote() for _ in range(self.waiting)]
        self.generators, self.waiting = self.generators + joined, 0
        self.nodes[GENERATOR] += [self.node() for _ in joined]
        return list(range(len(self.generators) - len(joined), len(self.generators)))

    def drains(self):
        pass

    def leaves(self, i):
        return i >= self.fixed

    def drop(self, i):
        self.ray.kill(self.generators.pop(i))
        self.nodes[GENERATOR].pop(i)
        self.left += 1

    def redid(self, pool, amount):
        assert pool == GENERATOR
        self.redone += amount

    def call(self, refs, what, timeout_s=None):
        return wait(refs, what, timeout_s or 60)

    def recover(self, pool, i):
        assert pool == GENERATOR
        self.generators[i], self.replaced = self.actor.remote(), self.replaced + 1
        self.nodes[GENERATOR][i] = self.node()


def lose(ray, actor) -> None:
    """Kill `actor` and wait until its death is known (``ray.kill`` returns before: a call sent meanwhile may still
    be answered, which would make what the loss costs depend on timing)."""
    ray.kill(actor)
    while True:
        try:
            ray.get(actor.calls.remote(), timeout=30)
        except ray.exceptions.RayActorError:
            return


class FakeEngines(Engines):
    def push(self, version, probe=False):
        """The weights loaded into every engine; one lost is replaced (or, past the fixed engines, leaves) and the
        weights loaded again (as ``Engines.sync`` does)."""
        self.version, lost = version, []
        for i, actor in enumerate(self.pools.generators):
            try:
                self.pools.call(actor.load.remote(version), f"load on engine {i}")
            except PoolFault:
                lost.append(i)
        for i in sorted(lost, reverse=True):
            if self.pools.leaves(i):
                self.leave(i)
            else:
                self.replace(i)
                self.pools.call(self.pools.generators[i].load.remote(version), f"load on engine {i}")
        return [], []


class Run:
    """A run's side of a source: the data stream (prompts with consecutive uids), the scorers (what was sent, by
    step), the learner's version and the steps."""

    def __init__(
        self, ray, schedule="batched", staleness=1, engines=2, steps=6, start_uid=0, elastic=0, batch=4, actor=None
    ):
        """`elastic`: generator.num_engines=`engines`..`elastic` (engines join and leave); `batch` prompts a step;
        `actor`: the engines' actor class (``FakePools``)."""
        overrides = [
            f"algorithm.schedule={schedule}",
            f"algorithm.max_staleness={staleness}",
            f"data.train_batch_size={batch}",
            "algorithm.group_size=2",
            "generator.timeout_s=30",
            "learner.mini_batch_size=8",
            "learner.micro_batch_size=4",
            "learner.world_size=1",
            *([f"generator.num_engines={engines}..{elastic}"] if elastic else []),
        ]
        self.recipe = load_recipe(ROOT / "recipes" / "tiny-cpu.yaml", overrides)
        self.pools = FakePools(ray, engines, elastic=bool(elastic), actor=actor)
        self.version, self.steps, self.next_uid, self.said, self.shares = 0, steps, start_uid, [], []
        self.engines = FakeEngines(self.recipe, self.pools, [], lambda: self.version, self.said.append)
        self.schedule = schedules.of(self.recipe.algorithm)
        self.source = sources.of(
            Hooks(
                recipe=self.recipe,
                engines=self.engines,
                schedule=self.schedule,
                prompts=self.prompts,
                prompt_of=lambda uid: Prompt([uid], "", "fake", uid=uid),
                send=lambda rollouts, stats, version: Collected(rollouts, stats, None, version),
                say=self.said.append,
                last_step=lambda: self.steps,
                saving=lambda step: False,
            )
        )

    def prompts(self):
        uids = range(self.next_uid, self.next_uid + self.recipe.data.train_batch_size)
        self.next_uid += len(uids)
        return [Prompt([u], "", "fake", uid=u) for u in uids]

    def step(self, step):
        """The step's batch (its prompts' uids, the version that generated it); the learner's update, then a push."""
        self.engines.grow(self.version)  # as the controller's step starts
        batch, flow = self.source.next(step, self.version, (0.0, 0.0))
        self.source.ahead(step, self.version)
        uids = [u for s in batch.stats for u in s.uids]
        self.shares.append(len(batch.stats))
        self.version += 1
        self.engines.push(self.version)
        return uids, batch.version, flow


def test_batched_trains_each_batch_in_the_streams_order_one_launched_ahead(ray_local):
    run = Run(ray_local, "batched", staleness=1, steps=4)
    got = [run.step(s) for s in range(1, 5)]
    assert [uids for uids, _, _ in got] == [list(range(4 * k, 4 * k + 4)) for k in range(4)]
    # batch 1 at the start's weights; each later one launched ahead, during the step before: one version behind
    assert [version for _, version, _ in got] == [0, 0, 1, 2]
    assert run.source.held_versions() == []  # the last step launches nothing ahead
    assert run.source.more(5, run.version)[1][0].uids == [16, 17]  # DAPO's more: the stream's next prompts


def test_streaming_trains_every_prompt_once_the_long_ones_later(ray_local):
    run = Run(ray_local, "streaming", staleness=2, steps=6)
    got = [run.step(s) for s in range(1, 7)]
    trained = [u for uids, _, _ in got for u in uids]
    assert len(trained) == len(set(trained)) == 24
    held = [p.uid for held in run.source.feed.held.values() for p, _ in held]
    assert sorted(trained + held) == list(range(run.next_uid))  # sent: trained once, or still held, none lost
    # uids 0 and 3 are long: short groups sent after them, for step 2, are trained first, and they at step 2
    assert got[0][0] == [1, 4, 2, 7] and {0, 3} <= set(got[1][0])
    assert all(flow["timing_s/learner_wait"] >= 0 for _, _, flow in got)


def test_streaming_across_a_checkpoint_trains_each_prompt_once(ray_local):
    first = Run(ray_local, "streaming", staleness=2, steps=6)
    before = [u for s in range(1, 4) for u in first.step(s)[0]]
    state = first.source.state(3)
    resumed = Run(ray_local, "streaming", staleness=2, steps=6, start_uid=first.next_uid)
    resumed.version = resumed.engines.version = first.version
    resumed.source.restore(state)
    after = [u for s in range(4, 7) for u in resumed.step(s)[0]]
    assert len(before) == len(after) == 12
    assert not set(before) & set(after) and len(set(after)) == 12  # none twice
    held = {p.uid for held in resumed.source.feed.held.values() for p, _ in held}
    assert set(before) | set(after) | held == set(range(resumed.next_uid))  # none lost


@pytest.mark.parametrize(
    "staleness, said",
    [
        (1, ["engine 1 lost"]),  # found by the step's take: replaced there, and asked again
        (2, ["take on engine 1: an actor died", "engine 1 was replaced: sending again"]),  # by the take ahead: after
    ],  # the update (the push replaces it), then sent what it held
)
def test_streaming_with_an_engine_lost_sends_what_it_held_again(ray_local, staleness, said):
    run = Run(ray_local, "streaming", staleness=staleness, steps=6)
    trained = [u for s in range(1, 3) for u in run.step(s)[0]]
    lose(ray_local, run.pools.generators[1])  # lost with groups in flight
    trained += [u for s in range(3, 7) for u in run.step(s)[0]]
    assert run.pools.replaced == 1 and [next(x for x in run.said if x.startswith(w)) for w in said], run.said
    resent = sum(int(x.split("the ")[-1].split(" groups")[0]) for x in run.said if "groups it held" in x)
    assert run.pools.redone == 2 * resent > 0  # each group sent again: its samples generated again (group_size 2)
    assert len(trained) == len(set(trained)) == 24
    held = {p.uid for held in run.source.feed.held.values() for p, _ in held}
    assert set(trained) | held == set(range(run.next_uid))


@pytest.mark.parametrize("staleness", [0, 1])
def test_batched_engines_join_and_leave_and_every_prompt_is_trained_once(ray_local, staleness):
    """generator.num_engines=1..3: two engines joining as step 2 starts (connected and given the weights) get a share
    of every batch launched after (one step off, the batch launched during step 1 stays on the one engine: cut as it
    was launched); one of them lost after step 3 leaves, its share of the batch it held generated on another,
    counted; every prompt is trained once, in the stream's order."""
    run = Run(ray_local, "batched", staleness=staleness, engines=1, steps=6, elastic=3)
    trained = run.step(1)[0]
    run.pools.waiting = 2
    trained += run.step(2)[0] + run.step(3)[0]
    calls = ray_local.get([g.calls.remote() for g in run.pools.generators])
    assert calls[1:] == [2, 2]  # the batches of steps 2 and 3 (one step off: of 3 and 4, launched during 2 and 3)
    lose(ray_local, run.pools.generators[2])
    trained += [u for s in range(4, 7) for u in run.step(s)[0]]
    assert trained == list(range(24))
    assert len(run.pools.generators) == 2 and run.pools.left == 1 and run.pools.replaced == 0
    if staleness == 0:  # found by step 4's batch (one step off: by the push after step 4, the batch ahead lost)
        assert any(x.startswith("engine 2 lost") and "it leaves" in x for x in run.said), run.said
    assert run.pools.redone == 1 * 2  # its share of a batch cut over 3 (4 prompts: 2, 1, 1), group_size 2


@pytest.mark.parametrize("staleness", [0, 1])
def test_batched_engine_on_a_draining_node_takes_no_prompts_and_its_loss_costs_no_samples(ray_local, staleness):
    """A preemption notice (engine 1's node marked draining after step 2): the batches launched after it are cut
    over the other engines, so its loss after step 3 costs no samples: the push finds it gone and it is replaced,
    nothing generated again; every prompt is trained once, in the stream's order; the replacement takes prompts."""
    run = Run(ray_local, "batched", staleness=staleness, engines=3, steps=6)
    trained = run.step(1)[0] + run.step(2)[0]
    run.pools.noticed.add(run.pools.nodes[GENERATOR][1])
    calls = ray_local.get(run.pools.generators[1].calls.remote())
    trained += run.step(3)[0]
    assert ray_local.get(run.pools.generators[1].calls.remote()) == calls  # nothing sent it since
    lose(ray_local, run.pools.generators[1])
    trained += [u for s in range(4, 7) for u in run.step(s)[0]]
    assert trained == list(range(24))
    assert run.pools.replaced == 1 and run.pools.redone == 0
    assert ray_local.get(run.pools.generators[1].calls.remote()) > 0  # the replacement, on a node not draining


@pytest.mark.parametrize("staleness", [1, 2])
def test_streaming_engines_join_and_leave_and_every_prompt_is_trained_once(ray_local, staleness):
    """generator.num_engines=1..3 under streaming: two engines joining as step 2 starts are sent their share of the
    prompts sent from then on, and step 3 takes groups of theirs (the engine that was alone is asked for what it
    holds past its new share first); one of them lost after step 3 leaves, the groups it held sent to the others
    and counted; every prompt is trained once or still held."""
    run = Run(ray_local, "streaming", staleness=staleness, engines=1, steps=6, elastic=3)
    trained = run.step(1)[0]
    run.pools.waiting = 2
    trained += run.step(2)[0]
    joined = run.pools.generators[1:]
    assert ray_local.get([g.sent.remote() for g in joined]) == [1, 1]  # of the 4 prompts sent next: 2, 1, 1
    trained += run.step(3)[0]
    lose(ray_local, run.pools.generators[2])
    trained += [u for s in range(4, 7) for u in run.step(s)[0]]
    assert len(run.pools.generators) == 2 and run.pools.left == 1 and run.pools.replaced == 0
    moved = [x for x in run.said if x.startswith("an engine left: sending the ")]
    assert len(moved) == 1 and run.pools.redone == 2 * int(moved[0].split("the ")[1].split(" groups")[0]), run.said
    # the takes a step's batch came from: the new engines' own from the step taken after their arrival (one step
    # off, the one taken during step 2); the take that found engine 2 lost (step 4's; one step off, step 5's, taken
    # during step 4) has the groups it was asked for from another engine, in a second take
    assert run.shares == ([1, 1, 3, 3, 2, 2] if staleness == 1 else [1, 1, 1, 3, 3, 2]), run.shares
    assert len(trained) == len(set(trained)) == 24
    held = {p.uid for held in run.source.feed.held.values() for p, _ in held}
    assert set(trained) | held == set(range(run.next_uid))


@pytest.mark.parametrize("staleness", [1, 2])
@pytest.mark.parametrize("elastic", [False, True])
def test_streaming_engine_on_a_draining_node_is_sent_nothing_and_its_groups_are_taken_first(
    ray_local, staleness, elastic
):
    """A preemption notice under streaming (engine 1's node marked draining after step 2): no prompt is sent to it
    since, the next take has it hand back the groups it has not finished (sent to the others, counted as work done
    again) and asks it for the finished ones before the others', so its node's end after step 3 costs nothing more:
    replaced, nothing sent again, or (`elastic`: an engine past num_engines) it has left already, once it held
    nothing; every prompt trained once or still held; a replacement, on a node not draining, is sent prompts."""
    start = 2 if staleness == 1 else 1  # engine 1 holds a long group then (uid 12 of step 3; one step off, 15 of 4)
    run = Run(ray_local, "streaming", staleness=staleness, engines=3, steps=8, start_uid=start)
    run.pools.fixed, run.pools.elastic = (1, True) if elastic else (3, False)
    trained = run.step(1)[0] + run.step(2)[0]
    engine = run.pools.generators[1]
    run.pools.noticed.add(run.pools.nodes[GENERATOR][1])
    sent = ray_local.get(engine.sent.remote())
    trained += run.step(3)[0]
    assert ray_local.get(engine.sent.remote()) == sent and run.source.feed.held[key(engine)] == []
    trained += run.step(4)[0] if elastic else []  # as it starts, the engine leaves
    assert ("engine 1 is on a draining node and holds no work: it leaves now" in run.said) == elastic, run.said
    lose(ray_local, engine)
    trained += [u for s in range(5 if elastic else 4, 9) for u in run.step(s)[0]]
    back = [x for x in run.said if x.startswith("engine 1 is on a draining node: it handed back the ")]
    assert len(back) == 1 and (back := int(back[0].split("the ")[1].split(" groups")[0])) > 0, run.said
    assert run.pools.redone == 2 * back and (run.pools.replaced, run.pools.left) == ((0, 1) if elastic else (1, 0))
    assert len(trained) == len(set(trained)) == 32
    held = {p.uid for held in run.source.feed.held.values() for p, _ in held}
    assert set(trained) | held == set(range(start, run.next_uid))
    assert ray_local.get(run.pools.generators[1].sent.remote()) > 0


def test_a_schedule_names_a_source_that_is_one(ray_local, monkeypatch):
    run = Run(ray_local, "batched", steps=2)
    monkeypatch.setattr(type(run.schedule), "source", "grpo_ray.sources:Hooks")
    with pytest.raises(Exception, match=r"Batched.source='grpo_ray.sources:Hooks': not a grpo_ray.sources.BatchSource"):
        sources.of(run.source.h)
