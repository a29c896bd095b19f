"""The GRPO step (the job around it, grpo_ray.runner, is shared with SFT). One step reads top to bottom:

    prompts ──> generators ──rollout refs──┬──> rewards, reward model ──scores (small)──> advantages ──┐
                                           ├──> reference, teacher ──logprob refs──────────────────┐ │
                                           └──────────────────────────────────────────────────────> learner (FSDP2)
                                                                                                     │
    generators <──────────── weight broadcast (gloo | nccl), then a logprob probe ───────────────────┘

The schedule (``algorithm.schedule``) hands the step its batch: its batch source (``grpo_ray.sources``) gives the
step's batch, sent to the scorers, and readies the next while the learner trains; its rules
(``grpo_ray.schedules``, which ``plan`` simulates too) say when weights are pushed and how stale a trained sample may
be. Batched at max_staleness k >= 1, the next batch is generated while the learner trains this one, and once
generated, its rewards (reward functions, reward model) and frozen logprobs (reference, teacher) are sent at once,
while the learner still trains, and read when its step starts:

    engines   │ gen s+1 ·······│        │push│ gen s+2 ·······│        │push│
    frozen    │                │ref, teacher, rewards s+1     │ref, teacher, rewards s+2
    learner   │ train s ·················│    │ train s+1 ················│    │
"""

from __future__ import annotations

import time
from functools import partial

import ray
import torch

from grpo_ray import schedules, sources
from grpo_ray.algo.advantage import TURN_ESTIMATORS, overlong_penalty, per_turn_advantages
from grpo_ray.algo.advantage import advantages as estimate
from grpo_ray.algo.batching import Samples
from grpo_ray.config import GENERATOR, KINDS, LEARNER, TEACHER, Recipe
from grpo_ray.engines import split
from grpo_ray.errors import Preempted, RunError
from grpo_ray.lengths import response_budget
from grpo_ray.pools import PoolFault
from grpo_ray.runner import Runner
from grpo_ray.scorers import RULES
from grpo_ray.setup_run import RunInputs
from grpo_ray.sources import Collected, Hooks
from grpo_ray.sources.dapo import keep_signal
from grpo_ray.telemetry.metrics import perf_metrics, pool_metrics, rollout_metrics
from grpo_ray.types import Prompt, Rollout, Work

__all__ = ["GRPOController", "RunError", "Preempted"]

NO_SYNC = {"sync/seconds": 0.0, "timing_s/sync_weights": 0.0}


