"""``grpo-ray plan --calibrate``: measure, on this machine, the rates the planner's time model uses (``speed.Rates``).

Each part runs in a child process of its own, so that its compute threads are set before torch starts and its
process group is its own:

    gemm        matmuls [tokens x width] @ [width x width] over a grid of both, per dtype; elementwise bandwidth;
                an optimizer step's cost per parameter (at each thread count: on CPU 1 and the node's cores)
    calls       the learner's own code (``Learner.update`` and its forward-only ``_score``, FSDP2 on a one-rank
                group) on tiny models of 1 and 3 layers, with one and two micro batches of one short sequence: the
                fixed cost of a forward, of a forward+backward and of an optimizer step, per call and per layer
    collective  two processes of the learner's backend: an all-gather's latency and bandwidth, a broadcast's
    engine     (where vLLM imports) an engine on tiny models of 1 and 4 layers: a decode step's fixed cost per step,
                per layer and per sequence, a generate call's, and an in-place reload's per layer; and a bf16 engine
                on a model of a real one's width, reloading in buckets at each thread count: the reload's bytes

What is not measured here (a reward actor's seconds per sample, the controller's own time per step) comes from
``FITTED``. The rates are written to ``<cache>/calibration/<device>.json`` (``rates_path``), which ``plan``
then reads for recipes on that device.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import socket
import statistics
import time
from datetime import date, datetime
from pathlib import Path

from grpo_ray.device import Device
from grpo_ray.models.dims import model_dims
from grpo_ray.planner import measure, work
from grpo_ray.planner.measure import (
    CALL_MODEL,
    DEPTHS,
    ENGINE_MODELS,
    LOG_VAR,
    LONG_PROMPT,
    MANY,
    RELOAD_MODEL,
    WORK,
    answer,
    calls_part,
    child,
    collective_part,
    engine_part,
    gemm_part,
    reload_part,
    reward_part,
)
from grpo_ray.planner.rates import FITTED, Rates, Throughput, fitted, rates_path


def line_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Intercept and slope of the line through two points (x0, y0), (x1, y1); both kept at least 0."""
    slope = (ys[1] - ys[0]) / (xs[1] - xs[0])
    return max(ys[0] - slope * xs[0], 0.0), max(slope, 0.0)


def has_vllm() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def has_gpu() -> bool:
    """Whether this machine has a GPU torch can use (asked before a GPU calibration starts)."""
    import torch

    return torch.cuda.is_available()


