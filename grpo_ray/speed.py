"""How long a step will take, predicted from the recipe before anything starts (``grpo-ray plan``).

Each phase is its work over measured rates plus its fixed costs, and plan prints the inputs beside each number. The
rates (``Rates``) are one device's, on CPU one actor's at its compute threads: calibrated on the machine at hand
(``grpo-ray plan --calibrate``, ``grpo_ray.calibrate``) or, for a GPU not calibrated, the published figures of
``PUBLISHED`` (marked as such in the output).

A step has n = data.train_batch_size x algorithm.group_size samples of p prompt and r response tokens (``Shape``).
A model call over T token slots costs the call's fixed cost (a base and a cost per decoder layer: kernel launches,
Python), its matmuls (each linear layer, attention's QK^T and AV, the LM head where logits are taken) at the rate the
calibration measured for matmuls of that shape, and its activations moved through memory; a backward costs 2 x the
matmuls and memory, and its own fixed cost. The phases:

    generation  each engine's n / E samples: a prefill of their prompts, then r decode steps, each a fixed cost, a
                cost per sequence, and its matmuls at the decode batch or the weights and keys/values read from
                memory, whichever is longer
    reward      each reward actor's share of the samples at a fixed cost per sample
    reference   each reference actor's share, micro batched as ``batching.micro_batches`` cuts it, in the layout
                the learner chooses (``model.shared_prompt``), plus the FSDP2 group's all-gathers
    old policy  the same forward on the learner ranks, in steps that recompute the old logprobs
    update      per mini batch and epoch, the rank's share: forward+backward of its micro batches, the group's
                all-gathers and reduce-scatters, and an optimizer step
    sync        the weights over the transport's bandwidth, then the engines' reload
    hops        the controller's own time in a step (Ray calls, object transfers)

The step under the recipe's schedule: on-policy, generation + max(reward, frozen pools) + old policy + update + sync
+ hops. One step off (algorithm.max_staleness >= 1), the next batch is generated while the learner trains, and
scored from the generation's end: max(generation, its scoring left over + old policy + update) + sync + hops (the
scoring that runs past the step's end opens the next); on CPU the phases running at once share the node's cores,
each going slower while they ask for more threads than there are cores.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from grpo_ray import models, placement, schedule
from grpo_ray.algo.batching import forward_work, micro_batches, pack_rows, shared_shape, use_shared
from grpo_ray.config import KINDS, Recipe
from grpo_ray.dims import ModelDims, model_dims
from grpo_ray.lengths import dtype_bytes, response_budget, wire_dtype


@dataclass
class Throughput:
    """What one device (on CPU: one actor at a number of compute threads) does per second."""

    gemm: dict[str, list[list[float]]]
    """dtype -> [tokens, width, FLOP/s] of a matmul [tokens x width] @ [width x width], over a grid of both."""
    bandwidth: float
    """Bytes per second read and written by elementwise work on large tensors."""
    forward_call: list[float]
    """Fixed seconds of one model forward: [base, per decoder layer] (launches, Python; measured on 1 token)."""
    train_call: list[float]
    """Fixed seconds of one forward+backward: [base, per decoder layer]."""
    optimizer: list[float]
    """Seconds of one optimizer step (clip + AdamW): [base, per parameter]."""
    forward_sample: float = 0.0
    """Fixed seconds a sample adds to a forward-only pass (the learner's and the reference's: collating, logprobs
    back into per-sample lists)."""
    train_sample: float = 0.0
    """Fixed seconds a sample adds to an update (collating, its loss terms placed)."""
    attention: dict[str, list[list[float]]] = field(default_factory=dict)
    """forward, train -> [keys, head_dim, seconds per query x key x head] of the device's attention (eager on CPU,
    sdpa on a GPU; masked, softmaxed, in the learner's dtype), over a grid of both; empty: from the matmul grid."""
    forward_scale: float = 1.0
    """What a forward-only pass's work (``work_parts``) takes in the learner's code over what the matmul grid, the
    memory bandwidth and the attention grid predict (norms, rotary embeddings, copies, fresh memory for every
    activation): measured on a step whose work outweighs its fixed costs."""
    train_scale: float = 1.0
    """The same for a forward+backward (3 x the forward's dense work, attention's forward and backward)."""
    overlap: bool = False
    """Whether a call's fixed costs (launching its kernels) overlap its work, as on a GPU: the call then takes the
    longer of the two, not their sum."""

    def attention_seconds(self, dtype: str, rows: list[tuple[float, float]], heads: int, head_dim: int, train: bool):
        """Seconds of attention over `rows` of (queries, keys) in one layer: the measured grid's rate at each row's
        keys (a head_dim past the grid's widest: that rate, times how many times wider; its matmuls grow with it, a
        bound), or without a grid, QK^T and AV on the matmul grid and the scores through memory, 3 passes."""
        grid = self.attention.get("train" if train else "forward")
        if grid:
            widest = max(p[1] for p in grid)  # past the grid's head_dim, the work grows with it
            wider = max(head_dim / widest, 1.0)
            return sum(q * k * heads * wider * _interpolate(grid, k, head_dim) for q, k in rows)
        matmuls = 2 * heads * sum(self.gemm_seconds(dtype, q, head_dim, k) for q, k in rows)
        scores = 3 * sum(q * k for q, k in rows) * heads * dtype_bytes(dtype) / self.bandwidth
        return (3 if train else 1) * (matmuls + scores)

    def gemm_seconds(self, dtype: str, tokens: float, fan_in: int, fan_out: int) -> float:
        """Seconds of [tokens x fan_in] @ [fan_in x fan_out], at the rate measured for its shape (interpolated on
        the grid in log space; its width the geometric mean of fan_in and fan_out)."""
        if tokens <= 0:
            return 0.0
        grid = self.gemm.get(dtype) or self.gemm["float32"]
        rate = _interpolate(grid, tokens, math.sqrt(fan_in * fan_out))
        return 2 * tokens * fan_in * fan_out / rate


