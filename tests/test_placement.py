"""Placement: the fit check, and pools on a simulated multi-node Ray cluster."""

import pytest

from grpo_ray import placement
from grpo_ray.config import load_recipe
from grpo_ray.controller import GRPOController
from grpo_ray.setup_run import setup_run
from tests.conftest import ROOT, TINY

TINY_RECIPE = ROOT / "recipes" / "tiny-cpu.yaml"


def test_plan_and_fit_check_on_gpu_nodes():
    r = load_recipe(
        TINY_RECIPE,
        [
            "cluster.device=cuda",
            "cluster.nodes=2",
            "cluster.devices_per_node=8",
            "generator.num_engines=2",
            "generator.tensor_parallel_size=4",
            "learner.world_size=4",
            "learner.micro_batch_size=8",
            "learner.mini_batch_size=128",
            "reference.num_actors=2",
            "cluster.colocate=[[learner,reference]]",
            "+cluster.node_resources.generator=generation",
        ],
    )
    plans = placement.plan(r)
    assert (plans["generator"].actors, plans["generator"].gpus) == (2, 4)
    assert plans["generator"].resources == {"generation": placement.MARKER}
    groups = [["learner", "reference"], ["generator"], ["teacher"], ["reward_model"], ["judge"], ["reward"]]
    assert placement.node_groups(r.cluster) == groups
    shared = placement.bundles(["learner", "reference"], plans)
    assert len(shared) == 4 and shared[0] == {"CPU": 0.75, "GPU": 1} and shared[3] == {"CPU": 0.5, "GPU": 1}
    gen_node = {"CPU": 32, "GPU": 8, "generation": 1}
    train_node = {"CPU": 32, "GPU": 8}
    assert placement.problems(r, [gen_node, train_node]) == []
    found = placement.problems(r, [train_node, train_node])  # nobody carries the generation marker
    assert found == [
        "no node can hold one actor of generator: it asks for CPU 0.5, GPU 4, generation 0.001",
        "the pools ask for 0.002 generation in all, the cluster has 0",
    ]
    assert placement.problems(r, [{"CPU": 32, "GPU": 2, "generation": 1}, train_node])[0].startswith(
        "no node can hold one actor of generator"
    )


def test_compute_threads_follow_the_schedule():
    on_policy = load_recipe(TINY_RECIPE)  # generator 0.5, learner 2 x 0.5, reference 0.25, reward 0.25 CPUs
    plans = placement.plan(on_policy)
    # one phase at a time: the phase running takes the node (the learner's 2 ranks share it); rewards keep theirs
    want = {"generator": 8, "learner": 4, "reference": 8, "teacher": 8, "reward_model": 8, "judge": 8, "reward": 1}
    assert placement.threads(on_policy, plans, 8) == want
    assert set(placement.threads(on_policy, plans, 1).values()) == {1}
    two_engines = load_recipe(TINY_RECIPE, ["generator.num_engines=2", "generator.num_cpus=3"])
    assert placement.threads(two_engines, placement.plan(two_engines), 8)["generator"] == 4
    reserved = {"generator": 3, "learner": 1, "reference": 1, "teacher": 1, "reward_model": 1, "judge": 1, "reward": 1}
    for overrides in (
        ["algorithm.max_staleness=1"],  # phases overlap: each keeps its reservation
        ["cluster.cpu_threads=reserved"],
        ["cluster.nodes=2"],
        ["cluster.device=cuda", "cluster.devices_per_node=8"],
    ):
        r = load_recipe(TINY_RECIPE, ["generator.num_cpus=3", *overrides])
        assert placement.threads(r, placement.plan(r), 8) == reserved, overrides
    forced = load_recipe(TINY_RECIPE, ["algorithm.max_staleness=1", "cluster.cpu_threads=node"])
    assert placement.threads(forced, placement.plan(forced), 8)["generator"] == 8


@pytest.mark.slow
def test_a_cluster_too_small_fails_before_any_actor_starts(ray_local, tmp_path):
    r = load_recipe(
        TINY_RECIPE, [f"model.path={TINY.format(arch='qwen2')}", f"trainer.output_dir={tmp_path}", "learner.num_cpus=3"]
    )
    c = GRPOController(r, setup_run(r))
    with pytest.raises(placement.ClusterError, match=r"the pools ask for 7\.?\d* CPU in all, the cluster has 4"):
        c.start()
    assert ray_local.util.list_named_actors() == [] and c.pools.actors["learner"] == []
