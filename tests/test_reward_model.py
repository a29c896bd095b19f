"""A learned reward: the reward model's score joined to the reward functions' (by hand), and the tiny twin of
recipes/qwen2.5-1.5b-gsm8k-rm.yaml (a reward-model pool of two actors, a Llama classifier with its own tokenizer
beside a Qwen2 policy) trained end to end, its scores those of a bare transformers forward of the classifier on the
dumped samples. (A reward model that is not a one-output classifier: tests/faults/test_bad_input.py.)"""

import json
import math
import statistics

import pytest
import torch

from grpo_ray import models
from grpo_ray.config import KINDS, load_recipe
from grpo_ray.data import load_rows
from grpo_ray.models.dims import model_dims
from grpo_ray.planner import memory
from grpo_ray.rewards.learned import standardised, true_reward, with_model
from grpo_ray.telemetry.dumps import read_samples
from grpo_ray.types import Scores
from tests.conftest import ROOT, run_cli

RECIPE = ROOT / "recipes" / "tiny-qwen2.5-1.5b-gsm8k-rm.yaml"
ONE_ENGINE_ONE_RANK = ("generator.num_engines=1", "learner.world_size=1")
"""CI's time: the twin's reward-model pool of two, on one engine and one learner rank (2 actors fewer)."""
STYLES = ("model", "rule", "both")


def shares(*rule: list[float]) -> list[Scores]:
    """Reward actors' shares with one function, `gsm8k`, of weight 1: each total its component."""
    return [Scores(list(r), {"gsm8k": list(r)}, 0, 0, 0.1) for r in rule]


def test_the_model_score_joins_the_weighted_sum_by_hand():
    scores, values = shares([1.0, 0.0], [0.0, 1.0, 1.0]), [2.0, -1.0, 0.5, 3.0, 0.5]
    out, m = with_model(scores, values, 0.5, False, [("gsm8k", 1.0)])
    assert [len(s.totals) for s in out] == [2, 3]  # each actor's share keeps its samples
    assert [t for s in out for t in s.totals] == [2.0, -0.5, 0.25, 2.5, 1.25]  # rule + 0.5 x model
    assert [v for s in out for v in s.components["reward_model"]] == values
    assert m["reward_model/score/mean"] == pytest.approx(1.0)
    assert m["reward_model/score/std"] == pytest.approx(math.sqrt(9.5 / 5))  # population std of the raw scores
    assert m["reward_model/gap"] == pytest.approx(1.0 - 0.6)  # the model's mean less the rule's
    # Pearson by hand: rule (1,0,0,1,1) mean 0.6, model mean 1.0
    dr, dm = [0.4, -0.6, -0.6, 0.4, 0.4], [1.0, -2.0, -0.5, 2.0, -0.5]
    corr = sum(a * b for a, b in zip(dr, dm)) / math.sqrt(sum(a * a for a in dr) * sum(b * b for b in dm))
    assert m["reward_model/true_corr"] == pytest.approx(corr)


def test_the_sigmoid_of_the_score_is_the_probability_of_a_good_answer():
    out, m = with_model(shares([1.0, 0.0, 0.0]), [2.0, -3.0, -800.0], 1.0, False, [("gsm8k", 0.0)], sigmoid=True)
    p = [1 / (1 + math.exp(-2.0)), 1 / (1 + math.exp(3.0)), 0.0]  # far below: 0, not an overflow
    assert out[0].components["reward_model"] == pytest.approx(p)
    assert out[0].totals == pytest.approx([1.0 + p[0], p[1], 0.0])
    assert m["reward_model/score/mean"] == pytest.approx(-267.0)  # the metrics keep the raw score
    z, _ = with_model(shares([0.0, 0.0]), [0.0, 2.0], 1.0, True, [], sigmoid=True)
    assert z[0].components["reward_model"] == pytest.approx([-1.0, 1.0])  # standardised after the sigmoid


