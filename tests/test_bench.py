"""The benchmark script runs end to end (one step, no sweep) and writes its JSON and Markdown."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def test_bench_smoke(tmp_path):
    res = subprocess.run([sys.executable, "benchmarks/bench.py", "--warmup", "1", "--steps", "1", "--reps", "1", "--no-sweep",
                          "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    main = json.loads((tmp_path / "results.json").read_text())["main"]
    for part in ("gen_tok_s", "learn_tok_s", "learn_mfu", "sync_GBps"):
        assert main["ours"][part] > 0 and main["raw"][part] > 0, part
    assert 0 < main["ours"]["learn_mfu"] <= 1 and main["sync_ratio"] > 0
    assert main["overhead_s"] == pytest.approx(
        main["ours"]["step_s"] - main["raw"]["gen_s"] - main["raw"]["learn_s"] - main["raw"]["sync_s"]
        - main["ours"]["reward_s"] - main["ours"]["ref_s"])
    assert "| generation (tokens/s) |" in (tmp_path / "results.md").read_text()
