"""`grpo-ray sft`: supervised fine-tuning on the FSDP2 learner pool, with the run's checkpoints, resume,
export, metrics and TensorBoard. (Learning itself, loss down and pass@1 up, is checked on the real warm-start
recipe in tests/test_showcase.py.)"""

import json

import pytest

from grpo_ray.config import load_recipe
from grpo_ray.models import recipe_key
from tests.conftest import run_cli

RECIPE = "recipes/tiny-cpu-reasoning-sft.yaml"
SHORT = [
    "trainer.test_freq=0",
    "trainer.val_before_train=false",
    "data.train_batch_size=16",
    "learner.mini_batch_size=8",
    "learner.micro_batch_size=4",
]


@pytest.mark.slow
def test_sft_trains_exports_and_resumes(tmp_path):
    res = run_cli("sft", RECIPE, f"trainer.output_dir={tmp_path}", "trainer.total_steps=3", *SHORT, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:  # 16 rows a step, two optimizer steps of 8 (4 per rank)
        assert r["actor/updates"] == 2 and r["sft/tokens"] > 16 * 10 and r["sft/loss"] > 0
    assert (tmp_path / "checkpoints" / "step_3").is_dir()  # saved at the end although save_freq is 0
    assert (tmp_path / "model" / "config.json").is_file() and list((tmp_path / "tensorboard").iterdir())
    assert f"model at {tmp_path / 'model'}" in res.stdout
    placement = json.loads((tmp_path / "placement.json").read_text())
    assert [p for p, actors in placement.items() if actors] == ["learner"]  # no validation: learners only

    # the same command with a longer budget resumes after step 3
    res = run_cli("sft", RECIPE, f"trainer.output_dir={tmp_path}", "trainer.total_steps=5", *SHORT, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "resuming from" in res.stdout and "step_3" in res.stdout
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]


def test_recipe_key_follows_what_makes_the_model():
    base = recipe_key(load_recipe(RECIPE, command="sft"))
    assert base == recipe_key(
        load_recipe(RECIPE, ["trainer.output_dir=/elsewhere", "trainer.loggers=[jsonl]"], command="sft")
    )
    assert base != recipe_key(load_recipe(RECIPE, ["learner.optim.lr=1e-4"], command="sft"))
    assert base != recipe_key(load_recipe(RECIPE, ["trainer.total_epochs=3"], command="sft"))


@pytest.mark.parametrize(
    "override,expected",
    [
        ("sft.max_target_length=0", "sft.max_target_length=0: must be positive"),
        (
            "data.train_batch_size=60",
            "data.train_batch_size (60) = 60 samples per step is not divisible by learner.mini_batch_size (64)",
        ),
        (
            "sft.max_target_length=2000",
            "data.max_prompt_length (96) + sft.max_target_length (2000) = 2096 tokens is "
            "over the model's max_position_embeddings (1024)",
        ),
        ("sft.target_key=extra_info.solution", "row 0: no text or messages at sft.target_key='extra_info.solution'"),
    ],
)
def test_sft_recipe_problems_are_one_line(override, expected, capsys, tmp_path):
    import ray

    from grpo_ray.cli import main

    assert main(["sft", RECIPE, override, f"trainer.output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("grpo-ray: error: ") and expected in err, err
    assert not ray.is_initialized()