def _interpolate(grid: list[list[float]], x: float, y: float) -> float:
    """Bilinear interpolation of z over a full grid of (x, y, z) points, in log space, clamped to its edges."""
    xs, ys = sorted({p[0] for p in grid}), sorted({p[1] for p in grid})
    z = {(p[0], p[1]): p[2] for p in grid}

    def bracket(values, v):
        v = min(max(v, values[0]), values[-1])
        hi = next(i for i, u in enumerate(values) if u >= v)
        lo = max(hi - 1, 0)
        if values[hi] == values[lo]:
            return values[lo], values[hi], 0.0
        return (
            values[lo],
            values[hi],
            (math.log(v) - math.log(values[lo])) / (math.log(values[hi]) - math.log(values[lo])),
        )

    x0, x1, fx = bracket(xs, x)
    y0, y1, fy = bracket(ys, y)
    logz = (
        (1 - fx) * (1 - fy) * math.log(z[x0, y0])
        + fx * (1 - fy) * math.log(z[x1, y0])
        + (1 - fx) * fy * math.log(z[x0, y1])
        + fx * fy * math.log(z[x1, y1])
    )
    return math.exp(logz)


@dataclass
class Rates:
    """A device type's rates: per compute-thread count on CPU (one entry on a GPU), and what is not per thread."""

    device: str
    """cpu, or a GPU model as cluster.gpu names it (h100, h200, ...)."""
    source: str
    """How they were had: 'calibrated on HOST, DATE' or 'published figures (...)'."""
    threads: dict[str, Throughput]
    """Compute threads -> throughput of one actor (on a GPU: '1', the device)."""
    collective: list[float]
    """The learner's and reference's group collectives (gloo / nccl) between two ranks: [latency s, bytes/s]."""
    transport: float
    """Bytes per second of a weight push from learner rank 0 to the engines."""
    engine: dict[str, float]
    """A vLLM engine's fixed costs (the generator role's, as a CPU actor runs it): an engine step's step_s +
    step_layer_s a decoder layer + seq_s a sequence, and work_scale x its matmuls' and memory's predicted seconds
    (vLLM's own kernels against the grid's); a generate call's prefill_s and request_s a sequence (its request and
    its answer); an in-place weight load's reload_layer_s a layer, and its bytes at reload_bps."""
    reward_sample_s: float
    """A reward actor's seconds per sample (a built-in rule reward)."""
    hop_s: float
    """The controller's own seconds per step (fitted: ``FITTED``)."""
    hop_sample_s: float = 0.0
    """The controller's own seconds per sample of a step (fitted)."""
    sync_s: float = 0.0
    """A push's fixed seconds beyond its bytes and the reload: the Ray calls around it, the probe (fitted)."""
    reward_call_s: float = 0.0
    """A reward actor's fixed seconds a call (its sandboxed child's round trip), beside its seconds per sample."""
    pass_s: float = 0.0
    """A forward-only pass's fixed seconds in a running job beyond what calibration measures of the call alone (the
    reference's and the old policy's: fitted)."""
    update_s: float = 0.0
    """An update's fixed seconds in a running job beyond what calibration measures of its calls alone (the batch
    handed to the ranks, their metrics gathered: fitted)."""

    def at(self, threads: int) -> Throughput:
        """The throughput of an actor with `threads` compute threads: the nearest count measured."""
        counts = sorted(self.threads, key=lambda t: (abs(int(t) - threads), -int(t)))
        return self.threads[counts[0]]

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, path: Path) -> Rates:
        raw = json.loads(Path(path).read_text())
        raw["threads"] = {k: Throughput(**v) for k, v in raw["threads"].items()}
        return cls(**raw)


