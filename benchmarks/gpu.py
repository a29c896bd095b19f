"""The GPU checks of ../shared/docs/GPU.md, in one command, on a machine with torch and no Ray or vLLM.

    python benchmarks/gpu.py --out benchmarks/results/gpu                 # on a GPU machine
    python benchmarks/gpu.py --tiny --device cpu --out /tmp/gpu-smoke     # the same code path here, tiny

It runs the learner's own code (``Learner.setup``: FSDP2 ``fully_shard`` on a one-rank group, nccl on a GPU,
bf16 mixed precision; ``Learner.update``: packed token logprobs, ``grpo_loss`` with a k3 KL term, backward,
grad clip, AdamW) on a random-init model of a real shape (default Qwen2.5-1.5B's dimensions from
``dims.KNOWN_DIMS``), on sequences of ``--seq`` tokens, and reports for each micro batch size:

1. tokens/s and MFU of the update against the device's dense bf16 peak (``perf.device_peak_tflops``);
2. the step's peak ``torch.cuda.max_memory_allocated`` against ``plan``'s learner estimate (``fit.learner_memory``)
   for the same shape, micro batch and sequence length (the estimate's ``runtime`` part, the CUDA context and
   NCCL buffers, is outside torch's allocator, so it is compared without it);
3. the mixed-precision drift: logprobs of one batch under the model in bf16 against the same weights in fp32
   (the train-inference mismatch a bf16 engine brings, which rollout correction has to absorb).

The weights are random, so the logprobs sit near uniform over the vocabulary: the drift is a floor for a
trained model's, not its value. Writes gpu.json and gpu.md to --out.

With ``--teacher NAME`` (a ``dims.KNOWN_DIMS`` name), on-policy distillation too: one more update at the last micro
batch size with a teacher's logprobs (each token's advantage takes the teacher's signal, ``algo.distill``), and the
teacher pool's own forward (``Reference.score``: FSDP2 on one rank, the learner's dtype) against a bare
transformers forward of the same model on the same batches (tokens/s of each, and the largest logprob gap).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

TINY = "tiny"


def build_model(name: str, path: Path, device: str, seed: int = 0):
    """A random-init checkpoint of `name`'s shape (``dims.KNOWN_DIMS``), written to `path` in bf16."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    from grpo_ray.models.dims import KNOWN_DIMS, ModelDims

    d = ModelDims(2, 128, 4, 2, 32, 256, 512, True, 4096) if name == TINY else KNOWN_DIMS[name]
    kind = LlamaConfig if "llama" in name.lower() else Qwen2Config
    cfg = kind(
        vocab_size=d.vocab,
        hidden_size=d.hidden,
        intermediate_size=d.intermediate,
        num_hidden_layers=d.layers,
        num_attention_heads=d.heads,
        num_key_value_heads=d.kv_heads,
        head_dim=d.head_dim,
        max_position_embeddings=d.max_positions,
        tie_word_embeddings=d.tied,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(path, safe_serialization=True)
    del model
    return d


def recipe_for(model_path: Path, args, micro: int, gpu: str):
    from grpo_ray.config import load_recipe

    prompt = args.seq // 4
    yaml = Path(tempfile.mkdtemp()) / "gpu.yaml"
    yaml.write_text("model: {path: x}\ndata: {train_files: ['synthetic://select']}\n")
    cuda = ["cluster.device=cuda", "cluster.devices_per_node=1", f"cluster.gpu={gpu}"] if args.device == "cuda" else []
    samples = micro * args.micro_batches
    return load_recipe(
        yaml,
        [
            f"model.path={model_path}",
            f"data.max_prompt_length={prompt}",
            f"generator.sampling.max_tokens={args.seq - prompt}",
            f"data.train_batch_size={samples // 2}",
            "algorithm.group_size=2",
            f"learner.mini_batch_size={samples}",
            f"learner.micro_batch_size={micro}",
            "learner.world_size=1",
            "learner.dtype=bfloat16",
            "algorithm.kl_coef=0.001",
            "learner.optim.lr=1e-6",
            *cuda,
        ],
    )


def batch(vocab: int, samples: int, seq: int, seed: int, turns: int = 1):
    """Rollouts of `samples` sequences of exactly `seq` tokens (a quarter prompt), groups of 2, with a sampler's and
    a reference's logprobs: every sample fills a packed row, so a micro batch is micro x seq tokens, as plan assumes.
    With `turns` > 1 each response is a multi-turn trajectory: `turns` model spans with observation spans (loss mask
    0) between them, in 2 x turns - 1 equal parts."""
    from grpo_ray.types import Completion, Prompt, Rollout

    rng = random.Random(seed)
    prompt, response = seq // 4, seq - seq // 4
    part = -(-response // (2 * turns - 1))
    mask = None if turns == 1 else [1 - (j // part) % 2 for j in range(response)]
    prompts = [Prompt([rng.randrange(3, vocab) for _ in range(prompt)], "1", "bench") for _ in range(samples // 2)]
    completions = [
        Completion(
            i,
            [rng.randrange(3, vocab) for _ in range(response)],
            "",
            [-rng.uniform(10, 13) for _ in range(response)],
            "length",
            mask=mask,
        )
        for i in range(len(prompts))
        for _ in range(2)
    ]
    refs = [torch.tensor(c.sampler_logprobs) + 0.01 for c in completions]
    advantages = [rng.choice([-1.0, 1.0]) for _ in completions]
    return [Rollout(prompts, completions, 0)], refs, advantages


def step_row(learner, dims, args, micro: int, peak_tflops: float | None, distill: bool = False) -> dict:
    """Warm-up then timed updates at micro batch `micro`; tokens/s, MFU, peak memory against plan. With `distill`,
    each update also takes a teacher's logprobs (the sampler's less 0.02, as a stand-in)."""
    from grpo_ray.planner import memory
    from grpo_ray.telemetry import perf

    recipe = recipe_for(Path(learner.model_path), args, micro, args.gpu)
    learner.recipe = recipe
    plan = memory.learner_memory(dims, recipe, args.seq)
    planned = plan.total - plan.parts["runtime"]
    samples = micro * args.micro_batches
    seconds, peak_alloc, peak_reserved = [], 0.0, 0.0
    try:
        for k in range(args.warmup + args.steps):
            rollouts, refs, adv = batch(dims.vocab, samples, args.seq, seed=k, turns=args.turns)
            if args.device == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            signals = {"kl": refs, **({"distill": [r - 0.02 for r in refs]} if distill else {})}
            start = time.perf_counter()
            # its .item() reads wait for the device
            metrics = learner.update(rollouts, adv, version=0, signals=signals).metrics
            elapsed = time.perf_counter() - start
            if k >= args.warmup:
                seconds.append(elapsed)
                if args.device == "cuda":
                    peak_alloc = max(peak_alloc, torch.cuda.max_memory_allocated() / 1e9)
                    peak_reserved = max(peak_reserved, torch.cuda.max_memory_reserved() / 1e9)
    except torch.OutOfMemoryError:
        learner.optimizer.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        return {
            "micro_batch": micro,
            "out_of_memory": True,
            "plan_gb": round(planned, 3),
            "plan_total_gb": round(plan.total, 3),
        }
    if args.profile:
        profile(learner, dims, args, micro, samples)
    median = statistics.median(seconds)
    seq_lens = [args.seq] * samples
    flops = metrics["actor/flops"]  # counted by the learner in the layout it ran (packed: train_flops(seq_lens))
    return {
        "micro_batch": micro,
        "distill": distill,
        "samples": samples,
        "tokens": sum(seq_lens),
        "seconds": seconds,
        "median_s": round(median, 4),
        "tokens_per_s": round(sum(seq_lens) / median, 1),
        "tflops": round(flops / median / 1e12, 2),
        "mfu": round(perf.mfu(flops, median, peak_tflops, 1), 4) if peak_tflops else None,
        "grad_norm": metrics["actor/grad_norm"],
        "pg_loss": metrics["actor/pg_loss"],
        "peak_allocated_gb": round(peak_alloc, 3),
        "peak_reserved_gb": round(peak_reserved, 3),
        "plan_gb": round(planned, 3),
        "plan_total_gb": round(plan.total, 3),
        "plan_over_measured": round(planned / peak_alloc, 3) if peak_alloc else None,
        "plan_parts_gb": {k: round(v, 3) for k, v in plan.parts.items()},
    }


def masked_sft(learner, dims, args) -> dict:
    """One SFT step on multi-turn traces (``Learner.sft_train(pairs, masks)``, the observations masked) at the
    last micro batch size: it runs on this device, and trains on the masks' tokens only."""
    rollouts, _, _ = batch(dims.vocab, 2 * int(args.micro.split(",")[-1]), args.seq, seed=7, turns=args.turns)
    pairs = [(r.prompts[c.prompt].ids, c.token_ids) for r in rollouts for c in r.completions]
    masks = [c.mask for r in rollouts for c in r.completions]
    metrics = learner.sft_train(pairs, masks)
    out = {"sft_loss": metrics["sft/loss"], "sft_tokens": metrics["sft/tokens"], "tokens": sum(map(len, masks))}
    print(json.dumps({"masked_sft": out}), flush=True)
    return out


def profile(learner, dims, args, micro: int, samples: int) -> None:
    """One more update under torch's profiler: the ops by self CPU time and by device time, to --out."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    rollouts, refs, adv = batch(dims.vocab, samples, args.seq, seed=99)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    with torch_profile(activities=activities) as prof:
        learner.update(rollouts, adv, version=0, signals={"kl": refs})
    table = prof.key_averages()
    text = table.table(sort_by="self_cpu_time_total", row_limit=30)
    if args.device == "cuda":
        text += "\n" + table.table(sort_by="self_cuda_time_total", row_limit=30)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"profile-micro{micro}.txt").write_text(text)


def teacher_check(args) -> dict:
    """The teacher pool's forward (``Reference.score``, FSDP2 on one rank in bf16) against a bare transformers
    forward of the same random-init model (bf16, no FSDP, one padded-free batch of micro sequences at a time: every
    sequence is `seq` tokens) on the same batches: tokens/s of each and the largest logprob gap."""
    from transformers import AutoModelForCausalLM

    from grpo_ray.algo.batching import flatten
    from grpo_ray.roles.reference import Reference
    from grpo_ray.sync import free_port

    path = Path(tempfile.mkdtemp(prefix="grpo-teacher-")) / "teacher"
    start = time.perf_counter()
    dims = build_model(args.teacher, path, args.device, seed=1)
    print(f"built teacher {args.teacher} ({dims.params / 1e9:.3g}B) in {time.perf_counter() - start:.0f}s", flush=True)
    micro = int(args.micro.split(",")[-1])
    samples = micro * args.micro_batches
    batches = [flatten(batch(dims.vocab, samples, args.seq, seed=k)[0]) for k in range(args.warmup + args.steps)]
    recipe = recipe_for(path, args, micro, args.gpu)
    recipe.teacher.model, recipe.teacher.micro_batch_size = str(path), micro

    def timed(fn) -> tuple[list[float], list]:
        seconds, outs = [], []
        for k, pairs in enumerate(batches):
            if args.device == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            outs.append(fn(pairs))
            if args.device == "cuda":
                torch.cuda.synchronize()
            if k >= args.warmup:
                seconds.append(time.perf_counter() - t)
        return seconds, outs

    role = Reference(str(path), recipe, 0, 1, threads=8, pool="teacher")
    role.setup("127.0.0.1", free_port())
    pool_s, pool_lps = timed(role.score)
    role.shutdown()
    del role
    if args.device == "cuda":
        torch.cuda.empty_cache()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(args.device).eval()

    def bare(pairs) -> list:
        out = []
        with torch.no_grad():
            for i in range(0, len(pairs), micro):
                chunk = pairs[i : i + micro]
                ids = torch.tensor([p + r for p, r in chunk], device=args.device)
                n = len(chunk[0][0])
                logits = model(ids).logits[:, n - 1 : -1].float()
                target = ids[:, n:]
                out += torch.log_softmax(logits, -1).gather(2, target[..., None])[..., 0].cpu().tolist()
        return out

    bare_s, bare_lps = timed(bare)
    model = None  # free it before the next check
    if args.device == "cuda":
        torch.cuda.empty_cache()
    flat = lambda outs: [values for out in outs for values in out]  # noqa: E731
    tokens = samples * args.seq
    compared = pool_against_bare(tokens, pool_s, bare_s, flat(pool_lps), flat(bare_lps))
    return {"model_shape": args.teacher, "parameters": dims.params, "micro_batch": micro, "tokens": tokens, **compared}


def pool_against_bare(tokens: int, pool_s: list, bare_s: list, pool_lps: list, bare_lps: list) -> dict:
    """A pool's calls against a bare forward's on the same batches of `tokens` tokens: the seconds of each call,
    tokens/s (medians), their ratio and the largest gap between the samples' logprobs."""
    gap = max(abs(a - b) for x, y in zip(pool_lps, bare_lps) for a, b in zip(x, y))
    pool_tps, bare_tps = tokens / statistics.median(pool_s), tokens / statistics.median(bare_s)
    return {
        "pool_seconds": pool_s,
        "bare_seconds": bare_s,
        "pool_tokens_per_s": round(pool_tps, 1),
        "bare_tokens_per_s": round(bare_tps, 1),
        "pool_over_bare": round(pool_tps / bare_tps, 3),
        "max_abs_logprob_gap": gap,
    }


def drift(model_path: Path, dims, args) -> dict:
    """Logprobs of one batch with the weights in bf16 against fp32: per token and per sequence."""
    from grpo_ray.algo.batching import collate, flatten
    from grpo_ray.algo.logprobs import sequence_logprobs
    from grpo_ray.device import Device
    from grpo_ray.models import load_causal_lm

    rollouts, _, _ = batch(dims.vocab, args.drift_samples, args.seq, seed=1000)
    pairs = flatten(rollouts)
    seqs = collate(pairs, 0, capacity=args.seq)
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = load_causal_lm(str(model_path), torch.float32, device=Device(args.device)).to(args.device).to(dtype)
        model.eval()
        with torch.no_grad():
            out[dtype] = sequence_logprobs(model, seqs, args.device)[0].float().cpu()
            if dtype == torch.float32:  # packing on this device's attention: two sequences a row against padded
                padded = sequence_logprobs(model, collate(pairs, 0), args.device)[0].float().cpu()
                two = sequence_logprobs(model, collate(pairs, 0, capacity=2 * args.seq), args.device)[0].float().cpu()
                packed_gap = (two - padded).abs().max().item()
        del model
        if args.device == "cuda":
            torch.cuda.empty_cache()
    mask = seqs.response_mask.bool()
    d = (out[torch.bfloat16] - out[torch.float32])[mask]  # bf16 - fp32, per response token
    per_seq = ((out[torch.bfloat16] - out[torch.float32]) * mask).sum(dim=1)
    k3 = torch.exp(-d) + d - 1  # KL(bf16 || fp32) on the bf16 side's tokens, k3
    return {
        "tokens": int(mask.sum()),
        "mean_abs": d.abs().mean().item(),
        "p99_abs": d.abs().quantile(0.99).item(),
        "max_abs": d.abs().max().item(),
        "mean": d.mean().item(),
        "k3_kl": k3.mean().item(),
        "seq_log_ratio_mean_abs": per_seq.abs().mean().item(),
        "seq_log_ratio_max_abs": per_seq.abs().max().item(),
        "mean_logprob_fp32": out[torch.float32][mask].mean().item(),
        "packed_vs_padded_max_abs": packed_gap,
        "attention": model_attention(args.device),
    }


def model_attention(device: str) -> str:
    """The attention implementation ``models.load_causal_lm`` picks on `device`."""
    return "sdpa" if device == "cuda" else "eager"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="Qwen/Qwen2.5-1.5B-Instruct", help="a dims.KNOWN_DIMS name (its shape)")
    p.add_argument("--tiny", action="store_true", help="a tiny shape instead (a smoke test of the code path)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--seq", type=int, default=1024, help="tokens per sequence (a quarter prompt)")
    p.add_argument("--micro", default="2,4,8", help="micro batch sizes to try (sequences per forward/backward)")
    p.add_argument("--turns", type=int, default=1, help="> 1: multi-turn trajectories, observation tokens masked")
    p.add_argument("--micro-batches", type=int, default=2, help="micro batches per optimizer step")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--drift-samples", type=int, default=8)
    p.add_argument("--profile", action="store_true", help="also profile one update per micro batch size")
    p.add_argument("--skip-drift", action="store_true")
    p.add_argument("--teacher", default="", help="a dims.KNOWN_DIMS name: also check on-policy distillation")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    name = TINY if args.tiny else args.model
    gpu_name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    args.gpu = next((g for g in ("b200", "h200", "h100") if g in gpu_name.lower()), "h100")
    work = Path(tempfile.mkdtemp(prefix="grpo-gpu-"))
    model_path = work / "model"
    start = time.perf_counter()
    dims = build_model(name, model_path, args.device)
    print(f"built {name} ({dims.params / 1e9:.3g}B parameters) in {time.perf_counter() - start:.0f}s", flush=True)

    from grpo_ray.roles.learner import Learner
    from grpo_ray.sync import free_port

    micros = [int(m) for m in args.micro.split(",")]
    learner = Learner(str(model_path), recipe_for(model_path, args, micros[0], args.gpu), 0, 1, threads=8)
    facts = learner.setup("127.0.0.1", free_port())
    print(f"learner ready on {facts['device_name']} (peak {facts['peak_tflops']} TFLOPS)", flush=True)
    rows = []
    for micro in micros:
        rows.append(step_row(learner, dims, args, micro, facts["peak_tflops"]))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "plan_parts_gb"}), flush=True)
    if args.teacher:  # the same update with a teacher's per-token signal
        rows.append(step_row(learner, dims, args, micros[-1], facts["peak_tflops"], distill=True))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "plan_parts_gb"}), flush=True)
    sft = masked_sft(learner, dims, args) if args.turns > 1 else None
    learner.shutdown()
    del learner
    if args.device == "cuda":
        torch.cuda.empty_cache()
    teacher = teacher_check(args) if args.teacher else None
    if teacher:
        print(json.dumps({"teacher": teacher}), flush=True)
    dr = None if args.skip_drift else drift(model_path, dims, args)
    print(json.dumps({"drift": dr}), flush=True)
    result = {
        "date": str(date.today()),
        "device": facts["device_name"],
        "peak_tflops": facts["peak_tflops"],
        "torch": torch.__version__,
        "python": platform.python_version(),
        "model_shape": name,
        "parameters": dims.params,
        "seq": args.seq,
        "turns": args.turns,
        "rows": rows,
        "masked_sft": sft,
        "teacher": teacher,
        "drift": dr,
        "command": "python benchmarks/gpu.py " + " ".join(a for a in sys.argv[1:] if a not in (args.out, "--out")),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu.json").write_text(json.dumps(result, indent=1))
    (out / "gpu.md").write_text(report(result))
    print(report(result))


def step_table(rows: list[dict], first: str) -> list[str]:
    """The markdown table of timed training steps (``step_row``'s, or the reward model's), one row each; `first`
    heads the micro batch's column."""
    lines = [
        f"| {first} | tokens / step | step (s, median) | tokens/s | TFLOP/s | MFU | peak allocated (GB) | "
        "plan without runtime (GB) | plan / measured |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        micro = f"{row['micro_batch']}{' + teacher' if row.get('distill') else ''}"
        if row.get("out_of_memory"):
            lines.append(f"| {micro} | out of memory | | | | | | {row['plan_gb']:.2f} | |")
            continue
        mfu = f"{row['mfu']:.3f}" if row["mfu"] is not None else "unknown"
        lines.append(
            f"| {micro} | {row['tokens']} | {row['median_s']:.3f} | {row['tokens_per_s']:.0f} | {row['tflops']:.1f} | "
            f"{mfu} | {row['peak_allocated_gb']:.2f} | {row['plan_gb']:.2f} | {row['plan_over_measured']} |"
        )
    return lines


def report(r: dict) -> str:
    lines = [
        f"# Learner step on {r['device']} ({r['date']})",
        "",
        f"`{r['command']}`: {r['model_shape']} shape ({r['parameters'] / 1e9:.3g}B parameters, random init), "
        f"sequences of {r['seq']} tokens, FSDP2 on one rank, bf16 compute, fp32 master weights and AdamW, "
        f"torch {r['torch']}. Peak {r['peak_tflops']} TFLOPS dense bf16."
        + (
            f" Multi-turn: {r['turns']} model turns a response, observation spans between them (loss mask 0)."
            if r.get("turns", 1) > 1
            else ""
        ),
        "",
        *step_table(r["rows"], "micro batch"),
    ]
    if r.get("masked_sft"):
        m = r["masked_sft"]
        lines += [
            "",
            f"One SFT step on these traces (`Learner.sft_train` with masks): trained on {m['sft_tokens']:.0f} of "
            f"{m['tokens']} response tokens (the model's turns), loss {m['sft_loss']:.3f}.",
        ]
    t = r.get("teacher")
    if t:
        lines += [
            "",
            f"Distillation teacher ({t['model_shape']} shape, {t['parameters'] / 1e9:.3g}B, random init), "
            f"{t['tokens']} tokens a batch in micro batches of {t['micro_batch']}: the teacher pool's forward "
            f"(`Reference.score`, FSDP2, bf16) {t['pool_tokens_per_s']:.0f} tokens/s against a bare transformers "
            f"forward's {t['bare_tokens_per_s']:.0f} ({t['pool_over_bare']:.2f}x); largest logprob gap "
            f"{t['max_abs_logprob_gap']:.3g}.",
        ]
    d = r["drift"]
    if not d:
        return "\n".join(lines + [""])
    lines += [
        "",
        f"Mixed-precision drift, bf16 against fp32 weights, {d['tokens']} response tokens: mean |d logp| "
        f"{d['mean_abs']:.3g}, p99 {d['p99_abs']:.3g}, max {d['max_abs']:.3g}; k3 KL {d['k3_kl']:.3g}; "
        f"per sequence |sum d| mean {d['seq_log_ratio_mean_abs']:.3g}, max {d['seq_log_ratio_max_abs']:.3g} "
        f"(mean fp32 logprob {d['mean_logprob_fp32']:.2f}: random weights, near uniform).",
        "",
        f"Packed rows on this device's attention ({d['attention']}, fp32, two sequences a row) against padded: "
        f"max |d logp| {d['packed_vs_padded_max_abs']:.3g}.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
