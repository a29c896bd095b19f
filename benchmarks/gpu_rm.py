"""The reward model's GPU checks, in one command, on a machine with torch and no Ray or vLLM.

    python benchmarks/gpu_rm.py --out benchmarks/results/gpu/h100-reward-model          # on a GPU machine
    python benchmarks/gpu_rm.py --tiny --device cpu --out /tmp/gpu-rm-smoke               # the same code path here

A sequence classifier of Qwen2.5-1.5B's body (28 layers, width 1536, a one-output score head; random init, with the
offline tokenizer of a ``tiny://`` model, so its vocabulary is small: a classifier's FLOPs are its body's) is:

1. **scored by the reward-model pool's own code** (``RewardModel.rewards``: one actor, so the whole classifier on
   the device with no group; the learner's dtype, longest-first micro batches, tokenizing included) against a bare transformers forward of the same
   checkpoint on the same conversations (tokenizing included; every conversation cut to --seq tokens, so neither
   side pads): tokens/s of each (median of --steps calls after --warmup), their ratio (the issue's target: the pool
   at least 0.9x) and the largest score gap;
2. **trained by ``grpo-ray rm``'s step** (``RewardLearner.rm_train``: Bradley-Terry on preference pairs, a pair's two
   conversations in one forward, FSDP2, bf16 compute, fp32 master weights and AdamW) at each --micro (pairs a
   forward): tokens/s, MFU against the device's dense bf16 peak, and peak allocated memory against ``plan``'s learner
   estimate for the classifier's shape (its head one output wide) at 2 x micro sequences.

Writes gpu-rm.json and gpu-rm.md to --out.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.gpu import step_table  # noqa: E402

SHAPES = {  # a tiny:// classifier of each body
    "Qwen/Qwen2.5-1.5B-Instruct": "tiny://qwen2?layers=28&hidden=1536&heads=12&kv_heads=2&intermediate=8960"
    "&max_len=4096&vocab=2000&score=1",
    "tiny": "tiny://qwen2?layers=2&hidden=128&heads=4&kv_heads=2&max_len=4096&vocab=2000&score=1",
}


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn, calls: list, warmup: int, device: str) -> tuple[list[float], list]:
    """Seconds of each call after the first `warmup`, and every call's answer."""
    seconds, outs = [], []
    for k, arg in enumerate(calls):
        sync(device)
        start = time.perf_counter()
        outs.append(fn(arg))
        sync(device)
        if k >= warmup:
            seconds.append(time.perf_counter() - start)
    return seconds, outs


def recipe_for(path: Path, args, micro: int, gpu: str):
    from grpo_ray.config import load_recipe

    yaml = path.parent / "gpu-rm.yaml"  # (beside the classifier: removed with it)
    yaml.write_text("model: {path: x}\ndata: {train_files: ['synthetic://select']}\n")
    cuda = ["cluster.device=cuda", "cluster.devices_per_node=1", f"cluster.gpu={gpu}"] if args.device == "cuda" else []
    return load_recipe(
        yaml,
        [
            f"model.path={path}",
            f"reward_model.model={path}",
            f"reward_model.max_length={args.seq}",
            f"reward_model.micro_batch_size={args.score_micro}",
            f"data.max_prompt_length={args.seq // 4}",
            f"generator.sampling.max_tokens={args.seq - args.seq // 4}",
            f"rm.max_length={2 * args.seq}",
            f"learner.mini_batch_size={micro * args.micro_batches}",
            f"learner.micro_batch_size={micro}",
            "learner.world_size=1",
            "learner.dtype=bfloat16",
            "learner.optim.lr=1e-6",
            *cuda,
        ],
    )


