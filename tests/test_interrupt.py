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
    # output to a file, not a pipe nobody drains: a full pipe would block the run's own printing
    log = tmp_path / "out.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "grpo_ray",
            "train",
            "recipes/tiny-cpu.yaml",
            "trainer.total_steps=1000",
            f"trainer.output_dir={tmp_path}",
        ],
        cwd=ROOT,
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        # as from a terminal: SIGINT at its default, whatever this test process inherited (a suite started in the
        # background has SIGINT ignored, children inherit that, and Python then never raises KeyboardInterrupt)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.time() + 300
        while "\nstep:2 " not in log.read_text() and time.time() < deadline:
            time.sleep(0.2)
        assert "\nstep:2 " in log.read_text(), "the run never reached step 2"
        pids = [a["pid"] for actors in json.loads((tmp_path / "placement.json").read_text()).values() for a in actors]
        assert len(pids) == 5 and all(alive(p) for p in pids)
        proc.send_signal(signal.SIGINT)  # the driver only, as a terminal's Ctrl-C reaches the foreground job
        try:
            code = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            code = "still running 120 s after SIGINT"
        assert code == 130, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of the job, Ray's own processes included
            proc.wait()
    deadline = time.time() + 60
    while any(alive(p) for p in pids) and time.time() < deadline:
        time.sleep(1)
    assert not [p for p in pids if alive(p)]
