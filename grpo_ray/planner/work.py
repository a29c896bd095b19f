"""What one model call costs on measured rates: its matmuls, attention and memory traffic (``work_parts``), an
engine's prefill and decode steps, a forward's micro batches as the learner lays them out (``share_work``) and an FSDP2
group's collectives. ``speed`` builds a step's phases from these."""

from __future__ import annotations

import math
from dataclasses import dataclass

from grpo_ray.algo.batching import forward_work, micro_batches, pack_rows, shared_shape
from grpo_ray.data import images
from grpo_ray.lengths import dtype_bytes
from grpo_ray.models.dims import ModelDims
from grpo_ray.planner.rates import Rates, Throughput

# --- one model call ---------------------------------------------------------------------------------------------


def work_parts(
    d: ModelDims,
    t: Throughput,
    dtype: str,
    slots: int,
    rows: list[tuple[float, float]],
    logits: int,
    calls: int = 1,
    train: bool = False,
) -> tuple[float, float]:
    """Seconds of the work of `calls` model calls over `slots` token slots, in two parts: the dense part of the
    forward, as the matmul grid and the memory bandwidth predict it (each linear layer at the calls' tokens, the LM
    head on `logits` positions, the activations and the logits moved through memory), and attention over `rows` of
    (queries, keys each attends to) in every layer, forward (or with `train`, forward and backward)."""
    if not calls:
        return 0.0, 0.0
    b = dtype_bytes(dtype)
    per_call = slots / calls
    linears = sum(t.gemm_seconds(dtype, per_call, i, o) for i, o in d.linears().values()) * d.layers * calls
    head = t.gemm_seconds(dtype, logits / calls, d.hidden, d.vocab) * calls
    memory = (slots * d.layers * (10 * d.hidden + 4 * d.intermediate) * b + logits * d.vocab * (b + 8)) / t.bandwidth
    attention = d.layers * t.attention_seconds(dtype, rows, d.heads, d.head_dim, train)
    return linears + head + memory, attention


def work_seconds(
    d: ModelDims, t: Throughput, dtype: str, slots: int, rows: list[tuple[float, float]], logits: int, calls: int = 1
) -> float:
    """``work_parts``' two parts of a forward together."""
    return sum(work_parts(d, t, dtype, slots, rows, logits, calls))


def call_seconds(
    d: ModelDims,
    t: Throughput,
    dtype: str,
    slots: int,
    rows: list[tuple[float, float]],
    logits: int,
    backward: bool,
    calls: int = 1,
) -> float:
    """The calls' fixed costs and their work (``work_parts``), scaled as calibration measured the learner's code
    (``Throughput.forward_scale``, ``train_scale``); with the backward, 3 x the forward's dense work and attention's
    measured forward and backward."""
    base, per_layer = t.train_call if backward else t.forward_call
    fixed = calls * (base + per_layer * d.layers)
    dense, attention = work_parts(d, t, dtype, slots, rows, logits, calls, backward)
    work = t.train_scale * (3 * dense + attention) if backward else t.forward_scale * (dense + attention)
    return max(fixed, work) if t.overlap else fixed + work


def pictures_read(r, samples: int, calls: int = 1) -> int:
    """The pictures that `calls` model calls over `samples` of a step of recipe `r` read: each prompt's (the most
    generator.vllm_kwargs.limit_mm_per_prompt lets a prompt carry; none where it names no image limit: a text run),
    once a call for each prompt the call holds (a group's samples share their prompt's pictures)."""
    each = images.limit(r.generator.vllm_kwargs, unset=0)
    return calls * math.ceil(samples / max(calls, 1) / r.algorithm.group_size) * each if samples else 0


def tower_seconds(d: ModelDims, t: Throughput, dtype: str, pictures: float) -> float:
    """The forward of `pictures` through the vision tower and its projection, at the matmul grid's rates: each
    block's attention projections and MLP over the picture's positions, its attention over all of them, the
    projection to the language model's width (at every position: a bound, Gemma 3 pools them first). 0 for a text
    model, or a tower whose positions follow each picture's size (``ModelDims.tower``)."""
    w = d.tower
    if not w or pictures <= 0:
        return 0.0
    rows = pictures * w.patches
    block = 4 * t.gemm_seconds(dtype, rows, w.hidden, w.hidden) + 2 * t.gemm_seconds(dtype, rows, w.hidden, w.inner)
    attention = t.attention_seconds(
        dtype, [(w.patches, w.patches)] * math.ceil(pictures), w.heads, w.hidden // w.heads, False
    )
    return w.layers * (block + attention) + t.gemm_seconds(dtype, rows, w.hidden, w.projected)