FITTED = {
    "engine": {
        "step_s": 0.0,
        "step_layer_s": 0.0,
        "seq_s": 0.0,
        "prefill_s": 0.0,
        "request_s": 0.0,
        "work_scale": 1.0,
        "prefill_scale": 1.0,
        "reload_layer_s": 0.0,
        "reload_bps": 1e10,
    },
    "reward_sample_s": 0.0,
    "hop_s": 0.0,
    "hop_sample_s": 0.0,
    "sync_s": 0.0,
    "pass_s": 0.0,
    "update_s": 0.0,
    "reward_call_s": 0.0,
}
"""Defaults of what calibration does not measure (``fitted`` gives the committed table's): the controller's own
seconds per step and per sample, a push's and a forward-only pass's fixed seconds (fitted by benchmarks/speed.py on
its fitting configurations); a reward actor's seconds and an engine's costs where no reward worker or vLLM runs."""


@dataclass
class Shape:
    """The samples a step predicts for."""

    prompt_tokens: int
    """Tokens of a prompt (the recipe's data.max_prompt_length unless the data's mean is given)."""
    response_tokens: int
    """Tokens of a response (the response budget unless expected shorter)."""
    source: str = ""
    """Where the lengths came from, for the output."""


@dataclass
class Phase:
    seconds: float
    detail: str
    busy: dict[str, float] = field(default_factory=dict)
    """Pool -> seconds its actors are busy in this phase (for idle shares)."""


@dataclass
class Prediction:
    phases: dict[str, Phase]
    step: float
    schedule: str
    tokens_per_s_per_device: float
    idle: dict[str, float]
    rates: str
    shape: Shape
    unmodelled: tuple[str, ...] = ()
    """Pools the recipe starts whose time this model does not hold (their KINDS row has no time): said, not left out."""

    def text(self) -> str:
        s = self.shape
        lines = [
            f"predicted step time ({self.rates}):",
            f"  samples of {s.prompt_tokens} prompt + {s.response_tokens} response tokens ({s.source})",
        ]
        for name, p in self.phases.items():
            lines.append(f"  {name:<11} {p.seconds:9.3f} s  {p.detail}")
        for pool in self.unmodelled:
            lines.append(f"  {pool:<11} {'-':>9}    not modelled: its actors' time is not in the step below")
        lines.append(f"  {'step':<11} {self.step:9.3f} s  {self.schedule}")
        idle = ", ".join(f"{k} {v:.2f}" for k, v in self.idle.items())
        lines.append(f"  tokens/s per device {self.tokens_per_s_per_device:.4g}; idle share: {idle}")
        return "\n".join(lines)


def seconds_str(x: float) -> str:
    return f"{x * 1e3:.3g} ms" if x < 1 else f"{x:.3g} s"


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


# --- the phases ---------------------------------------------------------------------------------------------------


def shape_pairs(r: Recipe, shape: Shape) -> list[tuple[list[int], list[int]]]:
    """A step's samples as (prompt ids, response ids) of the shape's lengths: each group one prompt, its own ids."""
    g = r.algorithm.group_size
    return [
        ([k] * shape.prompt_tokens, [0] * shape.response_tokens)
        for k in range(r.data.train_batch_size)
        for _ in range(g)
    ]


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


