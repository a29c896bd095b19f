"""Item 9: tokens in the environment never reach logs, config.yaml, metrics, rollouts, the placement file or Ray's
logs. The run is tests/faults/test_nonfinite.py's (tests/faults/conftest.py's nan_run): the tokens are planted in
its environment and the recipe passes HF_TOKEN on to vLLM."""

import os

import pytest

from tests.faults.conftest import SECRETS

pytestmark = pytest.mark.slow


def test_planted_tokens_appear_in_no_output(nan_run):
    out, _, session = nan_run
    files = [p for p in out.rglob("*") if p.is_file()] + [out.parent / "run.log"]
    files += [p for p in (session / "logs").rglob("*") if p.is_file()]
    assert any(p.name == "config.yaml" for p in files) and any(p.suffix == ".jsonl" for p in files)
    assert any("events.out.tfevents" in p.name for p in files) and any(p.name == "placement.json" for p in files)
    assert any(p.name.startswith("raylet") for p in files)  # Ray's own logs were searched too
    leaks = [(p, name) for p in files for name, value in SECRETS.items() if value.encode() in p.read_bytes()]
    assert not leaks, leaks
    assert "***redacted***" in (out / "config.yaml").read_text()
    assert os.environ.get("HF_TOKEN") != SECRETS["HF_TOKEN"]  # planted in the child only
