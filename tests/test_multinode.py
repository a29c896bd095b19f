"""Pools on a simulated multi-node Ray cluster (ray.cluster_utils.Cluster, several raylets on this machine)."""

import json

import pytest

from grpo_ray import placement
from grpo_ray.config import load_recipe
from grpo_ray.controller import GRPOController
from grpo_ray.setup_run import setup_run
from tests.conftest import ROOT, TINY

TINY_RECIPE = ROOT / "recipes" / "tiny-cpu.yaml"


@pytest.mark.slow
def test_generators_land_only_on_generator_nodes(tmp_path):
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    gen_nodes = [cluster.add_node(num_cpus=1, resources={"generation": 1}) for _ in range(2)]
    cluster.add_node(num_cpus=2, resources={"training": 1})
    cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        r = load_recipe(
            TINY_RECIPE,
            [
                f"model.path={TINY.format(arch='qwen2')}",
                f"trainer.output_dir={tmp_path}",
                "generator.num_engines=2",
                "cluster.nodes=5",
                "+cluster.node_resources.generator=generation",
                "+cluster.node_resources.learner=training",
                "+cluster.node_resources.reference=training",
                "data.train_batch_size=4",
                "algorithm.group_size=4",
                "learner.mini_batch_size=16",
                "learner.micro_batch_size=8",
                "data.max_prompt_length=200",
            ],
        )
        c = GRPOController(r, setup_run(r))
        try:
            c.start()
            plan = json.loads((tmp_path / "placement.json").read_text())
        finally:
            c.shutdown()
        nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
        gen_ids = {n for n, res in nodes.items() if "generation" in res}
        assert len(gen_ids) == len(gen_nodes) == 2
        assert {a["node_id"] for a in plan["generator"]} <= gen_ids
        for pool in ("learner", "reference"):
            assert all("training" in nodes[a["node_id"]] for a in plan[pool]), pool
        assert plan["generator"][0]["resources"]["generation"] == placement.MARKER
    finally:
        ray.shutdown()
        cluster.shutdown()


SCALE_LAYOUTS = ["qwen2.5-32b-gsm8k-b200", "llama3.1-8b-math-4node", "gemma3-27b-gsm8k-noncolocated"]


@pytest.mark.slow
@pytest.mark.parametrize("name", SCALE_LAYOUTS)
def test_scale_recipe_lands_as_planned(name):
    """The 2-node, 4-node and non-colocated recipes on a simulated cluster of their shape (GPUs are logical
    here): the placement groups Ray makes put each pool's bundles on the nodes `grpo-ray plan` shows."""
    from collections import Counter

    import ray
    from ray.cluster_utils import Cluster
    from ray.util.placement_group import placement_group_table, remove_placement_group

    r = load_recipe(ROOT / "recipes" / f"{name}.yaml")
    c = r.cluster
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 32})
    for marker, count in c.node_markers.items():
        for _ in range(count):
            cluster.add_node(num_cpus=200, num_gpus=c.devices_per_node, resources={marker: 1})
    ray.init(address=cluster.address, log_to_driver=False)
    pgs = {}
    try:
        pgs = placement.reserve(r, timeout_s=60)
        marker_of = {
            n["NodeID"]: next((m for m in c.node_markers if m in n["Resources"]), "head")
            for n in ray.nodes()
            if n["Alive"]
        }
        landed = {}
        for pool, (pg, _) in pgs.items():
            group = "+".join(next(g for g in placement.node_groups(r.cluster) if pool in g))
            per_node = Counter(placement_group_table(pg)["bundles_to_node_id"].values())
            landed[group] = sorted((marker_of[node], k) for node, k in per_node.items())
        nodes, problems = placement.layout(r)
        assert not problems
        planned = {}
        for n in nodes:
            for group, k in Counter(g for g, _, _ in n.hosts).items():
                planned.setdefault(group, []).append((n.markers[0], k))
        for group, where in planned.items():
            assert landed[group] == sorted(where), group
        assert set(planned) == {g for g in landed if g != "reward"}
    finally:
        for pg in {id(pg): pg for pg, _ in pgs.values()}.values():
            remove_placement_group(pg)
        ray.shutdown()
        cluster.shutdown()
