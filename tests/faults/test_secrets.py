"""Item 9: tokens in the environment never reach logs, config.yaml, metrics, rollouts, the placement file or Ray's
logs."""

import os
from pathlib import Path

import pytest

from tests.faults.conftest import Run

pytestmark = pytest.mark.slow

SECRETS = {
    "HF_TOKEN": "hf_planted-fake-token-0123456789",
    "WANDB_API_KEY": "wandb-planted-key-9876543210",
    "MY_SERVICE_PASSWORD": "planted-password-42",
}


def test_planted_tokens_appear_in_no_output(tmp_path):
    out = tmp_path / "run"
    # the recipe also passes the token on to vLLM, as a user with a gated model would
    run = Run(
        out,
        [
            "trainer.total_steps=2",
            "trainer.save_freq=2",
            "trainer.loggers=[console,jsonl,tensorboard]",
            "+generator.vllm_kwargs.hf_token=${oc.env:HF_TOKEN}",
        ],
        SECRETS,
    )
    assert run.wait() == 0, run.output()[-3000:]
    files = [p for p in out.rglob("*") if p.is_file()] + [out.parent / "run.log"]
    session = Path("/tmp/ray/session_latest").resolve()
    files += [p for p in (session / "logs").rglob("*") if p.is_file()]
    assert any(p.name == "config.yaml" for p in files) and any(p.suffix == ".jsonl" for p in files)
    assert any("events.out.tfevents" in p.name for p in files) and any(p.name == "placement.json" for p in files)
    leaks = [(p, name) for p in files for name, value in SECRETS.items() if value.encode() in p.read_bytes()]
    assert not leaks, leaks
    assert "***redacted***" in (out / "config.yaml").read_text()
    assert os.environ.get("HF_TOKEN") != SECRETS["HF_TOKEN"]  # planted in the child only
