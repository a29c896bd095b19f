"""The GRPO controller: it builds the pools, then runs steps. One step reads top to bottom:

    prompts ──> generators ──rollout refs──┬──> rewards ──scores (small)──> advantages ──┐
                                           ├──> reference ──logprob refs───────────────┐ │
                                           └──────────────────────────────────────────> learner (FSDP2)
                                                                                         │
    generators <──────────── weight broadcast (gloo | nccl), then a logprob probe ───────┘

Rollouts and logprobs travel between pools as Ray object refs; the controller only
gathers rewards, lengths, timings and metrics (rollout dumps are written by a task on the
driver's node, not by the controller).

The schedule (``algorithm.max_staleness``): at 0 each batch is generated after the last
push, so it is on-policy. At k >= 1 the next batch's generation is launched before this
step waits on anything, so the engines generate step s+1 while the learner trains step s:

    engines   │ gen s+1 ··········│push│ gen s+2 ··········│push│
    learner   │ score, ref, train s    │ score, ref, train s+1  │

An engine runs its calls in the order they were sent, so a batch is generated with the
weights of the last push sent before it (``Batch.version``) and the push waits for the
generation ahead of it. Weights are pushed when the next batch would otherwise be more than
k versions older than the learner when trained, and before validation and checkpoints.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import statistics
import time
from pathlib import Path

import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from grpo_ray import checkpoint, early_stop, trackers
from grpo_ray.algo.advantage import advantages as estimate
from grpo_ray.algo.advantage import overlong_penalty
from grpo_ray.algo.batching import Samples, balanced_ranges, select_groups, signal_groups, spans_of, take_groups
from grpo_ray.config import POOLS, Recipe
from grpo_ray.data.stream import Position, PromptStream
from grpo_ray.dumps import write_dump
from grpo_ray.engines import Batch, Engines
from grpo_ray.errors import Preempted, RunError
from grpo_ray.faults import fault_at
from grpo_ray.metrics import (
    MetricsLog,
    perf_metrics,
    pool_metrics,
    rollout_metrics,
    sample_table,
    since_start,
    validation_metrics,
)
from grpo_ray.models import chat_template_text
from grpo_ray.pools import Pools
from grpo_ray.setup_run import RunInputs
from grpo_ray.types import Prompt, Work

__all__ = ["Controller", "RunError", "Preempted"]

NO_SYNC = {"sync/seconds": 0.0, "timing_s/sync_weights": 0.0}


class Controller:
    save_at_end = False
    """Save a checkpoint after the last step even when trainer.save_freq is 0."""

    def __init__(self, recipe: Recipe, inputs: RunInputs):
        self.r, self.inputs = recipe, inputs
        self.stream = PromptStream(
            inputs.train_rows, recipe.data.train_batch_size, recipe.trainer.seed, recipe.data.shuffle
        )
        self.version = 0
        """The learner's weights: updates that changed them."""
        self.inflight: dict[int, Batch] = {}
        """Batches launched ahead of their step (max_staleness >= 1)."""
        self.learner_probe: list[float] | None = None
        """The learner's probe logprobs at its weights now (its last update computed them), for the sync's check."""
        self.last_update: tuple[float, float] = (0.0, 0.0)
        """Wall-clock window of the last learner update, to measure what generation overlapped it."""
        self.pools = Pools(recipe, inputs.model_path)
        self.engines = Engines(recipe, self.pools, inputs.probe_ids, lambda: self.version, self.say)
        """The generator side: batches out, weights in (engines.version: the weights they hold)."""
        self.pending_dumps: list = []
        self.skipped = {"in_a_row": 0, "total": 0}
        self.preempted_at: float | None = None
        self.log: MetricsLog | None = None
        self.best = early_stop.Best.of(recipe.trainer)
        """The best validation so far (early stopping, keep_best)."""
        self.reward_failures: dict[str, str] = {}
        """The first failure of each reward function (shown once), and the steps in a row over the limit."""
        self.failing_steps = 0

    # --- one step ----------------------------------------------------------------------

    def step(self, step: int) -> dict[str, float]:
        r, G, dapo = self.r, self.r.algorithm.group_size, self.r.algorithm.filter_groups.enable
        start = time.perf_counter()
        batch = self.inflight.pop(step, None) or self.launch(step)  # launched during the last step, or now
        if self.overlaps(step):
            self.inflight[step + 1] = self.launch(step + 1)  # generated while this step trains
        rollouts, stats = self.engines.collect(batch)
        samples = Samples.of(stats)  # counts and lengths: how the pools below share the work
        scores = self.score(rollouts, samples)
        refs = [] if dapo else self.reference_logprobs(rollouts, samples)  # runs while the rewards are scored
        scores, kept = self.check_rewards(self._get(scores, "reward")), {}
        if dapo:  # dynamic sampling: only groups whose rewards differ, more prompts until the batch is full
            rollouts, stats, scores, kept = self.keep_signal(step, rollouts, stats, scores)
            samples = Samples.of(stats)
            refs = self.reference_logprobs(rollouts, samples)
        staleness = self.check_staleness(stats)
        lengths = torch.tensor([n for s in stats for n in s.response_lengths])
        ob = r.algorithm.overlong_buffer  # DAPO's length penalty (0 unless set)
        penalty = overlong_penalty(lengths, r.generator.sampling.max_tokens, ob.len, ob.penalty_factor)
        rewards = torch.tensor([t for s in scores for t in s.totals], dtype=torch.float64) + penalty
        advantages = estimate(r.algorithm.adv_estimator, rewards, G, lengths, r.algorithm.norm_adv_by_std).tolist()
        trained, ref_work = self.train_on(rollouts, advantages, refs)
        self.version += self.updated(trained)
        memory = self.pools.ask_memory()  # answered while the weights go out: a push's own peak shows a step later
        synced = self.engines.sync(self.learner_probe) if self.push_due(step) else NO_SYNC  # waits for generation ahead
        if r.trainer.dump_freq and (step % r.trainer.dump_freq == 0 or step == self.total_steps()):
            self.dump(f"train_data_step{step}", step, rollouts, scores, advantages)
        seconds = time.perf_counter() - start
        learner = trained["timing_s/update_actor"] + trained["timing_s/old_log_prob"] + synced["sync/seconds"]
        work = {
            "generator": [Work(s.seconds + synced["sync/seconds"], len(s.response_lengths)) for s in stats],
            "learner": [Work(learner, len(samples.costs) // r.learner.world_size)] * r.learner.world_size,
            "reference": ref_work,
            "reward": [Work(s.seconds, len(s.totals)) for s in scores],
        }
        return {
            **rollout_metrics(stats, scores),
            **trained,
            **synced,
            **staleness,
            **kept,
            "reward/overlong_penalty/mean": penalty.mean().item(),
            **perf_metrics(stats, trained, seconds, self.pools.facts, self.pools.devices(), self.r),
            **pool_metrics(work, {p: len(a) for p, a in self.pools.actors.items()}, seconds),
            **self.pools.memory(memory),
            "fault/generator_restarts": self.pools.generator_restarts,
            "fault/skipped_steps": self.skipped["total"],
            "timing_s/step": seconds,
        }

    def overlaps(self, step: int) -> bool:
        """Whether the next batch is launched during this step. Not before a scheduled checkpoint: the next
        batch then waits for this step's weights, as it will in a run resumed from that checkpoint."""
        return self.r.algorithm.max_staleness > 0 and step < self.total_steps() and not self.saving(step)

    def push_due(self, step: int) -> bool:
        """Whether to push the learner's weights now: when the next batch launched would otherwise be more than
        max_staleness versions behind the learner when it trains (at 0: after every update), and before
        validation and checkpoints."""
        behind = self.version - self.engines.version
        return behind > 0 and (
            behind + 1 > self.r.algorithm.max_staleness or self.validating(step) or self.saving(step)
        )

    def check_staleness(self, stats: list) -> dict[str, float]:
        """The batch's age against the learner's weights (a sample older than max_staleness is never trained on),
        and from the engines' clocks, how much of its generation overlapped the last update and how long before
        that update ended it started (negative: after)."""
        oldest = min(s.policy_version for s in stats)
        if self.version - oldest > self.r.algorithm.max_staleness:
            raise RunError(
                f"samples of version {oldest} reached a learner at version {self.version}: older than "
                f"algorithm.max_staleness={self.r.algorithm.max_staleness}"
            )
        start, end = min(s.window[0] for s in stats), max(s.window[1] for s in stats)
        overlap = max(0.0, min(end, self.last_update[1]) - max(start, self.last_update[0]))
        return {
            "rollout/staleness": float(self.version - oldest),
            "perf/gen_overlap_s": overlap,
            "perf/gen_ahead_s": self.last_update[1] - start if self.last_update[1] else 0.0,
        }

    def keep_signal(self, step: int, rollouts: list, stats: list, scores: list) -> tuple[list, list, list, dict]:
        """DAPO's dynamic sampling: keep the groups whose rewards are not all equal; while fewer than
        data.train_batch_size are kept, generate the stream's next prompts too, up to
        filter_groups.max_num_gen_batches batches in all, then fill up with dropped groups (equal scores: advantage
        0 unless the overlong penalty tells their lengths apart). Only the scores are read here; a task per rollout
        cuts the chosen groups out of it."""
        G, want, cfg = self.r.algorithm.group_size, self.r.data.train_batch_size, self.r.algorithm.filter_groups
        batches, kept, dropped = [], [], []
        while True:
            signal = signal_groups(len(batches), stats, scores, G)
            kept, dropped = kept + signal[0], dropped + signal[1]
            batches.append((rollouts, stats, scores))
            if len(kept) >= want or len(batches) >= cfg.max_num_gen_batches:
                break
            rollouts, stats = self.engines.collect(self.launch(step))
            scores = self.check_rewards(self._get(self.score(rollouts, Samples.of(stats)), "reward"), counted=False)
        chosen, cut = sorted((kept + dropped)[:want]), ray.remote(select_groups).options(num_cpus=0)
        taken = [
            (rollouts[i], groups, st, sc)
            for b, (rollouts, stats, scores) in enumerate(batches)
            for i, groups, st, sc in take_groups(b, stats, scores, chosen, G, self.r.generator.sampling.max_tokens)
        ]
        every = [sc for _, _, scores in batches for sc in scores]  # reward work and faults of all that was scored
        first = dataclasses.replace(
            taken[0][3],
            errors=sum(sc.errors for sc in every),
            timeouts=sum(sc.timeouts for sc in every),
            seconds=sum(sc.seconds for sc in every),
        )
        return (
            [cut.remote([groups], G, ref) for ref, groups, _, _ in taken],
            [st for _, _, st, _ in taken],
            [first] + [sc for _, _, _, sc in taken[1:]],
            {
                "filter_groups/num_gen_batches": len(batches),
                "filter_groups/kept_groups": len(kept),
                "filter_groups/dropped_groups": len(dropped),
                "filter_groups/filled_groups": max(0, want - len(kept)),
            },
        )

    def check_rewards(self, scores: list, counted: bool = True) -> list:
        """`scores`, after showing the first failure of each reward function once; a training batch (`counted`)
        whose functions failed on more than reward.max_error_share of its samples max_error_steps times in a row
        stops the run with the failure."""
        for name, text in ((n, t) for s in scores for n, t in s.failures.items() if n not in self.reward_failures):
            self.reward_failures[name] = text
            self.say(
                f"reward {name} failed; its first failure (the next are counted in reward/errors and "
                f"reward/timeouts, logs in {self.pools.log_dir()}/reward-*.log):\n{text.rstrip()}"
            )
        if not counted:
            return scores
        w, n = self.r.reward, sum(len(s.totals) for s in scores)
        share = sum(s.errors + s.timeouts for s in scores) / n
        self.failing_steps = self.failing_steps + 1 if share > w.max_error_share else 0
        if w.max_error_steps and self.failing_steps >= w.max_error_steps:
            last = next(reversed(self.reward_failures.values()), "")
            raise RunError(
                f"reward functions failed on {share:.0%} of the samples, over reward.max_error_share="
                f"{w.max_error_share:g} for {self.failing_steps} steps in a row (reward.max_error_steps): "
                f"fix the function, or raise the limits. Its failure:\n{last.rstrip()}"
            )
        return scores

    def updated(self, trained: dict[str, float]) -> bool:
        """Whether the learner's weights changed; a step whose every update was skipped (non-finite loss or
        gradients, or every sample masked by rollout rejection) is counted, its weights are not pushed, and
        max_skipped_steps in a row stop the run."""
        if trained["actor/skipped_updates"] < trained["actor/updates"]:
            self.skipped["in_a_row"] = 0
            return True
        self.skipped["in_a_row"] += 1
        self.skipped["total"] += 1
        limit = self.r.trainer.max_skipped_steps
        why = (
            "every sample was masked by rollout rejection (algorithm.rollout_correction.rollout_rs)"
            if trained.get("actor/empty_updates") == trained["actor/updates"]
            else "non-finite loss or gradients"
        )
        self.say(f"{why}: update skipped, weights not pushed ({self.skipped['in_a_row']} in a row)")
        if self.skipped["in_a_row"] >= limit:
            raise RunError(
                f"{limit} steps in a row had non-finite loss or gradients (trainer.max_skipped_steps="
                f"{limit}); the weights are those of the last good step: lower learner.optim.lr, check "
                "the rewards, or resume from a checkpoint"
            )
        return False

    # --- hops --------------------------------------------------------------------------

    def launch(self, step: int) -> Batch:
        """Send the stream's next prompts to the engines."""
        return self.engines.launch(step, [Prompt.from_row(uid, row) for uid, row in self.stream.next_batch()])

    def spread(self, pool: str, rollouts: list, samples: Samples, by_tokens: bool) -> list[tuple]:
        """The step's samples cut into contiguous shares of near-equal tokens (or samples) over every actor of
        `pool`: (actor, rollout refs, spans) per actor with a share, in sample order."""
        actors = self.pools.actors[pool]
        costs = samples.costs if by_tokens else [1] * len(samples.costs)
        shares = [spans_of(samples.counts, share) for share in balanced_ranges(costs, len(actors))]
        return [
            (actor, [rollouts[i] for i, _, _ in pieces], [(a, b) for _, a, b in pieces])
            for actor, pieces in zip(actors, shares)
            if pieces
        ]

    def score(self, rollouts: list, samples: Samples) -> list:
        """Scores refs, one per reward actor: every actor scores an even share of the samples."""
        return [a.score.remote(refs, spans) for a, refs, spans in self.spread("reward", rollouts, samples, False)]

    def reference_logprobs(self, rollouts: list, samples: Samples) -> list:
        """(logprobs ref, Work ref) per reference actor, each an even share of the tokens; none without a KL term.
        Every actor is called, with or without a share: their forwards are collective (one FSDP2 group)."""
        shares = {id(a): (refs, spans) for a, refs, spans in self.spread("reference", rollouts, samples, True)}
        return [
            a.logprobs.options(num_returns=2).remote(*shares.get(id(a), ([], [])))
            for a in self.pools.actors["reference"]
        ]

    def train_on(self, rollouts: list, advantages: list[float], refs: list) -> tuple[dict[str, float], list[Work]]:
        """One learner step on the rollouts behind the refs, with reference logprobs when there is a KL term;
        the learner's metrics and the reference actors' work. Keeps the learner's probe logprobs of its new weights
        (``learner_probe``), for the sync that pushes them."""
        ref_lps = [lp for lp, _ in refs] or None
        keep_from = min([self.engines.version] + [b.version for b in self.inflight.values()])
        probe = self.inputs.probe_ids if self.pools.actors["generator"] else None
        update = self._get(
            [
                l.train.remote(rollouts, ref_lps, advantages, self.version, keep_from, probe)
                for l in self.pools.actors["learner"]
            ],
            "learner train",
        )[0]
        trained, self.last_update, self.learner_probe = update.metrics, update.window, update.probe
        ref_work = self._get([w for _, w in refs], "reference") if refs else []
        if ref_work:  # with LoRA the learner scores the reference itself (timing_s/ref is its own)
            trained["timing_s/ref"] = max(w.seconds for w in ref_work)
        return trained, ref_work

    def validate(self, step: int) -> dict[str, float]:
        """pass@1 (and pass@val_n) per data source over the validation rows, with the validation sampling."""
        g = self.r.generator
        prompts = [Prompt.from_row(i, row) for i, row in enumerate(self.inputs.val_rows)]
        sampling = dataclasses.replace(g.sampling, temperature=g.val_temperature)
        rollouts, stats = self.engines.generate(prompts, g.val_n, step, sampling)
        scores = self.check_rewards(self._get(self.score(rollouts, Samples.of(stats)), "validation reward"), False)
        if self.log and self.log.trackers:  # a few samples of the first engine's share, as a table
            self.log.table(step, sample_table(self._get(rollouts[0], "validation samples"), scores[0].totals))
        if self.r.trainer.dump_freq:
            self.dump(f"val_data_step{step}", step, rollouts, scores, None)
        perfect = sum(f.weight for f in self.r.reward.functions if f.weight > 0)
        return validation_metrics(
            [p.data_source for p in prompts], [t for s in scores for t in s.totals], g.val_n, perfect
        )

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
            self._get(self.pending_dumps[:done], "rollout dump")
            self.pending_dumps = self.pending_dumps[done:]

    # --- checkpoints -------------------------------------------------------------------

    def save(self, step: int, last_val: float | None) -> Path:
        """Learner shards (every rank), then trainer state, tokenizer and manifest; committed by a rename."""
        tmp = checkpoint.staging_dir(self.inputs.output_dir, step)
        learners = self.pools.actors["learner"]
        saved = self._get([l.save.remote(str(tmp / "learner")) for l in learners], "checkpoint save")[0]
        if fault_at("exit_mid_checkpoint", step):
            os._exit(1)  # fault test: the job dies with the shards written and the checkpoint not committed
        state = {
            "step": step,
            "version": self.version,
            "data": dataclasses.asdict(self.stream.position),
            "scheduler": saved["scheduler"],
            "best": self.best.state(),
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
        )

    def restore(self, ckpt: Path) -> int:
        """Learner weights and optimizer, scheduler, data position and version; generators get the weights."""
        state = checkpoint.load_state(ckpt)
        self.best = early_stop.Best.of(self.r.trainer, state.get("best"))
        self._get(
            [l.load.remote(str(ckpt / "learner"), state["scheduler"]) for l in self.pools.actors["learner"]],
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
        if self.pools.actors["generator"]:
            self.engines.push(self.version)  # before the first rollout
        return state["step"]

    # --- run ---------------------------------------------------------------------------

    def total_steps(self) -> int:
        t = self.r.trainer
        return t.total_steps or t.total_epochs * self.stream.steps_per_epoch

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
            if t.log_level == "info":
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
            if self.pools.actors["generator"]:
                diff = self.engines.probe()
                self.say(
                    f"{since_start()} first probe: sync/logprob_diff {diff:.3g} (the engines' logprobs against "
                    "the learner's, on the same tokens)"
                )
            if self.r.model.lora.rank and self.pools.metas:
                what = {
                    "adapters": "the adapters only, loaded in place by vLLM's LoRA support",
                    "merged": "every weight, the adapters merged (model.lora.sync=merged)",
                }[self.r.model.lora.sync]
                self.say(f"LoRA: a sync sends {what}: {sum(m.nbytes for m in self.pools.metas) / 1e6:.3g} MB")
            if t.val_before_train and self.inputs.val_rows and not done:
                self.say(f"{since_start()} validating before training: {len(self.inputs.val_rows)} prompts")
                self.log.log(0, self.validate(0))
            self.say(f"{since_start()} training: steps {done + 1} to {total}")
            last_val, save_seconds = None, 0.0
            for step in range(done + 1, total + 1):
                metrics, improved = self.step(step), False
                if self.validating(step):
                    metrics.update(self.validate(step))
                    last_val = statistics.fmean(v for k, v in metrics.items() if k.endswith("/pass@1"))
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
            self.flush_dumps()
            self.log.finish(self.best.line() if self.best.value is not None else None)
        finally:
            self.log.close()
            self.shutdown()

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

    def pools_needed(self) -> tuple[str, ...]:
        """The pools a run starts."""
        return POOLS

    def start(self, pools: tuple[str, ...] = POOLS) -> None:
        """Start the pools (all, or `pools` only) and write placement.json."""
        self.pools.start(pools, self.say)
        self.pools.write_placement(self.inputs.output_dir / "placement.json")

    def shutdown(self) -> None:
        self.pools.shutdown()

    def say(self, line: str) -> None:
        (self.log.say if self.log else print)(line)

    def _get(self, refs, what: str):
        return self.pools.call(refs, what)