@dataclass
class StepInputs:
    """What every phase's prediction reads: the recipe, the policy's shape, the rates, the step's samples, and the
    compute threads of each pool's actors on a node of `cores` cores."""

    r: Recipe
    d: ModelDims
    rates: Rates
    pairs: list
    plans: dict
    threads: dict[str, int]
    cores: int

    def at(self, pool: str) -> Throughput:
        return self.rates.at(self.threads[pool])

    def layout(self, size: int) -> tuple[bool, str]:
        """Whether forwards in micro batches of `size` run each prompt once (model.shared_prompt, decided as the
        roles decide it; packing under gradient checkpointing), and its name."""
        m = self.r.model
        shared = not self.r.learner.gradient_checkpointing and use_shared(
            m.shared_prompt, self.pairs, size, m.sequence_packing
        )
        return shared, "shared prompts" if shared else ("packed" if m.sequence_packing else "padded")


def predict(r: Recipe, d: ModelDims, rates: Rates, shape: Shape, node_cpus: int = 0) -> Prediction:
    """Each phase's seconds for a step of `shape` under recipe `r`, model `d`, `rates`; the step under the schedule.
    On CPU the node has `node_cpus` cores (0: this machine's)."""
    cpu = r.cluster.device == "cpu"
    plans = placement.plan(r)
    cores = node_cpus or (len(os.sched_getaffinity(0)) if cpu else 1)  # a CPU recipe's node: this machine
    threads = placement.threads(r, plans, cores) if cpu else {p: 1 for p in plans}
    s = StepInputs(r, d, rates, shape_pairs(r, shape), plans, threads, cores)
    phases = {
        "generation": generation_phase(s, shape),
        "reward": reward_phase(s),
        **frozen_phases(s),
        **learner_phases(s),
        "sync": sync_phase(s),
        "hops": Phase(
            rates.hop_s + rates.hop_sample_s * len(s.pairs), "the controller's own time (Ray calls, transfers, metrics)"
        ),
    }
    step, how = schedule_step(s, phases)
    busy: dict[str, float] = {}
    for p in phases.values():
        for pool, secs in p.busy.items():
            busy[pool] = busy.get(pool, 0.0) + secs
    idle = {
        pool: max(0.0, 1 - busy.get(pool, 0.0) / (plan.actors * step)) for pool, plan in plans.items() if plan.actors
    }
    devices = sum(p.actors * (p.cpus if cpu else p.gpus) for p in plans.values())
    tokens = len(s.pairs) * (shape.prompt_tokens + shape.response_tokens)
    unmodelled = tuple(p for p, plan in plans.items() if plan.actors and KINDS[p].time is None)
    return Prediction(phases, step, how, tokens / step / max(devices, 1e-9), idle, rates.source, shape, unmodelled)


def generation_phase(s: StepInputs, shape: Shape) -> Phase:
    """Each engine's share of the samples: a prefill, then a decode step per token (``generation_seconds``)."""
    engines = max(1, s.plans["generator"].actors)
    per_engine = math.ceil(len(s.pairs) / engines)
    tp = s.r.generator.tensor_parallel_size if s.r.cluster.device == "cuda" else 1
    prefill, decode = generation_seconds(
        s.d,
        s.at("generator"),
        wire_dtype(s.r),
        s.rates.engine,
        per_engine,
        shape.prompt_tokens,
        shape.response_tokens,
        tp,
    )
    return Phase(
        prefill + decode,
        f"{engines} engine(s) x {per_engine} sequences: prefill {seconds_str(prefill)}, "
        f"{max(shape.response_tokens - 1, 0)} decode steps {seconds_str(decode)}",
        {"generator": (prefill + decode) * engines},
    )


def reward_phase(s: StepInputs) -> Phase:
    """Each reward actor's call: its fixed cost and its share at its cost per sample."""
    actors = max(1, s.plans["reward"].actors)
    share = math.ceil(len(s.pairs) / actors)
    seconds = s.rates.reward_call_s + share * s.rates.reward_sample_s
    detail = f"{actors} actor(s): a call and {share} samples x {seconds_str(s.rates.reward_sample_s)}"
    return Phase(seconds, detail, {"reward": seconds * actors})


