"""The GRPO controller: it builds the pools, then runs steps. One step reads top to bottom:

    prompts ──> generators ──rollout refs──┬──> rewards ──scores (small)──> advantages ──┐
                                           ├──> reference ──logprob refs───────────────┐ │
                                           └──────────────────────────────────────────> learner (FSDP2)
                                                                                         │
    generators <──────────── weight broadcast (gloo | nccl), then a logprob probe ───────┘

Rollouts and logprobs travel between pools as Ray object refs; the controller only
gathers rewards, lengths, timings and metrics (rollout dumps are written by a task on the
driver's node, not by the controller). Generation of step k+1 could overlap training of
step k by launching the next ``generate`` before ``train_on`` returns: the hops are
already separate remote calls, so that is a change of schedule here, not a rewrite.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import statistics
import time
from pathlib import Path

import ray
import torch
from ray.util.placement_group import remove_placement_group
from ray.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

from grpo_ray import checkpoint, placement
from grpo_ray.algo.advantage import group_advantages
from grpo_ray.config import POOLS, Recipe
from grpo_ray.data.stream import Position, PromptStream
from grpo_ray.dumps import write_dump
from grpo_ray.metrics import (
    MetricsLog,
    perf_metrics,
    rollout_metrics,
    validation_metrics,
)
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
        self.actors: dict[str, list] = {p: [] for p in POOLS}
        self.pending_dumps: list = []

    # --- one step ----------------------------------------------------------------------

    def step(self, step: int) -> dict[str, float]:
        r, G = self.r, self.r.algorithm.group_size
        start = time.perf_counter()
        batch = [Prompt.from_row(uid, row) for uid, row in self.stream.next_batch()]
        rollouts, stats = self.generate(batch, G, step)
        scores = self.score(rollouts)
        refs = self.reference_logprobs(rollouts)  # runs while the rewards are scored
        stats, scores = self._get(stats, "generate"), self._get(scores, "reward")
        rewards = torch.tensor([t for s in scores for t in s.totals])
        advantages = group_advantages(rewards, G, r.algorithm.norm_adv_by_std).tolist()
        trained = self.train_on(rollouts, advantages, refs)
        synced = self.sync_weights()
        if r.trainer.dump_rollouts:
            self.dump(f"train_data_step{step}", step, rollouts, scores, advantages)
        seconds = time.perf_counter() - start
        busy = {"generator": max(s.seconds for s in stats) + synced["timing_s/sync_weights"],
                "learner": trained["timing_s/update_actor"] + trained["timing_s/old_log_prob"] + synced["sync/seconds"],
                "reference": trained["timing_s/ref"], "reward": max(s.seconds for s in scores)}
        return {**rollout_metrics(stats, scores, r.generator.sampling.max_tokens), **trained, **synced,
                **perf_metrics(stats, trained, busy, seconds, self.facts, self.devices(), self.r),
                **self.memory(), "timing_s/step": seconds}

    # --- hops --------------------------------------------------------------------------

    def generate(self, prompts: list[Prompt], n: int, step: int, sampling=None) -> tuple[list, list]:
        """Prompts cut evenly over the engines; rollout refs (for the pools) and stats refs (for us)."""
        shards = split(prompts, len(self.actors["generator"]))
        seeds = [[sample_seed(self.r.trainer.seed, step, p.uid) for p in shard] for shard in shards]
        generated = [gen.generate.options(num_returns=2).remote(shard, n, shard_seeds, sampling)
                     for gen, shard, shard_seeds in zip(self.actors["generator"], shards, seeds) if shard]
        return [ro for ro, _ in generated], [st for _, st in generated]

    def score(self, rollouts: list) -> list:
        """Score refs, one per rollout, spread over the reward pool."""
        return [self._pick("reward", i).score.remote([ro]) for i, ro in enumerate(rollouts)]

    def reference_logprobs(self, rollouts: list) -> list:
        """(logprobs ref, seconds ref) per rollout from the reference pool; none when there is no KL term."""
        return [self._pick("reference", i).logprobs.options(num_returns=2).remote([ro])
                for i, ro in enumerate(rollouts)] if self.actors["reference"] else []

    def train_on(self, rollouts: list, advantages: list[float], refs: list | None = None) -> dict[str, float]:
        """One learner step on the rollouts behind the refs, with reference logprobs when there is a KL term."""
        refs = self.reference_logprobs(rollouts) if refs is None else refs
        ref_lps = [lp for lp, _ in refs] or None
        trained = self._get([l.train.remote(rollouts, ref_lps, advantages) for l in self.actors["learner"]],
                            "learner train")[0]
        trained["timing_s/ref"] = max(self._get([s for _, s in refs], "reference")) if refs else 0.0
        return trained

    def probe(self) -> float:
        """Mean absolute difference of generator and learner logprobs on a fixed sequence (worst engine)."""
        ids = self.inputs.probe_ids
        gens = [g.prompt_logprobs.remote(ids) for g in self.actors["generator"]]
        learners = [l.probe_logprobs.remote(ids) for l in self.actors["learner"]]  # both sides at once
        gens, learner = self._get(gens, "generator probe"), self._get(learners, "learner probe")[0]
        return max(sum(abs(a - b) for a, b in zip(gen, learner)) / len(gen) for gen in gens)

    def push_weights(self, version: int) -> tuple[list[dict], list[float]]:
        """Learner rank 0 broadcasts (all ranks gather), every engine receives and loads; the workers' timings."""
        bucket = self.r.trainer.bucket_mb << 20
        sends = [l.push_weights.remote(self.metas, bucket) for l in self.actors["learner"]]
        receives = [g.receive_weights.remote(self.metas, bucket, version) for g in self.actors["generator"]]
        return self._get(sends, "weight send"), self._get(receives, "weight receive")

    def sync_weights(self) -> dict[str, float]:
        """Push the learner's weights to every generator as the next version, then check them with the probe."""
        self.version += 1
        pushed, received = self.push_weights(self.version)
        diff = self.probe()
        bound = self.r.trainer.max_sync_logprob_diff
        if diff > bound:
            raise RunError(f"weight sync to version {self.version}: generator and learner logprobs differ by "
                           f"{diff:.3g} on the probe, over trainer.max_sync_logprob_diff={bound}")
        send = pushed[0]["seconds"]  # timed inside learner rank 0: gather from shards + broadcast
        return {"sync/logprob_diff": diff, "sync/seconds": send, "sync/GBps": pushed[0]["bytes"] / send / 1e9,
                "timing_s/sync_weights": max([send, *received])}

    def validate(self, step: int) -> dict[str, float]:
        """pass@1 (and pass@val_n) per data source over the validation rows, with the validation sampling."""
        g = self.r.generator
        prompts = [Prompt.from_row(i, row) for i, row in enumerate(self.inputs.val_rows)]
        rollouts, _ = self.generate(prompts, g.val_n, step, dataclasses.replace(g.sampling, temperature=g.val_temperature))
        scores = self._get(self.score(rollouts), "validation reward")
        if self.r.trainer.dump_rollouts:
            self.dump(f"val_data_step{step}", step, rollouts, scores, None)
        perfect = sum(f.weight for f in self.r.reward.functions if f.weight > 0)
        return validation_metrics([p.data_source for p in prompts], [t for s in scores for t in s.totals],
                                  g.val_n, perfect)

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
        saved = self._get([l.save.remote(str(tmp / "learner")) for l in self.actors["learner"]], "checkpoint save")[0]
        state = {"step": step, "version": self.version, "data": dataclasses.asdict(self.stream.position),
                 "scheduler": saved["scheduler"]}
        info = {"step": step, "consumed_samples": step * self.r.data.train_batch_size, "last_val_score": last_val}
        t = self.r.trainer
        return checkpoint.commit(tmp, self.inputs.model_path, state, info, self.inputs.output_dir / "config.yaml",
                                 t.keep_last)

    def restore(self, ckpt: Path) -> int:
        """Learner weights and optimizer, scheduler, data position and version; generators get the weights."""
        state = checkpoint.load_state(ckpt)
        self._get([l.load.remote(str(ckpt / "learner"), state["scheduler"]) for l in self.actors["learner"]],
                  "checkpoint load")
        self.stream = PromptStream(self.inputs.train_rows, self.r.data.train_batch_size, self.r.trainer.seed,
                                   self.r.data.shuffle, Position(**state["data"]))
        self.version = state["version"]
        self.push_weights(self.version)  # before the first rollout
        return state["step"]

    # --- setup -------------------------------------------------------------------------

    def start(self, pools: tuple[str, ...] = POOLS) -> None:
        """Reserve the cluster, start the pools, join the learner group and (with generators) the sync group."""
        self.plans = placement.plan(self.r)
        pgs = placement.reserve(self.r, pools)
        self.groups = list({id(pg): pg for pg, _ in pgs.values()}.values())
        self._start_pools(pgs, pools)
        self._join_groups()
        self._write_placement()

    def _options(self, pool: str, index: int, pgs: dict, env: dict | None = None) -> dict:
        pg, gpus = pgs[pool]
        cpus = self.plans[pool].cpus
        return dict(num_cpus=cpus, num_gpus=gpus, resources=self.plans[pool].resources or None,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index),
                    runtime_env={"env_vars": {"OMP_NUM_THREADS": str(max(1, round(cpus))), **(env or {})}})

    def _start_pools(self, pgs: dict, pools: tuple[str, ...]) -> None:
        r, path, g = self.r, self.inputs.model_path, self.r.generator
        count = {p: self.plans[p].actors if p in pools else 0 for p in POOLS}
        max_len = g.max_model_len or r.data.max_prompt_length + g.sampling.max_tokens
        env = engine_env(r.cluster.device, g.num_cpus)
        self.actors["generator"] = [
            ray.remote(Generator).options(**self._options("generator", i, pgs, env)).remote(
                path, g, max_len, r.trainer.seed + i, r.model.trust_remote_code, r.cluster.device)
            for i in range(count["generator"])]
        self.actors["learner"] = [
            ray.remote(Learner).options(**self._options("learner", i, pgs)).remote(path, r, i, r.learner.world_size)
            for i in range(count["learner"])]
        self.actors["reference"] = [  # none when kl_coef is 0
            ray.remote(Reference).options(**self._options("reference", i, pgs)).remote(
                path, r.cluster.device, r.reference.micro_batch_size, g.sampling.temperature, r.reference.num_cpus,
                r.model.trust_remote_code, r.learner.dtype) for i in range(count["reference"])]
        functions = [(f.name, f.weight) for f in r.reward.functions]
        self.actors["reward"] = [
            ray.remote(RewardWorker).options(**self._options("reward", i, pgs)).remote(
                functions, r.reward.timeout_s, r.data.response_prefix, r.reward.memory_mb, r.reward.sandbox)
            for i in range(count["reward"])]

    def _join_groups(self) -> None:
        """The learners' torch.distributed group, then the weight-sync group: learner rank 0 + every engine worker."""
        learners, gens, g = self.actors["learner"], self.actors["generator"], self.r.generator
        if not learners:  # evaluation: generators and rewards only
            return
        host, port = self._get(learners[0].address.remote(), "learner address")
        self.facts = self._get([l.setup.remote(host, port) for l in learners], "learner setup")[0]
        if not gens:
            return
        self.metas = self._get(learners[0].weight_metas.remote(), "weight metadata")
        world = 1 + len(gens) * g.tensor_parallel_size
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

    def devices(self) -> float:
        """Devices of all pools for perf/throughput: GPUs on cuda, reserved CPUs on cpu."""
        if self.r.cluster.device == "cuda":
            return sum(p.actors * p.gpus for p in self.plans.values())
        return sum(p.actors * p.cpus for p in self.plans.values())

    def memory(self) -> dict[str, float]:
        """Peak memory per pool: perf/max_memory_allocated_gb/<pool> (torch on a GPU) or perf/peak_rss_gb/<pool>."""
        pools = {pool: [a.peak_memory_gb.remote() for a in actors] for pool, actors in self.actors.items() if actors}
        got = self._get([ref for refs in pools.values() for ref in refs], "memory")
        out, i = {}, 0
        for pool, refs in pools.items():
            kind = got[i][0]
            out[f"perf/{kind}/{pool}"] = max(gb for _, gb in got[i : i + len(refs)])
            i += len(refs)
        return out

    # --- run ---------------------------------------------------------------------------

    def total_steps(self) -> int:
        t = self.r.trainer
        return t.total_steps or t.total_epochs * self.stream.steps_per_epoch

    def run(self) -> None:
        t, total = self.r.trainer, self.total_steps()
        ckpt = checkpoint.find_resume(self.inputs.output_dir, t.resume)
        done = checkpoint.load_state(ckpt)["step"] if ckpt else 0
        keep_metrics(self.inputs.output_dir / "metrics.jsonl", done)  # steps after the checkpoint are redone
        log = MetricsLog(self.inputs.output_dir, t.loggers, total)
        try:
            self.start()
            if ckpt:
                log.say(f"resuming from {ckpt} (step {self.restore(ckpt)})")
            log.say(f"pools started; probe before training: sync/logprob_diff {self.probe():.3g}")
            if t.val_before_train and self.inputs.val_rows and not done:
                log.log(0, self.validate(0))
            last_val = None
            for step in range(done + 1, total + 1):
                metrics = self.step(step)
                if t.test_freq and self.inputs.val_rows and (step % t.test_freq == 0 or step == total):
                    metrics.update(self.validate(step))
                    last_val = statistics.fmean(v for k, v in metrics.items() if k.endswith("/pass@1"))
                log.log(step, metrics)
                if t.save_freq and (step % t.save_freq == 0 or step == total):
                    log.say(f"saved {self.save(step, last_val)}")
            self.flush_dumps()
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
        self.actors = {p: [] for p in POOLS}
        self.groups = []

    def _pick(self, pool: str, i: int):
        actors = self.actors[pool]
        return actors[i % len(actors)]

    def _get(self, refs, what: str):
        try:
            return ray.get(refs, timeout=self.r.trainer.call_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise RunError(f"{what} did not finish within trainer.call_timeout_s={self.r.trainer.call_timeout_s:g}s") from None


def keep_metrics(path: Path, up_to: int) -> None:
    """Drop the lines of steps after `up_to` from a metrics file (a resumed run writes them again)."""
    if path.is_file():
        lines = [line for line in path.read_text().splitlines(keepends=True) if json.loads(line)["step"] <= up_to]
        path.write_text("".join(lines))


def sample_seed(seed: int, step: int, uid: int) -> int:
    """The sampling seed of one prompt at one step: a hash of (run seed, step, prompt), so it needs no history."""
    return int.from_bytes(hashlib.blake2b(f"{seed}/{step}/{uid}".encode(), digest_size=4).digest(), "little")


def split(items: list, parts: int) -> list[list]:
    """`items` cut into `parts` contiguous shares as even as can be."""
    out, start = [], 0
    for k in range(parts):
        n = len(items) // parts + (k < len(items) % parts)
        out.append(items[start : start + n])
        start += n
    return out


def connect(recipe: Recipe) -> None:
    """Join the cluster in RAY_ADDRESS (as under `ray job submit`), or start a local one that stands in
    for every node group: it carries each node marker the recipe's pools ask for."""
    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            ray.init(address=os.environ["RAY_ADDRESS"])
        else:
            markers = {m: 1000.0 for m in recipe.cluster.node_resources.values()}
            ray.init(include_dashboard=False, resources=markers or None)


def train(recipe: Recipe, inputs: RunInputs) -> None:
    connect(recipe)
    Controller(recipe, inputs).run()


def replay(recipe: Recipe, dump_path: str) -> dict[str, float]:
    """One learner step on a training dump, with no generators: only the learner (and reference) pools start.

    Replaying step N's dump into learners holding the weights of step N-1 reproduces that step's update."""
    from grpo_ray import models
    from grpo_ray.dumps import load_dump

    rollouts, advantages = load_dump(dump_path)
    out = Path(recipe.trainer.output_dir) / "replay"
    out.mkdir(parents=True, exist_ok=True)
    connect(recipe)
    c = Controller(recipe, RunInputs(models.resolve(recipe.model.path), [], [], {}, out, []))
    try:
        c.start(pools=("learner", "reference"))
        return c.train_on([ray.put(r) for r in rollouts], advantages)
    finally:
        c.shutdown()
