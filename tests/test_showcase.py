"""The reasoning showcase, shortened: `grpo-ray train recipes/tiny-cpu-reasoning.yaml` as the README runs it.

The first run trains the SFT warm start (the real recipes/tiny-cpu-reasoning-sft.yaml, in this session's
model cache) and GRPO then starts from it. A model that has not learned scores 0 on these problems
(answers spread over 2..40), so the bounds fail when SFT or GRPO stops learning: the warm start answers
many problems without working them out, and GRPO must learn that the worked lines pay (longer responses,
higher pass@1; measured here +0.21 in 20 steps, 0.18 -> 0.38, and +0.26 in 40: benchmarks/results/
reasoning-showcase/grpo.jsonl).
"""

import json
import statistics
from pathlib import Path

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.slow  # its learning is also benchmarks/results/reasoning-showcase
STEPS = 20  # the recipe's first validation after step 0 (its benchmark: lengths 16.9 -> 24.8, steps 1-5 and 11-20)


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def pass_at_1(rows: list[dict]) -> list[tuple[int, float]]:
    key = "val/synthetic/reasoning/pass@1"
    return [(r["step"], r[key]) for r in rows if key in r]


@pytest.fixture(scope="module")
def showcase(tmp_path_factory):
    out = tmp_path_factory.mktemp("showcase")
    res = run_cli(
        "train",
        "recipes/tiny-cpu-reasoning.yaml",
        f"trainer.output_dir={out}",
        f"trainer.total_steps={STEPS}",
        f"trainer.test_freq={STEPS}",
        timeout=1800,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    model = Path(res.stdout.split("SFT warm start: model at ")[1].split()[0])
    return res, out, model


def test_sft_warm_start_lowers_the_loss_and_raises_pass_at_1(showcase):
    _, _, model = showcase
    rows = metrics(model.parent)
    losses = [r["sft/loss"] for r in rows if "sft/loss" in r]
    print("SFT pass@1:", pass_at_1(rows))
    assert len(losses) == 500 and statistics.fmean(losses[:10]) > 5 * statistics.fmean(losses[-10:])
    (first, before), *_, (last, after) = pass_at_1(rows)
    assert (first, last) == (0, 500)
    assert before < 0.05 and 0.1 <= after <= 0.6  # attempts the task, often wrong: room for RL
    assert (model / "config.json").is_file() and list((model.parent / "tensorboard").iterdir())


def test_warm_start_is_built_once(showcase):
    from grpo_ray.jobs.sft import warm_start

    _, _, model = showcase
    stamp = (model.parent / "metrics.jsonl").stat().st_mtime_ns
    assert warm_start("recipes/tiny-cpu-reasoning-sft.yaml") == str(model)  # no Ray, no training: the cache
    assert (model.parent / "metrics.jsonl").stat().st_mtime_ns == stamp


def test_grpo_raises_pass_at_1_over_its_sft_start(showcase):
    res, out, _ = showcase
    rows = metrics(out)
    curve = pass_at_1(rows)
    print("GRPO pass@1:", curve)
    (first, before), (last, after) = curve
    assert (first, last) == (0, STEPS)
    assert after >= before + 0.1
    steps = [r for r in rows if r["step"] > 0]
    lengths = [r["response_length/mean"] for r in steps]
    assert len(steps) == STEPS and min(lengths) >= 10
    assert statistics.fmean(lengths[-10:]) >= statistics.fmean(lengths[:5]) + 4  # it learns to work problems out
    assert max(r["sync/logprob_diff"] for r in steps) < 1e-3
