"""grpo-ray against the raw components doing the same work, in one run.

    python benchmarks/bench.py --recipe recipes/tiny-cpu.yaml --warmup 8 --steps 20 --out benchmarks/results \
        [--set KEY=VALUE ...]

For the recipe it measures, side by side:
  - generation: our generator pool (the controller's generate hop, Ray included) vs raw vLLM
    ``LLM.generate`` in one process, same prompts, same sampling, same thread budget;
  - learner: our learner pool's train hop vs a raw FSDP2 forward/backward/step loop over the same
    batch with the same ranks, micro batches and threads (tokens/s and MFU);
  - weight sync: our sync hop (gather from shards, broadcast, load into vLLM, probe) vs a raw
    ``torch.distributed.broadcast`` of the same bytes over the same backend (GB/s), and vLLM's in-place reload
    of the same weights, in memory, in the raw vLLM process (``raw_reload``);
  - the end-to-end step and its breakdown; overhead = step time - the step's raw parts: its own batch's
    generated and trained tokens at the raw components' tokens/s, raw broadcast + raw reload, and the reward
    and reference work measured inside their actors; the median over the steps.
Each side after its warm-up (--warmup steps; the raw components one call), then the median of --steps steps
(--reps calls): the same statistic on both sides. A run's first steps are slower (vLLM's and oneDNN's first
calls on new shapes; the raw side repeats one batch, so one call warms it): at the tiny size a step's overhead
fell from 0.08-0.12 s over its first 3 timed steps after 3 warm-up steps to 0.02-0.04 s from the 8th step on.
Then a sweep over model size and over group size x response length (end-to-end steps only).
It writes results.json, results.md and PNG plots to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# --- raw components, each run in a child process with the actor's thread budget -----------------


def raw_vllm(spec: dict) -> dict:
    """Raw vLLM: one engine in this process, the same prompts and sampling, timed over `reps` calls."""
    from vllm import LLM, SamplingParams

    from grpo_ray.roles import trim_heap
    from grpo_ray.roles.vllm_ext import bound_cpu_gemm_caches

    bound_cpu_gemm_caches()
    llm = LLM(
        model=spec["model"],
        kv_cache_memory_bytes=spec["kv_cache_memory_bytes"],
        dtype=spec["dtype"],
        enforce_eager=spec["enforce_eager"],
        max_model_len=spec["max_model_len"],
        seed=0,
        enable_chunked_prefill=False,
    )  # as our CPU generators run it
    params = [
        SamplingParams(
            n=spec["n"],
            max_tokens=spec["max_tokens"],
            temperature=spec["temperature"],
            top_p=spec["top_p"],
            top_k=spec["top_k"],
            logprobs=0,
            seed=seed,
        )
        for seed in spec["seeds"]
    ]
    prompts = [{"prompt_token_ids": ids} for ids in spec["prompts"]]
    llm.generate(prompts, params, use_tqdm=False)  # warm-up
    times, tokens = [], 0
    for _ in range(spec["reps"]):
        start = time.perf_counter()
        out = llm.generate(prompts, params, use_tqdm=False)
        times.append(time.perf_counter() - start)
        if spec.get("trim"):
            trim_heap()  # as the generator does after each generate, off the clock (the generator: in a thread)
        tokens = sum(len(c.token_ids) for o in out for c in o.outputs)
    return {"seconds": statistics.median(times), "tokens": tokens, "reload_seconds": raw_reload(llm, spec)}


def raw_reload(llm, spec: dict) -> float:
    """vLLM's in-place reload of the model's own weights, already in memory in the engine's dtype (what a
    sync loads once they are received): the median of `reps` reloads after one warm-up."""
    from safetensors.torch import load_file

    from grpo_ray.roles.vllm_ext import reload_in_place

    dtype = llm.llm_engine.model_config.dtype
    weights = {
        k: v.to(dtype) for f in sorted(Path(spec["model"]).glob("*.safetensors")) for k, v in load_file(f).items()
    }
    load = lambda worker: reload_in_place(worker, iter(weights.items()))  # noqa: E731
    llm.collective_rpc(load)
    times = []
    for _ in range(spec["reps"]):
        start = time.perf_counter()
        llm.collective_rpc(load)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def raw_vllm_spec(r, model_path: str, prompts: list, reps: int) -> dict:
    """What ``raw_vllm`` runs: the recipe's engine settings and training sampling on `prompts` (Prompt objects,
    step 0's seeds), trimming the heap after each call as the generator does."""
    from grpo_ray.engines import sample_seed
    from grpo_ray.lengths import cpu_kv_cache_bytes, max_model_len
    from grpo_ray.models.dims import model_dims

    g = r.generator
    return {
        "model": model_path,
        "kv_cache_memory_bytes": cpu_kv_cache_bytes(model_dims(model_path), r),
        "dtype": g.dtype,
        "enforce_eager": g.enforce_eager,
        "max_model_len": max_model_len(r),
        "n": r.algorithm.group_size,
        "max_tokens": g.sampling.max_tokens,
        "temperature": g.sampling.temperature,
        "top_p": g.sampling.top_p,
        "top_k": g.sampling.top_k,
        "prompts": [p.ids for p in prompts],
        "reps": reps,
        "trim": True,
        "seeds": [sample_seed(r.trainer.seed, 0, p.uid) for p in prompts],
    }