def frozen_phases(s: StepInputs) -> dict[str, Phase]:
    """The reference's (and the teacher's, on its own shape) forward over each actor's share, micro batched, with the
    group's all-gathers."""
    out = {}
    for pool in ("reference", "teacher"):
        count = s.plans[pool].actors
        if not count:
            continue
        d = s.d if pool == "reference" else model_dims(s.r.teacher.model, "teacher.model")
        size, m = getattr(s.r, pool).micro_batch_size, s.r.model
        shared, layout = s.layout(size)
        share = s.pairs[: math.ceil(len(s.pairs) / count)]
        w, t = share_work(share, size, m.sequence_packing, shared), s.at(pool)
        seconds = call_seconds(d, t, s.r.learner.dtype, w.slots, w.rows, w.logits, False, w.calls)
        seconds += s.rates.pass_s + t.forward_sample * len(share)
        seconds += group_seconds(d, s.rates, count, w.calls, False, s.r.learner.dtype)
        detail = f"{count} actor(s): {w.calls} calls over {w.slots} token slots ({layout})"
        out[pool] = Phase(seconds, detail, {pool: seconds * count})
    return out


def learner_phases(s: StepInputs) -> dict[str, Phase]:
    """Per rank, its share of each mini batch: ppo_epochs x (forward+backward of its micro batches, with gradient
    checkpointing the decoder layers' forward again, the group's collectives, an optimizer step); and the old
    policy's forward in steps that recompute it (more than one update, or samples of older weights, unless bypass
    mode), with older weights copied into the shards and back."""
    r, d, a, m = s.r, s.d, s.r.algorithm, s.r.model
    W, t, dtype = r.learner.world_size, s.at("learner"), r.learner.dtype
    mini = min(r.learner.mini_batch_size, len(s.pairs))
    minis = math.ceil(len(s.pairs) / mini)
    share = s.pairs[: math.ceil(mini / W)]
    shared, layout = s.layout(r.learner.micro_batch_size)
    w = share_work(share, r.learner.micro_batch_size, m.sequence_packing, shared)
    train = call_seconds(d, t, dtype, w.slots, w.rows, w.logits, True, w.calls) + t.train_sample * len(share)
    if r.learner.gradient_checkpointing:  # the backward runs each decoder layer's forward again (not the head)
        dense, attention = work_parts(d, t, dtype, w.slots, w.rows, 0, w.calls)
        train += w.calls * t.forward_call[1] * d.layers + t.forward_scale * (dense + attention)
    train += group_seconds(d, s.rates, W, w.calls, True, dtype)
    trained = d.lora_params(m.lora.rank, m.lora.target_modules) if m.lora.rank else d.params
    update = s.rates.update_s + a.ppo_epochs * minis * (train + t.optimizer[0] + t.optimizer[1] * trained / W)
    # in a steady run one step off or more, every batch is of older weights (schedule.push_due)
    recomputed = schedule.recomputes_old_policy(a, minis, stale=schedule.overlapping(a))
    old = 0.0
    if recomputed:
        forward = call_seconds(d, t, dtype, w.slots, w.rows, w.logits, False, w.calls) + t.forward_sample * len(share)
        old = s.rates.pass_s + minis * (forward + group_seconds(d, s.rates, W, w.calls, False, dtype))
        if schedule.keeps_older_weights(a):  # the older weights' snapshot copied in, the current ones back
            old += 2 * 2 * d.params / W * dtype_bytes(dtype) / t.bandwidth
    how = f"{W} rank(s) x {minis} mini batch(es), forward only" if recomputed else "not recomputed (one update)"
    return {
        "old policy": Phase(old, how, {"learner": old * W}),
        "update": Phase(
            update,
            f"{W} rank(s) x {a.ppo_epochs} epoch(s) x {minis} mini batch(es): {w.calls} calls over {w.slots} token "
            f"slots ({layout}) + an optimizer step over {trained / W:.3g} parameters",
            {"learner": update * W},
        ),
    }


def sync_phase(s: StepInputs) -> Phase:
    """Rank 0 gathers the weights (or LoRA's adapters) from the ranks' shards and sends them over the transport; the
    engines reload them; and a push's fixed cost."""
    if not s.plans["generator"].actors:
        return Phase(0.0, "no engines")
    r, d, m = s.r, s.d, s.r.model
    W, engines, e = r.learner.world_size, s.plans["generator"].actors, s.rates.engine
    sent = d.lora_params(m.lora.rank, m.lora.target_modules) if m.lora.rank and m.lora.sync == "adapters" else d.params
    nbytes = sent * dtype_bytes(wire_dtype(r))
    reload = e["reload_layer_s"] * d.layers + nbytes / e["reload_bps"]
    gather = nbytes * (W - 1) / W / s.rates.collective[1]
    seconds = s.rates.sync_s + gather + nbytes / s.rates.transport + reload
    detail = (
        f"{nbytes / 1e6:.4g} MB at {s.rates.transport / 1e9:.3g} GB/s, then the engines' reload {seconds_str(reload)}"
    )
    return Phase(seconds, detail, {"learner": seconds * W, "generator": seconds * engines})


