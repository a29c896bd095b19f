import math
from pathlib import Path

import pytest

from grpo_ray import rewards
from grpo_ray.config.scorers import RewardFnConfig
from grpo_ray.rewards import RewardLoadError, load, weighted_sum
from grpo_ray.rewards.runner import score_one
from grpo_ray.telemetry.metrics import validation_metrics, validation_totals
from grpo_ray.types import Scores


@pytest.mark.parametrize(
    "response,truth,expected",
    [
        ("Tom has 3 + 4 = 7 apples.\n#### 7", "7", 1.0),
        ("#### 1,000", "1000", 1.0),
        ("#### 1000.0", "1,000", 1.0),
        ("#### -3", "-3", 1.0),
        ("#### $18.", "18", 1.0),
        ("####7", "7", 1.0),
        ("#### 8", "7", 0.0),  # wrong
        ("The answer is 7.", "7", 0.0),  # no format
        ("", "7", 0.0),  # empty
        ("#### ", "7", 0.0),  # empty answer
        ("#### 7\n#### 7", "7", 0.0),  # several answers
        ("#### 6 #### 7", "7", 0.0),
        ("#### 1 2 3 4 5 6 7 8 9", "7", 0.0),  # every number listed
        ("#### 7, 8", "7", 0.0),
        ("#### 7 " + "zq " * 500, "7", 0.0),  # answer hidden before long garbage
        ("#### seven", "7", 0.0),
    ],
)
def test_gsm8k(response, truth, expected):
    assert load("gsm8k")(response, truth) == expected


@pytest.mark.parametrize(
    "response,truth,expected",
    [
        ("So $x = \\boxed{\\frac{14}{3}}$.", "\\frac{14}{3}", 1.0),
        ("\\boxed{\\dfrac{14}{3}}", "\\frac{14}{3}", 1.0),
        ("\\boxed{4.6667}", "\\frac{14}{3}", 0.0),
        ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)", 1.0),
        ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("\\boxed{3}", "5", 0.0),
        ("the answer is 5", "5", 0.0),  # not boxed
        ("\\boxed{5} or \\boxed{6}", "5", 0.0),  # several answers
        ("\\boxed{}", "5", 0.0),  # empty
        ("\\boxed{5", "5", 0.0),  # unbalanced
    ],
)
def test_math(response, truth, expected):
    assert load("math")(response, truth) == expected


def test_math_on_real_math500_solutions(shared_data):
    import json

    rows = [json.loads(l) for l in (shared_data / "math500" / "test.jsonl").read_text().splitlines()[:60]]
    math = load("math")
    scores = [math(r["solution"], r["answer"]) for r in rows if r["solution"].count("\\boxed{") == 1]
    assert len(scores) > 40 and sum(scores) / len(scores) > 0.95
    assert math(rows[0]["solution"], "\\frac{1}{123457}") == 0.0


def test_format():
    fmt = load("format")
    assert fmt("reasoning\n#### 12", "", data_source="gsm8k") == 1.0
    assert fmt("#### 12\n#### 13", "", data_source="gsm8k") == 0.0
    assert fmt("so \\boxed{x+1}", "", data_source="math500") == 1.0
    assert fmt("\\boxed{1} \\boxed{2}", "", data_source="math500") == 0.0
    assert fmt("#### 12", "", data_source="math500") == 0.0


def test_load_by_module_path_and_errors():
    assert load("grpo_ray.rewards.builtin:gsm8k_reward") is rewards.BUILTIN["gsm8k"]
    with pytest.raises(RewardLoadError, match="unknown reward 'gsm9k'"):
        load("gsm9k")
    with pytest.raises(RewardLoadError, match="cannot import module 'no_such_mod'"):
        load("no_such_mod:f")
    with pytest.raises(RewardLoadError, match="has no callable 'nope'"):
        load("grpo_ray.rewards:nope")


def everywhere(fns: list[tuple[str, float]]) -> list[tuple[str, list, dict]]:
    """What the reward child runs for (name, weight) pairs: each function on every data source, no kwargs."""
    return [(name, [], {}) for name, _ in fns]


def test_components_and_weights_as_the_reward_child_scores_them():
    fns = [("gsm8k", 0.9), ("format", 0.1)]
    extra = {"data_source": "gsm8k", "extra_info": {}}
    parts, errors, oom, failures = score_one(everywhere(fns), "#### 8", "7", extra)
    assert parts == {"gsm8k": 0.0, "format": 1.0} and (errors, oom, failures) == (0, False, {})
    assert weighted_sum(parts, fns) == pytest.approx(0.1)
    parts, _, _, _ = score_one(everywhere(fns), "#### 7", "7", extra)
    assert weighted_sum(parts, fns) == pytest.approx(1.0)


