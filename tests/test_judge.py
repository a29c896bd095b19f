"""A generative judge as the learned reward (reward_model.judge): the rubric filled and the score read by hand; bad
judge recipes refused in one line before start; and recipes/tiny-qwen2.5-1.5b-gsm8k-judge.yaml (the judge recipe's
twin) trained end to end with a judge pool of two vLLM engines, its scores those of transformers' greedy generate on
the same rubrics, and a judge that hangs past reward_model.judge.timeout_s scoring the default for its step while
the run goes on."""

import json
import math

import pytest

from grpo_ray.config import load_recipe
from grpo_ray.models.dims import model_dims
from grpo_ray.planner import memory
from grpo_ray.rewards.learned import fill_unread, judge_prompt, read_score
from grpo_ray.types import Prompt
from tests.conftest import ROOT, run_cli

RECIPE = ROOT / "recipes" / "tiny-qwen2.5-1.5b-gsm8k-judge.yaml"
CLASSIFIER = "tiny://llama?layers=2&hidden=64&heads=2&kv_heads=1&intermediate=128&vocab=400&seed=3&score=1"


def test_the_rubric_is_filled_in_one_pass():
    prompt = Prompt(
        [1], "42", "s", messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q?"}]
    )
    template = 'Q: {prompt} A: {response} ref {ground_truth} {"json": {}} {other}'
    # the system turn is left out; a response quoting a placeholder is not filled again; other braces stay
    assert judge_prompt(template, prompt, "{prompt} 41") == 'Q: Q? A: {prompt} 41 ref 42 {"json": {}} {other}'
    assert judge_prompt("{prompt}|{response}", Prompt([1], "1", "s", text="as text"), "x") == "as text|x"


