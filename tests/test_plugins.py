"""A recipe's ``plugins``: a process reward model written outside the package (``tests/prm_plugin.py``: its row, its
section, its role and its use, nothing else) is read, checked, priced by ``plan`` and trained end to end, its signal
applied as its use says; a plugin that cannot be imported is one line before start."""

import importlib
import json
import math
import subprocess
import sys

import pytest
import torch

from grpo_ray.algo.loss import ADVANTAGE_TERMS, LossInputs, micro_batch_loss
from grpo_ray.config import KINDS, SECTIONS, USES, AlgorithmConfig, RecipeError, load_recipe, recipe_yaml
from grpo_ray.pools import ROLES
from grpo_ray.telemetry.dumps import read_samples
from tests.conftest import LEAN, ROOT, run_cli
from tests.test_recipes import check_twin_run

RECIPE = ROOT / "recipes" / "tiny-cpu.yaml"
PRM_MODEL = "tiny://qwen2?layers=2&hidden=128&heads=4&kv_heads=2&intermediate=256&vocab=128&bytes=0&seed=1"
PLUGGED = ["plugins=[tests.prm_plugin]", f"prm.model={PRM_MODEL}"]


@pytest.fixture
def plugged():
    """The fixture plugin imported here, and the tables it added to taken back after the test (other tests count
    the package's own rows)."""
    tables = (KINDS, USES, SECTIONS, ROLES, ADVANTAGE_TERMS)
    saved = [dict(t) for t in tables]
    sys.modules.pop("tests.prm_plugin", None)
    yield importlib.import_module("tests.prm_plugin")
    for table, before in zip(tables, saved):
        table.clear()
        table.update(before)
    sys.modules.pop("tests.prm_plugin", None)


def test_a_plugins_section_is_read_checked_and_written_as_the_packages_own(plugged):
    r = load_recipe(RECIPE, [*PLUGGED, "prm.coef=0.25", "prm.num_actors=2"])
    assert (r.prm.coef, r.prm.num_actors, r.prm.model) == (0.25, 2, PRM_MODEL)
    assert KINDS["prm"].count(r) == 2 and KINDS["prm"].section_of(r) is r.prm
    assert "prm:\n  num_actors: 2\n" in recipe_yaml(r) and "coef: 0.25" in recipe_yaml(r)
    with pytest.raises(RecipeError, match=r"unknown key 'prm.coeff'; did you mean 'prm.coef'"):
        load_recipe(RECIPE, [*PLUGGED, "prm.coeff=1"])
    with pytest.raises(RecipeError, match=r"prm.coef: Value 'x' of type 'str' could not be converted to Float"):
        load_recipe(RECIPE, [*PLUGGED, "prm.coef=x"])


def test_a_recipe_unpickled_elsewhere_imports_its_plugins_first(plugged, tmp_path):
    """As a Ray worker receives it: a fresh process that has never imported the plugin gets its row and use."""
    r = load_recipe(RECIPE, [*PLUGGED, "prm.coef=0.5"])
    (tmp_path / "r.pkl").write_bytes(__import__("pickle").dumps(r))
    code = (
        "import pickle, sys; r = pickle.load(open(sys.argv[1], 'rb'));"
        "from grpo_ray.config import KINDS, USES; from grpo_ray.algo.loss import token_uses;"
        "print(r.prm.coef, KINDS['prm'].use, 'process_reward' in token_uses(), type(r).__name__)"
    )
    got = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "r.pkl")], capture_output=True, text=True, cwd=ROOT
    )
    assert got.stdout.split() == ["0.5", "process_reward", "True", "Recipe"], got.stderr[-2000:]


def test_the_prms_use_reshapes_each_tokens_advantage_before_the_loss(plugged):
    """Every advantage 0: the policy-gradient loss is minus the mean over kept tokens of coef x (score - 0.5)."""
    r = load_recipe(RECIPE, [*PLUGGED, "prm.coef=0.5"])
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.1], [0.9, 0.3, 0.2]]))
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    score = torch.tensor([[0.9, 0.1, 0.7], [0.5, 0.3, 0.8]])
    x = LossInputs(logp, logp, torch.zeros(2), mask, signals={"process_reward": score})
    loss, count, *_ = micro_batch_loss(x, AlgorithmConfig(kl_coef=0.0), 3, {"process_reward": r.prm})
    expected = -0.5 * ((0.9 - 0.5) + (0.1 - 0.5) + (0.5 - 0.5) + (0.3 - 0.5) + (0.8 - 0.5))
    assert float(loss) / float(count) == pytest.approx(expected / 5, abs=1e-6)
    plain, count, *_ = micro_batch_loss(LossInputs(logp, logp, torch.zeros(2), mask), AlgorithmConfig(), 3)
    assert float(plain) == 0.0


