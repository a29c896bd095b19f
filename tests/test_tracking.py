"""Experiment tracking against the real libraries: W&B in offline mode (its files read back), MLflow against a real
tracking server this module starts on localhost (SQLite), read back through its client; a resume continuing both
runs without duplicated steps; secrets; early stopping on a run that cannot improve, whose server is stopped mid-run."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_ray import checkpoint
from tests.conftest import LEAN, ROOT, run_cli
from tests.helpers import wandb_offline

SECRETS = {
    "WANDB_API_KEY": "wandb-secret-4f2a9c81e7d3b6",
    "MLFLOW_TRACKING_TOKEN": "mlflow-secret-9d1e8b7c6a5f4",
    "HF_TOKEN": "hf_planted-fake-tracking-token-42",
}
COMMON = [
    "trainer.test_freq=2",
    "trainer.val_before_train=false",
    "trainer.save_freq=2",
    "data.val_files=[synthetic://select?size=32&seed=0&split=test&items=1]",
    "trainer.project_name=grpo-tests",
    "trainer.experiment_name=tracked",
    "trainer.wandb_mode=offline",
    # two actors' start-up less a run: the trackers' subject is what the driver logs
    *LEAN,
]


def mlflow_server(tmp: Path):
    """A real MLflow tracking server on localhost, its store in SQLite, its artifacts in a folder; (process, uri)."""
    from grpo_ray.sync import free_port

    port = free_port()
    exe = ROOT / ".venv-mlflow" / "bin" / "mlflow"
    if not exe.is_file():
        pytest.skip(f"{exe} is absent: scripts/setup.sh --test makes it")
    proc = subprocess.Popen(
        [
            str(exe),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{tmp}/mlflow.db",
            "--artifacts-destination",
            str(tmp / "artifacts"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    uri = f"http://127.0.0.1:{port}"
    import urllib.request

    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"{uri}/health", timeout=2)
            return proc, uri
        except OSError:
            time.sleep(1)
    proc.kill()
    raise AssertionError("the MLflow server did not start within 120 s")


def stop(proc):
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """4 steps logged to W&B (offline) and MLflow; step 4's checkpoint removed (as if the job died after logging
    step 4 and before saving it), then the same run resumed to 6 steps: it redoes steps 3 and 4."""
    tmp = tmp_path_factory.mktemp("tracking")
    server, uri = mlflow_server(tmp / "server")
    out = tmp / "run"
    args = [
        *COMMON,
        "trainer.loggers=[console,jsonl,wandb,mlflow]",
        f"trainer.mlflow_tracking_uri={uri}",
        f"trainer.output_dir={out}",
    ]
    try:
        first = run_cli("train", "recipes/tiny-cpu.yaml", *args, "trainer.total_steps=4", env=SECRETS, timeout=900)
        assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
        ids = json.loads((out / "trackers.json").read_text())
        import shutil

        shutil.rmtree(out / "checkpoints" / "step_4")
        second = run_cli("train", "recipes/tiny-cpu.yaml", *args, "trainer.total_steps=6", env=SECRETS, timeout=900)
        assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]
        assert "resuming from" in second.stdout and "(step 2)" in second.stdout
        yield out, uri, ids, first.stdout + second.stdout, tmp
    finally:
        stop(server)


@pytest.mark.slow
@pytest.mark.smoke
def test_wandb_offline_run_holds_the_config_every_step_once_and_the_rollout_tables(tracked):
    out, _, ids, _, _ = tracked
    files = wandb_offline.run_files(out / "wandb", ids["wandb"]["id"])
    assert len(files) == 2  # the run and its resumption, under one id
    assert {r for r in wandb_offline.runs(files)} == {(ids["wandb"]["id"], "grpo-tests", "tracked")}
    rows = wandb_offline.history(files)
    steps = [r["_step"] for r in rows if "critic/score/mean" in r]
    assert steps == [1, 2, 3, 4, 5, 6]  # steps 3-4 were redone after the resume, and recorded once
    logged = {r["_step"]: r for r in rows if "critic/score/mean" in r}
    for m in metrics(out):  # what W&B holds is what metrics.jsonl holds (exact resume: the redone steps agree)
        assert logged[m["step"]]["critic/score/mean"] == pytest.approx(m["critic/score/mean"])
    tables = [r for r in rows if r.get("rollouts/_type") == "table-file"]
    assert [t["_step"] for t in tables] == [2, 4, 6] and all(t["rollouts/nrows"] == 16 for t in tables)
    cfg = wandb_offline.config(files)
    assert cfg["algorithm"]["group_size"] == 16 and "torch" in cfg["versions"]


@pytest.mark.slow
@pytest.mark.smoke
def test_mlflow_run_holds_params_every_step_once_tables_and_artifacts(tracked):
    out, uri, ids, _, _ = tracked
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    run = client.get_run(ids["mlflow"]["run_id"])
    assert run.info.run_name == "tracked" and run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "grpo-tests"
    assert run.data.params["algorithm.group_size"] == "16" and run.data.params["trainer.total_steps"] == "4"
    history = client.get_metric_history(run.info.run_id, "critic/score/mean")
    assert sorted(m.step for m in history) == [1, 2, 3, 4, 5, 6]  # each step once, the redone ones too
    by_step = {m.step: m.value for m in history}
    for m in metrics(out):
        assert by_step[m["step"]] == pytest.approx(m["critic/score/mean"])
    val = client.get_metric_history(run.info.run_id, "val/synthetic/select/pass_at_1")
    assert sorted(m.step for m in val) == [2, 4, 6]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"placement.json", "plot.png", "rollouts"} <= artifacts
    table = json.loads(Path(client.download_artifacts(run.info.run_id, "rollouts/step_2.json")).read_text())
    assert len(table["rows"]) == 16 and set(table["rows"][0]) == {"prompt", "response", "reward"}
    experiments = client.search_experiments()
    assert len([e for e in experiments if e.name == "grpo-tests"]) == 1
    assert len(client.search_runs([run.info.experiment_id])) == 1  # resumed, not a second run


@pytest.mark.slow
@pytest.mark.smoke
def test_no_secret_reaches_either_tracker(tracked):
    out, _, _, console, tmp = tracked
    stores = [p for p in (out / "wandb").rglob("*") if p.is_file()]
    stores += [p for p in (tmp / "server").rglob("*") if p.is_file()]  # the server's SQLite store and artifacts
    stores += [out / "trackers.json", out / "config.yaml"]
    assert len(stores) > 10
    for path in stores:
        data = path.read_bytes()
        for name, value in SECRETS.items():
            assert value.encode() not in data, (name, path)
    assert not any(v in console for v in SECRETS.values())


@pytest.mark.slow
def test_early_stop_keeps_the_best_and_a_server_lost_mid_run_leaves_training_going(tmp_path):
    """One run, two behaviours. It cannot improve (a learning rate of 1e-12): pass@1 is the same at every
    validation (steps 2, 4, 6), so with a patience of 2 it stops after step 6, keeps step 2's checkpoint as the
    best and exports it. Its MLflow server is killed after step 2: training goes on, said once, every step kept
    in metrics.jsonl, and what MLflow never received said at the end."""
    server, uri = mlflow_server(tmp_path / "server")
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "grpo_ray",
        "train",
        "recipes/tiny-cpu.yaml",
        *COMMON,
        "trainer.total_steps=20",
        "trainer.save_freq=0",
        "trainer.keep_last=1",
        "trainer.keep_best=true",
        "learner.optim.lr=1e-12",
        "trainer.early_stop.metric=val/synthetic/select/pass@1",
        "trainer.early_stop.patience=2",
        "trainer.early_stop.min_delta=0.1",
        "trainer.loggers=[console,jsonl,mlflow]",
        f"trainer.mlflow_tracking_uri={uri}",
        f"trainer.output_dir={out}",
    ]
    run = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    lines = []
    try:
        for line in run.stdout:
            lines.append(line)
            if line.startswith("step:2 "):
                stop(server)  # the tracking server goes away mid-run
        assert run.wait(timeout=900) == 0, "".join(lines)[-3000:]
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
        if server.poll() is None:
            stop(server)
    console = "".join(lines)
    assert [m["step"] for m in metrics(out)] == [1, 2, 3, 4, 5, 6]  # every step kept locally
    assert "early stop after step 6" in console and "at step 2" in console
    assert checkpoint.complete_steps(out / "checkpoints") == [2, 6]  # the best kept beside the last (keep_last=1)
    assert (out / "model" / "config.json").is_file()
    assert console.count("mlflow: not answering") == 1, console[-3000:]
    assert "mlflow:" in console and "not received" in console  # and what it never got, at the end


@pytest.mark.slow
def test_a_tracker_that_cannot_start_is_one_line_or_a_stop(tmp_path):
    """MLflow pointed at a port where nothing listens: left out with one line, the others kept; with
    trainer.tracker_required the run stops before any actor starts."""
    from grpo_ray.config import load_recipe
    from grpo_ray.sync import free_port
    from grpo_ray.telemetry import trackers

    dead = f"http://127.0.0.1:{free_port()}"
    said = []
    recipe = load_recipe(
        ROOT / "recipes" / "tiny-cpu.yaml",
        ["trainer.loggers=[console,wandb,mlflow]", f"trainer.mlflow_tracking_uri={dead}", "trainer.wandb_mode=offline"],
    )
    workers = trackers.start(recipe, tmp_path, said.append)
    try:
        assert [w.tracker.name for w in workers] == ["wandb"]
        assert len(said) == 1 and said[0].startswith("mlflow: cannot start") and "goes on without it" in said[0]
    finally:
        for w in workers:
            w.close()
    required = run_cli(
        "train",
        "recipes/tiny-cpu.yaml",
        "trainer.total_steps=1",
        "trainer.test_freq=0",
        "trainer.loggers=[console,jsonl,mlflow]",
        f"trainer.mlflow_tracking_uri={dead}",
        "trainer.tracker_required=true",
        f"trainer.output_dir={tmp_path / 'required'}",
        timeout=900,
    )
    assert required.returncode == 2 and "trainer.tracker_required=true" in required.stderr, required.stderr[-2000:]
    assert "actors placed" not in required.stdout  # stopped before any actor started


def test_best_counts_validations_without_an_improvement_by_hand():
    from grpo_ray.config import TrainerConfig
    from grpo_ray.early_stop import Best

    t = TrainerConfig()
    t.early_stop.metric, t.early_stop.patience, t.early_stop.min_delta = "val/x/pass@1", 2, 0.05
    best = Best.of(t)
    seen = [best.update(step, {"val/x/pass@1": v}) for step, v in [(10, 0.5), (20, 0.53), (30, 0.6), (40, 0.62)]]
    assert seen == [True, False, True, False] and (best.value, best.step, best.since, best.stop) == (0.6, 30, 1, False)
    assert best.update(50, {"val/x/pass@1": 0.1}) is False and best.stop
    resumed = Best.of(t, best.state())  # a checkpoint carries the count on
    assert resumed.stop and resumed.step == 30
    t.early_stop.mode = "min"
    low = Best.of(t)
    assert [low.update(s, {"val/x/pass@1": v}) for s, v in [(1, 0.5), (2, 0.4), (3, 0.38)]] == [True, True, False]
    mean = Best.of(TrainerConfig())  # keep_best without a metric: the mean pass@1 of every validation set
    assert mean.update(
        1, {"val/a/pass@1": 0.2, "val/b/pass@1": 0.4, "val/a/pass@4": 0.9}
    ) and mean.value == pytest.approx(0.3)
    assert not mean.stop  # no metric named: never stops


def test_the_default_mlflow_store_works_with_todays_mlflow_and_wandb_dir_wins(tmp_path, monkeypatch):
    """No tracking URI anywhere: MLflow's store is a SQLite file beside the run (mlflow 3 refuses a folder store),
    metrics, tables and files read back through its client, nothing written in the working directory; with
    WANDB_DIR set, W&B's files go there, not under the run (W&B's own rule: the variable wins)."""
    import wandb
    from mlflow.tracking import MlflowClient

    from grpo_ray.config import load_recipe
    from grpo_ray.telemetry import trackers

    wandb.teardown()  # W&B reads WANDB_DIR when its process-wide setup starts: an earlier test's would be kept
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-home"))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    out.mkdir()
    recipe = load_recipe(
        ROOT / "recipes" / "tiny-cpu.yaml", ["trainer.loggers=[console,wandb,mlflow]", "trainer.wandb_mode=offline"]
    )
    said = []
    workers = trackers.start(recipe, out, said.append)
    try:
        assert [w.tracker.name for w in workers] == ["wandb", "mlflow"] and not said, said
        for w in workers:
            w.tracker.log(1, {"critic/score/mean": 0.25})
            w.tracker.table(1, [{"prompt": "p", "response": "r", "reward": 1.0}])
    finally:
        for w in workers:
            w.close()
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    run_id = json.loads((out / "trackers.json").read_text())["mlflow"]["run_id"]
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "critic/score/mean")] == [(1, 0.25)]
    assert client.get_run(run_id).data.params["trainer.project_name"] == recipe.trainer.project_name
    assert (out / "mlartifacts").is_dir() and not (tmp_path / "mlruns").exists()
    assert list((tmp_path / "wandb-home").rglob("*.wandb")) and not (out / "wandb").exists()
