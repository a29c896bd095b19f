"""`grpo-ray eval` on 50 rows of the shared GSM8K test file, with the validation code of training."""

import json

import pytest

from grpo_ray.jobs.evaluate import eval_rows
from grpo_ray.telemetry.dumps import read_samples
from grpo_ray.telemetry.perf import pass_at_k
from tests.conftest import TINY, run_cli

pytestmark = pytest.mark.slow


def test_eval_rows_convert_raw_files(shared_data):
    rows = eval_rows(str(shared_data / "gsm8k" / "test.jsonl"), limit=5)
    assert len(rows) == 5 and rows[0]["data_source"] == "gsm8k" and rows[0]["reward_model"]["ground_truth"]
    assert eval_rows(str(shared_data / "math500" / "test.jsonl"), limit=3)[0]["data_source"] == "math500"


def test_eval_writes_pass_at_k_that_its_own_samples_recount(shared_data, tmp_path):
    """No --recipe: the default eval recipe (one engine here, the reward chosen by each row's data_source)."""
    res = run_cli(
        "eval",
        TINY.format(arch="qwen2"),
        "data.max_prompt_length=900",
        "--data",
        str(shared_data / "gsm8k" / "test.jsonl"),
        "--n",
        "2",
        "--temperature",
        "1.0",
        "--max-tokens",
        "8",
        "--limit",
        "50",
        "--out",
        str(tmp_path),
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads((tmp_path / "eval.json").read_text())
    samples = read_samples(tmp_path / "rollouts" / "val_data_step0.jsonl")
    assert result["rows"] == 50 and len(samples) == 100 and result["n"] == 2
    p1, p2 = result["metrics"]["val/gsm8k/pass@1"], result["metrics"]["val/gsm8k/pass@2"]
    assert 0 <= p1 <= p2 <= 1
    correct = {}
    for s in samples:
        correct.setdefault(s["uid"], []).append(s["score"] >= 1.0)
    assert len(correct) == 50
    assert p1 == pytest.approx(sum(pass_at_k(2, sum(c), 1) for c in correct.values()) / 50)
    assert p2 == pytest.approx(sum(pass_at_k(2, sum(c), 2) for c in correct.values()) / 50)
    assert all(s["ground_truth"] and s["prompt"] for s in samples)
    assert all(set(s["rewards"]) == {"auto"} for s in samples)


def test_eval_checks_the_model_and_the_data_sources_first(tmp_path):
    bad = run_cli("eval", str(tmp_path), "--data", "gsm8k", "--out", str(tmp_path / "out"))
    assert bad.returncode == 2 and "has no config.json, so it is not a Hugging Face model" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr and "huggingface" not in bad.stderr.lower()  # refused before the data
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        json.dumps(
            {
                "prompt": [{"role": "user", "content": "2+2?"}],
                "data_source": "my/quiz",
                "reward_model": {"ground_truth": "4"},
            }
        )
        + "\n"
    )
    unknown = run_cli("eval", TINY.format(arch="qwen2"), "--data", str(rows), "--out", str(tmp_path / "out"))
    assert unknown.returncode == 2, unknown.stderr
    assert (
        "no built-in reward for data_source 'my/quiz'" in unknown.stderr and "Started a local Ray" not in unknown.stderr
    )