def test_normalised_scores_and_the_true_reward_of_logged_functions():
    scores = shares([1.0, 0.0, 1.0])
    out, m = with_model(scores, [3.0, 1.0, 2.0], 2.0, True, [("gsm8k", 0.0)])
    z = [math.sqrt(1.5), -math.sqrt(1.5), 0.0]  # (v - 2) / pstdev, pstdev = sqrt(2/3)
    assert out[0].components["reward_model"] == pytest.approx(z)
    assert out[0].totals == pytest.approx([1 + 2 * z[0], 2 * z[1], 1 + 2 * z[2]])  # the totals given, + 2 x z
    assert m["reward_model/score/mean"] == pytest.approx(2.0)  # raw, before standardising
    # every function of weight 0 (logged, not trained on): the true reward is their plain sum
    assert true_reward(scores, [("gsm8k", 0.0)]) == [1.0, 0.0, 1.0]
    assert true_reward(scores, []) == [] and standardised([5.0, 5.0]) == [0.0, 0.0]
    _, alone = with_model(scores, [3.0, 1.0, 2.0], 1.0, False, [])
    assert "reward_model/true_corr" not in alone and "reward_model/gap" not in alone  # no truth: nothing to compare
    _, flat = with_model(shares([1.0, 1.0]), [0.2, 0.7], 1.0, False, [("gsm8k", 1.0)])
    assert "reward_model/true_corr" not in flat  # a constant true reward has no correlation
    with pytest.raises(ValueError, match="2 reward-model scores for 3 samples"):
        with_model(scores, [1.0, 2.0], 1.0, False, [])


def test_each_rows_style_chooses_its_reward():
    """reward_model.by_style: a rule row keeps the functions' total, a model row gets the model's alone, both both."""
    styled = Scores([1.0, 1.0, 0.0], {"gsm8k": [1.0, 1.0, 0.0]}, 0, 0, 0.1, styles=["rule", "model", "both"])
    out, m = with_model([styled], [0.5, 2.0, -1.0], 2.0, False, [("gsm8k", 1.0)])
    assert out[0].totals == [1.0, 4.0, -2.0]
    assert out[0].components["reward_model"] == [0.5, 2.0, -1.0]  # scored and logged on every row
    assert m["reward_model/rows_scored"] == pytest.approx(2 / 3)


