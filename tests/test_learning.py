"""The main job learns: `grpo-ray train recipes/tiny-cpu.yaml`, end to end, as the README runs it.

Every pool is its own Ray actor (vLLM generator, two FSDP2 learner ranks over gloo, reference,
reward); weights are synced every step. The synthetic task's answer must be read from the prompt, so
a constant answer scores about 1/9, and a generator left on the initial weights stays near 0.
"""

import json
import statistics

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.slow


def test_tiny_recipe_learns_with_every_pool_its_own_actor(tmp_path):
    res = run_cli("train", "recipes/tiny-cpu.yaml", f"trainer.output_dir={tmp_path}", timeout=900)
    assert res.returncode == 0, res.stderr[-5000:]
    everything = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in everything if r["step"] > 0]
    scores = [r["critic/score/mean"] for r in rows]
    print("score per step:", [round(s, 3) for s in scores])
    assert len(rows) == rows[-1]["step"] >= 50
    assert scores[0] <= 0.3
    assert statistics.fmean(scores[-5:]) >= 0.8
    assert max(r["sync/logprob_diff"] for r in rows) < 1e-3  # weights reached the generators every step
    assert [r["rollout/policy_version"] for r in rows] == list(range(len(rows)))
    val = [r["val/synthetic/select/pass@1"] for r in everything if "val/synthetic/select/pass@1" in r]
    assert len(val) == 4 and val[0] <= 0.3 and val[-1] >= 0.8  # before training, steps 50, 100, 150 (greedy)
    placement = json.loads((tmp_path / "placement.json").read_text())
    assert {p: len(a) for p, a in placement.items()} == {"generator": 1, "learner": 2, "reference": 1, "reward": 1}
    assert len({a["pid"] for actors in placement.values() for a in actors}) == 5
    for line in ("step:1 ", f"step:{len(rows)} "):
        assert line in res.stdout
