"""The benchmark script runs end to end (one step, no sweep) and writes its JSON and Markdown."""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def test_bench_smoke(tmp_path):
    before = set(Path(tempfile.gettempdir()).glob("grpo-bench-*"))
    res = subprocess.run(
        [
            sys.executable,
            "benchmarks/bench.py",
            "--warmup",
            "1",
            "--steps",
            "1",
            "--reps",
            "1",
            "--no-sweep",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    assert set(Path(tempfile.gettempdir()).glob("grpo-bench-*")) == before  # its runs' folders removed
    main = json.loads((tmp_path / "results.json").read_text())["main"]
    for part in ("gen_tok_s", "learn_tok_s", "learn_mfu", "sync_GBps"):
        assert main["ours"][part] > 0 and main["raw"][part] > 0, part
    assert 0 < main["ours"]["learn_mfu"] <= 1 and main["sync_ratio"] > 0
    (step,) = main["raw_steps"]  # the timed step's work at the raw components' speeds
    assert step["learn_s"] == pytest.approx(step["learn_tokens"] / main["raw"]["learn_tok_s"])
    assert step["gen_s"] == pytest.approx(step["gen_tokens"] / main["raw"]["gen_tok_s"])
    assert 0 < step["gen_s"] and 0 < step["reload_s"] < step["step_s"]
    assert main["overhead_s"] == pytest.approx(
        step["step_s"]
        - step["gen_s"]
        - step["learn_s"]
        - step["sync_s"]
        - step["reload_s"]
        - step["reward_s"]
        - step["ref_s"]
    )
    assert "| generation (tokens/s) |" in (tmp_path / "results.md").read_text()