def test_a_row_without_a_known_style_is_refused_before_start():
    from grpo_ray.data import DataError
    from grpo_ray.setup_run import check_styles

    check_styles([{"reward_model": {"style": s}} for s in ("rule", "model", "both")])
    with pytest.raises(DataError, match=r"data.train_files row 1: reward_model.style='judge'; .* rule, model, both"):
        check_styles([{"reward_model": {"style": "rule"}}, {"reward_model": {"style": "judge"}}])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The twin's run, its last reward-model actor exiting at its second scoring call (batch 2's, sent during step 1
    one step off): step 2 finds it gone, the pool (an FSDP2 group cannot take in a new member) starts again and
    scores the whole batch again."""
    out, markers = tmp_path_factory.mktemp("rm"), tmp_path_factory.mktemp("markers")
    env = {"GRPO_RAY_FAULTS": "exit_reward_model@2", "GRPO_RAY_FAULTS_DIR": str(markers)}
    res = run_cli("train", str(RECIPE), *ONE_ENGINE_ONE_RANK, f"trainer.output_dir={out}", env=env, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return out, metrics, res.stdout


@pytest.mark.slow
@pytest.mark.smoke
def test_the_twin_trains_with_a_reward_model_pool_of_two(run):
    from tests.test_recipes import check_twin_run

    out, metrics, said = run
    check_twin_run(RECIPE, out, overrides=ONE_ENGINE_ONE_RANK)
    placed = json.loads((out / "placement.json").read_text())
    assert len(placed["reward_model"]) == 2 and placed["reference"] == []
    steps = [m for m in metrics if m["step"]]
    assert [m["fault/reward_model_restarts"] for m in steps] == [0, 1, 1]  # the actor lost, once
    assert said.count("a reward_model actor was lost") == 1
    for m in steps:  # the new actors scored their shares too
        assert m["perf/work_balance/reward_model"] >= 0.8  # even shares of the tokens
        assert m["timing_s/reward_model"] > 0 and -1 <= m.get("reward_model/true_corr", 0) <= 1
        assert m["reward/reward_model/mean"] == pytest.approx(0, abs=1e-9)  # standardised over the step
    r = load_recipe(RECIPE, [*ONE_ENGINE_ONE_RANK, f"trainer.output_dir={out}"])
    measured = max(m.get("perf/peak_rss_gb/reward_model", 0) for m in steps)  # none the step its actor was lost
    predicted = memory.reference_memory(
        model_dims(r.reward_model.model), r, r.reward_model.max_length, KINDS["reward_model"]
    )
    assert 0.75 <= predicted.total / measured <= 1.25, (predicted, measured)
    dump = read_samples(out / "rollouts" / "train_data_step3.jsonl")
    for row in dump:  # the total: the rule reward + 1 x the standardised model score
        assert row["score"] == pytest.approx(row["rewards"]["gsm8k"] + row["rewards"]["reward_model"], abs=1e-9)


@pytest.mark.slow
@pytest.mark.smoke
def test_the_pool_scores_as_a_bare_forward_of_the_classifier(run):
    """The last step's scores, standardised back: those of AutoModelForSequenceClassification on each dumped
    sample's question and answer rendered in the classifier's own chat template (a Llama one: not the policy's)."""
    out, metrics, _ = run
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    r = load_recipe(RECIPE)
    path = models.resolve(r.reward_model.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
    assert tokenizer.get_vocab() != AutoTokenizer.from_pretrained(models.resolve(r.model.path)).get_vocab()
    rows = load_rows(r.data.train_files[0])
    dump = read_samples(out / "rollouts" / "train_data_step3.jsonl")
    raw = []
    with torch.no_grad():
        for row in dump:
            turns = [
                *rows[row["uid"]]["prompt"],
                {"role": "assistant", "content": r.data.response_prefix + row["response"]},
            ]
            text = tokenizer.apply_chat_template(turns, tokenize=False)
            ids = tokenizer(text, add_special_tokens=False, truncation=True, max_length=r.reward_model.max_length)
            raw.append(model(torch.tensor([ids["input_ids"]])).logits[0, 0].item())
    last = metrics[-1]
    assert last["reward_model/score/mean"] == pytest.approx(statistics.fmean(raw), abs=1e-5)
    mean, std = statistics.fmean(raw), statistics.pstdev(raw)
    assert std > 1e-4  # different answers, different scores: a signal to check
    for row, value in zip(dump, raw):
        assert row["rewards"]["reward_model"] == pytest.approx((value - mean) / std, abs=1e-4)


@pytest.mark.slow
@pytest.mark.smoke
def test_the_reward_worker_hands_back_each_rows_style(ray_local):
    """With reward_model.by_style the reward actors return each completion's row style for the controller to choose
    by (``with_model``); without it, none."""
    from grpo_ray.config import RewardConfig, RewardFnConfig
    from grpo_ray.roles.reward import RewardWorker
    from grpo_ray.types import Completion, Prompt, Rollout

    rows = [{"prompt_ids": [1], "reward_model": {"ground_truth": "7", "style": s}, "data_source": "t"} for s in STYLES]
    rollout = Rollout([Prompt.from_row(i, row) for i, row in enumerate(rows)], [], 0)
    rollout.completions = [Completion(i, [3], "7", [], "stop") for i in range(len(rows))]
    ref, section = ray_local.put(rollout), RewardConfig(functions=[RewardFnConfig(name="gsm8k")])
    for styles, expected in ((True, list(STYLES)), (False, [])):
        worker = ray_local.remote(RewardWorker).options(num_cpus=0.25).remote(section, "#### ", styles=styles)
        scores = ray_local.get(worker.score.remote([ref]), timeout=120)
        assert scores.styles == expected and scores.totals == [1.0, 1.0, 1.0]
        ray_local.kill(worker)


@pytest.mark.parametrize("heads", [1, 3], ids=["one output", "head 2 of 3"])
def test_an_unsharded_actor_scores_as_a_bare_forward_with_no_group(heads):
    """reward_model.shard=false: the actor holds the whole classifier and scores its texts with no process group
    (rank 1 of 2 here: nothing to join), the scores a bare transformers forward's; of a classifier with three
    outputs (a multi-objective reward model's shape), the one reward_model.head picks."""
    import torch.distributed as dist
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from grpo_ray.roles.reward_model import RewardModel

    head = heads - 1
    scorer = "tiny://llama?layers=2&hidden=64&heads=2&kv_heads=1&intermediate=128&vocab=400&seed=3"
    r = load_recipe(
        RECIPE, ["reward_model.shard=false", f"reward_model.model={scorer}&score={heads}", f"reward_model.head={head}"]
    )
    path = models.resolve(r.reward_model.model)
    actor = RewardModel(path, r, rank=1, world_size=2)
    actor.setup("", 0)
    assert not dist.is_initialized()
    tokenizer = AutoTokenizer.from_pretrained(path)
    texts = [f"question {k} answer {'7 ' * k}" for k in range(1, 12)]  # lengths differ: padding and micro batches
    got = actor.rewards(texts)
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        bare = [model(**tokenizer(t, add_special_tokens=False, return_tensors="pt")).logits[0] for t in texts]
    assert model.config.num_labels == heads
    assert got == pytest.approx([b[head].item() for b in bare], abs=1e-5) and len(set(got)) > 1
    if heads > 1:  # another output would score otherwise
        assert got != pytest.approx([b[0].item() for b in bare], abs=1e-3)