def _raw_fsdp_rank(rank: int, spec: dict, port: int, out: dict) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from grpo_ray.algo.batching import collate, micro_batches
    from grpo_ray.algo.logprobs import sequence_logprobs
    from grpo_ray.models import load_causal_lm

    torch.set_num_threads(spec["threads"])
    world = spec["world"]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    model = load_causal_lm(spec["model"], torch.float32)
    mesh = init_device_mesh("cpu", (world,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    pairs, adv = spec["pairs"], torch.tensor(spec["advantages"])
    per_rank = len(pairs) // world
    mine = list(range(rank * per_rank, (rank + 1) * per_rank))
    tokens = sum(len(pairs[i][1]) for i in range(len(pairs)))

    def one_step():  # the learner's batching (packed or padded), forward and logprobs; a plain policy gradient
        micros, capacity = micro_batches(mine, pairs, spec["micro"], spec["packing"], spec["shared"])
        for micro in micros:
            seqs = collate([pairs[i] for i in micro], spec["pad"], capacity, spec["shared"])
            logp, _ = sequence_logprobs(model, seqs, "cpu")
            loss = -(logp * adv[micro, None] * seqs.response_mask).sum() / tokens * world
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()

    one_step()  # warm-up
    times = []
    for _ in range(spec["reps"]):
        dist.barrier()
        start = time.perf_counter()
        one_step()
        dist.barrier()
        times.append(time.perf_counter() - start)
    if rank == 0:
        out["seconds"] = statistics.median(times)
    dist.destroy_process_group()


def _raw_broadcast_rank(rank: int, spec: dict, port: int, out: dict) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=spec["world"])
    flat = torch.ones(spec["bytes"] // 4)
    dist.broadcast(flat, 0)  # warm-up
    times = []
    for _ in range(spec["reps"]):
        dist.barrier()
        start = time.perf_counter()
        dist.broadcast(flat, 0)
        times.append(time.perf_counter() - start)
    if rank == 0:
        out["seconds"] = statistics.median(times)
    dist.destroy_process_group()


def _spawn(target, spec: dict) -> dict:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(target, args=(spec, port, out), nprocs=spec["world"])
    return dict(out)


def cpu_engine(path: str, **options):
    """A CPU vLLM.LLM as the generators build one (float32, eager, seeded, no chunked prefill), with `options`, its
    weights labelled version 0 as a generator labels them (rollouts read each token's version)."""
    import vllm

    settings = {"max_model_len": 512, "kv_cache_memory_bytes": 256 << 20, **options}
    llm = vllm.LLM(model=path, dtype="float32", enforce_eager=True, seed=0, enable_chunked_prefill=False, **settings)
    llm.llm_engine.set_weight_version("0")
    return llm


def endpoint_engine(path: str):
    """The endpoint benchmarks' engine (``cpu_engine``), its replies --tokens long on every path (vllm.SamplingParams
    made to ignore EOS, once however often it is called); (the engine, vLLM's own SamplingParams)."""
    import vllm

    llm = cpu_engine(path)
    params = getattr(vllm, "unpatched_sampling_params", vllm.SamplingParams)
    vllm.unpatched_sampling_params = params
    vllm.SamplingParams = lambda **kw: params(**kw, ignore_eos=True)
    return llm, params


def run_child(kind: str, spec: dict, env: dict) -> dict:
    """Run one raw measurement in a fresh process (its own env: thread counts, vLLM in-process)."""
    with tempfile.TemporaryDirectory() as tmp:
        spec_file = Path(tmp) / "spec.json"
        spec_file.write_text(json.dumps(spec))
        res = subprocess.run(
            [sys.executable, __file__, "--raw", kind, str(spec_file)],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
            timeout=3600,
        )
    lines = [l for l in res.stdout.splitlines() if l.startswith("RAW ")]
    if res.returncode or not lines:
        raise RuntimeError(f"raw {kind} failed:\n{res.stderr[-3000:]}")
    return json.loads(lines[-1][4:])


# --- our side: the controller's hops ------------------------------------------------------------


def step_parser(steps: int, warmup: int, out: str) -> argparse.ArgumentParser:
    """The arguments every step-timing benchmark takes: --steps timed after --warmup, results to --out."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--warmup", type=int, default=warmup)
    ap.add_argument("--out", default=out)
    return ap


def timed_steps(
    overrides: list[str], warmup: int, steps: int, recipe: str = "recipes/tiny-cpu.yaml"
) -> tuple[list[dict], float]:
    """The controller's steps on `recipe` with `overrides` (no validation, no dumps): `warmup` steps, then
    `steps` timed ones; their metrics and wall seconds."""
    import ray

    from grpo_ray.config import load_recipe
    from grpo_ray.controller import GRPOController
    from grpo_ray.jobs.launch import connect
    from grpo_ray.setup_run import setup_run

    out = tempfile.mkdtemp(prefix="grpo-bench-")
    r = load_recipe(
        ROOT / recipe,
        [
            *overrides,
            f"trainer.output_dir={out}",
            "trainer.dump_freq=0",
            "trainer.loggers=[jsonl]",
            "trainer.test_freq=0",
            "trainer.val_before_train=false",
        ],
    )
    connect(r)
    c = GRPOController(r, setup_run(r))
    try:
        c.start()
        for k in range(1, warmup + 1):
            c.step(k)
        start = time.perf_counter()
        rows = [c.step(k) for k in range(warmup + 1, warmup + steps + 1)]
        return rows, time.perf_counter() - start
    finally:
        c.shutdown()
        ray.shutdown()
        shutil.rmtree(out, ignore_errors=True)  # its checkpoints and logs: nothing of a benchmark's run is kept


def memory_against_fit(r, rows: list[dict]) -> dict:
    """The peak resident memory of the learner's and the reference's actors over `rows` (``perf/peak_rss_gb/*``)
    against ``grpo_ray.fit``'s estimate for recipe `r` at the steps' longest sequence (``benchmarks/memory.py``'s
    comparison)."""
    from grpo_ray.models.dims import model_dims
    from grpo_ray.planner import memory

    d = model_dims(r.model.path)
    seq = max(int(m["global_seqlen/max"]) for m in rows)
    out = {}
    for pool, estimate in (("learner", memory.learner_memory), ("reference", memory.reference_memory)):
        key = f"perf/peak_rss_gb/{pool}"
        if any(key in m for m in rows):
            measured = max(m[key] for m in rows if key in m)
            out[pool] = {"predicted_gb": estimate(d, r, seq).total, "measured_gb": measured, "seq": seq}
    return out


def memory_errors(runs: list[dict]) -> dict:
    """Per pool, over `runs` that carry a ``memory_against_fit``: the estimate's mean absolute error, its worst
    (signed) and how many are within 10%."""
    out = {}
    for pool in ("learner", "reference"):
        e = [
            (m["memory"][pool]["predicted_gb"] - m["memory"][pool]["measured_gb"]) / m["memory"][pool]["measured_gb"]
            for m in runs
            if pool in m.get("memory", {})
        ]
        if e:
            out[pool] = {
                "n": len(e),
                "mape": statistics.fmean(abs(x) for x in e),
                "worst": max(e, key=abs),
                "within_10": sum(abs(x) <= 0.10 for x in e),
            }
    return out


RAW_PARTS = [
    ("generation", "gen_s"),
    ("learner", "learn_s"),
    ("broadcast", "sync_s"),
    ("vLLM reload", "reload_s"),
    ("reward", "reward_s"),
    ("reference", "ref_s"),
]
"""A step's raw parts (``measure``'s raw_steps): name, key."""


def measure(recipe_path: str, overrides: list[str], steps: int, reps: int, raw: bool, warmup: int = 1) -> dict:
    import ray

    from grpo_ray.algo.batching import flatten, use_shared
    from grpo_ray.config import load_recipe
    from grpo_ray.controller import GRPOController
    from grpo_ray.device import Device
    from grpo_ray.jobs.launch import connect
    from grpo_ray.setup_run import setup_run
    from grpo_ray.telemetry import perf
    from grpo_ray.types import Prompt

    out_dir = tempfile.mkdtemp(prefix="grpo-bench-")
    # a learning rate too small to move an fp32 weight: every step does the same work, and the engines keep the
    # model the raw components load, so both sides generate the same responses (a tiny model trained at the
    # recipe's rate changes its response lengths, and with them the tokens/s, from step to step)
    r = load_recipe(
        recipe_path,
        [
            *overrides,
            f"trainer.output_dir={out_dir}",
            "trainer.dump_freq=0",
            "trainer.loggers=[jsonl]",
            "trainer.test_freq=0",
            "trainer.val_before_train=false",
            "learner.optim.lr=1e-12",
        ],
    )
    inputs = setup_run(r)
    connect(r)
    c = GRPOController(r, inputs)
    G = r.algorithm.group_size
    result: dict = {"overrides": overrides}
    try:
        c.start()
        for k in range(1, warmup + 1):
            c.step(k)
        step_metrics = [c.step(k) for k in range(warmup + 1, warmup + steps + 1)]
        prompts = [Prompt.from_row(uid, row) for uid, row in c.stream.next_batch()]
        gen_s, gen_tokens = [], 0
        for _ in range(reps):
            start = time.perf_counter()
            rollouts, stats = c.engines.generate(prompts, G, 0)
            gen_s.append(time.perf_counter() - start)
            gen_tokens = sum(sum(s.response_lengths) for s in stats)
        pairs = flatten(ray.get(rollouts))
        seq_lens = [len(p) + len(q) for p, q in pairs]
        advantages = [0.5 if i % 2 else -0.5 for i in range(len(pairs))]
        learn_s = []
        for _ in range(reps):  # the learner hop alone (no reference pass: the raw loop has none either)
            start = time.perf_counter()
            update = ray.get([l.train.remote(rollouts, advantages, c.version) for l in c.pools.actors["learner"]])
            learn_s.append(time.perf_counter() - start)
        flops = update[0].metrics["actor/flops"]  # in the layout the learner ran (the raw loop runs the same)
        sync_s = []
        for _ in range(max(reps, 5)):  # gather from shards + broadcast + load into vLLM; not the probe
            start = time.perf_counter()
            c.engines.push(c.version)
            sync_s.append(time.perf_counter() - start)
        nbytes = sum(m.nbytes for m in c.pools.metas)
        params = sum(m.numel for m in c.pools.metas)
        facts, pool_threads = c.pools.facts, dict(c.pools.threads)
    finally:
        c.shutdown()
        ray.shutdown()
        shutil.rmtree(out_dir, ignore_errors=True)

    world, peak = r.learner.world_size, facts["peak_tflops"]
    typical = {k: statistics.median(m[k] for m in step_metrics) for k in step_metrics[0]}  # as the raw side's
    ours = {
        "step_s": typical["timing_s/step"],
        "breakdown_s": {
            k.split("/")[1]: typical[k] for k in typical if k.startswith("timing_s/") and k != "timing_s/step"
        },
        "gen_s": statistics.median(gen_s),
        "gen_tokens": gen_tokens,
        "learn_s": statistics.median(learn_s),
        "learn_tokens": sum(seq_lens),
        "sync_s": statistics.median(sync_s),
        "sync_bytes": nbytes,
        "reward_s": typical["timing_s/reward"],
        "ref_s": typical["timing_s/ref"],
        "score_mean": typical["critic/score/mean"],
        "mfu_actor_in_step": typical["perf/mfu/actor"],
        "params": params,
    }
    ours["gen_tok_s"] = gen_tokens / ours["gen_s"]
    ours["learn_tok_s"] = ours["learn_tokens"] / ours["learn_s"]
    ours["learn_mfu"] = perf.mfu(flops, ours["learn_s"], peak, world)
    ours["sync_GBps"] = nbytes / ours["sync_s"] / 1e9
    result.update(ours=ours, peak_tflops_per_device=peak)
    g = r.generator
    raw_sync = run_child(
        "broadcast", {"world": 1 + g.num_engines, "bytes": nbytes, "reps": max(reps, 5)}, {"OMP_NUM_THREADS": "1"}
    )
    result["raw_sync_GBps"] = nbytes / raw_sync["seconds"] / 1e9
    result["sync_ratio"] = ours["sync_GBps"] / result["raw_sync_GBps"]
    if not raw:
        return result

    gen_env = Device("cpu").engine_env(pool_threads["generator"], r.generator.enforce_eager)
    raw_gen = run_child("vllm", raw_vllm_spec(r, inputs.model_path, prompts, reps), gen_env)
    threads = pool_threads["learner"]
    raw_learn = run_child(
        "fsdp",
        {
            "model": inputs.model_path,
            "world": world,
            "threads": threads,
            "micro": r.learner.micro_batch_size,
            "pad": 0,
            "packing": r.model.sequence_packing,
            "shared": use_shared(r.model.shared_prompt, pairs, r.learner.micro_batch_size, r.model.sequence_packing),
            "pairs": pairs,
            "advantages": advantages,
            "reps": reps,
        },
        {"OMP_NUM_THREADS": str(threads)},
    )
    rawd = {
        "gen_s": raw_gen["seconds"],
        "gen_tok_s": raw_gen["tokens"] / raw_gen["seconds"],
        "learn_s": raw_learn["seconds"],
        "learn_tok_s": sum(seq_lens) / raw_learn["seconds"],
        "learn_mfu": perf.mfu(flops, raw_learn["seconds"], peak, world),
        "sync_s": raw_sync["seconds"],
        "sync_GBps": result["raw_sync_GBps"],
        "reload_s": raw_gen["reload_seconds"],
    }
    # each timed step's own work at the raw components' speeds: its batch, not the one the raw side ran (a tiny
    # model's response lengths vary from step to step), generated and trained at their tokens/s
    raw_steps = []
    for m in step_metrics:
        gen_tokens, learn_tokens = m["response_length/mean"] * r.data.train_batch_size * G, m["perf/total_num_tokens"]
        raw_steps.append(
            {
                "step_s": m["timing_s/step"],
                "gen_tokens": gen_tokens,
                "learn_tokens": learn_tokens,
                "gen_s": gen_tokens / rawd["gen_tok_s"],
                "learn_s": learn_tokens / rawd["learn_tok_s"],
                "sync_s": rawd["sync_s"],
                "reload_s": rawd["reload_s"],
                "reward_s": m["timing_s/reward"],
                "ref_s": m["timing_s/ref"],
            }
        )
    overheads = [s["step_s"] - sum(s[k] for _, k in RAW_PARTS) for s in raw_steps]
    result.update(
        raw=rawd,
        raw_steps=raw_steps,
        overhead_s=statistics.median(overheads),
        overhead_share=statistics.median(o / s["step_s"] for o, s in zip(overheads, raw_steps)),
    )
    return result


# --- report ---------------------------------------------------------------------------------


def machine() -> dict:
    import ray
    import torch
    import vllm

    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    mem = next((int(l.split()[1]) / 1e6 for l in open("/proc/meminfo") if l.startswith("MemTotal")), 0)
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gb": round(mem, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "vllm": vllm.__version__,
        "ray": ray.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }


def rows_of(path: Path) -> list[dict]:
    """The rows of a metrics.jsonl."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def fresh_work(work: str) -> tuple[Path, dict, list[str]]:
    """A showcase's work directory, emptied (every model of a showcase trains in its command), the environment its
    commands run in (a fresh model cache there) and the overrides every run takes (its own directory, metrics
    only)."""
    path = Path(work).resolve()
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return (
        path,
        {**os.environ, "GRPO_RAY_CACHE": str(path / "cache")},
        ["trainer.overwrite=true", "trainer.loggers=[jsonl]"],
    )


def run_summary(name: str, out: Path, seconds: float, overrides: list[str], key: str) -> tuple[dict, list[dict]]:
    """A showcase run's summary, from its metrics.jsonl under `out`: its validation `key` by step, first and last,
    with its name, overrides, seconds and directory; and the metrics' rows, for a showcase's own figures."""
    rows = rows_of(out / "metrics.jsonl")
    val = {r["step"]: r[key] for r in rows if key in r}
    common = {"name": name, "overrides": overrides, "seconds": seconds, "val": val, "dir": str(out)}
    return {**common, "start": val[0], "final": val[max(val)]}, rows


def sft_summary(run: Path, key: str) -> dict:
    """An SFT warm start's summary from its run directory's metrics.jsonl: its steps, its loss over the first and
    the last 10 steps, its validation `key` by step and the seconds of its steps."""
    rows = rows_of(Path(run) / "metrics.jsonl")
    losses = [r["sft/loss"] for r in rows if "sft/loss" in r]
    return {
        "steps": len(losses),
        "loss_first10": sum(losses[:10]) / 10,
        "loss_last10": sum(losses[-10:]) / 10,
        "val": {r["step"]: r[key] for r in rows if key in r},
        "seconds": sum(r.get("timing_s/step", 0.0) for r in rows),
    }


def mean_of(key: str, rows: list[dict]) -> float:
    """The mean of `key` over `rows` (0 where a row lacks it)."""
    return sum(r.get(key, 0.0) for r in rows) / len(rows)


def run_curves(
    runs: list[dict], panels: list[tuple[str, str]], out: Path, xlabel: str, colors: dict | None = None, hline=None
) -> None:
    """One panel per (metric, title), each run's metrics.jsonl (under run["dir"]) a line, the first panel's with
    markers (validation points); `hline` (value, label) is drawn on the first panel. Written to `out` as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
    for ax, (key, title) in zip(axes, panels):
        for r in runs:
            points = [(row["step"], row[key]) for row in rows_of(Path(r["dir"]) / "metrics.jsonl") if key in row]
            if points:
                color = (colors or {}).get(r["name"])
                ax.plot(*zip(*points), label=r["name"], color=color, marker="." if key == panels[0][0] else None)
        if hline and key == panels[0][0]:
            ax.axhline(hline[0], color="grey", linestyle="--", label=hline[1])
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def val_table(runs: list[dict]) -> list[str]:
    """A Markdown table of each run's validation (run["val"]: step -> value), a column per step."""
    steps = sorted(set().union(*(r["val"] for r in runs)))
    lines = ["| step | " + " | ".join(str(s) for s in steps) + " |", "|---" * (len(steps) + 1) + "|"]
    for r in runs:
        lines.append(f"| {r['name']} | " + " | ".join(f"{r['val'].get(s, float('nan')):.3f}" for s in steps) + " |")
    return lines


def heading(title: str, report: dict) -> list[str]:
    """A report's first lines: its title with the machine and date, and the command that made it."""
    m = report["machine"]
    return [f"# {title} ({m['date']}, {m['cpu']}, {m['cores']} cores)", "", f"`{report['command']}`", ""]


def write_report(out: str | Path, name: str, report: dict, text: str) -> None:
    """`<out>/<name>.json` and `<out>/<name>.md`, and the Markdown on stdout."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(report, indent=1))
    (out / f"{name}.md").write_text(text)
    print(text)


def markdown(report: dict) -> str:
    m, main = report["machine"], report["main"]
    o, rw = main["ours"], main["raw"]
    target = lambda ok: "met" if ok else "**missed**"  # noqa: E731
    lines = [
        f"# grpo-ray benchmark: `{report['recipe']}`" + "".join(f" `{o}`" for o in report.get("overrides", [])),
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB; torch {m['torch']}, vLLM {m['vllm']}, "
        f"Ray {m['ray']}; {m['date']}. No GPU: CPU peak = best measured fp32 matmul of one learner thread "
        f"({main['peak_tflops_per_device'] * 1000:.1f} GFLOPS).",
        "",
        "| part | grpo-ray | raw component | ratio |",
        "| --- | --- | --- | --- |",
        f"| generation (tokens/s) | {o['gen_tok_s']:.0f} | {rw['gen_tok_s']:.0f} (vLLM `LLM.generate`) | {o['gen_tok_s'] / rw['gen_tok_s']:.2f} |",
        f"| learner (tokens/s) | {o['learn_tok_s']:.0f} | {rw['learn_tok_s']:.0f} (FSDP2 loop) | {o['learn_tok_s'] / rw['learn_tok_s']:.2f} |",
        f"| learner MFU | {o['learn_mfu']:.3f} | {rw['learn_mfu']:.3f} | {o['learn_mfu'] / rw['learn_mfu']:.2f} |",
        f"| weight sync (GB/s) | {o['sync_GBps']:.4f} | {rw['sync_GBps']:.4f} (`dist.broadcast`, gloo) | {main['sync_ratio']:.2f} |",
        "",
        f"Step (median of {report['steps']} steps after {report.get('warmup', 1)} warm-up; each part its own median): "
        f"{o['step_s']:.3f} s; breakdown (s): "
        + ", ".join(f"{k} {v:.3f}" for k, v in sorted(o["breakdown_s"].items())),
        "",
        "Raw parts, each step's own batch at the raw components' speeds (medians over the steps): "
        + " + ".join(f"{name} {statistics.median(s[k] for s in main['raw_steps']):.4f}" for name, k in RAW_PARTS)
        + f" s. Framework overhead, each step's time less its raw parts (median over the steps): "
        f"{main['overhead_s']:.3f} s = **{main['overhead_share']:.1%}** of the step "
        f"(target <= 10%: {target(main['overhead_share'] <= 0.10)}). "
        f"Sync at {main['sync_ratio']:.2f} x the raw broadcast's GB/s (target >= 0.5: {target(main['sync_ratio'] >= 0.5)}).",
        "",
        "## Sweep (end-to-end steps)",
        "",
        "| config | parameters | step (s) | gen (s) | learner (s) | sync (s) | learner MFU | tokens/step "
        "| sync GB/s | raw broadcast GB/s | sync ratio |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in report["sweep"]:
        o = s["ours"]
        b = o["breakdown_s"]
        lines.append(
            f"| {s['name']} | {o['params'] / 1e6:.2f}M | {o['step_s']:.2f} | {b['gen']:.2f} | "
            f"{b['update_actor']:.2f} | {b['sync_weights']:.3f} | {o['learn_mfu']:.3f} | {o['learn_tokens']} "
            f"| {o['sync_GBps']:.3f} | {s['raw_sync_GBps']:.3f} | {s['sync_ratio']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def plots(report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for kind, ax in zip(("size", "work"), axes):
        size = (lambda s: s["ours"]["params"] / 1e6) if kind == "size" else (lambda s: s["ours"]["learn_tokens"])
        rows = sorted((s for s in report["sweep"] if s["kind"] == kind), key=size)
        x = [size(s) for s in rows]
        for part in ("gen", "update_actor", "sync_weights"):
            ax.plot(x, [s["ours"]["breakdown_s"][part] for s in rows], "o-", label=part)
        ax.plot(x, [s["ours"]["step_s"] for s in rows], "k.-", label="step")
        ax.set_xlabel("parameters (M)" if kind == "size" else "tokens per step")
        ax.set_ylabel("seconds")
        ax.set_title("cost against model size" if kind == "size" else "cost against group size x response length")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "sweep.png", dpi=80)
    plt.close(fig)


SIZES = [
    ("tiny 128x2", "layers=2&hidden=128&heads=4&kv_heads=2&intermediate=256"),
    ("256x4", "layers=4&hidden=256&heads=8&kv_heads=4&intermediate=512"),
    ("512x6", "layers=6&hidden=512&heads=8&kv_heads=4&intermediate=1024"),
    ("768x8", "layers=8&hidden=768&heads=12&kv_heads=4&intermediate=2048"),
]
WORK = [(4, 1), (16, 1), (4, 32), (16, 32)]  # (group size, max response tokens)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="recipes/tiny-cpu.yaml")
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides of the recipe measured")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "recipe": args.recipe,
        "overrides": args.set,
        "machine": machine(),
        "steps": args.steps,
        "warmup": args.warmup,
    }
    report["main"] = measure(args.recipe, args.set, args.steps, args.reps, raw=True, warmup=args.warmup)
    report["sweep"] = []
    if not args.no_sweep:
        small = [
            "data.train_batch_size=8",
            "learner.mini_batch_size=32",
            "learner.micro_batch_size=8",
            "reference.micro_batch_size=32",
        ]
        for name, shape in SIZES:
            path = f"model.path=tiny://qwen2?{shape}&vocab=384&seed=0"
            res = measure(
                args.recipe,
                [
                    path,
                    *small,
                    "algorithm.group_size=4",
                    "generator.sampling.max_tokens=16",
                    "data.response_prefix=''",
                    "data.max_prompt_length=128",
                ],
                2,
                1,
                raw=False,
            )
            report["sweep"].append({"kind": "size", "name": name, **res})
        for group, tokens in WORK:
            res = measure(
                args.recipe,
                [
                    *small,
                    f"algorithm.group_size={group}",
                    f"generator.sampling.max_tokens={tokens}",
                    f"learner.mini_batch_size={8 * group}",
                ],
                2,
                1,
                raw=False,
            )
            report["sweep"].append({"kind": "work", "name": f"group {group} x {tokens} tokens", **res})
    (out / "results.json").write_text(json.dumps(report, indent=1))
    (out / "results.md").write_text(markdown(report))
    if report["sweep"]:
        plots(report, out)
    print(markdown(report))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--raw":
        spec = json.loads(Path(sys.argv[3]).read_text())
        kind = sys.argv[2]
        if kind == "vllm":
            res = raw_vllm(spec)
        else:
            res = _spawn(_raw_fsdp_rank if kind == "fsdp" else _raw_broadcast_rank, spec)
        print("RAW " + json.dumps(res))
    else:
        main()
