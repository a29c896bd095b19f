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

    def start(self) -> None:
        """Reserve the cluster, start every pool, join the learner group and the weight-sync group."""
        self.plans = placement.plan(self.r)
        pgs = placement.reserve(self.r)
        self.groups = list({id(pg): pg for pg, _ in pgs.values()}.values())
        self._start_pools(pgs)
        self._join_groups()
        self._write_placement()

    def _options(self, pool: str, index: int, pgs: dict, env: dict | None = None) -> dict:
        pg, gpus = pgs[pool]
        cpus = self.plans[pool].cpus
        return dict(num_cpus=cpus, num_gpus=gpus, resources=self.plans[pool].resources or None,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index),
                    runtime_env={"env_vars": {"OMP_NUM_THREADS": str(max(1, round(cpus))), **(env or {})}})

    def _start_pools(self, pgs: dict) -> None:
        r, path, g = self.r, self.inputs.model_path, self.r.generator
        max_len = g.max_model_len or r.data.max_prompt_length + g.sampling.max_tokens
        env = engine_env(r.cluster.device, g.num_cpus)
        self.actors["generator"] = [
            ray.remote(Generator).options(**self._options("generator", i, pgs, env)).remote(
                path, g, max_len, r.trainer.seed + i, r.model.trust_remote_code)
            for i in range(self.plans["generator"].actors)]
        self.actors["learner"] = [
            ray.remote(Learner).options(**self._options("learner", i, pgs)).remote(path, r, i, r.learner.world_size)
            for i in range(self.plans["learner"].actors)]
        self.actors["reference"] = [
            ray.remote(Reference).options(**self._options("reference", i, pgs)).remote(
                path, r.cluster.device, r.reference.micro_batch_size, g.sampling.temperature, r.reference.num_cpus,
                r.model.trust_remote_code)
            for i in range(self.plans["reference"].actors)]  # none when kl_coef is 0
        functions = [(f.name, f.weight) for f in r.reward.functions]
        self.actors["reward"] = [
            ray.remote(RewardWorker).options(**self._options("reward", i, pgs)).remote(
                functions, r.reward.timeout_s, r.data.response_prefix)
            for i in range(self.plans["reward"].actors)]

    def _join_groups(self) -> None:
        """The learners' torch.distributed group, then the weight-sync group: learner rank 0 + every engine worker."""
        learners, gens, g = self.actors["learner"], self.actors["generator"], self.r.generator
        host, port = self._get(learners[0].address.remote(), "learner address")
        self._get([l.setup.remote(host, port) for l in learners], "learner setup")
        self.metas = self._get(learners[0].weight_metas.remote(), "weight metadata")
        world = 1 + g.num_engines * g.tensor_parallel_size
        host, port = self._get(learners[0].address.remote(), "sync address")
        timeout, backend = self.r.trainer.call_timeout_s, backend_for(self.r.cluster.device)
        self._get([learners[0].init_sync.remote(host, port, world, timeout)] +
                  [gen.init_sync.remote(backend, host, port, 1 + i * g.tensor_parallel_size, world, timeout)
                   for i, gen in enumerate(gens)], "weight-sync group")

    def _write_placement(self) -> None:
        out = {}
        for pool, actors in self.actors.items():
            where = self._get([a.where.remote() for a in actors], f"{pool} start")
            p = self.plans[pool]
            out[pool] = [{"actor": i, **w, "resources": {"CPU": p.cpus, "GPU": p.gpus, **p.resources}}
                         for i, w in enumerate(where)]
        placement.write_placement(self.inputs.output_dir / "placement.json", out)

    # --- one step ----------------------------------------------------------------------

    def step(self, step: int) -> dict[str, float]:
        r, G = self.r, self.r.algorithm.group_size
        start = time.perf_counter()
        batch = [Prompt.from_row(uid, row) for uid, row in self.stream.next_batch()]
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
        """Mean absolute difference of generator and learner logprobs on a fixed sequence (worst engine)."""
        ids = self.inputs.probe_ids
        gens = self._get([g.prompt_logprobs.remote(ids) for g in self.actors["generator"]], "generator probe")
        learner = self._get([l.probe_logprobs.remote(ids) for l in self.actors["learner"]], "learner probe")[0]
        return max(sum(abs(a - b) for a, b in zip(gen, learner)) / len(gen) for gen in gens)

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
