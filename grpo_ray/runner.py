"""The job around the steps: one place for the run, resume, checkpoints, preemption, validation and its cadence,
early stopping and the logs. What a step does is a subclass's: the GRPO step (grpo_ray.controller) and the SFT step
(grpo_ray.jobs.sft) share all of this.

    run:  start pools ─> (resume) ─> probe ─> (validate) ─> for each step: step ─> validate? ─> save? ─> stop?
                                                                      SIGTERM: save if the grace allows, then stop

Rollouts and logprobs travel between pools as Ray object refs; the runner only gathers rewards, lengths, timings
and metrics (rollout dumps are written by a task on the driver's node, not here).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from grpo_ray import checkpoint, early_stop
from grpo_ray.algo.batching import Samples
from grpo_ray.config import LEARNER, POOLS, Recipe
from grpo_ray.data.stream import Position, PromptStream
from grpo_ray.engines import Engines
from grpo_ray.errors import Preempted, RunError
from grpo_ray.faults import fault_at
from grpo_ray.models import chat_template_text
from grpo_ray.pools import REDONE, Pools
from grpo_ray.scorers import Scorers
from grpo_ray.setup_run import RunInputs
from grpo_ray.telemetry import trackers
from grpo_ray.telemetry.dumps import write_dump
from grpo_ray.telemetry.failures import Failures
from grpo_ray.telemetry.metrics import MetricsLog, sample_table, since_start, validation_metrics, validation_totals
from grpo_ray.types import Prompt

__all__ = ["Runner", "RunError", "Preempted"]


class Runner:
    """A training job on the pools: runs `step` from the first step not done to the last, validates, saves,
    resumes and stops on SIGTERM or early stopping. Subclasses give `step` (and the pools they need)."""

    save_at_end = False
    """Save a checkpoint after the last step even when trainer.save_freq is 0."""
    job = "train"
    """The command whose checkpoints this runner writes and resumes (train, sft, rm): another's is refused."""
    roles: dict = {}
    """Actor classes that replace a pool's own (``pools.ROLES``): a reward model's run trains a classifier."""

    def __init__(self, recipe: Recipe, inputs: RunInputs):
        self.r, self.inputs = recipe, inputs
        self.stream = PromptStream(
            inputs.train_rows, recipe.data.train_batch_size, recipe.trainer.seed, recipe.data.shuffle
        )
        self.version = 0
        """The learner's weights: updates that changed them."""
        self.pools = Pools(recipe, inputs.paths, inputs.dims, self.roles)
        self.engines = Engines(recipe, self.pools, inputs.probe_ids, lambda: self.version, self.say)
        """The generator side: batches out, weights in (engines.version: the weights they hold)."""
        self.failures = Failures(self.say, self.pools.log_dir, recipe.reward, recipe.environment.name)
        """User code's failures: the first of each kind said once, a run of failing steps stops the run."""
        self.scorers = Scorers(recipe, self.pools, self.failures, self.say)
        """The scorer side: batches out, scores and per-token signals back."""
        self.pending_dumps: list = []
        self.preempted_at: float | None = None
        self.log: MetricsLog | None = None
        self.best = early_stop.Best.of(recipe.trainer)
        """The best validation so far (early stopping, keep_best)."""

    def step(self, step: int) -> dict[str, float]:
        """One training step; its metrics."""
        raise NotImplementedError

    def pools_needed(self) -> tuple[str, ...]:
        """The pools a run starts."""
        return POOLS

    # --- run ---------------------------------------------------------------------------

    def run(self) -> None:
        t, total = self.r.trainer, self.total_steps()
        ckpt = self.inputs.resume  # chosen before any actor started (grpo_ray.rundir)
        done = checkpoint.load_state(ckpt)["step"] if ckpt else 0
        checkpoint.keep_metrics(self.inputs.output_dir / "metrics.jsonl", done)  # steps after the checkpoint are redone
        self.log = MetricsLog(
            self.inputs.output_dir, t.loggers, total, done, trackers.start(self.r, self.inputs.output_dir, self.say)
        )
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "preempted_at", self.preempted_at or time.monotonic()))
        try:
            self.begin(ckpt)
            if t.val_before_train and self.inputs.val_rows and not done:
                self.say(f"{since_start()} validating before training: {len(self.inputs.val_rows)} prompts")
                self.log.log(0, self.validate(0))
            self.say(f"{since_start()} training: steps {done + 1} to {total}")
            last_val, save_seconds = None, 0.0
            for step in range(done + 1, total + 1):
                metrics, improved = self.step(step), False
                if self.validating(step):
                    metrics.update(self.validate(step))
                    last_val = early_stop.headline(metrics)
                    improved = self.best.update(step, metrics)
                self.log.log(step, metrics)
                keep = improved and t.keep_best  # the best validation's weights, kept whatever keep_last says
                if self.saving(step) or keep or self.best.stop or self.preempted_at is not None:
                    save_seconds = self.save_or_quit(
                        step, last_val, self.saving(step) or keep or self.best.stop, save_seconds
                    )
                if self.best.stop:
                    model = early_stop.export(self.best, t, self.inputs.output_dir, step, self.say)
                    self.log.note("export_path", str(model))
                    break
            if any(self.pools.restarts.values()) or self.pools.left:  # the run's summary of what its faults cost
                lost = ", ".join(f"{p} {n}" for p, n in self.pools.restarts.items() if n) or "none"
                spent, starting = sum(self.pools.recovery_s.values()), sum(self.pools.start_s.values())
                redone = ", ".join(
                    f"{p} {n} {REDONE.get(p, 'sample')}{'s' * (n != 1)}" for p, n in self.pools.redone.items() if n
                )
                self.say(
                    f"{since_start()} recovered from lost actors (restarts: {lost}) in {spent:.1f} s "
                    f"({starting:.1f} s of it starting new actors)"
                    + (f", work done again: {redone}" if redone else "")
                    + (f", engines that left with their node: {self.pools.left}" if self.pools.left else "")
                    + " (fault/*)"
                )
            self.flush_dumps()
            self.log.finish(self.best.line() if self.best.value is not None else None)
        finally:
            self.log.close()
            self.shutdown()

    def begin(self, ckpt: Path | None) -> None:
        """Start the pools, resume from `ckpt`, probe the engines' weights against the learner's, with a line each."""
        if self.r.trainer.log_level == "info":
            self.say(
                f"actor logs (vLLM, transformers, Ray workers): {self.pools.log_dir()}/ "
                "(trainer.log_level=debug shows them here)"
            )
        self.start(self.pools_needed())
        self.log.file(self.inputs.output_dir / "placement.json")
        if self.pools.facts and not self.pools.facts["peak_tflops"]:
            self.say(
                f"MFU not reported: no peak TFLOPS known for {self.pools.facts['device_name']!r}; set "
                "cluster.peak_tflops to report it"
            )
        if ckpt:
            self.say(f"resuming from {ckpt} (step {self.restore(ckpt)})")
        if self.pools.generators:
            diff = self.engines.probe()
            self.say(
                f"{since_start()} first probe: sync/logprob_diff {diff:.3g} (the engines' logprobs against "
                "the learner's, on the same tokens)"
            )
        if self.r.model.lora.rank and self.pools.metas:
            what = {
                "adapters": "the adapters only, loaded in place by vLLM's LoRA support",
                "merged": "the adapted weights, the adapters merged into them (model.lora.sync=merged)",
            }[self.r.model.lora.sync]
            self.say(f"LoRA: a sync sends {what}: {sum(m.nbytes for m in self.pools.metas) / 1e6:.3g} MB")

    def total_steps(self) -> int:
        t = self.r.trainer
        return t.total_steps or t.total_epochs * self.stream.steps_per_epoch

    def validating(self, step: int) -> bool:
        """Whether validation runs after `step`."""
        t = self.r.trainer
        return bool(t.test_freq and self.inputs.val_rows and (step % t.test_freq == 0 or step == self.total_steps()))

    def saving(self, step: int) -> bool:
        """Whether a checkpoint is due after `step` (SIGTERM aside)."""
        t = self.r.trainer
        return bool(
            (t.save_freq and step % t.save_freq == 0)
            or (step == self.total_steps() and (t.save_freq or self.save_at_end))
        )

    def save_or_quit(self, step: int, last_val: float | None, due: bool, last_seconds: float) -> float:
        """Save when due; after SIGTERM, save if the last save fits in what is left of the grace, then stop."""
        start = time.monotonic()
        left = self.r.trainer.preemption_grace_s - (start - self.preempted_at) if self.preempted_at else 0.0
        if due or (self.preempted_at is not None and last_seconds < left):
            self.flush_dumps()
            self.say(f"saved {self.save(step, last_val)}")
        if self.preempted_at is not None:
            saved = "a checkpoint of" if due or last_seconds < left else "no checkpoint (no time left) after"
            raise Preempted(f"SIGTERM: stopped with {saved} step {step}; run the same command to resume")
        return time.monotonic() - start

    # --- validation --------------------------------------------------------------------

    def validate(self, step: int) -> dict[str, float]:
        """pass@1 (and pass@val_n) per data source over the validation rows, with the validation sampling."""
        g = self.r.generator
        prompts = [Prompt.from_row(i, row) for i, row in enumerate(self.inputs.val_rows)]
        sampling = dataclasses.replace(g.sampling, temperature=g.val_temperature)
        rollouts, stats = self.engines.generate(prompts, g.val_n, step, sampling)
        self.failures.episodes(stats, counted=False)
        scores, out = self.pass_rates(step, "val_data", prompts, rollouts, stats, g.val_n)
        if self.log and self.log.trackers:  # a few samples of the first engine's share, as a table
            self.log.table(step, sample_table(self.call(rollouts[0], "validation samples"), scores[0].totals))
        return out

    def pass_rates(self, step: int, name: str, prompts: list, rollouts: list, stats: list, n: int) -> tuple:
        """The scores of validation answers (`n` to each of `prompts`, in `rollouts`), dumped as
        rollouts/<name>_step<step>.jsonl when dumps are on, and pass@1 (and pass@n) per data source: the reward
        functions decide, a reward model never does."""
        scores = self.failures.rewards(
            self.call(self.scorers.rules(rollouts, Samples.of(stats)), f"validation reward ({name})"), False
        )
        if self.r.trainer.dump_freq:
            self.dump(f"{name}_step{step}", step, rollouts, scores, None)
        totals, perfect = validation_totals(scores, self.r.reward.functions)
        return scores, validation_metrics([p.data_source for p in prompts], totals, n, perfect)

    def dump(self, name: str, step: int, rollouts: list, scores: list, advantages: list[float] | None) -> None:
        """Write rollouts/<name>.jsonl from a task on the driver's node (the rollouts never pass through here)."""
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        path = str(self.inputs.output_dir / "rollouts" / f"{name}.jsonl")
        task = ray.remote(write_dump).options(num_cpus=0, scheduling_strategy=here)
        self.pending_dumps.append(task.remote(path, step, scores, advantages, *rollouts))
        self.flush_dumps(keep=2)  # at most two dumps in flight

    def flush_dumps(self, keep: int = 0) -> None:
        """Wait for all but the newest `keep` rollout dumps to be written."""
        done = len(self.pending_dumps) - keep
        if done > 0:
            self.call(self.pending_dumps[:done], "rollout dump")
            self.pending_dumps = self.pending_dumps[done:]

    # --- checkpoints -------------------------------------------------------------------

    def save(self, step: int, last_val: float | None) -> Path:
        """Learner shards (every rank), then trainer state, tokenizer and manifest; committed by a rename. Where the
        run keeps copies of the learner's state (trainer.fault_tolerance=all), a copy of the state saved is taken
        first: a rank lost in the save starts the group again from it, and the shards are written again, once."""
        tmp = checkpoint.staging_dir(self.inputs.output_dir, step)

        def saves() -> list:  # (again, by a group started again from the copy, where a rank is lost in them)
            return [l.save.remote(str(tmp / LEARNER)) for l in self.pools.learners]

        said = "the learner group started again from the copy of the state it was saving, saving again"
        saved = self.pools.kept_call(LEARNER, saves, "checkpoint save", said)[0]
        if fault_at("exit_mid_checkpoint", step):
            os._exit(1)  # fault test: the job dies with the shards written and the checkpoint not committed
        state = {
            "step": step,
            "version": self.version,
            "data": dataclasses.asdict(self.stream.position),
            "scheduler": saved["scheduler"],
            "best": self.best.state(),
            "job": self.job,
            **self.held_state(step),
        }
        info = {"step": step, "consumed_samples": step * self.r.data.train_batch_size, "last_val_score": last_val}
        keep = frozenset([self.best.step] if self.r.trainer.keep_best and self.best.step else [])
        template = chat_template_text(self.r.model.chat_template) if self.r.model.chat_template else ""
        return checkpoint.commit(
            tmp,
            self.inputs.model_path,
            state,
            info,
            self.inputs.output_dir / "config.yaml",
            self.r.trainer.keep_last,
            keep,
            template,
            self.pools.facts.get("config", ""),
        )

    def restore(self, ckpt: Path) -> int:
        """Learner weights and optimizer, scheduler, data position and version; generators get the weights."""
        state = checkpoint.load_state(ckpt)
        self.best = early_stop.Best.of(self.r.trainer, state.get("best"))
        self.call(
            [l.load.remote(str(ckpt / LEARNER), state["scheduler"]) for l in self.pools.learners],
            "checkpoint load",
        )
        self.stream = PromptStream(
            self.inputs.train_rows,
            self.r.data.train_batch_size,
            self.r.trainer.seed,
            self.r.data.shuffle,
            Position(**state["data"]),
        )
        self.version = self.engines.version = state["version"]
        self.restore_held(state)
        if self.pools.generators:
            self.engines.push(self.version)  # before the first rollout
        return state["step"]

    def held_state(self, step: int) -> dict:
        """What a checkpoint after `step` keeps of the work in flight (none here)."""
        return {}

    def restore_held(self, state: dict) -> None:
        """Take back what ``held_state`` kept."""

    # --- pools -------------------------------------------------------------------------

    def start(self, pools: tuple[str, ...] = POOLS) -> None:
        """Start the pools (all, or `pools` only) and write placement.json."""
        self.pools.start(pools, self.say)
        self.pools.write_placement(self.inputs.output_dir / "placement.json")

    def shutdown(self) -> None:
        self.pools.shutdown()

    def say(self, line: str) -> None:
        (self.log.say if self.log else print)(line)

    def call(self, refs, what: str):
        return self.pools.call(refs, what)
