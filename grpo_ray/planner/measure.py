"""The parts ``calibrate`` measures, each in a child process of its own (``child``) so that its threads are set before
torch starts: matmul grids and memory bandwidth (``gemm_part``, ``attention_grid``), the learner's own calls
(``calls_part``), collectives (``collective_part``), a reward actor (``reward_part``) and a vLLM engine
(``engine_part``)."""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import tempfile
import time
from pathlib import Path

from grpo_ray import models

GRID = {
    "cpu": ([1, 16, 128, 1024], [32, 128, 512, 2048]),
    "cuda": ([1, 16, 128, 1024, 8192], [32, 128, 512, 2048, 8192]),
}
"""Matmul tokens and widths measured per device: a GPU's models are wider, its micro batches longer."""
DTYPES = ["float32", "bfloat16"]
LONGEST_MATMUL_S = 0.5
"""A grid point whose matmul would take longer than this, at the rate measured on its width with fewer tokens (else
at the last point's), is not run and takes that rate: bf16 on a CPU without bf16 units (AMD EPYC here: 0.3 GFLOP/s,
fp32's 80) would spend 30 s a call, minutes a calibration, on a dtype no recipe there trains in."""
CALL_MODEL = "tiny://qwen2?layers={layers}&hidden=64&heads=2&kv_heads=1&intermediate=128&vocab=128&bytes=0&seed=0"
ENGINE_MODELS = {
    1: "tiny://qwen2?layers=1&hidden=64&heads=2&kv_heads=1&intermediate=128&vocab=128&bytes=0&seed=0",
    4: "tiny://qwen2?layers=4&hidden=512&heads=8&kv_heads=2&intermediate=1536&vocab=128&bytes=0&seed=0",
}
RELOAD_MODEL = "tiny://qwen2?layers=2&hidden=1024&heads=8&kv_heads=2&intermediate=2816&vocab=128&bytes=0&seed=0"
"""The in-place reload's bytes are measured at a real model's width (a wide layer repacks slower a byte than a tiny
one, and its 45 MB of bf16 weights outgrow the caches), in bf16 and 32 MiB buckets, as a push feeds an engine."""


def _timed(fn, least_s: float = 0.02, reps: int = 3, sync=lambda: None) -> float:
    """Median seconds of one call of `fn` over `reps` trials, each as many calls as fill `least_s`."""
    fn()
    sync()
    start = time.perf_counter()
    fn()
    sync()
    once = max(time.perf_counter() - start, 1e-7)
    inner = max(1, int(least_s / once))
    trials = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        sync()
        trials.append((time.perf_counter() - start) / inner)
    return statistics.median(trials)


def _timed_collective(fn, calls: int, sync=lambda: None) -> float:
    """Mean seconds of a collective `fn` over `calls` calls after one warm-up: the same count on every rank (a count
    chosen by each rank's own timing would leave a rank waiting for a collective the others never start)."""
    fn()
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) / calls


LOG_VAR = "GRPO_RAY_CALIBRATION_LOG"
"""Where the parts' processes write what they print (set by ``calibrate``; unset: the console)."""


def child(target, args: tuple, env: dict[str, str]):
    """Run `target(*args)` in a fresh process with `env` set before anything imports torch; its return value."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        proc = ctx.Process(target=_call, args=(queue, target, args))
        proc.start()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    ok, value = answer(queue, [proc], target.__name__)
    proc.join()
    queue.close()
    queue.join_thread()
    if not ok:
        raise RuntimeError(f"calibration part {target.__name__} failed:\n{value}")
    return value


def answer(queue, procs: list, name: str):
    """What a part's process put on `queue`; a RuntimeError once they have all ended without answering."""
    import queue as queues

    while True:
        try:
            return queue.get(timeout=1)
        except queues.Empty:
            if not any(p.is_alive() for p in procs):
                codes = [p.exitcode for p in procs]
                raise RuntimeError(f"calibration part {name} ended without an answer (exit codes {codes})") from None


def _to_log() -> None:
    """A part's own output (weight-loading bars, vLLM's lines, torch's warnings) to the log, not the console."""
    log = os.environ.get(LOG_VAR)
    if log:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)


def _call(queue, target, args):
    import traceback

    _to_log()
    try:
        queue.put((True, target(*args)))
    except BaseException:  # the parent shows it
        queue.put((False, traceback.format_exc()))


# --- the parts, each in its own process ----------------------------------------------------------------------------