def test_a_function_scores_only_the_data_sources_it_names_and_takes_its_kwargs(tmp_path):
    """verl's routing by data_source, as a mixed GSM8K + MATH dataset with verl's two files needs: a row of a source
    a function does not name is not scored by it (NaN: neither its score nor its weight), and validation passes it
    with the weights of the functions that do; reward_kwargs reach the function."""
    path = tmp_path / "strict_math.py"
    path.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None, wrong=-1.0):\n"
        "    return 1.0 if solution_str == 'boxed ' + ground_truth else wrong\n"
    )
    math_fn = f"{path}:compute_score"
    calls = [("gsm8k", ["openai/gsm8k"], {}), (math_fn, ["math500"], {"wrong": -2.0})]
    weights = [("gsm8k", 1.0), (math_fn, 1.0)]
    gsm = score_one(calls, "#### 7", "7", {"data_source": "openai/gsm8k", "extra_info": {}})[0]
    assert gsm["gsm8k"] == 1.0 and math.isnan(gsm[math_fn]) and weighted_sum(gsm, weights) == 1.0
    wrong = score_one(calls, "boxed 8", "7", {"data_source": "math500", "extra_info": {}})[0]
    assert math.isnan(wrong["gsm8k"]) and wrong[math_fn] == -2.0  # the kwarg, not the file's default -1
    right = score_one(calls, "boxed 7", "7", {"data_source": "math500", "extra_info": {}})[0]
    assert weighted_sum(right, weights) == 1.0

    functions = [RewardFnConfig("gsm8k", 1.0, ["openai/gsm8k"]), RewardFnConfig(math_fn, 0.5, ["math500"])]
    scores = [Scores([1.0, 0.5, 0.0], {"gsm8k": [1.0, math.nan, math.nan], math_fn: [math.nan, 1.0, -2.0]}, 0, 0, 0.1)]
    totals, perfect = validation_totals(scores, functions)
    assert (perfect("openai/gsm8k"), perfect("math500")) == (1.0, 0.5)
    got = validation_metrics(["openai/gsm8k", "math500", "math500"], totals, 1, perfect)
    assert got == {"val/openai/gsm8k/pass@1": 1.0, "val/math500/pass@1": 0.5}
    assert math.isnan(score_one(calls, "x", "7", {"data_source": "other", "extra_info": {}})[0]["gsm8k"])


def test_auto_reward_follows_the_rows_data_source():
    auto = load("auto")
    assert auto("#### 7", "7", data_source="gsm8k") == 1.0
    assert auto("\\boxed{7}", "7", data_source="gsm8k") == 0.0  # GSM8K pays the #### answer only
    assert auto("\\boxed{\\frac{1}{2}}", "0.5", data_source="math500") == 1.0
    assert auto("#### 7", "7", data_source="synthetic/select") == 1.0
    with pytest.raises(ValueError, match="no built-in reward for data_source 'my/quiz'"):
        auto("#### 7", "7", data_source="my/quiz")


VERL_STYLE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    assert data_source == "quiz" and extra_info == {"index": 3}
    return {"score": float(solution_str.strip() == ground_truth), "acc": True}


def two_args(response, ground_truth):
    return float(response == ground_truth)


def nothing(response, ground_truth, **extra):
    return None


def buggy(response, ground_truth, **extra):
    return {}["missing"]