def schedule_step(s: StepInputs, phases: dict[str, Phase]) -> tuple[float, str]:
    """The step's seconds under the schedule, and how they add up.

    One step off, as the controller runs it: the step launches the next batch's generation, whose scoring starts as
    it ends, while the learner waits for what is left of this batch's scoring (started in the step before), then
    runs the old policy and the update; the sync waits for both. Scoring past the step's end goes on through the
    sync and the hops, and what is left of it then opens the next step. Steps are simulated one after another from
    a first with nothing left over, the step the mean of the last four (where the learner's chain is the longer,
    what is left over alternates). On CPU the phases running at once share the node's cores (``shared_cores``),
    and each phase's seconds become what it takes there (its Phase is changed here)."""
    sec = {k: p.seconds for k, p in phases.items()}
    scoring = max(sec["reward"], sec.get("reference", 0.0), sec.get("teacher", 0.0))
    after = sec["sync"] + sec["hops"]
    if not schedule.overlapping(s.r.algorithm):
        step = sec["generation"] + scoring + sec["old policy"] + sec["update"] + after
        return step, "on-policy: generation + max(reward, reference) + old policy + update + sync + hops"
    frozen = [k for k in ("reference", "teacher") if k in sec]
    scorers = {"reward": s.plans["reward"].actors, **{k: s.plans[k].actors * s.threads[k] for k in frozen}}
    # scoring's pools run at once, each busy its own share of the time: their threads on average
    scoring_threads = sum(n * sec[k] for k, n in scorers.items()) / scoring if scoring else 0.0
    threads = {
        "generation": s.plans["generator"].actors * s.threads["generator"],
        "scoring": scoring_threads,
        "scoring left": scoring_threads,
        "old policy": s.r.learner.world_size * s.threads["learner"],
        "update": s.r.learner.world_size * s.threads["learner"],
    }
    cores = s.cores if s.r.cluster.device == "cpu" else math.inf
    left, steps = 0.0, []
    for _ in range(6):
        chains = [
            [("generation", sec["generation"]), ("scoring", scoring)],
            [("scoring left", left), ("old policy", sec["old policy"]), ("update", sec["update"])],
        ]
        took, ended = shared_cores(chains, threads, cores)
        step = max(ended["generation"], ended["update"]) + after
        left = max(0.0, ended["scoring"] - step)
        steps.append(step)
    for name, seconds in took.items():
        for phase in ["reward", *frozen] if name == "scoring" else [] if name == "scoring left" else [name]:
            p = phases[phase]
            stretch = seconds / scoring if name == "scoring" and scoring else seconds / p.seconds if p.seconds else 1
            if stretch > 1.001:
                p.seconds *= stretch
                p.busy = {k: v * stretch for k, v in p.busy.items()}
                p.detail += f"; x{stretch:.2f} sharing {s.cores} cores"
    return statistics.fmean(steps[-4:]), (
        "one step off: max(generation, scoring left over + old policy + update) + sync + hops, the next batch's "
        "scoring from the generation's end" + (", sharing the cores" if math.isfinite(cores) else "")
    )


def shared_cores(chains: list[list[tuple[str, float]]], threads: dict[str, float], cores: float):
    """Phases in chains, the chains at once on `cores` cores: a phase alone would take its seconds with its
    `threads`; while the running phases ask for more threads than there are cores, each goes that much slower. The
    seconds each phase took, and when each ended."""
    left = [list(c) for c in chains]
    took: dict[str, float] = {}
    ended: dict[str, float] = {}
    now = 0.0
    while any(left):
        running = [c[0] for c in left if c]
        slow = max(1.0, sum(threads[name] for name, _ in running) / cores)
        dt = min(rest for _, rest in running) * slow  # until the first running phase ends
        now += dt
        for c in left:
            if c:
                name, rest = c[0]
                took[name] = took.get(name, 0.0) + dt
                rest -= dt / slow
                c[0] = (name, rest)
                if rest <= 1e-12:
                    c.pop(0)
                    ended[name] = now
    return took, ended


