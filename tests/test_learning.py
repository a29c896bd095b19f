"""The main job learns: `grpo-ray train recipes/tiny-cpu.yaml`, end to end, as the README runs it (100 of its 150
steps).

Every pool is its own Ray actor (vLLM generator, two FSDP2 learner ranks over gloo, reference,
reward); weights are synced every step. It learns on-policy and one step off (the next batch generated
while this one trains) to the same bound. The synthetic task's answer must be read from the prompt, so
a constant answer scores about 1/9, and a generator left on the initial weights stays near 0.

The one-step-off run is also what a verl user brings in their first hour: the same rows as a plain
{question, answer} JSONL file read through data.prompt_key / data.answer_key (named as one value, verl's
form), a reward file beside them with verl's compute_score signature, named by verl's custom_reward_function.path
(resolved in the working directory), and a model directory without a chat template, given one by model.chat_template.
"""

import json
import statistics
from pathlib import Path

import pytest

from grpo_ray.config import load_recipe
from grpo_ray.placement import plan, threads
from tests.conftest import ROOT, run_cli

pytestmark = pytest.mark.slow


# 100 of the quick start's 150 steps, either schedule: its score passes 0.8 near step 85 either way (the 150-step
# on-policy run here: 0.976 over steps 96-100, validation 1.0 at step 100; with a constant learning rate and the same
# rows, a 100-step run is its first 100 steps), and 50 steps more take most of a minute
STEPS = ["trainer.total_steps=100"]
ONE_STEP_OFF = ["algorithm.max_staleness=1", "algorithm.rollout_correction.rollout_is=token"]


VERL_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    said = solution_str.removeprefix("####").strip()
    return {"score": float(said == ground_truth), "acc": said == ground_truth, "pred": said}
"""


def as_a_verl_user_brings_it(home: Path) -> list[str]:
    """The tiny recipe's model, rows and reward in the forms a verl user has them, written under `home` (the run's
    working directory); the overrides that name them."""
    import shutil

    import datasets

    from grpo_ray import models
    from grpo_ray.data import load_rows

    rows = load_rows("synthetic://select?size=4000&seed=0&items=1")
    val = load_rows("synthetic://select?size=256&seed=0&split=test&items=1")  # a `datasets` folder, mapped alike
    plain = [
        {
            "question": r["prompt"][0]["content"],
            "answer": int(r["reward_model"]["ground_truth"]),
            "data_source": r["data_source"],
        }
        for r in val
    ]
    datasets.Dataset.from_list(plain).save_to_disk(str(home / "val_set"))
    (home / "train.jsonl").write_text(
        "".join(
            json.dumps({"question": r["prompt"][0]["content"], "answer": int(r["reward_model"]["ground_truth"])}) + "\n"
            for r in rows
        )
    )
    (home / "my_reward.py").write_text(VERL_REWARD)
    recipe = load_recipe(ROOT / "recipes" / "tiny-cpu.yaml")
    base = Path(models.resolve(recipe.model.path))
    model = home / "base-model"
    shutil.copytree(base, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    (home / "template.jinja").write_text(config.pop("chat_template", "") or (model / "chat_template.jinja").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    (model / "chat_template.jinja").unlink(missing_ok=True)
    return [
        f"model.path={model}",
        "model.chat_template=template.jinja",
        "data.train_files=train.jsonl",
        "data.val_files=[val_set]",
        "data.prompt_key=question",
        "data.answer_key=answer",
        "custom_reward_function.path=my_reward.py",  # verl's key; its name, compute_score, by default
    ]


@pytest.mark.parametrize("schedule", [[], ONE_STEP_OFF], ids=["on-policy", "one-step-off-verl-user"])
def test_tiny_recipe_learns_with_every_pool_its_own_actor(tmp_path, schedule):
    user = as_a_verl_user_brings_it(tmp_path) if schedule else []
    res = run_cli(
        "train",
        str(ROOT / "recipes" / "tiny-cpu.yaml"),
        f"trainer.output_dir={tmp_path / 'run'}",
        *STEPS,
        *schedule,
        *user,
        timeout=900,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-5000:]
    if user:  # the reward that ran is the user's file, named by its absolute path in config.yaml
        assert f"{tmp_path / 'my_reward.py'}:compute_score" in (tmp_path / "run" / "config.yaml").read_text()
    tmp_path = tmp_path / "run"
    everything = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in everything if r["step"] > 0]
    scores = [r["critic/score/mean"] for r in rows]
    print("score per step:", [round(s, 3) for s in scores])
    assert len(rows) == rows[-1]["step"] == 100
    if user:  # verl's dict: its other numbers are metrics too (acc here, the score itself; pred is text)
        name = "reward/my_reward:compute_score"  # by the file's stem, never the machine's path
        assert all(r[f"{name}/acc/mean"] == r["critic/score/mean"] and f"{name}/pred/mean" not in r for r in rows)
    assert scores[0] <= 0.3
    assert statistics.fmean(scores[-5:]) >= 0.8
    assert max(r["sync/logprob_diff"] for r in rows) < 1e-3  # weights reached the generators every step
    # on-policy, batch k is generated by version k-1; one step off, batch k+1 is generated during step k
    versions = list(range(len(rows))) if not schedule else [0] + list(range(len(rows) - 1))
    assert [r["rollout/policy_version"] for r in rows] == versions
    if not schedule:  # on-policy, from the engines' and the learner's clocks: each batch after the update and push
        assert all(r["rollout/staleness"] == 0 and r["perf/gen_overlap_s"] == 0 for r in rows)
        assert all(r["perf/frozen_overlap_s"] == 0 for r in rows)  # the reference scores after the push too
        assert all(r["perf/gen_ahead_s"] < 0 for r in rows[1:])
    val = [r["val/synthetic/select/pass@1"] for r in everything if "val/synthetic/select/pass@1" in r]
    assert len(val) == len(rows) // 50 + 1 and val[0] <= 0.3 and val[-1] >= 0.8  # before training, every 50 steps
    placement = json.loads((tmp_path / "placement.json").read_text())
    assert {p: len(a) for p, a in placement.items()} == {
        "generator": 1,
        "learner": 2,
        "reference": 1,
        "teacher": 0,
        "reward_model": 0,
        "judge": 0,
        "reward": 1,
    }
    assert len({a["pid"] for actors in placement.values() for a in actors}) == 5
    # each actor runs the threads planned: on-policy the engine (alone on the node) takes all its CPUs
    recipe = load_recipe(ROOT / "recipes" / "tiny-cpu.yaml", schedule)
    planned = threads(recipe, plan(recipe), placement["generator"][0]["threads"] if not schedule else 1)
    assert schedule or planned["generator"] >= 2 * planned["learner"] >= 2  # one step off: each its reservation (1)
    assert {p: [a["threads"] for a in actors] for p, actors in placement.items() if p != "reward"} == {
        p: [planned[p]] * n
        for p, n in (
            ("generator", 1),
            ("learner", 2),
            ("reference", 1),
            ("teacher", 0),
            ("reward_model", 0),
            ("judge", 0),
        )
    }
    for line in ("step:1 ", f"step:{len(rows)} "):
        assert line in res.stdout
