"""The GRPO controller: it builds the pools, then runs steps. One step reads top to bottom:

    prompts ──> generators ──rollout refs──┬──> rewards ──scores (small)──> advantages ──┐
                                           ├──> reference ──logprob refs───────────────┐ │
                                           └──────────────────────────────────────────> learner (FSDP2)
                                                                                         │
    generators <──────────── weight broadcast (gloo | nccl), then a logprob probe ───────┘

Rollouts and logprobs travel between pools as Ray object refs; the controller only
gathers rewards, lengths, timings and metrics. Generation of step k+1 could overlap
training of step k by launching the next ``generate`` before ``train`` returns: the
hops are already separate remote calls, so that is a change of schedule here.
"""

from __future__ import annotations

import os
import time

import ray
import torch
from ray.util.placement_group import remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from grpo_ray import placement
from grpo_ray.algo.advantage import group_advantages
from grpo_ray.config import Recipe
from grpo_ray.data.stream import PromptStream
from grpo_ray.metrics import MetricsLog, rollout_metrics
from grpo_ray.roles.generator import Generator, engine_env
from grpo_ray.roles.learner import Learner
from grpo_ray.roles.reference import Reference
from grpo_ray.roles.reward import RewardWorker
from grpo_ray.setup_run import RunInputs
from grpo_ray.sync import backend_for
from grpo_ray.types import Prompt


class RunError(RuntimeError):
    """The run cannot go on (a pool call timed out, a weight sync went wrong); the message says which."""