def default_shape(r: Recipe, prompt_tokens: int = 0, response_tokens: int = 0) -> Shape:
    """The shape to predict for: the lengths given, else the recipe's longest (a bound, said so)."""
    said = []
    if not prompt_tokens:
        said.append("prompt: data.max_prompt_length")
    if not response_tokens:
        said.append("response: the response budget")
    return Shape(
        prompt_tokens or r.data.max_prompt_length,
        response_tokens or response_budget(r),
        "; ".join(said) + ", the longest: a bound" if said else "as given",
    )


# --- where the rates come from ---------------------------------------------------------------------------------------

TABLE = Path(__file__).with_name("rates.json")
"""The committed table: this project's CPU machine (calibrated there) and the GPUs measured by ``--calibrate``."""

DATASHEET = {
    "b200": (2250.0, 8000.0),
    "h200": (989.0, 4800.0),
    "h100": (989.0, 3350.0),
    "a100-80gb": (312.0, 2039.0),
    "a100-40gb": (312.0, 1555.0),
    "l40s": (362.0, 864.0),
    "l4": (121.0, 300.0),
    "rtx4090": (165.2, 1008.0),
}
"""cluster.gpu -> (dense bf16 peak TFLOPS, memory bandwidth GB/s) from the vendors' datasheets: a GPU the table did
not measure takes a measured one's rates scaled by these ratios (matmuls by the peak, memory by the bandwidth)."""


def published() -> dict[str, Rates]:
    """The committed table's rates, and for each DATASHEET GPU it lacks, a measured GPU's scaled (said so)."""
    raw = json.loads(TABLE.read_text()) if TABLE.is_file() else {}
    table = {}
    for name, value in raw.items():
        value["threads"] = {k: Throughput(**v) for k, v in value["threads"].items()}
        table[name] = Rates(**value)
    measured = next((g for g in DATASHEET if g in table), None)
    if measured:
        for gpu, (peak, bandwidth) in DATASHEET.items():
            if gpu not in table:
                table[gpu] = scaled(
                    table[measured], gpu, peak / DATASHEET[measured][0], bandwidth / DATASHEET[measured][1]
                )
    return table


def scaled(base: Rates, gpu: str, compute: float, memory: float) -> Rates:
    """`base`'s rates with matmuls `compute` times and memory `memory` times as fast: another GPU's, from datasheets."""
    threads = {
        k: Throughput(
            gemm={d: [[t, w, f * compute] for t, w, f in pts] for d, pts in v.gemm.items()},
            bandwidth=v.bandwidth * memory,
            forward_call=v.forward_call,
            train_call=v.train_call,
            optimizer=[v.optimizer[0], v.optimizer[1] / memory],
        )
        for k, v in base.threads.items()
    }
    source = (
        f"{base.device}'s scaled by {gpu}'s datasheet (matmuls x{compute:.2f}, memory x{memory:.2f}); {base.device}: "
        f"{base.source}"
    )
    return replace(base, device=gpu, source=source, threads=threads)


def fitted() -> dict[str, float]:
    """What a calibration takes from the committed table, not measuring it: the controller's own seconds (a step,
    a sample), a push's fixed seconds (they run on the CPU nodes whatever the devices) and a reward actor's seconds
    per sample where no reward worker runs; ``FITTED``'s defaults without a table."""
    cpu = json.loads(TABLE.read_text()).get("cpu", {}) if TABLE.is_file() else {}
    keys = ("hop_s", "hop_sample_s", "sync_s", "pass_s", "update_s", "reward_sample_s", "reward_call_s")
    return {k: cpu.get(k, FITTED[k]) for k in keys}


def rates_path(device: str) -> Path:
    """Where the rates calibrated on a machine of a device type are kept (``grpo-ray plan --calibrate``)."""
    return models.cache_dir().parent / "calibration" / f"{device}.json"


def rates_for(r: Recipe) -> Rates | None:
    """The rates for the recipe's devices: calibrated on a machine of that kind (``plan --calibrate``), else the
    published table's; None when neither knows the device."""
    kind = "cpu" if r.cluster.device == "cpu" else r.cluster.gpu
    path = rates_path(kind)
    if path.is_file():
        return Rates.load(path)
    table = published()
    if kind in table:
        rates = table[kind]
        rates.source = f"the committed table, not calibrated here: {rates.source}"
        return rates
    return None


