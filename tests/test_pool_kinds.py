"""A pool is one row of grpo_ray.config.pools.KINDS: every kind names its placement (count, CPUs, GPUs), its memory
and time models or declares them not modelled, and `plan` accounts for every pool a recipe starts."""

import re
from pathlib import Path

import pytest

from grpo_ray import placement
from grpo_ray.config import KINDS, POOLS, load_recipe
from grpo_ray.models.dims import model_dims
from grpo_ray.planner import memory, rates, speed
from grpo_ray.setup_run import MODEL_CHECKS
from tests.conftest import ROOT


def test_every_kind_names_its_models_and_they_exist():
    assert tuple(POOLS) == tuple(KINDS)  # a view of the table: a plugin's row is a pool too
    r = load_recipe(ROOT / "recipes" / "tiny-cpu.yaml")
    for name, k in KINDS.items():
        assert hasattr(r, k.section or name), f"{name}: no recipe section {k.section or name!r}"
        assert callable(getattr(memory, k.memory, None)), f"{name}: grpo_ray.planner.memory has no {k.memory}"
        assert k.time is None or k.time in speed.TIME_MODELS, f"{name}: no time model {k.time!r}"
        assert k.checked in MODEL_CHECKS, f"{name}: setup_run has no model check {k.checked!r}"


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
    """Each pool the recipe starts is busy in a phase of the prediction, or said to be not modelled; the committed
    `plan` output (kept current by tests/test_recipes.py) prints every phase."""
    r = load_recipe(ROOT / "recipes" / f"{plan_file.stem}.yaml")
    started = [p for p, plan in placement.plan(r).items() if plan.actors]
    p = speed.predict(r, model_dims(r.model.path), rates.rates_for(r), speed.default_shape(r))
    busy = {pool for phase in p.phases.values() for pool in phase.busy}
    assert set(started) == busy | set(p.unmodelled), plan_file.name
    text = plan_file.read_text().split("predicted step time", 1)[1]
    for name in [*p.phases, *p.unmodelled]:
        assert re.search(rf"^  {name}\s", text, re.M), f"{plan_file.name}: {name} is not in the prediction"


def test_a_pool_whose_time_is_not_modelled_is_said_so():
    """A row with no time model (none today) is printed as such, never left out of the prediction."""
    shape = speed.Shape(8, 8, "as given")
    p = speed.Prediction({}, 1.0, "on-policy", 1.0, {}, "by hand", shape, unmodelled=("process_reward",))
    assert re.search(r"^  process_reward\s+-\s+not modelled", p.text(), re.M)


def test_the_learners_state_copy_is_planned_where_the_run_keeps_it():
    """trainer.fault_tolerance=all (issue 78): each rank's copy of its weights and Adam's moments, 12 bytes a trained
    parameter over the ranks, made on its host (a part of a CPU learner's memory, not of a GPU's) and kept on the
    driver's node (all ranks' copies: a note)."""
    for recipe, cpu in (("tiny-cpu.yaml", True), ("qwen2.5-32b-gsm8k-b200.yaml", False)):
        kept, plain = (
            load_recipe(ROOT / "recipes" / recipe, [f"trainer.fault_tolerance={f}"]) for f in ("all", "pools")
        )
        d, w = model_dims(kept.model.path), kept.learner.world_size
        with_copy, without = memory.learner_memory(d, kept), memory.learner_memory(d, plain)
        gb = 12 * d.params / w / memory.GB
        assert "state_copy" not in without.parts and "copy of its state" not in without.note
        assert f"{gb:.1f} GB of host memory a rank as it is made, {gb * w:.1f} GB kept on the driver's node" in (
            with_copy.note
        )
        if cpu:
            assert with_copy.parts["state_copy"] == pytest.approx(gb) and with_copy.total > without.total
        else:
            assert with_copy.total == without.total  # device memory: the copy is the host's


def test_plan_prices_the_state_copys_time_where_the_run_keeps_it(capsys):
    """The copy's time a step (``memory.state_copy``): each rank's 12 bytes a trained parameter to the host (a GPU's
    at the assumed D2H_GBPS), then that and its snapshots into Ray's object store at the host's bandwidth; `plan`
    prints it beside the step, and nothing where the run keeps no copy."""
    from grpo_ray.cli import main
    from grpo_ray.planner import rates

    r = load_recipe(ROOT / "recipes" / "llama3.1-8b-math-4node-streaming.yaml", ["trainer.fault_tolerance=all"])
    d, w = model_dims(r.model.path), r.learner.world_size
    state = 12 * d.trained(r.model) / w
    gb, seconds = memory.state_copy(d, r, 10.0)
    assert gb == pytest.approx(state / memory.GB)  # streaming keeps no snapshot
    assert seconds == pytest.approx(state / (memory.D2H_GBPS * memory.GB) + state / (10.0 * memory.GB))
    assert memory.state_copy(d, load_recipe(ROOT / "recipes" / "llama3.1-8b-math-4node-streaming.yaml"), 10.0) == (0, 0)
    for over, said in ((["trainer.fault_tolerance=all"], True), ([], False)):
        main(["plan", str(ROOT / "recipes" / "llama3.1-8b-math-4node-streaming.yaml"), *over])
        found = re.search(
            r"^  state copy\s+([\d.]+) s  trainer.fault_tolerance=all: ([\d.]+) GB a learner rank",
            capsys.readouterr().out,
            re.M,
        )
        assert bool(found) == said
        if found:
            host = rates.published()["cpu"].at(1).bandwidth / 1e9  # the host's: this project's CPU machine's
            assert float(found[2]) == pytest.approx(state / memory.GB, rel=1e-2)
            assert float(found[1]) == pytest.approx(memory.state_copy(d, r, host)[1], abs=1e-3)