def calibrate(device: str = "cpu", say=print) -> tuple[Rates, Path]:
    """Measure every part on this machine's `device` (cpu or cuda), write the rates, and return them and where. What
    the parts' processes print goes to ``calibration/calibrate.log`` beside the rates, not the console."""
    log = rates_path(device).with_name("calibrate.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    say(f"  the parts' own output: {log}")
    os.environ[LOG_VAR] = str(log)
    try:
        return _calibrate(device, say)
    finally:
        os.environ.pop(LOG_VAR, None)


def _calibrate(device: str, say) -> tuple[Rates, Path]:
    start = time.perf_counter()
    cores = len(os.sched_getaffinity(0))
    counts = sorted({1, cores}) if device == "cpu" else [1]
    threads = {}
    for t in counts:
        threads[str(t)] = torch_rates(device, t)
        say(f"  {t} thread(s): matmuls, memory and the learner's calls measured ({time.perf_counter() - start:.0f} s)")
    coll = _collective(device)
    say(f"  collectives measured ({time.perf_counter() - start:.0f} s)")
    engine = dict(FITTED["engine"])
    if device == "cpu" and has_vllm():
        env = Device("cpu").engine_env(cores, eager=True)  # a run's engine's (measure's recipes: enforce_eager)
        runs = child(engine_part, (tuple(ENGINE_MODELS),), env)
        engine = _engine_rates(runs, threads[str(cores)])
        layers = model_dims(RELOAD_MODEL).layers
        for t in counts:  # the reload's bytes at each thread count, beyond its layers' fixed cost
            reload = child(reload_part, (), {**env, "OMP_NUM_THREADS": str(t)})
            extra = reload["seconds"] - engine["reload_layer_s"] * layers
            threads[str(t)].reload_bps = reload["bytes"] / extra if extra > 0 else math.inf
        say(f"  engines measured ({time.perf_counter() - start:.0f} s)")
    table = fitted()
    reward = child(reward_part, (), {}) if device == "cpu" else (table["reward_call_s"], table["reward_sample_s"])
    changes_bps, apply_bps = changes_rates()
    rates = Rates(
        device=device if device == "cpu" else _gpu_kind(),
        source=f"calibrated on {socket.gethostname()}, {date.today()}",
        threads=threads,
        collective=coll["collective"],
        transport=coll["transport"],
        engine=engine,
        reward_call_s=reward[0],
        reward_sample_s=reward[1],
        hop_s=table["hop_s"],
        hop_sample_s=table["hop_sample_s"],
        sync_s=table["sync_s"],
        pass_s=table["pass_s"],
        changes_bps=changes_bps,
        apply_bps=apply_bps,
    )
    path = rates_path(rates.device)
    if path.exists():  # an earlier calibration is kept, renamed aside with its own time
        stamp = datetime.fromtimestamp(path.stat().st_mtime).strftime("%Y%m%d-%H%M%S")
        aside = path.with_name(f"{path.stem}-{stamp}{path.suffix}")
        path.rename(aside)
        say(f"  the earlier calibration is kept as {aside}")
    rates.save(path)
    return rates, path


def torch_rates(device: str, threads: int) -> Throughput:
    """The throughput of one actor with `threads` compute threads on `device`: the matmul grid, memory and the
    optimizer (``gemm_part``), and the learner's fixed costs (``calls_part``): a second micro batch costs one call
    (at 1 and 3 layers: a call's base and its cost per layer), an update of one micro batch less its call is the
    optimizer step's base, and MANY samples less 2 in as many calls cost their samples' own time (less their
    matmuls and memory, predicted on the grid)."""
    env = {"OMP_NUM_THREADS": str(threads)}
    g = child(gemm_part, (device, threads), env)  # alone: its timings are the process's only work
    calls = child(calls_part, (device, threads, DEPTHS[device]), env)
    calls_work = calls.pop("work")
    t = Throughput(g["gemm"], g["bandwidth"], [0.0, 0.0], [0.0, 0.0], [0.0, g["optimizer_per_param"]])
    t.overlap = device == "cuda"  # kernels launch ahead of the device: a call takes the longer of launches and work
    for kind, name in (("update", "train_call"), ("forward", "forward_call")):
        call = {k: calls[k][f"{kind}_2"] - calls[k][f"{kind}_1"] for k in calls}
        setattr(t, name, list(line_fit(list(DEPTHS[device]), [call[k] for k in DEPTHS[device]])))
    t.optimizer[0] = max(2 * calls[1]["update_1"] - calls[1]["update_2"], 0.0)
    extra = MANY - 2  # samples of 4 + 2 tokens, the head on the 2
    for kind, name, passes in (("update", "train_sample", 3), ("forward", "forward_sample", 1)):
        per_sample = []
        for layers, c in calls.items():
            dims = model_dims(CALL_MODEL.format(layers=layers))
            predicted = passes * work.work_seconds(dims, t, "float32", 6 * extra, [(6, 6)] * extra, 2 * extra, 2)
            per_sample.append(max(c[f"{kind}_many"] - c[f"{kind}_2"] - predicted, 0.0) / extra)
        setattr(t, name, statistics.fmean(per_sample))
    t.attention = g["attention"]
    # the work's scale: WORK's measured seconds less the optimizer's (and, where they add up, the calls' fixed
    # costs), over its work predicted on the grids
    w = WORK[device]
    dims = model_dims(w["model"])
    step = work.share_work([([0] * w["prompt"], [0] * w["response"])] * w["samples"], w["micro"], True, False)
    for kind, name, passes, base, sample in (
        ("update", "train_scale", 3, t.train_call, t.train_sample),
        ("forward", "forward_scale", 1, t.forward_call, t.forward_sample),
    ):
        dense, attention = work.work_parts(
            dims, t, w["dtype"], step.slots, step.rows, step.logits, step.calls, kind == "update"
        )
        predicted = passes * dense + attention
        fixed = step.calls * (base[0] + base[1] * dims.layers) + w["samples"] * sample
        measured = calls_work[kind] - (t.optimizer[0] + t.optimizer[1] * dims.params if kind == "update" else 0.0)
        if t.overlap:  # the work, where it outlasts the launches
            setattr(t, name, measured / predicted if measured > fixed else 1.0)
        else:
            setattr(t, name, max(measured - fixed, 0.0) / predicted)
    return t


def _collective(device: str) -> dict:
    from grpo_ray.sync import free_port

    ctx = mp.get_context("spawn")
    queue, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=collective_part, args=(device, rank, port, queue)) for rank in range(2)]
    for p in procs:
        p.start()
    out = answer(queue, procs, "collective_part")
    for p in procs:
        p.join()
    queue.close()
    queue.join_thread()
    latency, per_byte = line_fit(
        [out["gather_small_bytes"], out["gather_large_bytes"]], [out["gather_small"], out["gather_large"]]
    )
    return {
        "collective": [latency, 1 / per_byte if per_byte else math.inf],
        "transport": out["broadcast_bytes"] / out["broadcast"],
    }