# --- suggestions -----------------------------------------------------------------------------------------------------


@dataclass
class Suggestion:
    overrides: list[str]
    prediction: Prediction
    memory_gb: float
    """The fullest device's memory (GPU) or node's host memory (CPU), as plan counts it."""


def layouts(r: Recipe, devices: int) -> list[list[str]]:
    """The layouts the recipe allows, as override lists: the generator / learner split (on GPUs, engines x tensor
    parallel and learner ranks on `devices` GPUs less the frozen pools'; on CPU one or two engines and ranks), the
    schedule (max_staleness 0 or 1), the forward's layout (shared prompts or packed) and the learner's micro batch
    size (half, as is, twice)."""
    g, l = r.generator, r.learner
    if r.cluster.device == "cuda":
        plans = placement.plan(r)
        frozen = sum(plans[p].actors * plans[p].gpus for p in ("reference", "teacher", "reward_model"))
        splits = [
            (e, tp, devices - frozen - e * tp)
            for tp in sorted({g.tensor_parallel_size, 1, 2, 4, 8})
            for e in range(1, devices)
            if devices - frozen - e * tp >= 1
        ]
    else:
        splits = [(e, 1, w) for e in (1, 2) for w in (1, 2)]
    micro = sorted({max(1, l.micro_batch_size // 2), l.micro_batch_size, l.micro_batch_size * 2})
    return [
        [
            f"generator.num_engines={e}",
            *([f"generator.tensor_parallel_size={tp}"] if r.cluster.device == "cuda" else []),
            f"learner.world_size={w}",
            f"algorithm.max_staleness={k}",
            f"model.shared_prompt={s}",
            f"learner.micro_batch_size={m}",
        ]
        for e, tp, w in splits
        for k in sorted({r.algorithm.max_staleness, 0, 1})
        for s in ("true", "false")
        for m in micro
    ]


def suggest(
    make, r: Recipe, d: ModelDims, rates: Rates, shape: Shape, devices: int, top: int | None = 3, node_cpus: int = 0
) -> list[Suggestion]:
    """The `top` fastest layouts (``layouts``; None: all of them) that load (`make(overrides)` -> Recipe, raising
    RecipeError when the combination is refused) and fit (``fit.check``; on CPU, their pools also ask for no more
    CPUs than the nodes have: `node_cpus` each, 0: this machine's cores, as ``predict`` assumes), by predicted step
    time."""
    from grpo_ray import fit
    from grpo_ray.config import RecipeError

    out = []
    for overrides in layouts(r, devices):
        try:
            candidate = make(overrides)
        except RecipeError:
            continue
        report = fit.check(candidate, d)
        if not report.fits or cpus_short(candidate, node_cpus):
            continue
        busiest = max((m.total for m in report.memory), default=0.0)
        out.append(Suggestion(overrides, predict(candidate, d, rates, shape, node_cpus), busiest))
    out.sort(key=lambda s: s.prediction.step)
    distinct, seen = [], set()
    for s in out:  # layouts that change nothing of the step (a micro batch larger than a rank's share) once
        key = (round(s.prediction.step, 6), round(s.memory_gb, 3))
        if key not in seen:
            seen.add(key)
            distinct.append(s)
    return distinct[:top]


def cpus_short(r: Recipe, node_cpus: int = 0) -> bool:
    """A CPU recipe whose pools ask for more CPUs than its nodes have, `node_cpus` each (0: this machine's cores):
    ``placement.reserve`` would refuse it."""
    if r.cluster.device != "cpu":
        return False
    asked = sum(p.actors * p.cpus for p in placement.plan(r).values())
    return asked > r.cluster.nodes * (node_cpus or len(os.sched_getaffinity(0))) + 1e-9


def suggestions_text(now: Prediction, found: list[Suggestion]) -> str:
    lines = [f"fastest layouts that fit (predicted; the recipe as it is: {now.step:.3f} s a step):"]
    for i, s in enumerate(found, 1):
        lines.append(
            f"  {i}. {s.prediction.step:.3f} s a step ({now.step / s.prediction.step:.2f}x), the largest pool "
            f"{s.memory_gb:.2f} GB per device: {' '.join(s.overrides)}"
        )
    if not found:
        lines.append("  none of the layouts considered fits")
    return "\n".join(lines)
