"""Pools on a simulated multi-node Ray cluster (ray.cluster_utils.Cluster, several raylets on this machine)."""

import json

import pytest

from grpo_ray import placement
from grpo_ray.config import load_recipe
from grpo_ray.controller import Controller
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
        r = load_recipe(TINY_RECIPE, [
            f"model.path={TINY.format(arch='qwen2')}", f"trainer.output_dir={tmp_path}", "generator.num_engines=2",
            "cluster.nodes=5", "+cluster.node_resources.generator=generation",
            "+cluster.node_resources.learner=training", "+cluster.node_resources.reference=training",
            "data.train_batch_size=4", "algorithm.group_size=4", "learner.mini_batch_size=16",
            "learner.micro_batch_size=8", "data.max_prompt_length=200"])
        c = Controller(r, setup_run(r))
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