class Controller:
    def __init__(self, recipe: Recipe, inputs: RunInputs):
        self.r, self.inputs = recipe, inputs
        self.stream = PromptStream(inputs.train_rows, recipe.data.train_batch_size, recipe.trainer.seed,
                                   recipe.data.shuffle)
        self.version = 0
        self.groups: list = []
        self.actors: dict[str, list] = {p: [] for p in placement.POOLS}

    # --- setup -------------------------------------------------------------------------

    def _actor(self, cls, pool: str, index: int, pgs: dict, cpus: float, env: dict | None = None):
        pg, gpus = pgs[pool]
        plan = placement.plan(self.r)[pool]
        opts = dict(num_cpus=cpus, num_gpus=gpus, resources=plan.resources or None, name=None,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index),
                    runtime_env={"env_vars": {"OMP_NUM_THREADS": str(max(1, round(cpus))), **(env or {})}})
        return ray.remote(cls).options(**opts)

    def start(self) -> None:
        """Reserve the cluster, start every pool, join the learner group and the weight-sync group."""
        r, path = self.r, self.inputs.model_path
        pgs = placement.reserve(r)
        self.groups = list({id(pg): pg for pg, _ in pgs.values()}.values())
        g = r.generator
        max_len = g.max_model_len or r.data.max_prompt_length + g.sampling.max_tokens
        self.actors["generator"] = [
            self._actor(Generator, "generator", i, pgs, g.num_cpus, engine_env(r.cluster.device, g.num_cpus))
            .remote(path, g, max_len, r.trainer.seed + i, r.model.trust_remote_code) for i in range(g.num_engines)]
        self.actors["learner"] = [
            self._actor(Learner, "learner", i, pgs, r.learner.num_cpus).remote(path, r, i, r.learner.world_size)
            for i in range(r.learner.world_size)]
        if r.algorithm.kl_coef > 0:
            self.actors["reference"] = [
                self._actor(Reference, "reference", i, pgs, r.reference.num_cpus).remote(
                    path, r.cluster.device, r.reference.micro_batch_size, g.sampling.temperature, r.reference.num_cpus,
                    r.model.trust_remote_code) for i in range(r.reference.num_actors)]
        functions = [(f.name, f.weight) for f in r.reward.functions]
        self.actors["reward"] = [
            self._actor(RewardWorker, "reward", i, pgs, r.reward.num_cpus).remote(
                functions, r.reward.timeout_s, r.data.response_prefix) for i in range(r.reward.num_actors)]

        learners = self.actors["learner"]
        host, port = self._get(learners[0].address.remote(), "learner address")
        self._get([l.setup.remote(host, port) for l in learners], "learner setup")
        self.metas = self._get(learners[0].weight_metas.remote(), "weight metadata")
        tp = g.tensor_parallel_size
        world = 1 + g.num_engines * tp
        host, port = self._get(learners[0].address.remote(), "sync address")
        timeout = r.trainer.call_timeout_s
        self._get([learners[0].init_sync.remote(host, port, world, timeout)] +
                  [gen.init_sync.remote(backend_for(r.cluster.device), host, port, 1 + i * tp, world, timeout)
                   for i, gen in enumerate(self.actors["generator"])], "weight-sync group")
        where = {pool: self._get([a.where.remote() for a in actors], f"{pool} start") for pool, actors in
                 self.actors.items()}
        plans = placement.plan(r)
        placement.write_placement(self.inputs.output_dir / "placement.json", {
            pool: [{"actor": i, **w, "resources": {"CPU": plans[pool].cpus, "GPU": plans[pool].gpus,
                                                   **plans[pool].resources}} for i, w in enumerate(ws)]
            for pool, ws in where.items()})

    # --- one step ----------------------------------------------------------------------

    def step(self, step: int) -> dict[str, float]:
        r, G = self.r, self.r.algorithm.group_size
        start = time.perf_counter()
        batch = [Prompt(row["prompt_ids"], row["reward_model"]["ground_truth"], row["data_source"],
                        row.get("extra_info") or {}, uid) for uid, row in self.stream.next_batch()]
        shards = split(batch, len(self.actors["generator"]))
        generated = [gen.generate.options(num_returns=2).remote(shard, G)
                     for gen, shard in zip(self.actors["generator"], shards) if shard]
        rollouts = [rollout for rollout, _ in generated]
        scores = [self._pick("reward", i).score.remote([ro]) for i, ro in enumerate(rollouts)]
        refs = [self._pick("reference", i).logprobs.options(num_returns=2).remote([ro])
                for i, ro in enumerate(rollouts)] if self.actors["reference"] else []
        stats = self._get([s for _, s in generated], "generate")
        scores = self._get(scores, "reward")
        rewards = torch.tensor([t for s in scores for t in s.totals])
        advantages = group_advantages(rewards, G, r.algorithm.norm_adv_by_std)
        ref_lps = [lp for lp, _ in refs] or None
        trained = self._get([l.train.remote(rollouts, ref_lps, advantages.tolist()) for l in self.actors["learner"]],
                            "learner train")[0]
        ref_seconds = max(self._get([s for _, s in refs], "reference")) if refs else 0.0
        synced = self.sync_weights()
        return {**rollout_metrics(stats, scores, r.generator.sampling.max_tokens), **trained, **synced,
                "timing_s/ref": ref_seconds, "timing_s/step": time.perf_counter() - start}

    # --- weight sync -------------------------------------------------------------------

    def probe(self) -> float:
        """Mean absolute difference of generator and learner logprobs on a fixed sequence."""
        ids = self.inputs.probe_ids
        gen = self._get(self.actors["generator"][0].prompt_logprobs.remote(ids), "generator probe")
        learner = self._get([l.probe_logprobs.remote(ids) for l in self.actors["learner"]], "learner probe")[0]
        return sum(abs(a - b) for a, b in zip(gen, learner)) / len(gen)

    def sync_weights(self) -> dict[str, float]:
        """Push the learner's weights to every generator, then check them with the probe."""
        start = time.perf_counter()
        self.version += 1
        bucket = self.r.trainer.bucket_mb << 20
        pushed = self._get([l.push_weights.remote(self.metas, bucket) for l in self.actors["learner"]] +
                           [g.receive_weights.remote(self.metas, bucket, self.version)
                            for g in self.actors["generator"]], "weight sync")
        seconds = time.perf_counter() - start
        diff = self.probe()
        if diff > self.r.trainer.max_sync_logprob_diff:
            raise RunError(f"weight sync to version {self.version}: generator and learner logprobs differ by "
                           f"{diff:.3g} on the probe, over trainer.max_sync_logprob_diff={self.r.trainer.max_sync_logprob_diff}")
        nbytes = pushed[0]["bytes"]
        return {"sync/logprob_diff": diff, "sync/seconds": seconds, "sync/GBps": nbytes / seconds / 1e9,
                "timing_s/sync_weights": seconds}

    # --- run ---------------------------------------------------------------------------

    def total_steps(self) -> int:
        t = self.r.trainer
        return t.total_steps or t.total_epochs * self.stream.steps_per_epoch

    def run(self) -> None:
        log = MetricsLog(self.inputs.output_dir, self.r.trainer.loggers)
        try:
            self.start()
            print(f"pools started; probe before training: sync/logprob_diff {self.probe():.3g}", flush=True)
            for step in range(1, self.total_steps() + 1):
                log.log(step, self.step(step))
        finally:
            log.close()
            self.shutdown()

    def shutdown(self) -> None:
        """Stop every actor and release the placement groups (by handle, not by name)."""
        for actors in self.actors.values():
            for a in actors:
                ray.kill(a)
        for pg in self.groups:
            remove_placement_group(pg)
        self.actors = {p: [] for p in placement.POOLS}
        self.groups = []

    def _pick(self, pool: str, i: int):
        actors = self.actors[pool]
        return actors[i % len(actors)]

    def _get(self, refs, what: str):
        try:
            return ray.get(refs, timeout=self.r.trainer.call_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise RunError(f"{what} did not finish within trainer.call_timeout_s={self.r.trainer.call_timeout_s:g}s") from None


def split(items: list, parts: int) -> list[list]:
    """`items` cut into `parts` contiguous shares as even as can be."""
    out, start = [], 0
    for k in range(parts):
        n = len(items) // parts + (k < len(items) % parts)
        out.append(items[start : start + n])
        start += n
    return out


def train(recipe: Recipe, inputs: RunInputs) -> None:
    """Start or join a Ray cluster (RAY_ADDRESS, as under `ray job submit`, or a local one) and run."""
    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            ray.init(address=os.environ["RAY_ADDRESS"])
        else:
            ray.init(include_dashboard=False)
    Controller(recipe, inputs).run()
