"""The learner's and the reference's forward layouts on one batch: padded, packed, shared prompts.

    python benchmarks/layout.py [--prompts 4] [--group 16] [--prompt-len 256] [--response 32 256] \
        [--micro 4] [--reps 3] [--out benchmarks/results/layout]

One process, the peer benchmark's 14.3M-parameter model, a batch shaped like a recipe's step (`prompts` x
`group` samples, every prompt `prompt-len` tokens, response lengths uniform in the `response` range; random
tokens, seeded), cut into micro batches as the learner cuts them (``micro_batches`` with `micro`). For each
layout (``model.sequence_packing`` false / true, ``model.shared_prompt``) and dtype: seconds of the update's work
(forward, response logprobs, backward, over every micro batch) and of the reference's (forward only), median of
`reps` after a warm-up, and the token slots the forwards hold (padding included).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LAYOUTS = {"padded": (False, False), "packed": (True, False), "shared prompts": (False, True)}


def slots(seqs) -> int:
    """Token positions the forward runs on, padding included."""
    if seqs.shared is not None:
        return seqs.shared.prompt_ids.numel() + seqs.shared.input_ids.numel()
    return (seqs.packed.input_ids if seqs.packed is not None else seqs.input_ids).numel()


def measure(model, pairs: list, micro: int, packing: bool, shared: bool, reps: int) -> dict:
    import torch

    from grpo_ray.algo.batching import collate, micro_batches
    from grpo_ray.algo.logprobs import sequence_logprobs

    micros, capacity = micro_batches(list(range(len(pairs))), pairs, micro, packing, shared)
    batches = [collate([pairs[i] for i in m], 0, capacity, shared) for m in micros]

    def update():
        model.zero_grad(set_to_none=True)
        for seqs in batches:
            logp, _ = sequence_logprobs(model, seqs, "cpu")
            (logp * seqs.response_mask).sum().backward()

    def reference():
        with torch.no_grad():
            for seqs in batches:
                sequence_logprobs(model, seqs, "cpu")

    out = {"micro_batches": len(batches), "slots": sum(slots(s) for s in batches)}
    for name, work in (("update_s", update), ("reference_s", reference)):
        work()  # warm-up
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            work()
            times.append(time.perf_counter() - start)
        out[name] = statistics.median(times)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--response", type=int, nargs=2, default=[32, 256])
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/layout")
    args = ap.parse_args()
    import torch

    from benchmarks.bench import machine, write_report
    from benchmarks.peer import MODEL
    from grpo_ray.models import load_causal_lm, resolve

    torch.set_num_threads(args.threads)
    path = resolve(MODEL)
    vocab = load_causal_lm(path, torch.float32).config.vocab_size
    rng = random.Random(0)
    pairs = []
    for _ in range(args.prompts):
        prompt = [rng.randrange(3, vocab) for _ in range(args.prompt_len)]
        pairs += [
            (prompt, [rng.randrange(3, vocab) for _ in range(rng.randint(*args.response))]) for _ in range(args.group)
        ]
    tokens = sum(len(p) + len(r) for p, r in pairs)
    results = {}
    for dtype in args.dtypes:
        model = load_causal_lm(path, getattr(torch, dtype))
        results[dtype] = {
            name: measure(model, pairs, args.micro, packing, shared, args.reps)
            for name, (packing, shared) in LAYOUTS.items()
        }
    report = {"machine": machine(), "args": vars(args), "tokens": tokens, "results": results}
    m = report["machine"]
    lines = [
        "# Forward layouts: padded, packed, shared prompts",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB; torch {m['torch']}; {m['date']}. "
        f"`python benchmarks/layout.py --prompts {args.prompts} --group {args.group} --prompt-len {args.prompt_len} "
        f"--response {args.response[0]} {args.response[1]} --micro {args.micro} --reps {args.reps}`: the peer "
        f"benchmark's 14.3M-parameter model, {args.threads} threads, one batch of {args.prompts} prompts x {args.group} "
        f"samples ({tokens} tokens, {args.prompts * args.prompt_len * args.group / tokens:.0%} of them prompt), "
        f"micro batches as the learner cuts them (micro_batch_size {args.micro}).",
        "",
        "| dtype | layout | micro batches | token slots | update (s) | reference (s) | update vs packed | reference vs packed |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for dtype, by_layout in results.items():
        packed = by_layout["packed"]
        lines += [
            f"| {dtype} | {name} | {r['micro_batches']} | {r['slots']} | {r['update_s']:.2f} | "
            f"{r['reference_s']:.2f} | {packed['update_s'] / r['update_s']:.2f}x | "
            f"{packed['reference_s'] / r['reference_s']:.2f}x |"
            for name, r in by_layout.items()
        ]
    write_report(args.out, "layout", report, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
