"""`grpo-ray rm`: a reward model (a one-output sequence classifier) trained on the FSDP2 learner pool from preference
pairs or pointwise labels, with the run's validation, checkpoints, resume and export; the export scores the held-out
rows as the run's last validation did, rendered as the reward-model pool renders rollouts. (GRPO on a learned
reward: tests/test_reward_model.py.)"""

import json
import math
import shutil

import pytest
import torch

from grpo_ray.algo.loss import reward_model_loss
from grpo_ray.config import load_recipe
from tests.conftest import run_cli

RECIPE = "recipes/tiny-cpu-rm.yaml"
SHORT = [
    "data.val_files=[synthetic://select?size=64&seed=1&split=test&items=1&pairs=1]",
    "trainer.total_steps=30",
    "trainer.test_freq=15",
    "trainer.save_freq=15",
]


def metrics(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Thirty steps of the tiny reward-model recipe, validated before training and every 15 steps, saved every 15."""
    out = tmp_path_factory.mktemp("rm")
    res = run_cli("rm", RECIPE, f"trainer.output_dir={out}", *SHORT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return out, res


def test_bradley_terry_and_pointwise_losses_by_hand():
    scores = torch.tensor([2.0, 0.5, 1.0, 1.5])  # chosen (2, 0.5), then their rejected (1, 1.5)
    loss, sums = reward_model_loss(scores, None, 4.0)
    nll = [math.log(1 + math.exp(-1.0)), math.log(1 + math.exp(1.0))]  # -log sigmoid(margin), margins 1 and -1
    assert loss.item() == pytest.approx(sum(nll) / 4)
    assert sums.tolist() == pytest.approx([sum(nll), 1, 0.0, 2])  # loss, right order, margin, rows
    loss, sums = reward_model_loss(torch.tensor([1.0, -2.0, 0.0]), torch.tensor([1.0, 1.0, 0.25]), 3.0)
    bce = [math.log(1 + math.exp(-1.0)), math.log(1 + math.exp(2.0)), math.log(2)]  # y log s(x) + (1-y) log(1-s(x))
    assert loss.item() == pytest.approx(sum(bce) / 3)
    assert sums.tolist() == pytest.approx([sum(bce), 2, 1.0 - 2.0 + 0.0, 3])  # 0 < 0.5 agrees with the label


@pytest.mark.slow
@pytest.mark.smoke
def test_a_reward_model_trains_validates_and_exports(trained):
    out, res = trained
    rows = metrics(out)
    assert [r["step"] for r in rows] == list(range(31))
    val = {r["step"]: r for r in rows if "val/rm/accuracy" in r}
    assert sorted(val) == [0, 15, 30]
    assert val[30]["val/rm/loss"] < val[0]["val/rm/loss"] - 0.2  # it learns which answer is right
    assert val[30]["val/rm/accuracy"] > 0.7 and val[0]["val/rm/accuracy"] < 0.75
    for r in rows[1:]:  # 32 pairs a step: one optimizer step, 16 pairs a rank in one micro batch
        assert r["actor/updates"] == 1 and r["rm/loss"] > 0 and 0 <= r["rm/accuracy"] <= 1
    placement = json.loads((out / "placement.json").read_text())
    assert [p for p, actors in placement.items() if actors] == ["learner"]
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForSequenceClassification"] and len(config["id2label"]) == 1
    assert f"reward model at {out / 'model'}" in res.stdout


@pytest.mark.slow
def test_plan_for_rm_places_the_learner_alone_and_predicts_its_memory(trained):
    """`grpo-ray plan --job rm`: the learner pool alone, its memory the classifier's (no logits over the vocabulary,
    a pair's two conversations in one forward) within 25% of the run's measured peak."""
    from grpo_ray.models.dims import model_dims
    from grpo_ray.planner import memory

    out, _ = trained
    plan = run_cli("plan", RECIPE, "--job", "rm")
    assert plan.returncode == 0 and "node 0: learner x2\n" in plan.stdout, plan.stdout + plan.stderr
    assert "generator" not in plan.stdout and "reward" not in plan.stdout.split("memory per device")[1]
    r = load_recipe(RECIPE, SHORT, command="rm")
    predicted = memory.job_learner_memory(model_dims(r.model.path), r, "rm").total
    measured = max(row["perf/peak_rss_gb/learner"] for row in metrics(out) if row["step"])
    assert 0.75 <= predicted / measured <= 1.25, (predicted, measured)


@pytest.mark.slow
@pytest.mark.smoke
def test_the_export_scores_the_held_out_rows_as_validated(trained):
    """The exported classifier, loaded by transformers as the reward-model pool loads it, on the held-out rows as
    setup_run renders them (``data.conversation_text``): the accuracy and loss of the run's last validation."""
    from transformers import AutoModelForSequenceClassification

    from grpo_ray.models import load_tokenizer
    from grpo_ray.setup_run import usable_rows

    out, _ = trained
    recipe = load_recipe(RECIPE, SHORT, command="rm")
    model = AutoModelForSequenceClassification.from_pretrained(out / "model", dtype=torch.float32).eval()
    rows = usable_rows(recipe.data.val_files, load_tokenizer(str(out / "model"), recipe.model), recipe, {}, "rm")
    with torch.no_grad():
        scores = [
            model(torch.tensor([row[k]])).logits[0, 0].item() for k in ("chosen_ids", "rejected_ids") for row in rows
        ]
    loss, sums = reward_model_loss(torch.tensor(scores), None, len(rows))
    last = metrics(out)[-1]
    assert last["val/rm/loss"] == pytest.approx(loss.item(), abs=1e-4)
    # a pair whose margin is within float error of 0 may order either way: at most one such
    assert abs(last["val/rm/accuracy"] - sums[1].item() / len(rows)) <= 1 / len(rows)


@pytest.mark.slow
def test_a_reward_model_run_resumes_where_it_left_off(trained, tmp_path):
    """The run's step-15 checkpoint resumed: steps 16-30 again, metric for metric the uninterrupted run's."""
    out, _ = trained
    run = tmp_path / "run"
    shutil.copytree(out, run)
    shutil.rmtree(run / "checkpoints" / "step_30")
    shutil.rmtree(run / "model")
    res = run_cli("rm", RECIPE, f"trainer.output_dir={run}", *SHORT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "resuming from" in res.stdout and "step_15" in res.stdout
    whole, resumed = metrics(out), metrics(run)
    assert [r["step"] for r in resumed] == list(range(31))
    for a, b in zip(whole[16:], resumed[16:]):
        for key in ("rm/loss", "rm/accuracy", "actor/grad_norm", "val/rm/loss"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), (a["step"], key)


@pytest.mark.slow
def test_pointwise_labels_train(tmp_path):
    """Rows of one response and a label (rm.label_key) train with binary cross-entropy."""
    from grpo_ray.data import load_rows

    data = tmp_path / "labelled.jsonl"
    with data.open("w") as f:
        for row in load_rows("synthetic://select?size=128&seed=2&items=1&pairs=1"):
            for key, label in (("chosen", 1), ("rejected", 0)):
                f.write(json.dumps({"prompt": row["prompt"], "response": row[key], "good": label}) + "\n")
    res = run_cli(
        "rm",
        RECIPE,
        f"trainer.output_dir={tmp_path / 'run'}",
        f"data.train_files=[{data}]",
        f"data.val_files=[{data}]",
        "rm.label_key=good",
        "trainer.total_steps=2",
        "trainer.test_freq=2",
        "trainer.val_before_train=false",
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2] and rows[-1]["val/rm/loss"] > 0
    assert all(0 <= r["rm/accuracy"] <= 1 for r in rows)


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (["model.lora.rank=8"], "model.lora.rank=8: grpo-ray rm trains every weight of the classifier"),
        (["rm.max_length=5000"], "rm.max_length=5000 is over the model's max_position_embeddings (1024)"),
        (["rm.chosen_key=better"], "row 0: rm.chosen_key='better' holds nothing; expected the response as text"),
        (
            ["rm.label_key=chosen", "rm.response_key=rejected"],
            "row 0: rm.label_key='chosen' holds '#### 2'; expected a number from 0 (bad) to 1",
        ),
        (["trainer.early_stop.metric=val/select/pass@1"], "validation reports val/rm/accuracy, val/rm/loss"),
    ],
)
def test_reward_model_recipe_problems_are_one_line(overrides, expected, capsys, tmp_path):
    import ray

    from grpo_ray.cli import main

    assert main(["rm", RECIPE, *overrides, f"trainer.output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("grpo-ray: error: ") and expected in err, err
    assert not ray.is_initialized()


def test_the_gpu_check_runs_here_on_a_tiny_shape(tmp_path):
    """benchmarks/gpu_rm.py's code path on this CPU (the GPU machine runs it at 1.5B): the pool's scoring gives the
    bare forward's scores, and the reward learner's step trains on random pairs."""
    import subprocess
    import sys

    args = ["--tiny", "--device", "cpu", "--samples", "8", "--score-micro", "4", "--seq", "64", "--micro", "2"]
    res = subprocess.run(
        [sys.executable, "benchmarks/gpu_rm.py", *args, "--out", str(tmp_path)], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads((tmp_path / "gpu-rm.json").read_text())
    assert report["scoring"]["max_abs_score_gap"] == 0.0 and report["scoring"]["score_spread"] > 0
    (row,) = report["training"]
    assert row["tokens"] == 2 * 2 * 2 * 64 and all(math.isfinite(x) for x in row["loss"])