"""


def test_verl_signature_file_form_and_our_signature_score_alike(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(VERL_STYLE)
    fns = [(f"{path}:compute_score", 1.0), (f"{path}:two_args", 1.0), ("gsm8k", 1.0)]
    extra = {"data_source": "quiz", "extra_info": {"index": 3}}
    parts, errors, _, failures = score_one(everywhere(fns), "7", "7", extra)
    # verl's dict gives its other numbers too, as name/key (for the metrics; the weights take the score only)
    assert parts == {
        f"{path}:compute_score": 1.0,
        f"{path}:compute_score/acc": 1.0,
        f"{path}:two_args": 1.0,
        "gsm8k": 0.0,
    }
    assert (errors, failures) == (0, {})
    assert score_one(everywhere(fns), "8", "7", extra)[0][f"{path}:compute_score"] == 0.0


def test_a_failing_function_scores_zero_and_says_why_with_its_own_frames(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(VERL_STYLE)
    fns = [(f"{path}:nothing", 1.0), (f"{path}:buggy", 1.0)]
    parts, errors, _, failures = score_one(everywhere(fns), "7", "7", {"data_source": "quiz", "extra_info": {}})
    assert parts == {f"{path}:nothing": 0.0, f"{path}:buggy": 0.0} and errors == 2
    assert failures[f"{path}:nothing"].startswith("TypeError: returned NoneType 'None': expected a number")
    text = failures[f"{path}:buggy"]
    assert f'File "{path}", line 16, in buggy' in text and text.rstrip().endswith("KeyError: 'missing'")
    assert "runner.py" not in text  # grpo-ray's own frames are left out


def test_file_form_paths_resolve_against_the_working_directory_then_the_recipes_folder(tmp_path, monkeypatch):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "r.py").write_text(VERL_STYLE)
    monkeypatch.chdir(tmp_path)
    assert rewards.resolve_file("r.py:two_args", [tmp_path / "recipes"]) == f"{tmp_path / 'recipes' / 'r.py'}:two_args"
    with pytest.raises(RewardLoadError, match="no file nope.py"):
        rewards.resolve_file("nope.py:f", [tmp_path / "recipes"])
    sources, dirs = rewards.shipped([f"{tmp_path / 'recipes' / 'r.py'}:two_args", "tests.helpers.odd_rewards:odd"])
    assert sources[f"{tmp_path / 'recipes' / 'r.py'}:two_args"] == VERL_STYLE  # the text travels to every node
    assert dirs == [str(Path(__file__).parents[1])]  # where the driver found the module's package


def test_a_verl_signature_mismatch_is_one_line_before_start(tmp_path):
    from grpo_ray.config import Recipe, RecipeError, RewardFnConfig
    from grpo_ray.preflight import try_rewards

    path = tmp_path / "mine.py"
    path.write_text("def score(solution, truth, source):\n    return 1.0\n")
    r = Recipe()
    r.reward.functions = [RewardFnConfig(name="gsm8k"), RewardFnConfig(name=f"{path}:score")]
    row = {"prompt": [{"role": "user", "content": "q"}], "reward_model": {"ground_truth": "4"}, "data_source": "quiz"}
    with pytest.raises(
        RecipeError,
        match=r"^reward.functions\[1\].name='.*mine.py:score': scoring the first row "
        r"\(its ground truth as the response\) it failed: TypeError: score\(\) missing 1 required "
        r"positional argument: 'source'$",
    ):
        try_rewards(r, row, "the first row")
    path.write_text("def score(response, ground_truth, **extra):\n    return 1.0\n")
    try_rewards(r, row, "the first row")  # fine now


def test_the_reward_worker_routes_a_mixed_dataset_by_data_source(tmp_path):
    """The reward worker (its sandboxed child, as a reward actor runs it) on a rollout of GSM8K and MATH rows with
    verl's two files, each named for its source: the MATH file, which scores anything not boxed -1, never sees a
    GSM8K row (without sources it gave every GSM8K row -1), and each metric is over its own rows."""
    from grpo_ray.config import RewardConfig
    from grpo_ray.rewards import shipped
    from grpo_ray.roles.reward import RewardWorker
    from grpo_ray.telemetry.metrics import rollout_metrics
    from grpo_ray.types import Completion, Prompt, Rollout, RolloutStats

    (tmp_path / "gsm8k_file.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(solution_str.strip() == '#### ' + ground_truth)\n"
    )
    (tmp_path / "math_file.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return 1.0 if solution_str.strip() == '\\\\boxed{' + ground_truth + '}' else -1.0\n"
    )
    gsm, maths = f"{tmp_path}/gsm8k_file.py:compute_score", f"{tmp_path}/math_file.py:compute_score"
    functions = [RewardFnConfig(gsm, 1.0, ["openai/gsm8k"]), RewardFnConfig(maths, 1.0, ["math500"])]
    worker = RewardWorker(RewardConfig(functions=functions), "", shipped([gsm, maths]))
    rows = [Prompt([5], "7", "openai/gsm8k"), Prompt([6], "3", "math500")]
    answers = ["#### 7", "#### 8", "\\boxed{3}", "3"]
    rollout = Rollout(rows, [Completion(i // 2, [9], a, [-1.0], "stop") for i, a in enumerate(answers)], 0)
    try:
        scores = worker.score_rollouts([rollout])
    finally:
        worker.shutdown()
    assert scores.errors == 0 and scores.totals == [1.0, 0.0, 1.0, -1.0]
    assert scores.components[gsm][:2] == [1.0, 0.0] and all(math.isnan(v) for v in scores.components[gsm][2:])
    assert scores.components[maths][2:] == [1.0, -1.0] and all(math.isnan(v) for v in scores.components[maths][:2])
    stats = RolloutStats(0.1, 0, [1] * 4, [1] * 4, 0)
    got = rollout_metrics([stats], [scores])
    assert got["reward/gsm8k_file:compute_score/mean"] == 0.5 and got["reward/math_file:compute_score/mean"] == 0.0
