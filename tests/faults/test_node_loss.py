"""A pool's node removed mid-step on a simulated cluster (issue 78; ``ray.cluster_utils.Cluster``: raylets on this
machine, a removed one's actors killed as a lost node's are). Each pool's actors are placed on nodes of their own
(``cluster.node_resources``), two such nodes, so the pool's lost actor has another to start on; its actor waits at
a fault point (``hold_<pool>@N``) until its node is gone. The run finishes in the same job: every metric the
uninterrupted run's on the same cluster, bit for bit (on-policy, fixed seed, fp32), but the restart count. For the
learner, trainer.fault_tolerance=all keeps the copies of the ranks' state on the driver's node, so the group started
again on the other node takes them."""

import json
import re
import threading
import time

import pytest

from grpo_ray.config import load_recipe
from grpo_ray.controller import GRPOController
from grpo_ray.setup_run import setup_run
from tests.conftest import ROOT
from tests.faults.conftest import differing

pytestmark = pytest.mark.slow

OVER = [
    "algorithm.kl_coef=0",  # (a reference only where its node is the one lost)
    "learner.mini_batch_size=128",  # two optimizer steps a step: a rank lost after the first moved the weights
    "trainer.fault_tolerance=all",
    "trainer.total_steps=3",
    "trainer.val_before_train=false",
    "trainer.test_freq=0",
    "trainer.loggers=[jsonl]",
]
NODES = {
    "generator": ("generation", 1),
    "learner": ("training", 2),
    "reference": ("scoring", 1),
    "reward": ("rewarding", 1),
}
"""Each pool's node marker and a node's CPUs."""


def train(out, over) -> list[dict]:
    r = load_recipe(ROOT / "recipes" / "tiny-cpu.yaml", [*OVER, *over, f"trainer.output_dir={out}"])
    GRPOController(r, setup_run(r)).run()
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def lose_a_node(tmp_path, monkeypatch, pool: str, point: str, over=()) -> tuple[list[dict], list[dict], list]:
    """The plain run and the one whose `pool`'s node is removed when its actor reaches `point`, on a cluster of a
    head and, for each pool placed apart (`pool` and the generator and learner), one node (two for `pool`); and the
    nodes removed."""
    import ray
    from ray.cluster_utils import Cluster

    apart = {"generator", "learner", pool}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    # two nodes for `pool` (its actors packed on one of them): the other is where it starts again (a node can only
    # be added from the main thread, which the run holds)
    nodes = {
        name: [
            cluster.add_node(num_cpus=NODES[name][1], resources={NODES[name][0]: 1})
            for _ in (1, 2)[: 1 + (name == pool)]
        ]
        for name in apart
    }
    placed = [f"+cluster.node_resources.{name}={NODES[name][0]}" for name in apart]
    over = [f"cluster.nodes={1 + len(apart)}", *placed, *over]
    ray.init(address=cluster.address, log_to_driver=False)
    removed = []
    try:
        plain = train(tmp_path / "plain", over)
        markers = tmp_path / "markers"
        markers.mkdir()
        monkeypatch.setenv("GRPO_RAY_FAULTS", point)
        monkeypatch.setenv("GRPO_RAY_FAULTS_DIR", str(markers))

        def remove_when_held():
            try:
                while not (markers / point).exists():
                    time.sleep(0.2)
                ids = {a["node_id"] for a in json.loads((tmp_path / "lost" / "placement.json").read_text())[pool]}
                removed.extend(n for n in nodes[pool] if n.node_id in ids)
                for node in removed:
                    cluster.remove_node(node)
            except BaseException as e:  # said in the caller's assertion
                removed.append(e)

        threading.Thread(target=remove_when_held, daemon=True).start()
        lost = train(tmp_path / "lost", over)
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert len(removed) == 1 and removed[0] in nodes[pool], removed  # the pool's node, removed mid step 2
    return plain, lost, removed


@pytest.mark.smoke  # issue 78's CI smoke: a learner node removed mid-run, the run finishing
def test_a_learner_node_removed_mid_step_and_the_run_finishes_on_the_node_that_replaces_it(
    tmp_path, monkeypatch, capsys
):
    plain, lost, removed = lose_a_node(tmp_path, monkeypatch, "learner", "hold_learner@2")
    assert [m["fault/learner_restarts"] for m in lost] == [0, 1, 1]
    assert [m["fault/learner_recovery_s"] > 0 for m in lost] == [False, True, True]  # timed, once
    # the new group's start timed apart: a part of the recovery, the copy taken and the transport joined the rest
    assert [0 < m["fault/learner_start_s"] < m["fault/learner_recovery_s"] for m in lost] == [False, True, True]
    said = capsys.readouterr().out
    assert said.count("recovered from lost actors (restarts: learner 1) in ") == 1  # the run's summary
    event = re.findall(
        r"learner actor \d lost \(node (\w+)\); the pool's 2 new actors on node ([\w, ]+), "
        r"in [\d.]+ s \([\d.]+ s of it starting\)",
        said,
    )
    assert len(event) == 1 and event[0][0] == removed[0].node_id[:12] and event[0][0] not in event[0][1], event
    assert [m["fault/learner_redone"] for m in lost] == [0, 1, 1]  # the step, trained again
    assert differing(lost, plain) <= {"fault/learner_restarts", "fault/learner_redone"}