def _engine_rates(runs: dict[int, dict], t: Throughput) -> dict[str, float]:
    """The engine's costs from the generator role's calls on models of two depths at 1 and MANY sequences, its work
    (matmuls and memory) predicted on `t` (the engine's threads): a decode step (a 33-token call less a 1-token one,
    over 32 steps) = step_s + step_layer_s x layers + seq_s x sequences + work_scale x its work (least squares over
    the four); MANY prompts of LONG_PROMPT tokens less of 4 = prefill_scale x their forwards' work difference (least
    squares through 0 over both models); a 1-token call = prefill_s + request_s x sequences + one step +
    prefill_scale x the prompts' forward; a reload = reload_layer_s x layers + bytes / reload_bps."""
    import numpy as np

    dims = {k: model_dims(ENGINE_MODELS[k]) for k in runs}
    points = [(k, n) for k in runs for n in (1, MANY)]
    a = [[1.0, k, n, work.decode_work(dims[k], t, "float32", n, 21)] for k, n in points]
    y = [(runs[k][f"generate_{n}_33"] - runs[k][f"generate_{n}_1"]) / 32 for k, n in points]
    step_s, step_layer_s, seq_s, scale = (max(float(v), 0.0) for v in np.linalg.lstsq(a, y, rcond=None)[0])
    engine = {"step_s": step_s, "step_layer_s": step_layer_s, "seq_s": seq_s, "work_scale": scale}
    x = [
        work.prefill_work(dims[k], t, "float32", MANY, LONG_PROMPT) - work.prefill_work(dims[k], t, "float32", MANY, 4)
        for k in runs
    ]
    y = [runs[k]["prefill_long"] - runs[k][f"generate_{MANY}_1"] for k in runs]
    prefill_scale = max(sum(a * b for a, b in zip(x, y)) / sum(a * a for a in x), 0.0)
    engine["prefill_scale"] = prefill_scale
    a = [[1.0, n] for k, n in points]
    y = [
        runs[k][f"generate_{n}_1"]
        - work.step_fixed(engine, dims[k], n)
        - prefill_scale * work.prefill_work(dims[k], t, "float32", n, 4)
        for k, n in points
    ]
    prefill_s, request_s = (max(float(v), 0.0) for v in np.linalg.lstsq(a, y, rcond=None)[0])
    engine.update(prefill_s=prefill_s, request_s=request_s)
    # reload: the small model's is mostly its per-layer cost, the big one's adds its bytes
    small, big = min(runs), max(runs)
    engine["reload_layer_s"] = runs[small]["reload"] / small
    extra = runs[big]["reload"] - engine["reload_layer_s"] * big
    engine["reload_bps"] = runs[big]["weight_bytes"] / extra if extra > 0 else math.inf
    return engine


def changes_rates(share: float = 0.025) -> tuple[float, float]:
    """Bytes per second at which the delta transport finds what changed in a 32 MiB bf16 bucket where `share` of its
    elements did (learner rank 0: ``transports.delta.Copies.encode``), and at which an engine worker writes those
    changes into its copy and checks its sum (``Copies.decode``); each on one host core."""
    import torch

    from grpo_ray.sync import WeightMeta
    from grpo_ray.transports.delta import Copies

    gen = torch.Generator().manual_seed(0)
    last = torch.randn(1 << 24, generator=gen).to(torch.bfloat16)
    flat = last.clone()
    moved = torch.randperm(flat.numel(), generator=gen)[: int(share * flat.numel())]
    flat[moved] = (flat[moved].float() * 1.01).to(torch.bfloat16)
    metas = [WeightMeta("w", (flat.numel(),), "bfloat16")]
    sender, receiver = Copies(), Copies()
    sender.start(1)
    receiver.start(1)

    def find():
        sender.last[0] = last
        return sender.encode(0, flat, metas, [0], 0)

    header, payload = find()
    receiver.last[0] = last.clone()  # applying the same changes again leaves the copy as the learner's
    apply = lambda: receiver.decode(0, header.tolist(), payload, False, metas, [0], 0)  # noqa: E731
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one host core each
    try:
        return flat.nbytes / measure._timed(find, 0.2), flat.nbytes / measure._timed(apply, 0.2)
    finally:
        torch.set_num_threads(threads)


def _gpu_kind() -> str:
    """cluster.gpu's name for this machine's GPU (h100, h200, ...), else its torch name."""
    import torch

    from grpo_ray.config import GPU_MEMORY_GB

    name = torch.cuda.get_device_name().lower()
    return next((k for k in sorted(GPU_MEMORY_GB, key=len, reverse=True) if k.split("-")[0] in name), name)


def main() -> None:  # pragma: no cover - `grpo-ray plan --calibrate` is the way in
    rates, path = calibrate()
    print(json.dumps({"path": str(path), "source": rates.source}))
