"""Ctrl-C: the run stops its actors (by handle) and exits 130."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_ctrl_c_stops_every_actor(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpo_ray", "train", "recipes/tiny-cpu.yaml", "trainer.total_steps=1000",
         f"trainer.output_dir={tmp_path}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.time() + 300
        for line in proc.stdout:
            if line.startswith("step:2 ") or time.time() > deadline:
                break
        assert line.startswith("step:2 "), "the run never reached step 2"
        pids = [a["pid"] for actors in json.loads((tmp_path / "placement.json").read_text()).values()
                for a in actors]
        assert len(pids) == 5 and all(alive(p) for p in pids)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.time() + 60
    while any(alive(p) for p in pids) and time.time() < deadline:
        time.sleep(1)
    assert not [p for p in pids if alive(p)]
