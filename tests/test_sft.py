"""`grpo-ray sft`: supervised fine-tuning on the FSDP2 learner pool, with the run's checkpoints, resume,
export, metrics and TensorBoard. (Learning itself, loss down and pass@1 up, is checked on the real warm-start
recipe in tests/test_showcase.py.)"""

import json
from pathlib import Path

import pytest

from grpo_ray.config import load_recipe
from grpo_ray.models import recipe_key
from tests.conftest import ROOT, run_cli

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


@pytest.mark.slow
def test_sft_with_copies_of_the_learners_state_trains_on_through_a_lost_rank(tmp_path):
    """trainer.fault_tolerance=all in SFT (issue 78): each rank's state copied as each step starts; rank 1 exits
    after the first of step 2's two optimizer steps, the group starts again from the copies and trains the step
    again: every metric the uninterrupted run's, bit for bit, but the restart and the step done again."""
    from tests.faults.conftest import differing

    def sft(out, env=None):
        over = [f"trainer.output_dir={out}", "trainer.total_steps=3", "trainer.fault_tolerance=all", *SHORT]
        res = run_cli("sft", RECIPE, *over, env=env, timeout=600)
        assert res.returncode == 0, res.stderr[-4000:]
        return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()], res.stdout

    plain, _ = sft(tmp_path / "plain")
    (tmp_path / "markers").mkdir()
    lost, said = sft(
        tmp_path / "lost", {"GRPO_RAY_FAULTS": "exit_learner@2", "GRPO_RAY_FAULTS_DIR": str(tmp_path / "markers")}
    )
    assert [m["fault/learner_restarts"] for m in lost] == [0, 1, 1] and [m["fault/learner_redone"] for m in lost] == [
        0,
        1,
        1,
    ]
    assert said.count("starting the learner group again from the copy of its state as the step began") == 1
    assert all(m["fault/learner_copy_mb"] > 0 for m in plain)
    assert differing(lost, plain) <= {"fault/learner_restarts", "fault/learner_redone"}


@pytest.mark.slow
@pytest.mark.smoke
def test_grpo_starts_from_the_model_its_sft_warm_start_made(tmp_path):
    """SFT then GRPO as recipes/tiny-cpu-reasoning.yaml runs them, cut short: `model.path: sft://RECIPE` trains the
    SFT recipe once, in the cache, and GRPO trains the model that SFT exported; the next run finds it there. (That
    SFT and GRPO learn: tests/test_showcase.py, with --full.)"""
    import yaml

    from grpo_ray.jobs.sft import warm_start

    sft = yaml.safe_load((ROOT / RECIPE).read_text())
    sft["data"]["train_files"] = ["synthetic://reasoning?size=64&seed=0&answer_only=0.5"]
    sft["data"]["train_batch_size"] = 16
    sft["learner"].update(mini_batch_size=8, micro_batch_size=4, world_size=1)  # CI's time: one rank each
    sft["trainer"].update(total_steps=2, test_freq=0, val_before_train=False)
    recipe = tmp_path / "warm-start.yaml"
    recipe.write_text(yaml.safe_dump(sft))
    out = tmp_path / "grpo"
    res = run_cli(
        "train",
        "recipes/tiny-cpu-reasoning.yaml",
        f"model.path=sft://{recipe}",
        "data.train_batch_size=4",
        "learner.mini_batch_size=64",
        "learner.micro_batch_size=32",
        "learner.world_size=1",
        "trainer.total_steps=2",
        "trainer.save_freq=2",
        "trainer.test_freq=0",
        "trainer.val_before_train=false",
        f"trainer.output_dir={out}",
        timeout=900,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "SFT warm start: training" in res.stdout  # the first run trains it
    model = Path(res.stdout.split("SFT warm start: model at ")[1].split()[0])
    sft_rows = [json.loads(line) for line in (model.parent / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in sft_rows] == [1, 2] and all(r["sft/loss"] > 0 for r in sft_rows)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and max(r["sync/logprob_diff"] for r in rows) < 1e-3
    info = json.loads((out / "checkpoints" / "step_2" / "training_info.json").read_text())
    assert info["model_path"] == str(model)  # GRPO's base: the model SFT exported
    assert warm_start(str(recipe)) == str(model)  # found in the cache: no second SFT run


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