def conversations(path: Path, count: int, seq: int, seed: int) -> list[str]:
    """`count` conversations rendered in the classifier's chat template, each of random words from its tokenizer's
    own text and more than `seq` tokens long (so a cut at `seq` leaves every one exactly `seq`)."""
    from transformers import AutoTokenizer

    from grpo_ray.data import conversation_text as render
    from grpo_ray.data import synthetic

    tokenizer = AutoTokenizer.from_pretrained(path)
    rng = random.Random(seed)
    vocab = " ".join(synthetic.corpus("select", size=200)).split()
    text = lambda n: " ".join(rng.choice(vocab) for _ in range(n))  # noqa: E731
    out = [render(tokenizer, [{"role": "user", "content": text(seq // 2)}], text(seq)) for _ in range(count)]
    shortest = min(len(x) for x in tokenizer(out, add_special_tokens=False)["input_ids"])
    assert shortest > seq, f"conversations of {shortest} tokens, not over {seq}"
    return out


def scoring(path: Path, args) -> dict:
    """The pool's scoring against a bare forward, on the same batches of conversations."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from grpo_ray.roles.reward_model import RewardModel
    from grpo_ray.sync import free_port

    batches = [conversations(path, args.samples, args.seq, seed=k) for k in range(args.warmup + args.steps)]
    role = RewardModel(str(path), recipe_for(path, args, 1, args.gpu), 0, 1, threads=8)
    role.setup("127.0.0.1", free_port())
    pool_s, pool_out = timed(role.rewards, batches, args.warmup, args.device)
    role.shutdown()
    del role
    if args.device == "cuda":
        torch.cuda.empty_cache()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.bfloat16).to(args.device).eval()

    def bare(texts: list[str]) -> list[float]:
        ids = tokenizer(texts, add_special_tokens=False, truncation=True, max_length=args.seq)["input_ids"]
        out = []
        with torch.no_grad():
            for i in range(0, len(ids), args.score_micro):
                batch = torch.tensor(ids[i : i + args.score_micro], device=args.device)
                out += model(input_ids=batch).logits[:, 0].float().cpu().tolist()
        return out

    bare_s, bare_out = timed(bare, batches, args.warmup, args.device)
    model = None  # free it before training
    if args.device == "cuda":
        torch.cuda.empty_cache()
    tokens = args.samples * args.seq
    pool_tps, bare_tps = tokens / statistics.median(pool_s), tokens / statistics.median(bare_s)
    gap = max(abs(a - b) for x, y in zip(pool_out, bare_out) for a, b in zip(x, y))
    return {
        "samples": args.samples,
        "tokens": tokens,
        "micro_batch": args.score_micro,
        "pool_seconds": pool_s,
        "bare_seconds": bare_s,
        "pool_tokens_per_s": round(pool_tps, 1),
        "bare_tokens_per_s": round(bare_tps, 1),
        "pool_over_bare": round(pool_tps / bare_tps, 3),
        "max_abs_score_gap": gap,
        "score_spread": statistics.pstdev([v for out in bare_out for v in out]),
    }


def training(path: Path, dims, args, peak: float | None) -> list[dict]:
    """``RewardLearner.rm_train`` at each micro batch: tokens/s, MFU and peak memory against plan."""
    from grpo_ray.planner import memory
    from grpo_ray.roles.reward_learner import RewardLearner
    from grpo_ray.sync import free_port
    from grpo_ray.telemetry import perf

    micros = [int(m) for m in args.micro.split(",")]
    learner = RewardLearner(str(path), recipe_for(path, args, micros[0], args.gpu), 0, 1, threads=8)
    learner.setup("127.0.0.1", free_port())
    rng = random.Random(0)
    rows = []
    for micro in micros:
        recipe = recipe_for(path, args, micro, args.gpu)
        learner.recipe = recipe
        pairs = micro * args.micro_batches
        seqs = [2 * args.seq] * pairs
        plan = memory.learner_memory(dims, recipe_twice(recipe), args.seq)
        planned = plan.total - plan.parts["runtime"]
        calls = [
            [[[rng.randrange(3, args.vocab) for _ in range(args.seq)] for _ in range(2)] for _ in range(pairs)]
            for _ in range(args.warmup + args.steps)
        ]
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        try:
            seconds, metrics = timed(learner.rm_train, calls, args.warmup, args.device)
        except torch.OutOfMemoryError:
            learner.optimizer.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            rows.append({"micro_batch": micro, "out_of_memory": True, "plan_gb": round(planned, 3)})
            print(json.dumps(rows[-1]), flush=True)
            continue
        median = statistics.median(seconds)
        flops = perf.train_flops(dims, [args.seq] * 2 * pairs)
        alloc = torch.cuda.max_memory_allocated() / 1e9 if args.device == "cuda" else 0.0
        rows.append(
            {
                "micro_batch": micro,
                "pairs": pairs,
                "tokens": sum(seqs),
                "seconds": seconds,
                "median_s": round(median, 4),
                "tokens_per_s": round(sum(seqs) / median, 1),
                "tflops": round(flops / median / 1e12, 2),
                "mfu": round(perf.mfu(flops, median, peak, 1), 4) if peak else None,
                "loss": [m["rm/loss"] for m in metrics],
                "grad_norm": metrics[-1]["actor/grad_norm"],
                "peak_allocated_gb": round(alloc, 3),
                "plan_gb": round(planned, 3),
                "plan_over_measured": round(planned / alloc, 3) if alloc else None,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    learner.shutdown()
    return rows


def recipe_twice(recipe):
    """`recipe` with twice the micro batch: a pair's two conversations go through one forward."""
    twice = copy.deepcopy(recipe)
    twice.learner.micro_batch_size *= 2
    return twice


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="Qwen/Qwen2.5-1.5B-Instruct", choices=[k for k in SHAPES if k != "tiny"])
    p.add_argument("--tiny", action="store_true", help="a tiny shape instead (a smoke test of the code path)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--seq", type=int, default=1024, help="tokens of each conversation")
    p.add_argument("--samples", type=int, default=256, help="conversations a scoring call")
    p.add_argument("--score-micro", type=int, default=32, help="conversations a scoring forward")
    p.add_argument("--micro", default="2,4", help="preference pairs a training forward (two sequences each)")
    p.add_argument("--micro-batches", type=int, default=2, help="micro batches per optimizer step")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    from grpo_ray.models.dims import model_dims
    from grpo_ray.models.tiny import build_tiny, parse_tiny
    from grpo_ray.telemetry.perf import device_peak_tflops

    name = "tiny" if args.tiny else args.model
    gpu_name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    args.gpu = next((g for g in ("b200", "h200", "h100") if g in gpu_name.lower()), "h100")
    path = Path(tempfile.mkdtemp(prefix="grpo-gpu-rm-")) / "classifier"
    try:
        start = time.perf_counter()
        build_tiny(parse_tiny(SHAPES[name]), path)
        args.vocab = model_dims(str(path), "reward_model.model").vocab
        dims = dataclasses.replace(model_dims(str(path), "reward_model.model"), vocab=1)  # the head: one output
        params = sum(math.prod(t.get_shape()) for t in _tensors(path))
        print(f"built a {params / 1e9:.3g}B classifier in {time.perf_counter() - start:.0f}s", flush=True)
        peak = device_peak_tflops(gpu_name) if args.device == "cuda" else None
        score = scoring(path, args)
        print(json.dumps({"scoring": score}), flush=True)
        rows = training(path, dims, args, peak)
    finally:
        shutil.rmtree(path.parent, ignore_errors=True)
    result = {
        "date": str(date.today()),
        "device": gpu_name,
        "peak_tflops": peak,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "shape": name,
        "classifier": SHAPES[name],
        "parameters": params,
        "seq": args.seq,
        "scoring": score,
        "training": rows,
        "command": "python benchmarks/gpu_rm.py " + " ".join(a for a in sys.argv[1:] if a not in (args.out, "--out")),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu-rm.json").write_text(json.dumps(result, indent=1))
    (out / "gpu-rm.md").write_text(report(result))
    print(report(result))


def _tensors(path: Path):
    from safetensors import safe_open

    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for k in st.keys():
                yield st.get_slice(k)


def report(r: dict) -> str:
    s = r["scoring"]
    lines = [
        f"# Reward model on {r['device']} ({r['date']})",
        "",
        f"`{r['command']}`: a sequence classifier of {r['shape']}'s body ({r['parameters'] / 1e9:.3g}B parameters, "
        f"random init, a one-output head; `{r['classifier']}`), conversations of {r['seq']} tokens, bf16 compute, "
        f"torch {r['torch']}.",
        "",
        f"**Scoring** {s['samples']} conversations a call in micro batches of {s['micro_batch']} (median of "
        f"{len(s['pool_seconds'])} calls after a warm-up, tokenizing included): the reward-model pool's code "
        f"(`RewardModel.rewards`, one actor: the whole classifier, no group) {s['pool_tokens_per_s']:.0f} tokens/s against a bare "
        f"transformers forward's {s['bare_tokens_per_s']:.0f}: **{s['pool_over_bare']:.2f}x**; largest score gap "
        f"{s['max_abs_score_gap']:.3g} (scores' spread {s['score_spread']:.3g}).",
        "",
        "**Training** (`RewardLearner.rm_train`, Bradley-Terry on pairs, a pair's two conversations in one forward, "
        f"FSDP2, fp32 master weights and AdamW; peak {r['peak_tflops']} TFLOPS dense bf16):",
        "",
        *step_table(r["training"], "pairs a forward"),
    ]
    return "\n".join(lines + [""])


if __name__ == "__main__":
    main()