def test_the_score_is_the_last_match_and_an_unread_reply_the_default():
    pattern = r"(-?\d+(?:\.\d+)?)"
    assert read_score("Step 1, step 2... Score: 7.5", pattern) == 7.5
    assert read_score("score -3", pattern) == -3.0
    assert math.isnan(read_score("no number here", pattern))
    assert math.isnan(read_score("Score: high", r"Score: (\w+)"))  # matched, but not a number
    assert math.isnan(read_score("Score: inf", r"Score: (\w+)"))  # not finite
    values, unread = fill_unread([1.0, math.nan, 0.5, math.nan], -1.0)
    assert values == [1.0, -1.0, 0.5, -1.0] and unread == 2


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (
            ["reward_model.judge.template='Grade: {prompt}'"],
            "reward_model.judge.template has no {response}: the judge would grade without seeing the response",
        ),
        (["reward_model.judge.pattern='[0-9]'"], "reward_model.judge.pattern='[0-9]' has no group"),
        (["reward_model.judge.pattern='(['"], "reward_model.judge.pattern='([' is not a regular expression"),
        (
            ["reward_model.judge.vllm_kwargs={max_model_len: 64, limit_mm_per_prompt: {image: 1}}"],
            "reward_model.judge.vllm_kwargs.max_model_len: set by grpo-ray from reward_model.judge.max_model_len; set "
            "that instead",
        ),
        (
            [f"reward_model.model={CLASSIFIER}"],
            "a LlamaForSequenceClassification, not a language model (ForCausalLM) that a judge's rubric",
        ),
        (
            ["reward_model.judge.template=''"],
            "a Qwen2ForCausalLM, not a sequence classifier (AutoModelForSequenceClassification with one output, as "
            "Skywork and ArmoRM reward models are); to use a language model as a generative judge, give it a rubric",
        ),
    ],
)
def test_judge_recipe_problems_are_one_line(overrides, expected, capsys, tmp_path):
    import ray

    from grpo_ray.cli import main

    assert main(["train", str(RECIPE), *overrides, f"trainer.output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("grpo-ray: error: ") and expected in err, err
    assert not ray.is_initialized()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The tiny judge recipe for 3 steps, its first judge hanging at its second call (step 2's batch): the step's
    judging misses reward_model.judge.timeout_s, its samples score the default, the pool starts again."""
    out, markers = tmp_path_factory.mktemp("judge"), tmp_path_factory.mktemp("markers")
    env = {"GRPO_RAY_FAULTS": "hang_judge@2", "GRPO_RAY_FAULTS_DIR": str(markers)}
    res = run_cli(
        "train",
        str(RECIPE),
        f"trainer.output_dir={out}",
        "reward_model.judge.timeout_s=15",
        "trainer.dump_freq=1",
        env=env,
        timeout=900,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return out, metrics, res.stdout


@pytest.mark.slow
def test_a_judge_pool_of_two_engines_scores_and_a_hung_judge_scores_the_default(run):
    import matplotlib.image

    out, metrics, said = run
    steps = [m for m in metrics if m["step"]]
    assert [m["step"] for m in steps] == [1, 2, 3]
    assert [m["reward_model/judge_timeouts"] for m in steps] == [0.0, 1.0, 0.0]
    assert [m["fault/judge_restarts"] for m in steps] == [0, 1, 1]
    assert said.count("(reward_model.judge.timeout_s): this step's samples score the default") == 1
    assert steps[1]["reward_model/score/mean"] == 0.0 and steps[1]["reward_model/score/std"] == 0.0  # the default
    for m in (steps[0], steps[2]):
        assert m["perf/work_balance/judge"] == 1.0  # even shares: 16 samples each
        assert 0.0 <= m["reward_model/judge_unread"] < 1.0 and m["reward_model/score/mean"] > 0  # some grades read
    from tests.test_recipes import check_twin_run

    check_twin_run(RECIPE, out, faulted=(2,))  # step 2's judging timed out: no actor's work was used
    placed = json.loads((out / "placement.json").read_text())
    assert len(placed["judge"]) == 2
    plot = run_cli("plot", str(out), "--out", str(out / "curves.png"))  # a row more: the learned reward vs the true
    assert plot.returncode == 0 and matplotlib.image.imread(out / "curves.png").shape[:2] == (840, 1280), plot.stderr
    r = load_recipe(RECIPE)
    measured = max(m["perf/peak_rss_gb/judge"] for m in (steps[0], steps[2]))
    predicted = memory.judge_memory(model_dims(r.reward_model.model), r, 0.0)  # plan's judge: engine, KV, runtime
    assert 0.75 <= predicted.total / measured <= 1.25, (predicted, measured)


QUICK = [
    "generator.num_engines=1",
    "reward_model.num_actors=1",
    "learner.world_size=1",
    "trainer.total_steps=2",
    "trainer.dump_freq=1",
    "trainer.test_freq=0",
    "trainer.val_before_train=false",
]
"""CI's run of the judge: the twin on one engine, one judge and one learner rank, two steps."""


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("judge-quick")
    res = run_cli("train", str(RECIPE), *QUICK, f"trainer.output_dir={out}", timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return out


@pytest.mark.slow
@pytest.mark.smoke
def test_a_judges_scores_are_transformers_greedy_replies_read_by_the_pattern(quick):
    """Every sample of CI's judge run (two steps): the judge's grade is what the recipe's pattern reads in the judge
    model's greedy reply to the rubric (transformers, fp32 as the engine here), the total the rule reward beside it."""
    check_judge_scores(quick, (1, 2))


@pytest.mark.slow
def test_the_judges_scores_are_transformers_greedy_replies_read_by_the_pattern(run):
    """The judge component of steps 1 and 3 of the faulted run (2 timed out)."""
    check_judge_scores(run[0], (1, 3))


def check_judge_scores(out, steps: tuple[int, ...]) -> None:
    """For each dumped sample of `steps`: the rubric in the judge's chat template, greedy generate of transformers
    (fp32, as the engine here) and the recipe's pattern, or the default; the total the rule reward + 0.1 x that."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_ray import models
    from grpo_ray.data import load_rows
    from grpo_ray.telemetry.dumps import read_samples

    r = load_recipe(RECIPE)
    j = r.reward_model.judge
    path = models.resolve(r.reward_model.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    rows = load_rows(r.data.train_files[0])
    dump = [row for step in steps for row in read_samples(out / "rollouts" / f"train_data_step{step}.jsonl")]
    read = []
    for row in dump:
        prompt = Prompt([1], row_truth(rows[row["uid"]]), "s", messages=rows[row["uid"]]["prompt"])
        rubric = judge_prompt(j.template, prompt, r.data.response_prefix + row["response"])
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": rubric}], add_generation_prompt=True, tokenize=False
        )
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            reply = model.generate(
                ids, max_new_tokens=j.max_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )
        value = read_score(tokenizer.decode(reply[0, ids.shape[1] :], skip_special_tokens=True), j.pattern)
        read.append(j.default if math.isnan(value) else value)
        assert row["rewards"]["reward_model"] == read[-1], (row["response"], row["rewards"])
    assert len(set(read)) > 1  # different answers, different grades: a signal to check
    for row in dump:  # the total: the rule reward + 0.1 x the judge's grade
        assert row["score"] == pytest.approx(row["rewards"]["gsm8k"] + 0.1 * row["rewards"]["reward_model"])


def row_truth(row: dict) -> str:
    return row["reward_model"]["ground_truth"]
