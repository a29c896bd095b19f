"""On-policy distillation end to end: the tiny twin of recipes/qwen2.5-1.5b-gsm8k-distill.yaml (a teacher pool of
two actors, one step off, the reward beside the teacher's signal) trains, its reverse KL is the one a bare
transformers forward of the teacher gives on the dumped samples, and it resumes with its teacher. (The objective's
values and gradients by hand: tests/test_algo.py; a teacher with another tokenizer: tests/faults/test_bad_input.py.)"""

import json

import pytest
import torch

from grpo_ray import models
from grpo_ray.config import KINDS, load_recipe
from grpo_ray.models.dims import model_dims
from grpo_ray.planner import memory
from grpo_ray.telemetry.dumps import read_samples
from tests.conftest import ROOT, run_cli
from tests.test_recipes import check_twin_run

pytestmark = pytest.mark.slow  # distillation: its run in CI's tier (smoke), its resume not
RECIPE = ROOT / "recipes" / "tiny-qwen2.5-1.5b-gsm8k-distill.yaml"
ONE_ENGINE_ONE_RANK = ("generator.num_engines=1", "learner.world_size=1")
"""CI's time: the twin's teacher pool of two, on one engine and one learner rank (2 actors fewer)."""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The twin's 3 steps (a checkpoint at the last)."""
    out = tmp_path_factory.mktemp("distill")
    first = run_cli("train", str(RECIPE), *ONE_ENGINE_ONE_RANK, f"trainer.output_dir={out}", timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    check_twin_run(RECIPE, out, overrides=ONE_ENGINE_ONE_RANK)  # what every twin's run shows (tests/test_recipes.py)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    dump = read_samples(out / "rollouts" / "train_data_step3.jsonl")
    return out, metrics, dump


@pytest.fixture(scope="module")
def resumed(run):
    """The same output_dir continued to step 4 (the slow tier's: resuming is CI's in tests/test_checkpoint.py)."""
    out = run[0]
    said = run_cli(
        "train", str(RECIPE), *ONE_ENGINE_ONE_RANK, f"trainer.output_dir={out}", "trainer.total_steps=4", timeout=900
    )
    assert said.returncode == 0, said.stdout[-3000:] + said.stderr[-3000:]
    return out, said.stdout


@pytest.mark.smoke
def test_the_twin_trains_with_its_teacher_on_two_actors(run):
    out, metrics, dump = run
    r = load_recipe(RECIPE, [*ONE_ENGINE_ONE_RANK, f"trainer.output_dir={out}", "trainer.total_steps=3"])
    placed = json.loads((out / "placement.json").read_text())
    assert len(placed["teacher"]) == 2 and placed["reference"] == []  # kl_coef 0: no reference
    steps = [m for m in metrics if m["step"]]
    for m in steps:
        assert m["perf/work_balance/teacher"] >= 0.8  # even shares of the tokens
        assert 0 < m["distill/advantage_share"] <= 1  # 1 where every group's rewards were equal
        assert m["timing_s/teacher"] > 0 and m["perf/teacher_tokens_per_s"] > 0
    rewarded = any(row["advantage"] for row in dump)  # the last step's: the reward moved some advantages
    assert (metrics[-1]["distill/advantage_share"] < 1) == rewarded
    measured = max(m["perf/peak_rss_gb/teacher"] for m in steps)
    predicted = memory.reference_memory(model_dims(r.teacher.model), r, kind=KINDS["teacher"]).total
    assert 0.75 <= predicted / measured <= 1.25, (predicted, measured)


@pytest.mark.smoke
def test_reverse_kl_is_the_teachers_own_forward(run):
    """distill/reverse_kl of the last step: the mean over response tokens of the student's logprob (the old
    policy's: the sampler's weights, so the sampler's logprobs to ~1e-6) minus the teacher's, the teacher's taken
    here by a plain transformers forward of the teacher model on the dumped prompt and response ids."""
    _, metrics, dump = run
    r = load_recipe(RECIPE)
    from transformers import AutoModelForCausalLM

    teacher = AutoModelForCausalLM.from_pretrained(models.resolve(r.teacher.model), torch_dtype=torch.float32).eval()
    diffs = []
    with torch.no_grad():
        for row in dump:
            ids = row["prompt_ids"] + row["response_ids"]
            logits = teacher(torch.tensor([ids])).logits[0, len(row["prompt_ids"]) - 1 : -1].float()
            logits = logits / r.generator.sampling.temperature
            theirs = torch.log_softmax(logits, -1).gather(1, torch.tensor(row["response_ids"])[:, None])[:, 0]
            diffs += (torch.tensor(row["sampler_logprobs"]) - theirs).tolist()
    expected = sum(diffs) / len(diffs)
    assert abs(expected) > 1e-3  # two different models: a signal to check
    assert metrics[-1]["distill/reverse_kl"] == pytest.approx(expected, abs=2e-4)


@pytest.mark.smoke
def test_the_teachers_own_validation_is_its_greedy_answers(run):
    """Before training, teacher/val/<source>/pass@1 (teacher.validate): the teacher pool's answers to the validation
    prompts, each actor generating its share in batches, are those of a plain transformers greedy generate of the
    teacher one prompt at a time, and the metric is their share of full rewards."""
    out, metrics, _ = run
    r = load_recipe(RECIPE)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = models.resolve(r.teacher.model)
    teacher = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    eos = AutoTokenizer.from_pretrained(path).eos_token_id
    rows = read_samples(out / "rollouts" / "val_teacher_step0.jsonl")
    assert len(rows) == 16  # every validation prompt, once
    for row in rows:
        ids = torch.tensor([row["prompt_ids"]])
        with torch.no_grad():
            gen = teacher.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=r.generator.sampling.max_tokens,
                eos_token_id=eos,
                pad_token_id=eos,
            )[0, ids.shape[1] :].tolist()
        assert row["response_ids"] == gen[: gen.index(eos) + 1 if eos in gen else None]
    passed = sum(row["score"] >= 1.0 for row in rows) / len(rows)
    assert metrics[0]["step"] == 0 and metrics[0]["teacher/val/synthetic/select/pass@1"] == passed
    assert not any(k.startswith("teacher/val/") for m in metrics[1:] for k in m)  # once, before training


def test_a_run_resumes_with_its_teacher(resumed):
    out, said = resumed
    assert "resuming from" in said and "(step 3)" in said and "teacher ready: 2 actor(s)" in said
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["step"] == 4 and last["timing_s/teacher"] > 0 and "distill/reverse_kl" in last