@pytest.mark.parametrize(
    "pool, point, over",
    [
        ("reference", "hold_reference@2", ["algorithm.kl_coef=0.001"]),  # its 2nd call: step 2's batch
        ("reward", "hold_reward@2", []),
        ("generator", "hold_generator@1", []),  # the batch asked of weight version 1: step 2's
    ],
)
def test_a_pools_node_removed_mid_step_and_the_run_finishes_as_if_not(tmp_path, monkeypatch, capsys, pool, point, over):
    plain, lost, removed = lose_a_node(tmp_path, monkeypatch, pool, point, over)
    key = f"fault/{pool}_restarts"
    assert [m[key] for m in lost] == [0, 1, 1] and [m[key] for m in plain] == [0, 0, 0]
    said = capsys.readouterr().out
    assert said.count(f"recovered from lost actors (restarts: {pool} 1) in ") == 1
    event = re.findall(
        rf"{pool} actor \d lost \(node (\w+)\); (?:its replacement|the pool's \d new actors) on node", said
    )
    assert event == [removed[0].node_id[:12]], event  # the node removed, named once
    # the step's samples, generated (the one engine's share) or scored again
    assert [m[f"fault/{pool}_redone"] for m in lost] == [0, 16 * 16, 16 * 16]
    assert differing(lost, plain) <= {key, f"fault/{pool}_redone"}


ELASTIC = [
    "cluster.nodes=3",
    "+cluster.node_resources.generator=generation",
    "+cluster.node_resources.learner=training",
    "generator.num_cpus=1",  # a generation node's one CPU holds one engine
    "trainer.total_steps=4",
]
"""The pools of a ``generation_cluster`` placed."""