def test_extending_refuses_what_would_clash(plugged):
    from grpo_ray.config import PoolKind, Use
    from grpo_ray.extend import add_pool, add_use

    with pytest.raises(ValueError, match="a plugin's use is a token signal"):
        add_use("judged", Use("sequence", ""), plugged.process_reward)
    with pytest.raises(ValueError, match="use 'process_reward' exists"):
        add_use("process_reward", Use("token", "another"), plugged.process_reward)
    row = PoolKind("critic", lambda r: 0, lambda r: 1, lambda r: 0, "frozen_pool", "frozen", use="value")
    with pytest.raises(ValueError, match="its use 'value' is none of kl, distill, reward_component, process_reward"):
        add_pool(row, plugged.PRMConfig, plugged.ProcessRewardModel)
    row = PoolKind("critic", lambda r: 0, lambda r: 1, lambda r: 0, "frozen_pool", "frozen", section="reward")
    with pytest.raises(ValueError, match="its section 'reward' is the recipe's own"):
        add_pool(row, plugged.PRMConfig, plugged.ProcessRewardModel)


def test_a_plugin_that_cannot_be_imported_is_one_line_before_start(tmp_path):
    (tmp_path / "broken_plugin.py").write_text("x = 1\nraise RuntimeError('no PRM here')\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.read_text())
    for plugin, said in [
        ("absent_plugin", "plugins: no module 'absent_plugin' (looked in "),
        ("broken_plugin", "plugins: 'broken_plugin' failed to import: RuntimeError: no PRM here (broken_plugin.py:2)"),
    ]:
        out = run_cli("train", str(recipe), f"plugins=[{plugin}]", f"trainer.output_dir={tmp_path / 'run'}")
        assert out.returncode == 2 and said in out.stderr, out.stderr[-2000:]
        assert "Traceback" not in out.stderr and not (tmp_path / "run").exists()


def test_plan_prices_the_prm_as_its_row_says():
    out = run_cli("plan", str(RECIPE), *PLUGGED)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "prm x1" in out.stdout  # placed
    assert any(line.split()[:1] == ["prm"] and "micro batch 16 x" in nxt for line, nxt in _pairs(out.stdout))
    assert any(line.split()[:1] == ["prm"] and line.split()[2] == "s" for line in out.stdout.splitlines())


def _pairs(text: str):
    lines = text.splitlines()
    return zip(lines, lines[1:])


@pytest.mark.slow
@pytest.mark.smoke
def test_the_prm_trains_end_to_end_and_its_signal_is_the_loss(plugged, tmp_path):
    """One step where every response scores the same (every advantage 0): the step's policy-gradient loss is the
    PRM's term alone, minus the mean over response tokens of coef x (p - 0.5), p the PRM's probability of each sampled
    token by a plain transformers forward of its model on the dumped samples. Without the plugin it would be 0."""
    over = [
        *PLUGGED,
        "prm.coef=2.0",
        "prm.num_cpus=0.25",
        # CI's time: one rank (the quick start's two are its own test's)
        *LEAN,
        "reward.functions=[{name: tests.helpers.varied_rewards:flat}]",
    ]
    over += ["trainer.total_steps=1", "trainer.val_before_train=false", "trainer.dump_freq=1", "trainer.save_freq=1"]
    out = run_cli("train", str(RECIPE), *over, f"trainer.output_dir={tmp_path}", timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    check_twin_run(RECIPE, tmp_path, overrides=tuple(over))
    step = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()][-1]
    assert step["timing_s/prm"] > 0 and (tmp_path / "logs" / "prm-0.log").is_file()
    from transformers import AutoModelForCausalLM

    from grpo_ray import models

    prm = AutoModelForCausalLM.from_pretrained(models.resolve(PRM_MODEL), torch_dtype=torch.float32).eval()
    terms = []
    with torch.no_grad():
        for row in read_samples(tmp_path / "rollouts" / "train_data_step1.jsonl"):
            assert row["advantage"] == 0.0
            ids = row["prompt_ids"] + row["response_ids"]
            logits = prm(torch.tensor([ids])).logits[0, len(row["prompt_ids"]) - 1 : -1]
            logp = torch.log_softmax(logits, -1).gather(1, torch.tensor(row["response_ids"])[:, None])[:, 0]
            terms += [2.0 * (math.exp(v) - 0.5) for v in logp.tolist()]
    assert step["actor/pg_loss"] == pytest.approx(-sum(terms) / len(terms), abs=1e-5)