class GRPOController(Runner):
    """GRPO: generate, score, reference logprobs, advantages, learner update, push; on the schedule above."""

    def __init__(self, recipe: Recipe, inputs: RunInputs):
        super().__init__(recipe, inputs)
        self.learner_probe: list[float] | None = None
        """The learner's probe logprobs at its weights now (its last update computed them), for the sync's check."""
        self.last_update: tuple[float, float] = (0.0, 0.0)
        """Wall-clock window of the last learner update, to measure what generation overlapped it."""
        self.skipped = {"in_a_row": 0, "total": 0}
        self.schedule = schedules.of(recipe.algorithm)
        """When weights are pushed and how stale a sample may be (``algorithm.schedule``)."""
        hooks = Hooks(
            recipe=recipe,
            engines=self.engines,
            schedule=self.schedule,
            prompts=self.next_prompts,
            prompt_of=lambda uid: Prompt.from_row(uid, inputs.train_rows[uid]),
            send=self.sent,
            say=self.say,
            last_step=self.total_steps,
            saving=self.saving,
        )
        self.source = sources.of(hooks)
        """Each step's batch (the schedule's ``source``)."""

    # --- one step ----------------------------------------------------------------------

    def step(self, step: int) -> dict[str, float]:
        start, dapo = time.perf_counter(), self.r.algorithm.filter_groups.enable
        self.engines.grow(self.version)  # generator.max_engines: engines placed and loaded since join the next batch
        (rollouts, stats, sent, _), flow = self.source.next(step, self.version, self.last_update)  # maybe scored
        scores, learned, learned_work = self.scorers.rewards(sent)
        frozen, kept = sent.tokens, {}
        if dapo:  # dynamic sampling: only groups whose rewards differ, more prompts until the batch is full
            rollouts, stats, scores, kept = keep_signal(
                self.r, (rollouts, stats, scores), lambda: self.scored_more(step)
            )
            frozen = self.scorers.send_tokens(rollouts, Samples.of(stats))
        staleness = self.schedule.staleness(stats, self.version, self.last_update)
        advantages, penalty = self.advantages(stats, scores)
        self.pools.copy_state(LEARNER)  # trainer.fault_tolerance=all: the state a lost rank's group starts from
        update = self.send_update(rollouts, advantages, frozen)
        again = partial(self.send_update, rollouts, advantages, frozen, self.version)  # (a rank lost in the push)
        self.source.ahead(step, self.version)  # the next batch readied (and sent to the scorers) meanwhile
        trained, work = self.wait_update(update, frozen, (rollouts, advantages, Samples.of(stats)))
        self.version += self.updated(trained)
        memory = self.pools.ask_memory()  # answered while the weights go out: a push's own peak shows a step later
        synced = self.engines.sync(self.learner_probe, again) if self.push_due(step) else NO_SYNC  # (generation ahead)
        if self.r.trainer.dump_freq and (step % self.r.trainer.dump_freq == 0 or step == self.total_steps()):
            self.dump(f"train_data_step{step}", step, rollouts, scores, advantages)
        extra = {
            **staleness,
            **kept,
            **learned,
            **flow,
            **self.pools.copy_costs(),
            "reward/overlong_penalty/mean": penalty,
        }
        if self.scorers.learned_pool:
            work[self.scorers.learned_pool] = learned_work
        out = self.metrics(time.perf_counter() - start, stats, scores, trained, synced, work, memory, extra)
        if flow:  # the learner's side waiting on the engines' groups
            out["perf/learner_idle_share"] = flow["timing_s/learner_wait"] / out["timing_s/step"]
        return out

    def advantages(self, stats: list, scores: list) -> tuple[list, float]:
        """Each sample's advantage from its group's rewards (less DAPO's overlong penalty), and the mean penalty.
        Under a per-turn estimator (``TURN_ESTIMATORS``), each sample's list of its model turns' advantages."""
        a, r = self.r.algorithm, self.r
        lengths = torch.tensor([n for s in stats for n in s.response_lengths])
        penalty = overlong_penalty(lengths, response_budget(r), a.overlong_buffer.len, a.overlong_buffer.penalty_factor)
        rewards = torch.tensor([t for s in scores for t in s.totals], dtype=torch.float64) + penalty
        if a.adv_estimator in TURN_ESTIMATORS:  # single-turn samples: one turn, no environment reward
            turns = [t for s in stats for t in (s.turn_rewards or [[0.0]] * len(s.response_lengths))]
            return per_turn_advantages(
                a.adv_estimator, rewards.tolist(), turns, a.group_size, a.norm_adv_by_std
            ), penalty.mean().item()
        return estimate(
            a.adv_estimator, rewards, a.group_size, lengths, a.norm_adv_by_std
        ).tolist(), penalty.mean().item()

    def metrics(self, seconds, stats, scores, trained, synced, work, memory, extra) -> dict[str, float]:
        """The step's metrics: rollouts, rewards, the learner's, the sync's, speed, each pool's work (`work`: the
        model pools') and memory."""
        r, samples = self.r, Samples.of(stats)
        learner = trained["timing_s/update_actor"] + trained["timing_s/old_log_prob"] + synced["sync/seconds"]
        work = {
            GENERATOR: [Work(s.seconds + synced["sync/seconds"], len(s.response_lengths)) for s in stats],
            LEARNER: [Work(learner, len(samples.costs) // r.learner.world_size)] * r.learner.world_size,
            **{k.name: work.get(k.name, []) for k in KINDS.values() if k.model and k.signal},  # the model scorers
            RULES: [Work(s.seconds, len(s.totals)) for s in scores],
        }
        out = {
            **rollout_metrics(stats, scores),
            **trained,
            **synced,
            **extra,
            **perf_metrics(stats, trained, seconds, self.pools.facts, self.pools.devices(), r),
            **pool_metrics(work, {p: len(a) for p, a in self.pools.actors.items()}, seconds),
            **self.pools.memory(memory),
            **self.pools.fault_metrics(),
            "fault/skipped_steps": self.skipped["total"],
            "timing_s/step": seconds,
        }
        if "timing_s/teacher" in trained:  # every token of the step went through the teacher
            out["perf/teacher_tokens_per_s"] = out["perf/total_num_tokens"] / max(trained["timing_s/teacher"], 1e-9)
        return out

    def push_due(self, step: int) -> bool:
        """Whether to push the learner's weights now (the schedule's ``push_due``)."""
        behind = self.version - self.engines.version
        return self.schedule.push_due(behind, self.validating(step), self.saving(step))

    def scored_more(self, step: int) -> tuple[list, list, list]:
        """DAPO's next batch for `step` from the source, with its rewards (not counted: it may be dropped)."""
        rollouts, stats = self.source.more(step, self.version)
        sent = self.scorers.send(rollouts, Samples.of(stats), tokens=False)
        return rollouts, stats, self.scorers.rewards(sent, counted=False)[0]

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

    def validate(self, step: int) -> dict[str, float]:
        """The policy's validation; before training, the teacher's too (``validate_teacher``)."""
        out = super().validate(step)
        return {**out, **self.validate_teacher()} if step == 0 else out

    def validate_teacher(self) -> dict[str, float]:
        """teacher/val/<data_source>/pass@1: the teacher's greedy answers to the validation prompts, generated by
        the teacher pool (each actor an even share) and scored by the reward pool, dumped as
        rollouts/val_teacher_step0.jsonl; none without a teacher, with teacher.validate off, with an environment
        (its episodes run in the engines) or with image rows (its generate reads text)."""
        if not self.pools.actors[TEACHER] or not self.r.teacher.validate:
            return {}
        prompts = [Prompt.from_row(i, row) for i, row in enumerate(self.inputs.val_rows)]
        why = "multi-turn episodes run only in the engines" if self.r.environment.name else ""
        why = why or ("its generate reads text alone so far" if any(p.images for p in prompts) else "")
        if why:
            self.say(f"teacher validation skipped: {why}")
            return {}
        start, actors = time.perf_counter(), self.pools.actors[TEACHER]
        calls = [
            a.rollout.options(num_returns=2).remote(share, self.r.generator.sampling.max_tokens)
            for a, share in zip(actors, split(prompts, len(actors)))
        ]
        rollouts, stats = [c[0] for c in calls], self.call([c[1] for c in calls], "teacher validation")
        out = {f"teacher/{k}": v for k, v in self.pass_rates(0, "val_teacher", prompts, rollouts, stats, 1)[1].items()}
        said = ", ".join(f"{k.split('/', 2)[2]} {v:.3f}" for k, v in out.items())
        self.say(f"teacher, greedy: {said} ({time.perf_counter() - start:.0f}s, transformers' generate)")
        return out

    def sent(self, rollouts: list, stats: list, version: int) -> Collected:
        """Rollouts from the engines, sent to the scorers."""
        self.failures.episodes(stats)  # its first failures said, a run of failing steps stops the run
        dapo = self.r.algorithm.filter_groups.enable  # DAPO: the token scorers after its groups are chosen
        return Collected(rollouts, stats, self.scorers.send(rollouts, Samples.of(stats), not dapo), version)

    def next_prompts(self) -> list[Prompt]:
        """The stream's next batch of prompts."""
        return [Prompt.from_row(uid, row) for uid, row in self.stream.next_batch()]

    def held_state(self, step: int) -> dict:
        """What the batch source holds after `step` (streaming: the prompts in flight), for a checkpoint."""
        return self.source.state(step)

    def restore_held(self, state: dict) -> None:
        self.source.restore(state)

    def send_update(self, rollouts: list, advantages: list[float], frozen: dict, version: int | None = None) -> list:
        """Start one learner step on the rollouts behind the refs, with the reference's logprobs when there is a
        KL term and the teacher's when distilling (refs: the learner waits for them), from the learner's weights at
        `version` (default: the current); its refs."""
        signals = self.scorers.signals(frozen)
        keep_from = min([self.engines.version] + self.source.held_versions())
        probe = self.inputs.probe_ids if self.pools.generators else None
        at = self.version if version is None else version
        return [l.train.remote(rollouts, advantages, at, signals, keep_from, probe) for l in self.pools.learners]

    def wait_update(
        self, update: list, frozen: dict[str, list], batch: tuple
    ) -> tuple[dict[str, float], dict[str, list[Work]]]:
        """The learner's metrics and the frozen pools' work. Keeps the learner's probe logprobs of its new weights
        (``learner_probe``), for the sync that pushes them. A token scorer that lost an actor during `batch`
        (rollout refs, advantages, samples) fails the learner as it reads the signal, before it trains: its pool is
        started again, scores the batch again, and the learner is sent the step again, once (``Scorers.rescored``).
        A learner rank lost, where the run keeps copies of the ranks' state (trainer.fault_tolerance=all), starts
        the group again from the copies taken as the step began, and the step is sent again, once."""
        try:
            update = self.call(update, "learner train")[0]
        except PoolFault as e:
            if (died := self.pools.lost(LEARNER, e)) and self.pools.lost_policy(LEARNER) == "stop":  # no copy kept
                raise
            again = self.scorers.rescored(frozen, batch[0], batch[2])  # a scorer lost beside it (the same node)
            if died:
                self.say(f"{e}; starting the learner group again from the copy of its state as the step began")
                self.pools.recover(LEARNER)
                self.pools.redid(LEARNER, 1)  # the step, trained again from the copies
            elif again is None:  # the learner's own failure
                raise
            frozen = again or frozen
            update = self.call(self.send_update(*batch[:2], frozen), "learner train (again)")[0]
        previous = self.last_update
        trained, self.last_update, self.learner_probe = update.metrics, update.window, update.probe
        work = self.scorers.token_work(frozen)
        windows = [w.window for done in work.values() for w in done if w.samples]
        if windows:  # one step off, the frozen pools score this batch while the learner trains the last one
            start, end = min(a for a, _ in windows), max(b for _, b in windows)
            trained["perf/frozen_overlap_s"] = max(0.0, min(end, previous[1]) - max(start, previous[0]))
        for pool, done in work.items():  # with LoRA the learner scores the reference itself (timing_s/ref its own)
            if done:
                trained[KINDS[pool].timing_key] = max(w.seconds for w in done)
        return trained, work

    def replay(self, rollouts: list[Rollout], advantages: list[float]) -> dict[str, float]:
        """One learner update on `rollouts` (a dump's), taking the loaded weights as those that generated them;
        the learner's metrics. Only the learner, reference and teacher pools need to run."""
        refs = [ray.put(r) for r in rollouts]
        self.version = self.engines.version = rollouts[0].policy_version
        samples = Samples.of_rollouts(rollouts)
        frozen = self.scorers.send_tokens(refs, samples)
        return self.wait_update(self.send_update(refs, advantages, frozen), frozen, (refs, advantages, samples))[0]
