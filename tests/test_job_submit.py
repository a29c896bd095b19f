"""`ray job submit` against a real Ray head started here (and stopped by its own handle), with the
documented commands (docs/gpus.md): its token line, its exports and its submit line, verbatim but for the ports."""

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import LEAN, ROOT

pytestmark = [pytest.mark.slow, pytest.mark.smoke]  # `ray job submit`, in CI's tier
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def readme_lines(name: str) -> list[str]:
    """The commands of docs/gpus.md's bash block marked `<!-- name -->`, continuation lines joined."""
    text = (ROOT / "docs" / "gpus.md").read_text()
    block = re.search(rf"<!-- {re.escape(name)} -->\n```bash\n(.*?)```", text, re.S).group(1)
    return [line.split("  #")[0].strip() for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def test_ray_job_submit_runs_the_tiny_recipe(tmp_path, model_cache):
    gcs, dash, agent = free_port(), free_port(), free_port()
    token_line, export, start, submit_line = readme_lines("job-submit: local")
    assert token_line.startswith("ray get-auth-token --generate") and start == "ray start --head"
    # a home of its own: the README's token line makes ~/.ray/auth_token there, and nothing else gives a token
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH") and k != "RAY_ADDRESS"}
    env.update({"PATH": f"{BIN}:{os.environ['PATH']}", "GRPO_RAY_CACHE": str(model_cache), "HOME": str(tmp_path)})
    subprocess.run(token_line, shell=True, cwd=ROOT, env=env, check=True, capture_output=True, timeout=120)
    assert (tmp_path / ".ray" / "auth_token").is_file()
    env.update(dict(kv.split("=", 1) for kv in shlex.split(export.removeprefix("export "))))
    # its own (short: unix socket paths) temp dir, so its address file cannot send later runs to a dead head
    temp_dir = tempfile.mkdtemp(prefix="rayjob", dir="/tmp")
    head = subprocess.Popen(
        [
            *shlex.split(start),
            "--block",
            f"--port={gcs}",
            f"--temp-dir={temp_dir}",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dash}",
            f"--dashboard-agent-listen-port={agent}",
            "--num-cpus=3",
            "--include-dashboard=true",
            "--disable-usage-stats",
        ],
        env=env,
        stdout=open(tmp_path / "head.log", "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    address = f"http://127.0.0.1:{dash}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(f"{address}/api/version", timeout=2)
                break
            except urllib.error.HTTPError:  # it answers (Ray 2.60 asks for its auth token): it is up
                break
            except OSError:
                assert head.poll() is None, (tmp_path / "head.log").read_text()[-3000:]
                assert time.time() < deadline, "the Ray head did not come up"
                time.sleep(1)
        out = tmp_path / "run"
        submit = [
            *shlex.split(submit_line.replace("http://127.0.0.1:8265", address)),
            "trainer.total_steps=2",
            # CI's time: the path is the submission, not the pools (2 actors fewer)
            *LEAN,
            f"trainer.output_dir={out}",
        ]
        deadline = time.time() + 120
        while True:  # the dashboard can answer before its job agent is up: Ray says to try again later
            job = subprocess.run(submit, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
            if "No available agent to submit job" not in job.stdout + job.stderr or time.time() > deadline:
                break
            time.sleep(3)
        logs = job.stdout + job.stderr
        assert job.returncode == 0, logs[-5000:]
        job_id = re.search(r"Job '(raysubmit_\w+)' succeeded", logs).group(1)
        status = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from ray.job_submission import JobSubmissionClient as C; "
                "print(C(sys.argv[1]).get_job_status(sys.argv[2]).value)",
                address,
                job_id,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert status.stdout.strip() == "SUCCEEDED", status.stderr[-2000:]
        assert "step:1 score:" in logs and "step:2 score:" in logs
        steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert steps == [0, 1, 2]  # validation before training, then two steps
    finally:
        head.terminate()  # `ray start --block` stops what it started when it is told to stop
        head.wait(timeout=120)
        shutil.rmtree(temp_dir, ignore_errors=True)
