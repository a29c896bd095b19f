"""A pool is one row of grpo_ray.config.pools.KINDS: every kind names its placement (count, CPUs, GPUs), its memory
and time models or declares them not modelled, and `plan` accounts for every pool a recipe starts."""

import re
from pathlib import Path

import pytest

from grpo_ray import placement
from grpo_ray.config import KINDS, POOLS, load_recipe
from grpo_ray.planner import memory, speed
from tests.conftest import ROOT


def test_every_kind_names_its_models_and_they_exist():
    assert tuple(KINDS) == POOLS
    r = load_recipe(ROOT / "recipes" / "tiny-cpu.yaml")
    for name, k in KINDS.items():
        assert hasattr(r, name), f"{name}: no recipe section of its name"
        assert callable(getattr(memory, k.memory, None)), f"{name}: grpo_ray.planner.memory has no {k.memory}"
        assert k.time is None or k.time in {"generation", "reward", "reference", "teacher", "reward_model", "update"}


@pytest.mark.parametrize(
    "overrides, on",
    [
        ([], {"generator": 1, "learner": 2, "reference": 1, "reward": 1}),  # the quick start as shipped
        (["algorithm.kl_coef=0"], {"generator": 1, "learner": 2, "reward": 1}),  # no KL term: no reference
        (["model.lora.rank=8"], {"generator": 1, "learner": 2, "reward": 1}),  # the learner is its own reference
        (
            ["teacher.model=x", "teacher.num_actors=2"],
            {"generator": 1, "learner": 2, "reference": 1, "teacher": 2, "reward": 1},
        ),
        (["reward_model.model=x"], {"generator": 1, "learner": 2, "reference": 1, "reward_model": 1, "reward": 1}),
    ],
)
def test_each_rows_rule_turns_its_pool_on(overrides, on):
    plans = placement.plan(load_recipe(ROOT / "recipes" / "tiny-cpu.yaml", overrides))
    assert list(plans) == list(POOLS)
    assert {p: plan.actors for p, plan in plans.items() if plan.actors} == on
    assert all(plan.gpus == 0 for plan in plans.values())  # on CPU every pool runs on the node's cores


def test_on_gpus_each_row_asks_for_its_devices():
    r = load_recipe(ROOT / "recipes" / "qwen2.5-1.5b-gsm8k-rm.yaml")
    plans = placement.plan(r)
    assert plans["generator"].gpus == r.generator.tensor_parallel_size
    assert plans["learner"].gpus == plans["reward_model"].gpus == 1 and plans["reward"].gpus == 0


@pytest.mark.parametrize("plan_file", sorted((ROOT / "recipes" / "plans").glob("*.txt")), ids=lambda p: p.stem)
def test_plan_accounts_for_every_pool_the_run_starts(plan_file: Path):
    """Each pool the recipe starts has its phase in the committed `plan` output (kept current by
    tests/test_recipes.py), or a line saying its time is not modelled: none is left out silently."""
    plans = placement.plan(load_recipe(ROOT / "recipes" / f"{plan_file.stem}.yaml"))
    started = [p for p, plan in plans.items() if plan.actors]
    text = plan_file.read_text().split("predicted step time", 1)[1]
    for pool in started:
        k = KINDS[pool]
        said = k.time if k.time else pool
        assert re.search(rf"^  {said}\s", text, re.M), f"{plan_file.name}: {pool} ({said}) is not in the prediction"
        if not k.time:
            assert re.search(rf"^  {pool}\s+-\s+not modelled", text, re.M), plan_file.name


def test_a_pool_whose_time_is_not_modelled_is_said_so():
    """A row with no time model (none today) is printed as such, never left out of the prediction."""
    shape = speed.Shape(8, 8, "as given")
    p = speed.Prediction({}, 1.0, "on-policy", 1.0, {}, "by hand", shape, unmodelled=("process_reward",))
    assert re.search(r"^  process_reward\s+-\s+not modelled", p.text(), re.M)