def gemm_part(device: str, threads: int) -> dict:
    """The matmul grid per dtype, elementwise bandwidth, and an optimizer step's cost per parameter."""
    import torch

    torch.set_num_threads(threads)
    dev = torch.device(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    gemm = {}
    for dtype in DTYPES:
        points, rate = [], {}  # rate: per width, that of its most tokens measured so far
        for t in GRID[device][0]:
            for w in GRID[device][1]:
                flops = 2 * t * w * w
                known = (rate.get(w) or points[-1][2]) if points else None
                if known and flops / known > LONGEST_MATMUL_S:  # a dtype this device computes slowly: not run
                    points.append([t, w, known])
                    continue
                a = torch.randn(t, w, dtype=getattr(torch, dtype), device=dev)
                b = torch.randn(w, w, dtype=getattr(torch, dtype), device=dev)
                rate[w] = flops / _timed(lambda a=a, b=b: a @ b, sync=sync)
                points.append([t, w, rate[w]])
        gemm[dtype] = points
    x = torch.ones(1 << 25, device=dev)  # 128 MB: past every cache
    y = torch.empty_like(x)
    bandwidth = 2 * x.numel() * 4 / _timed(lambda: torch.add(x, 1.0, out=y), sync=sync)
    n = 1 << (26 if device == "cuda" else 22)  # past a GPU's launch-bound sizes
    p = torch.nn.Parameter(torch.zeros(n, device=dev))
    p.grad = torch.ones_like(p)
    opt = torch.optim.AdamW([p], lr=1e-6)

    def step():
        torch.nn.utils.clip_grad_norm_([p], 1.0)
        opt.step()

    per_param = _timed(step, sync=sync) / n
    return {
        "gemm": gemm,
        "bandwidth": bandwidth,
        "optimizer_per_param": per_param,
        "attention": attention_grid(device),
    }


ATTENTION = {"keys": [64, 256, 1024], "head_dims": [32, 64, 128], "heads": 8}


def attention_grid(device: str) -> dict[str, list[list[float]]]:
    """Seconds per query x key x head of one layer's attention as the learner runs it (CPU: transformers' eager
    attention in fp32: queries and keys transposed out of the projections, keys and values repeated for grouped
    heads, scores scaled, a mask per row added, softmax, AV; GPU: sdpa in bf16 with the same mask), forward and
    forward+backward, at each of ATTENTION's key counts (as many queries, rows enough for 16 MB of scores: past the
    caches, as a micro batch's) and head sizes."""
    import torch
    import torch.nn.functional as F

    dev = torch.device(device)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    heads, groups, out = ATTENTION["heads"], 2, {"forward": [], "train": []}
    for k in ATTENTION["keys"]:
        # CPU: 16 MB of scores, past the caches, as a micro batch's; a GPU: enough work to outlast the launches
        rows = max(1, (16 << 20) // (heads * k * k * 4)) if device == "cpu" else max(1, (1 << 28) // (heads * k * k))
        causal = torch.full((k, k), float("-inf"), device=dev, dtype=dtype).triu(1)
        mask = causal.expand(rows, 1, k, k).contiguous()  # transformers makes one per row from the positions
        for hd in ATTENTION["head_dims"]:
            q = torch.randn(rows, k, heads * hd, device=dev, dtype=dtype, requires_grad=True)
            kv = [torch.randn(rows, k, heads // groups * hd, device=dev, dtype=dtype, requires_grad=True) for _ in "kv"]

            def forward(q=q, kv=kv, mask=mask, hd=hd, rows=rows, k=k):
                query = q.view(rows, k, heads, hd).transpose(1, 2)
                key, value = (
                    x.view(rows, k, heads // groups, hd).transpose(1, 2).repeat_interleave(groups, dim=1) for x in kv
                )
                if device == "cuda":  # one sequence a row: the causal kernel (a row of several takes a mask)
                    out = F.scaled_dot_product_attention(query, key, value, is_causal=True)
                else:
                    w = torch.matmul(query, key.transpose(2, 3)) * hd**-0.5 + mask
                    w = F.softmax(w, dim=-1, dtype=torch.float32).to(query.dtype)
                    out = torch.matmul(w, value)
                return out.transpose(1, 2).contiguous()

            units = rows * k * k * heads
            with torch.no_grad():
                out["forward"].append([k, hd, _timed(forward, sync=sync) / units])
            out["train"].append([k, hd, _timed(lambda f=forward: f().sum().backward(), sync=sync) / units])
    return out


def calls_part(device: str, threads: int, depths: tuple[int, ...]) -> dict:
    """The learner's code on tiny models of each of `depths` layers (``_calls``), and on the device's WORK
    (``_work``)."""
    out = {layers: _calls(device, threads, layers) for layers in depths}
    out["work"] = _work(device, threads)
    return out


DEPTHS = {"cpu": (1, 3), "cuda": (1, 5)}
"""The layers of the tiny models whose calls give a call's base cost and its cost per layer (a GPU's launches
are cheap: further apart)."""
MANY = 64
"""Samples of the calls that measure a sample's own cost (and of the generate and reward calls)."""
LONG_PROMPT = 96
"""The prompt tokens of the generate call whose prefill, wide matmuls, gives the engine's prefill scale."""


def _recipe(path: str, device: str, more: list[str]):
    """A recipe for the calibration's roles on tiny model `path` (the synthetic task; nothing is read from it)."""
    from grpo_ray.config import load_recipe

    with tempfile.TemporaryDirectory() as tmp:
        yaml = Path(tmp) / "calibrate.yaml"
        yaml.write_text("model: {path: x}\ndata: {train_files: ['synthetic://select']}\n")
        cuda = ["cluster.devices_per_node=1", "cluster.gpu=h100"] if device == "cuda" else []
        return load_recipe(yaml, [f"model.path={path}", f"cluster.device={device}", *cuda, *more])


def _calls(device: str, threads: int, layers: int) -> dict:
    """Seconds of the learner's update (``Learner.update``) and of the reference's forward (``Reference.score``)
    over 2 samples in 1 and in 2 micro batches, and over MANY samples in 2: a second call's cost, and a sample's."""
    import torch

    from grpo_ray.roles.learner import Learner
    from grpo_ray.sync import free_port
    from grpo_ray.types import Completion, Prompt, Rollout

    path = models.resolve(CALL_MODEL.format(layers=layers))

    def recipe(samples: int, micro: int):
        return _recipe(
            path,
            device,
            [
                "data.train_batch_size=1",
                f"algorithm.group_size={samples}",
                f"learner.mini_batch_size={samples}",
                f"learner.micro_batch_size={micro}",
                f"reference.micro_batch_size={micro}",
                "learner.world_size=1",
                "learner.dtype=float32",
                "algorithm.kl_coef=0.0",
                "model.shared_prompt=false",
                "learner.optim.lr=1e-9",
            ],
        )

    learner = Learner(path, recipe(2, 1), 0, 1, threads=threads)
    learner.setup("127.0.0.1", free_port())
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out = {}
    runs = (("1", 2, 2), ("2", 2, 1), ("many", MANY, MANY // 2))
    rollouts = {
        samples: Rollout(
            [Prompt([5, 6, 7, 8], "1", "calibrate")],
            [Completion(0, [9, 10], "", [-4.0, -4.0], "length") for _ in range(samples)],
            0,
        )
        for _, samples, _ in runs
    }
    for name, samples, micro in runs:
        advantages = [0.5 - (i % 2) for i in range(samples)]
        learner.recipe = recipe(samples, micro)
        call = lambda r=rollouts[samples], a=advantages: learner.update([r], a, 0)  # noqa: E731
        out[f"update_{name}"] = _timed(call, 0.2, 5, sync)
    learner.shutdown()  # the process's group: the reference makes its own
    for name, samples, micro in runs:
        reference = _reference(path, recipe(samples, micro), threads)
        pairs = [(rollouts[samples].prompts[0].ids, c.token_ids) for c in rollouts[samples].completions]
        out[f"forward_{name}"] = _timed(lambda p=pairs: reference.score(p), 0.2, 5, sync)  # noqa: B023
        reference.shutdown()
    return out


def _reference(path: str, recipe, threads: int):
    """The reference role on a one-rank group of its own in this process."""
    from grpo_ray.roles.reference import Reference
    from grpo_ray.sync import free_port

    reference = Reference(path, recipe, 0, 1, threads=threads)
    reference.setup("127.0.0.1", free_port())
    return reference


WORK = {
    "cpu": {
        "model": "tiny://qwen2?layers=2&hidden=256&heads=8&kv_heads=2&intermediate=768&vocab=128&bytes=0&seed=0",
        "samples": 16,
        "prompt": 32,
        "response": 224,
        "micro": 4,
        "dtype": "float32",
    },
    "cuda": {
        "model": "tiny://qwen2?layers=8&hidden=3072&heads=24&kv_heads=8&intermediate=8192&vocab=128&bytes=0&seed=0",
        "samples": 16,
        "prompt": 256,
        "response": 768,
        "micro": 4,
        "dtype": "bfloat16",
    },
}
"""Per device, a step whose work outweighs its fixed costs, of sequences of a length RL steps see, in the dtype the
learner trains in there: what the grids' prediction of its work is scaled by to match the learner's code."""


def _work(device: str, threads: int) -> dict:
    """Seconds of an update and of a forward-only pass over the device's WORK, packed."""
    import torch

    from grpo_ray.roles.learner import Learner
    from grpo_ray.sync import free_port
    from grpo_ray.types import Completion, Prompt, Rollout

    w = WORK[device]
    path = models.resolve(w["model"])
    recipe = _recipe(
        path,
        device,
        [
            "data.train_batch_size=1",
            f"data.max_prompt_length={w['prompt']}",
            f"generator.sampling.max_tokens={w['response']}",
            f"algorithm.group_size={w['samples']}",
            f"learner.mini_batch_size={w['samples']}",
            f"learner.micro_batch_size={w['micro']}",
            f"reference.micro_batch_size={w['micro']}",
            "learner.world_size=1",
            f"learner.dtype={w['dtype']}",
            "algorithm.kl_coef=0.0",
            "model.shared_prompt=false",
            "learner.optim.lr=1e-9",
        ],
    )
    learner = Learner(path, recipe, 0, 1, threads=threads)
    learner.setup("127.0.0.1", free_port())
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    prompt = Prompt([5 + i % 50 for i in range(w["prompt"])], "1", "calibrate")
    completions = [
        Completion(0, [9 + (i + j) % 50 for j in range(w["response"])], "", [-4.0] * w["response"], "length")
        for i in range(w["samples"])
    ]
    rollout = Rollout([prompt], completions, 0)
    pairs = [(prompt.ids, c.token_ids) for c in completions]
    advantages = [0.5 - (i % 2) for i in range(w["samples"])]
    out = {"update": _timed(lambda: learner.update([rollout], advantages, 0), 0.2, 3, sync)}
    learner.shutdown()
    reference = _reference(path, recipe, threads)
    out["forward"] = _timed(lambda: reference.score(pairs), 0.2, 3, sync)
    reference.shutdown()
    return out


def reward_part() -> tuple[float, float]:
    """A reward actor's seconds per call and per sample (the built-in gsm8k reward, in its sandboxed child): MANY
    samples less 2, over the samples between; 2 samples less theirs."""
    from grpo_ray.config import RewardConfig
    from grpo_ray.roles.reward import RewardWorker
    from grpo_ray.types import Completion, Prompt, Rollout

    worker = RewardWorker(RewardConfig(), "####")  # the default: the built-in gsm8k reward

    def rollout(n: int):
        return Rollout([Prompt([5], "7", "calibrate")], [Completion(0, [9], " 7", [-1.0], "stop") for _ in range(n)], 0)

    few, many = rollout(2), rollout(MANY)
    seconds = {n: _timed(lambda r=r: worker.score_rollouts([r]), 0.1, 3) for n, r in ((2, few), (MANY, many))}
    worker.shutdown()
    per_sample = max((seconds[MANY] - seconds[2]) / (MANY - 2), 0.0)
    return max(seconds[2] - 2 * per_sample, 0.0), per_sample


def collective_part(device: str, rank: int, port: int, queue) -> None:
    """Rank `rank` of a two-process group: all-gather of 1 KB and 32 MB, broadcast of 32 MB (rank 0 reports)."""
    _to_log()
    import torch
    import torch.distributed as dist

    backend = "nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    dev = torch.device(device, rank) if device == "cuda" else torch.device("cpu")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out = {}
    for name, numel in (("small", 256), ("large", 1 << 23)):
        shard = torch.ones(numel // 2, device=dev)
        full = torch.empty(numel, device=dev)
        out[f"gather_{name}"] = _timed_collective(lambda f=full, s=shard: dist.all_gather_into_tensor(f, s), 20, sync)
        out[f"gather_{name}_bytes"] = numel * 4 / 2  # what each rank receives
    x = torch.ones(1 << 23, device=dev)
    out["broadcast"] = _timed_collective(lambda: dist.broadcast(x, 0), 10, sync)
    out["broadcast_bytes"] = x.numel() * 4
    dist.destroy_process_group()
    if rank == 0:
        queue.put(out)


def engine_part(depths: tuple[int, ...]) -> dict[int, dict]:
    """A vLLM engine on each of ``ENGINE_MODELS``' tiny models, one after the other in this process."""
    import gc

    out = {}
    for layers in depths:
        out[layers] = _engine(layers)
        gc.collect()
    return out


def _engine(layers: int) -> dict:
    """The generator role (``Generator``: a vLLM engine in this process, as a CPU actor runs it) on a tiny model of
    `layers` layers: generate calls of 1 prompt x 1 sample and of 16 prompts x 4 samples (seeded, logprobs, past the
    end-of-sequence token), 1 and 33 tokens each, of prompts of 4 tokens and (1 token) of LONG_PROMPT; and in-place
    reloads of its own weights."""
    from safetensors.torch import load_file

    from grpo_ray.config import SamplingConfig
    from grpo_ray.roles.generator import Generator
    from grpo_ray.roles.vllm_ext import reload_in_place
    from grpo_ray.types import Prompt

    path = models.resolve(ENGINE_MODELS[layers])
    recipe = _recipe(
        path,
        "cpu",
        ["generator.dtype=float32", "generator.enforce_eager=true", f"data.max_prompt_length={LONG_PROMPT}"],
    )
    engine = Generator(path, recipe, 256 << 20, 0)
    out = {}
    for prompts, group in ((1, 1), (MANY // 4, 4)):
        for k in (1, 33):
            batch = [Prompt([5 + i % 50, 6, 7, 8], "1", "calibrate") for i in range(prompts)]
            sampling = SamplingConfig(temperature=1.0, max_tokens=k, ignore_eos=True)
            call = lambda b=batch, g=group, s=sampling: engine.generate(b, g, list(range(len(b))), s)  # noqa: E731
            out[f"generate_{prompts * group}_{k}"] = _timed(call, 0.2, 3)
    batch = [Prompt([5 + (i + j) % 50 for j in range(LONG_PROMPT)], "1", "calibrate") for i in range(MANY // 4)]
    sampling = SamplingConfig(temperature=1.0, max_tokens=1, ignore_eos=True)
    out["prefill_long"] = _timed(lambda: engine.generate(batch, 4, list(range(len(batch))), sampling), 0.2, 3)
    weights = load_file(f"{path}/model.safetensors")
    out["weight_bytes"] = sum(t.numel() * t.element_size() for t in weights.values())
    reload = lambda: engine.llm.collective_rpc(lambda w: reload_in_place(w, iter(weights.items())))  # noqa: E731
    out["reload"] = _timed(reload, 0.2, 3)
    return out


def reload_part() -> dict:
    """Seconds of RELOAD_MODEL's in-place reload in a bf16 engine (the generator role's), its weights fed in 32 MiB
    buckets of memory already touched (as ``sync.Buffers`` keeps them), each after a heap trim as in a run (the
    reload's own new weights then fault their pages in), and its bytes."""
    import torch
    from safetensors.torch import load_file

    from grpo_ray.roles import trim_heap
    from grpo_ray.roles.generator import Generator
    from grpo_ray.roles.vllm_ext import reload_in_place
    from grpo_ray.sync import WeightMeta, plan_buckets, unflatten

    path = models.resolve(RELOAD_MODEL)
    recipe = _recipe(path, "cpu", ["generator.dtype=bfloat16", "generator.enforce_eager=true"])
    engine = Generator(path, recipe, 256 << 20, 0)
    weights = {k: t.to(torch.bfloat16) for k, t in load_file(f"{path}/model.safetensors").items()}
    metas = [WeightMeta(k, tuple(t.shape), "bfloat16") for k, t in weights.items()]
    buckets = plan_buckets(metas, 32 << 20)
    flats = [torch.cat([weights[metas[i].name].reshape(-1) for i in b]) for b in buckets]
    feed = lambda: (pair for b, f in zip(buckets, flats) for pair in unflatten(f, metas, b))  # noqa: E731
    seconds = []
    for _ in range(4):  # each after a heap trim, as in a run (a generator trims after each generate call)
        trim_heap()
        start = time.perf_counter()
        engine.llm.collective_rpc(lambda w: reload_in_place(w, feed()))
        seconds.append(time.perf_counter() - start)
    return {"seconds": statistics.median(seconds[1:]), "bytes": sum(t.nbytes for t in weights.values())}