def generation_cluster():
    """A head, a training node and a generation node with room for one engine."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    cluster.add_node(num_cpus=2, resources={"training": 1})
    cluster.add_node(num_cpus=1, resources={"generation": 1})
    return cluster


def draining(cluster, node) -> None:
    """Ray marks `node` draining: a preemption notice (as its SIGTERM handler or an autoscaler gives), its deadline a
    minute on."""
    import ray
    from ray.core.generated import autoscaler_pb2

    preemption = autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION")
    gcs = ray._raylet.GcsClient(address=cluster.address)
    at = int(time.time() * 1000) + 60_000
    assert gcs.drain_node(node.node_id, preemption, "spot notice", at)[0]


def node_joining(cluster, pools, added: list, grow) -> list[int]:
    """A node with room for an engine added (to `added`), and ``Pools.grow`` (`grow`) asked until the engine placed
    on it joins."""
    added.append(cluster.add_node(num_cpus=1, resources={"generation": 1}))
    deadline = time.monotonic() + 300
    while not (joined := grow(pools)):
        assert time.monotonic() < deadline, "the engine did not join"
        time.sleep(0.5)
    return joined


@pytest.mark.parametrize("notice", [False, True])
def test_engines_join_as_nodes_appear_and_leave_with_them(tmp_path, monkeypatch, capsys, notice):
    """generator.num_engines=1..2 (issue 78's elastic engines) on a cluster whose one generation node holds one
    engine: the second engine's placement group waits for room. A node with room added as step 2 starts places it;
    the engine loads and joins (connected to the weight transport, given the weights), and step 2's batch is cut
    over two engines. Its node removed as step 3 starts, the engine leaves as its share fails, the share generated on
    the other, and the run finishes on one engine. Every metric is the one-engine run's, bit for bit, but the engine
    count and what the leaving cost (on-policy, fixed seed, fp32: each prompt's samples are its seed's on any
    engine). With a `notice`, Ray marks the node draining as step 3 starts (a preemption notice, as its SIGTERM
    handler or an autoscaler does) and removes it as step 4 starts: the engine takes no prompts from the notice on,
    and, holding none, leaves at once (past num_engines: not replaced), while alive, so its node's end costs nothing
    (no samples, and no push that fails: one that found it gone would replace the engines whose receive failed)."""
    import ray

    from grpo_ray.pools import Pools

    cluster, over = generation_cluster(), ELASTIC
    ray.init(address=cluster.address, log_to_driver=False)
    added, real, grows = [], Pools.grow, []

    def remove(self):  # the engine's node goes (its process with it: a call to it fails)
        cluster.remove_node(added[0])
        if len(self.generators) == 1:  # (the engine left already)
            return
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                ray.get(self.generators[1].where.remote(), timeout=5)
                time.sleep(0.5)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                break

    def grow(self):
        grows.append(len(grows) + 1)
        if len(grows) == 2:  # step 2 starts: a node with room for an engine appears; the engine joins this step
            return node_joining(cluster, self, added, real)
        if len(grows) == 3 and notice:  # step 3 starts: the notice, its deadline a minute on
            draining(cluster, added[0])
        elif len(grows) == 3 + notice:
            remove(self)
        return real(self)

    try:
        plain = train(tmp_path / "plain", over)
        monkeypatch.setattr(Pools, "grow", grow)
        elastic = train(tmp_path / "elastic", [*over, "generator.num_engines=1..2"])
    finally:
        ray.shutdown()
        cluster.shutdown()
    said = capsys.readouterr().out
    joined = re.findall(r"engine 1 joined \(node (\w+)\), now 2 engine\(s\)", said)
    assert joined == [added[0].node_id[:12]], said[-3000:]
    assert said.count(f"engine 1 left (node {added[0].node_id[:12]}): now 1 engine(s)") == 1
    if notice:
        drained = re.findall(r"node (\w+) is draining \(a preemption notice, (\d+) s left\); on it: generator 1", said)
        assert drained == [(added[0].node_id[:12], drained[0][1])] and 50 <= int(drained[0][1]) <= 60, said[-3000:]
        assert [m["fault/notices"] for m in elastic] == [0, 0, 1, 1]
        assert "engine 1 is on a draining node and holds no work: it leaves now" in said
        assert [m["generator/engines"] for m in elastic] == [1, 2, 1, 1]  # it left at the notice, while alive
        assert [m["fault/generator_left"] for m in elastic] == [0, 0, 1, 1]
        assert [m["fault/generator_redone"] for m in elastic] == [0, 0, 0, 0]  # it held nothing when it went
        assert said.count("engines that left with their node: 1 (fault/*)") == 1
    else:
        assert [m["generator/engines"] for m in elastic] == [1, 2, 1, 1]
        assert [m["fault/generator_left"] for m in elastic] == [0, 0, 1, 1]
        assert [m["fault/generator_redone"] for m in elastic] == [0, 0, 8 * 16, 8 * 16]  # the half it held
        assert said.count("work done again: generator 128 samples, engines that left with their node: 1 (fault/*)") == 1
    known = {"generator/engines", "fault/generator_left", "fault/generator_redone", "fault/notices"}
    assert differing(elastic, plain) <= known


@pytest.mark.parametrize("notice", [False, True])
def test_streaming_engines_join_as_a_node_appears(tmp_path, monkeypatch, capsys, notice):
    """Streaming (max_staleness 1), generator.num_engines=1..2: a node with room for an engine added as step 2
    starts, the engine joins (given the weights), is sent its share of the prompts sent from then on, and the takes
    after ask it for groups (``Feed.counts``); every prompt is trained once. With a `notice` (its node marked
    draining as step 3 starts, removed as step 4 starts): it is sent nothing more, hands back the groups it has not
    finished, and leaves once it holds none, before its node goes."""
    import ray

    from grpo_ray.pools import Pools
    from grpo_ray.sources.streaming import Feed

    cluster, added = generation_cluster(), []
    real_grow, real_counts, real_take, grows, asked, trained = Pools.grow, Feed.counts, Feed.take, [], [], []

    def grow(self):
        grows.append(1)
        if len(grows) == 2:
            return node_joining(cluster, self, added, real_grow)
        if len(grows) == 3 and notice:
            draining(cluster, added[0])
        if len(grows) == 4 and notice:
            cluster.remove_node(added[0])
        return real_grow(self)

    def counts(self, step, need):
        asked.append(real_counts(self, step, need))
        return asked[-1]

    def take(self, *args, **kwargs):
        rollouts, stats, flow = real_take(self, *args, **kwargs)
        trained.extend(u for s in stats for u in s.uids)
        return rollouts, stats, flow

    monkeypatch.setattr(Pools, "grow", grow)
    monkeypatch.setattr(Feed, "counts", counts)
    monkeypatch.setattr(Feed, "take", take)
    streaming = [
        "algorithm.schedule=streaming",
        "algorithm.max_staleness=1",
        "algorithm.rollout_correction.rollout_is=token",
    ]
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        metrics = train(tmp_path / "run", [*ELASTIC, *streaming, "generator.num_engines=1..2"])
    finally:
        ray.shutdown()
        cluster.shutdown()
    said = capsys.readouterr().out
    assert re.findall(r"engine 1 joined \(node (\w+)\), now 2 engine\(s\)", said) == [added[0].node_id[:12]]
    assert len(trained) == len(set(trained)) == 4 * 16, trained  # each prompt trained once
    if not notice:
        assert [m["generator/engines"] for m in metrics] == [1, 2, 2, 2]
        assert [len(c) for c in asked] == [1, 2, 2, 2] and asked[2][1] > 0, asked  # its groups taken from step 3 on
        return
    assert "engine 1 is on a draining node and holds no work: it leaves now" in said, said[-3000:]
    assert [m["generator/engines"] for m in metrics][:2] == [1, 2] and metrics[-1]["generator/engines"] == 1
    assert metrics[-1]["fault/generator_left"] == 1 and metrics[-1]["fault/notices"] == 1
    back = re.findall(r"engine 1 is on a draining node: it handed back the (\d+) groups", said)
    assert metrics[-1]["fault/generator_redone"] == 16 * sum(int(n) for n in back)  # those alone done again
