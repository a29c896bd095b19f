"""How long a step will take, predicted from the recipe before anything starts (``grpo-ray plan``).

Each phase is its work over measured rates plus its fixed costs, and plan prints the inputs beside each number. The
rates (``Rates``) are one device's, on CPU one actor's at its compute threads: calibrated on the machine at hand
(``grpo-ray plan --calibrate``, ``calibrate``) or, for a GPU not calibrated, the committed table (``rates``; marked
as such in the output). What one model call costs is ``work``'s.

A step has n = data.train_batch_size x algorithm.group_size samples of p prompt and r response tokens (``Shape``).
A model call over T token slots costs the call's fixed cost (a base and a cost per decoder layer: kernel launches,
Python), its matmuls (each linear layer, attention's QK^T and AV, the LM head where logits are taken) at the rate the
calibration measured for matmuls of that shape, and its activations moved through memory; a backward costs 2 x the
matmuls and memory, and its own fixed cost. The phases:

    generation  each engine's n / E samples: a prefill of their prompts (a vision-language model's pictures through
                its tower first: ``work.pictures_read``, ``tower_seconds``; the learner and the scorers read them
                too, once a call), then r decode steps, each a fixed cost, a cost per sequence, and its matmuls at
                the decode batch or the weights and keys/values read from memory, whichever is longer
    reward      each reward actor's share of the samples at a fixed cost per sample
    reference   each reference actor's share, micro batched as ``batching.micro_batches`` cuts it, in the layout
                the learner chooses (``model.shared_prompt``), plus the FSDP2 group's all-gathers; the teacher's the
                same on its own shape
    reward_model  a classifier's forward over each actor's share (one output a row)
    judge         a judge's engines generating a verdict for each sample of their share
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

import math
import os
import statistics
from dataclasses import dataclass, field, replace

from grpo_ray import placement, schedules, transports
from grpo_ray.algo.batching import use_shared
from grpo_ray.config import GENERATOR, KINDS, LEARNER, PoolKind, Recipe
from grpo_ray.lengths import dtype_bytes, response_budget, wire_dtype
from grpo_ray.models.dims import ModelDims
from grpo_ray.planner.memory import bucket_bytes, dims_of
from grpo_ray.planner.rates import Rates, Throughput
from grpo_ray.planner.work import (
    call_seconds,
    generation_seconds,
    group_seconds,
    pictures_read,
    share_work,
    tower_seconds,
    work_parts,
)


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
            lines.append(f"  {name:<12} {p.seconds:9.3f} s  {p.detail}")
        for pool in self.unmodelled:
            lines.append(f"  {pool:<12} {'-':>9}    not modelled: its actors' time is not in the step below")
        lines.append(f"  {'step':<12} {self.step:9.3f} s  {self.schedule}")
        idle = ", ".join(f"{k} {v:.2f}" for k, v in self.idle.items())
        lines.append(f"  tokens/s per device {self.tokens_per_s_per_device:.4g}; idle share: {idle}")
        return "\n".join(lines)


def seconds_str(x: float) -> str:
    return f"{x * 1e3:.3g} ms" if x < 1 else f"{x:.3g} s"


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
@dataclass
class StepInputs:
    """What every phase's prediction reads: the recipe, the policy's shape, the rates, the step's samples, and the
    compute threads of each pool's actors on a node of `cores` cores."""

    r: Recipe
    d: ModelDims
    rates: Rates
    shape: Shape
    pairs: list
    plans: dict
    threads: dict[str, int]
    cores: int

    def model_of(self, kind: PoolKind) -> ModelDims:
        """The shape of the model `kind`'s row names: the policy's, or its own (read from its recipe key)."""
        return dims_of(kind, self.r, self.d)

    @property
    def schedule(self) -> schedules.Schedule:
        """The recipe's schedule: the rules the controller runs, simulated here."""
        return schedules.of(self.r.algorithm)

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
    s = StepInputs(r, d, rates, shape, shape_pairs(r, shape), plans, threads, cores)
    phases = {}
    for kind in sorted(KINDS.values(), key=lambda k: k.name == LEARNER):  # the pools' phases, the learner's last
        if kind.time and plans[kind.name].actors:
            phases.update(TIME_MODELS[kind.time](s, kind))
    phases |= {
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


def generation_phase(s: StepInputs, kind: PoolKind) -> dict[str, Phase]:
    """Each engine's share of the samples: a prefill, then a decode step per token (``generation_seconds``)."""
    engines, shape = s.plans[kind.name].actors, s.shape
    per_engine = math.ceil(len(s.pairs) / engines)
    tp = s.r.generator.tensor_parallel_size if s.r.cluster.device == "cuda" else 1
    prefill, decode = generation_seconds(
        s.d,
        s.at(kind.name),
        wire_dtype(s.r),
        s.rates.engine,
        per_engine,
        shape.prompt_tokens,
        shape.response_tokens,
        tp,
    )
    tower = tower_seconds(s.d, s.at(kind.name), wire_dtype(s.r), pictures_read(s.r, per_engine) / tp)
    prefill += tower
    detail = (
        f"{engines} engine(s) x {per_engine} sequences: prefill {seconds_str(prefill)}"
        f"{f' (the vision tower {seconds_str(tower)})' if tower else ''}, "
        f"{max(shape.response_tokens - 1, 0)} decode steps {seconds_str(decode)}"
    )
    return {"generation": Phase(prefill + decode, detail, {kind.name: (prefill + decode) * engines})}


def reward_phase(s: StepInputs, kind: PoolKind) -> dict[str, Phase]:
    """Each reward actor's call: its fixed cost and its share at its cost per sample."""
    actors = s.plans[kind.name].actors
    share = math.ceil(len(s.pairs) / actors)
    seconds = s.rates.reward_call_s + share * s.rates.reward_sample_s
    detail = f"{actors} actor(s): a call and {share} samples x {seconds_str(s.rates.reward_sample_s)}"
    return {kind.name: Phase(seconds, detail, {kind.name: seconds * actors})}


def frozen_phase(s: StepInputs, kind: PoolKind) -> dict[str, Phase]:
    """A frozen model's forward (the reference's; the teacher's, on its own shape) over each actor's share, micro
    batched, with the group's all-gathers."""
    count, d = s.plans[kind.name].actors, s.model_of(kind)
    size, m = kind.section_of(s.r).micro_batch_size, s.r.model
    shared, layout = s.layout(size)
    share = s.pairs[: math.ceil(len(s.pairs) / count)]
    w, t = share_work(share, size, m.sequence_packing, shared), s.at(kind.name)
    seconds = call_seconds(d, t, s.r.learner.dtype, w.slots, w.rows, w.logits, False, w.calls)
    seconds += s.rates.pass_s + t.forward_sample * len(share)
    seconds += tower_seconds(d, t, s.r.learner.dtype, pictures_read(s.r, len(share), w.calls))
    seconds += group_seconds(d, s.rates, count, w.calls, False, s.r.learner.dtype)
    detail = f"{count} actor(s): {w.calls} calls over {w.slots} token slots ({layout})"
    return {kind.name: Phase(seconds, detail, {kind.name: seconds * count})}


def judge_phase(s: StepInputs, kind: PoolKind) -> dict[str, Phase]:
    """A judge's engines generating a verdict of up to judge.max_tokens for each sample of their share (its prompt:
    the rubric, about 4 characters a token, around the sample's prompt and response)."""
    count, name, j = s.plans[kind.name].actors, kind.name, s.r.reward_model.judge
    share = s.pairs[: math.ceil(len(s.pairs) / count)]
    prompt = len(share[0][0]) + len(share[0][1]) + len(j.template) // 4
    d, t = s.model_of(kind), s.at(name)
    prefill, decode = generation_seconds(d, t, wire_dtype(s.r), s.rates.engine, len(share), prompt, j.max_tokens)
    prefill += tower_seconds(d, t, wire_dtype(s.r), pictures_read(s.r, len(share)))
    detail = f"{count} judge engine(s) x {len(share)} verdicts of up to {j.max_tokens} tokens"
    return {name: Phase(prefill + decode, detail, {name: (prefill + decode) * count})}


def reward_model_phase(s: StepInputs, kind: PoolKind) -> dict[str, Phase]:
    """A classifier's forward over each actor's share on its own shape (one output a row, no vocabulary), with its
    group's all-gathers when sharded."""
    count, name = s.plans[kind.name].actors, kind.name
    rm, share = s.r.reward_model, s.pairs[: math.ceil(len(s.pairs) / count)]
    d, t = s.model_of(kind), s.at(name)
    d = replace(d, vocab=1)
    w = share_work(share, rm.micro_batch_size, s.r.model.sequence_packing, False)
    seconds = call_seconds(d, t, s.r.learner.dtype, w.slots, w.rows, len(w.rows), False, w.calls)
    seconds += s.rates.pass_s + t.forward_sample * len(share)
    seconds += tower_seconds(d, t, s.r.learner.dtype, pictures_read(s.r, len(share), w.calls))
    if rm.shard and count > 1:
        seconds += group_seconds(d, s.rates, count, w.calls, False, s.r.learner.dtype)
    detail = f"{count} actor(s): a classifier's {w.calls} calls over {w.slots} token slots"
    return {name: Phase(seconds, detail, {name: seconds * count})}


def learner_phases(s: StepInputs, kind: PoolKind) -> dict[str, Phase]:
    """Per rank, its share of each mini batch: ppo_epochs x (forward+backward of its micro batches, with gradient
    checkpointing the decoder layers' forward again, the group's collectives, an optimizer step); and the old
    policy's forward in steps that recompute it (more than one update, or samples of older weights, unless bypass
    mode), with older weights copied into the shards and back."""
    r, d, a, m = s.r, s.d, s.r.algorithm, s.r.model
    W, t, dtype = r.learner.world_size, s.at(kind.name), r.learner.dtype
    mini = min(r.learner.mini_batch_size, len(s.pairs))
    minis = math.ceil(len(s.pairs) / mini)
    share = s.pairs[: math.ceil(mini / W)]
    shared, layout = s.layout(r.learner.micro_batch_size)
    w = share_work(share, r.learner.micro_batch_size, m.sequence_packing, shared)
    train = call_seconds(d, t, dtype, w.slots, w.rows, w.logits, True, w.calls) + t.train_sample * len(share)
    tower = tower_seconds(d, t, dtype, pictures_read(r, len(share), w.calls))
    train += tower * (1 if m.freeze_vision or m.lora.rank else 3)  # its backward too where the tower trains
    if r.learner.gradient_checkpointing:  # the backward runs each decoder layer's forward again (not the head)
        dense, attention = work_parts(d, t, dtype, w.slots, w.rows, 0, w.calls)
        train += w.calls * t.forward_call[1] * d.layers + t.forward_scale * (dense + attention)
    train += group_seconds(d, s.rates, W, w.calls, True, dtype)
    trained = d.trained(m)
    update = s.rates.update_s + a.ppo_epochs * minis * (train + t.optimizer[0] + t.optimizer[1] * trained / W)
    # in a steady run one step off or more, every batch is of older weights (the schedule's push_due)
    recomputed = s.schedule.recomputes_old_policy(minis, stale=s.schedule.overlapping())
    old = 0.0
    if recomputed:
        forward = call_seconds(d, t, dtype, w.slots, w.rows, w.logits, False, w.calls) + t.forward_sample * len(share)
        forward += tower
        old = s.rates.pass_s + minis * (forward + group_seconds(d, s.rates, W, w.calls, False, dtype))
        if s.schedule.keeps_older_weights():  # the older weights' snapshot copied in, the current ones back
            old += 2 * 2 * d.params / W * dtype_bytes(dtype) / t.bandwidth
    how = f"{W} rank(s) x {minis} mini batch(es), forward only" if recomputed else "not recomputed (one update)"
    return {
        "old policy": Phase(old, how, {kind.name: old * W}),
        "update": Phase(
            update,
            f"{W} rank(s) x {a.ppo_epochs} epoch(s) x {minis} mini batch(es): {w.calls} calls over {w.slots} token "
            f"slots ({layout}) + an optimizer step over {trained / W:.3g} parameters",
            {kind.name: update * W},
        ),
    }


TIME_MODELS = {
    "generation": generation_phase,
    "frozen": frozen_phase,
    "learned_reward": reward_model_phase,
    "judging": judge_phase,
    "rule_reward": reward_phase,
    "update": learner_phases,
}
"""Each time model a pool kind's row may name (``PoolKind.time``): its phases for a step, by phase name."""


def sync_phase(s: StepInputs) -> Phase:
    """Rank 0 gathers the weights (or LoRA's adapters) from the ranks' shards and sends them over the transport; the
    engines reload them; and a push's fixed cost. A transport that sends only what changed (``delta``) sends its
    expected share of the bytes (``Transport.bytes_share``), after rank 0 finds the changes at ``changes_bps``, and
    the engines apply them to their copies at ``apply_bps`` before they reload: that search of bucket k + 1 runs
    while the engines apply and reload bucket k, so the longer of the two counts, and a bucket's worth of the
    shorter."""
    engines = s.plans[GENERATOR].actors
    if not engines:
        return Phase(0.0, "no engines")
    r, d, m = s.r, s.d, s.r.model
    W, e = r.learner.world_size, s.rates.engine
    sent = d.pushed(m)  # what trains (LoRA merged: the adapted weights)
    nbytes = sent * dtype_bytes(wire_dtype(r))
    reload = e["reload_layer_s"] * d.layers + nbytes / (s.at(GENERATOR).reload_bps or e["reload_bps"])
    gather = nbytes * (W - 1) / W / s.rates.collective[1]
    transport = transports.transport_class(r.trainer.weight_transport)
    wire, find = nbytes * transport.bytes_share(r), 0.0
    if transport.finds_changes:  # rank 0 finds the changes, the engines apply them to their copies, then reload
        find, reload = nbytes / s.rates.changes_bps, reload + nbytes / s.rates.apply_bps
    buckets = max(1, math.ceil(nbytes / bucket_bytes(d, r)))
    seconds = s.rates.sync_s + gather + wire / s.rates.transport + max(find, reload) + min(find, reload) / buckets
    detail = (
        f"{wire / 1e6:.4g} MB at {s.rates.transport / 1e9:.3g} GB/s, then the engines' reload {seconds_str(reload)}"
    )
    if transport.finds_changes:
        detail = (
            f"{transport.name}: finding changes {seconds_str(find)}, {wire / nbytes:.1%} of a whole push: " + detail
        )
    return Phase(seconds, detail, {LEARNER: seconds * W, GENERATOR: seconds * engines})


def schedule_step(s: StepInputs, phases: dict[str, Phase]) -> tuple[float, str]:
    """The step's seconds under the schedule, and how they add up: on-policy, its phases in a row; else as the
    schedule's timing says (``STEPS``: the batched schedule one step off, the streaming schedule's). On CPU the
    phases running at once share the node's cores (``shared_cores``), and each phase's seconds become what it takes
    there (its Phase is changed there)."""
    sec = {k: p.seconds for k, p in phases.items()}
    scorers, scoring, after = scoring_of(sec)
    if not s.schedule.overlapping():
        step = sec["generation"] + scoring + sec["old policy"] + sec["update"] + after
        return step, "on-policy: generation + max(reward, frozen pools) + old policy + update + sync + hops"
    # scoring's pools run at once, each busy its own share of the time: their threads on average (a reward actor's
    # sandboxed children one thread each)
    threads_of = {k: s.plans[k].actors * (s.threads[k] if KINDS[k].model else 1) for k in scorers}
    scoring_threads = sum(n * sec[k] for k, n in threads_of.items()) / scoring if scoring else 0.0
    threads = {
        "generation": s.plans[GENERATOR].actors * s.threads[GENERATOR],
        "scoring": scoring_threads,
        "scoring left": scoring_threads,
        "old policy": s.r.learner.world_size * s.threads[LEARNER],
        "update": s.r.learner.world_size * s.threads[LEARNER],
    }
    cores = s.cores if s.r.cluster.device == "cpu" else math.inf
    return STEPS[s.schedule.timing](s, phases, sec, threads, cores)


def scoring_of(sec: dict) -> tuple[list[str], float, float]:
    """A step's scorers (they score at once), their seconds (the longest's), and the seconds after the update (the
    sync and the hops)."""
    scorers = [k.name for k in KINDS.values() if k.signal and k.name in sec]
    return scorers, max([0.0, *(sec[k] for k in scorers)]), sec["sync"] + sec["hops"]


def one_step_off(s: StepInputs, phases: dict[str, Phase], sec: dict, threads: dict, cores: float) -> tuple[float, str]:
    """The batched schedule's step at max_staleness >= 1, as the controller runs it: the step launches the next
    batch's generation, whose scoring starts as it ends, while the learner waits for what is left of this batch's
    scoring (started in the step before), then runs the old policy and the update; the sync waits for both. Scoring
    past the step's end goes on through the sync and the hops, and what is left of it then opens the next step.
    Steps are simulated one after another from a first with nothing left over, the step the mean of the last four
    (where the learner's chain is the longer, what is left over alternates)."""
    scorers, scoring, after = scoring_of(sec)
    left, steps = 0.0, []
    for _ in range(6):
        chains = [
            [("generation", sec["generation"]), ("scoring", scoring)],
            [("scoring left", left), *((k, sec[k]) for k in LEARNING)],
        ]
        took, ended = shared_cores(chains, threads, cores)
        step = max(ended["generation"], ended["update"]) + after
        left = max(0.0, ended["scoring"] - step)
        steps.append(step)
    stretch_shared(s, phases, took, scorers, scoring)
    return statistics.fmean(steps[-4:]), (
        "one step off: max(generation, scoring left over + old policy + update) + sync + hops, the next batch's "
        "scoring from the generation's end" + (", sharing the cores" if math.isfinite(cores) else "")
    )


def streaming_step(
    s: StepInputs, phases: dict[str, Phase], sec: dict, threads: dict, cores: float
) -> tuple[float, str]:
    """The streaming schedule's step: the engines never wait, so generation (and each push's pause) runs against the
    learner's chain; at max_staleness >= 2 the next step's groups are scored during the update (``launches_ahead``)."""
    scorers, scoring, after = scoring_of(sec)
    learning = [(k, sec[k]) for k in LEARNING]
    ahead = s.schedule.launches_ahead(1, 2, False)
    scoring_chain = [[("scoring", scoring)], learning] if ahead else [[("scoring", scoring), *learning]]
    took, ended = shared_cores([[("generation", sec["generation"])], *scoring_chain], threads, cores)
    stretch_shared(s, phases, took, scorers, scoring)
    step = max(ended["generation"] + sec["sync"], ended["scoring"], ended["update"] + after)
    return step, (
        "streaming: max(generation + the push's pause, "
        + (
            "scoring of the next step's groups, old policy + update + sync + hops"
            if ahead
            else "scoring + old policy + update + sync + hops"
        )
        + "), each engine generating through the learner's step"
        + (", sharing the cores" if math.isfinite(cores) else "")
    )


LEARNING = ("old policy", "update")
"""The learner's phases of a step, in order."""

STEPS = {"batched": one_step_off, "streaming": streaming_step}
"""How a schedule whose phases overlap adds up a step, by the name it gives (``Schedule.timing``)."""


def stretch_shared(s: StepInputs, phases: dict[str, Phase], took: dict, scorers: list[str], scoring: float) -> None:
    """Each phase's seconds become what it took sharing the cores (``shared_cores``), said in its detail."""
    for name, seconds in took.items():
        for phase in scorers if name == "scoring" else [] if name == "scoring left" else [name]:
            p = phases[phase]
            stretch = seconds / scoring if name == "scoring" and scoring else seconds / p.seconds if p.seconds else 1
            if stretch > 1.001:
                p.seconds *= stretch
                p.busy = {k: v * stretch for k, v in p.busy.items()}
                p.detail += f"; x{stretch:.2f} sharing {s.cores} cores"


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