def prefill_work(d: ModelDims, t: Throughput, dtype: str, sequences: int, prompt_tokens: float) -> float:
    """An engine's prefill of `sequences` prompts: their forward, the head on each one's last position."""
    rows = [(prompt_tokens, prompt_tokens)] * sequences
    return work_seconds(d, t, dtype, round(sequences * prompt_tokens), rows, sequences)


def decode_work(d: ModelDims, t: Throughput, dtype: str, sequences: int, context: float) -> float:
    """One decode step of `sequences` sequences of `context` tokens: their matmuls at the decode batch, or the weights
    read from memory when that is longer, and their keys and values read."""
    compute = work_seconds(d, t, dtype, sequences, [(sequences, context)], sequences)
    weights = d.params * dtype_bytes(dtype) / t.bandwidth
    kv = sequences * context * 2 * d.layers * d.kv_heads * d.head_dim * dtype_bytes(dtype) / t.bandwidth
    return max(compute, weights) + kv


def step_fixed(engine: dict[str, float], d: ModelDims, sequences: int) -> float:
    """An engine step's fixed cost: its base, its layers', its sequences'."""
    return engine["step_s"] + engine["step_layer_s"] * d.layers + engine["seq_s"] * sequences


def generation_seconds(
    d: ModelDims,
    t: Throughput,
    dtype: str,
    engine: dict[str, float],
    sequences: int,
    prompt: float,
    response: int,
    tp: int = 1,
) -> tuple[float, float]:
    """A generate call of `sequences` sequences (prompts of `prompt` tokens, `response` tokens each) on an engine of
    `tp` devices (tensor parallel: the work split among them): its prefill (the call's and each request's own cost,
    and a step that computes the prompts and the first token), and its response - 1 decode steps (the context
    growing: summed over up to 32 chunks of steps)."""
    prefill = (
        engine["prefill_s"]
        + engine["request_s"] * sequences
        + step_fixed(engine, d, sequences)
        + engine.get("prefill_scale", engine["work_scale"]) * prefill_work(d, t, dtype, sequences, prompt) / tp
    )
    decode, steps_left = 0.0, max(response - 1, 0)
    chunk = max(1, steps_left // 32)
    for k in range(0, steps_left, chunk):
        steps = min(chunk, steps_left - k)
        context = prompt + 1 + k + steps / 2
        work = engine["work_scale"] * decode_work(d, t, dtype, sequences, context) / tp
        decode += steps * (step_fixed(engine, d, sequences) + work)
    return prefill, decode


@dataclass
class ForwardWork:
    """The forwards of one actor over its share, as its micro batches lay them out."""

    calls: int
    slots: int
    rows: list[tuple[int, int]]
    """Each row of the layout: (its token slots, the keys each attends to)."""
    logits: int


def share_work(pairs: list, size: int, packing: bool, shared: bool) -> ForwardWork:
    """The model calls, token slots, attention rows and head positions of `pairs` in micro batches of `size`, as
    collate lays them out: padded, each sequence a row as long as the micro batch's longest; packed, each row as
    wide as the fullest (its attention computed over the whole row, masked); shared prompts, each distinct prompt
    padded to the longest, then rows of responses as wide as the longest, each attending to its prompt's keys."""
    micros, capacity = micro_batches(list(range(len(pairs))), pairs, size, packing, shared)
    w = ForwardWork(0, 0, [], 0)
    for micro in micros:
        batch = [pairs[i] for i in micro]
        w.logits += forward_work(batch, shared)[1]
        lengths = [len(p) + len(q) for p, q in batch]
        if shared:
            prompts, longest, rows, width = shared_shape(batch)
            layout = [(longest, longest)] * prompts + [(width, longest + width)] * rows
            w.calls += 2
        elif capacity:
            packed = pack_rows(lengths, capacity)
            width = max(sum(lengths[j] for j in row) for row in packed)
            layout = [(width, width)] * len(packed)
            w.calls += 1
        else:
            layout = [(max(lengths), max(lengths))] * len(batch)
            w.calls += 1
        w.rows += layout
        w.slots += sum(q for q, _ in layout)
    return w


def group_seconds(d: ModelDims, rates: Rates, ranks: int, calls: int, backward: bool, dtype: str) -> float:
    """The FSDP2 collectives of `calls` model calls on a group of `ranks`: each call gathers every unit (a decoder
    block, and the root) in `dtype` once forward and once more backward, and a backward reduce-scatters the
    gradients in fp32."""
    if ranks <= 1 or not calls:
        return 0.0
    latency, bps = rates.collective
    units = d.layers + 1
    moved = d.params * (ranks - 1) / ranks
    gathers = (2 if backward else 1) * (units * latency + moved * dtype_bytes(dtype) / bps)
    scatters = (units * latency + moved * 4 / bps) if backward else 0.0
    return calls * (gathers + scatters)
