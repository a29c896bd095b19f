"""LoRA against full fine-tuning on the same 100M+ model, in one run: memory, bytes per sync, step time.

    python benchmarks/lora.py --steps 3 --out benchmarks/results/lora

The quick start's recipe and task on a 122M-parameter Qwen2-shaped model (random init, 8000-token vocabulary),
8 prompts x 8 samples, at most 32 response tokens, KL to the reference on (k3). Three configurations:
  - full fine-tuning: a reference pool of its own (a second copy of the weights);
  - LoRA rank 16 on every linear layer, adapters synced alone (vLLM's LoRA support);
  - the same LoRA, synced as merged weights (model.lora.sync=merged).
Memory is each pool's peak RSS (the largest actor of the pool); host memory in all is the sum over every
actor. Each configuration runs --warmup steps, then --steps timed ones. Writes lora.json and lora.md to --out.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench import machine, step_parser, timed_steps, write_report  # noqa: E402

MODEL = "tiny://qwen2?layers=8&hidden=1024&heads=8&kv_heads=2&vocab=8000&tie=0&seed=0"
COMMON = [
    f"model.path={MODEL}",
    "data.train_batch_size=8",
    "algorithm.group_size=8",
    "data.response_prefix=''",
    "data.max_prompt_length=64",
    "generator.sampling.max_tokens=32",
    "learner.mini_batch_size=64",
    "learner.micro_batch_size=16",
    "reference.micro_batch_size=32",
    "trainer.total_steps=1000",
]
LORA = ["model.lora.rank=16", "model.lora.alpha=32", "learner.optim.lr=1e-4"]
RUNS = {
    "full fine-tuning": ["learner.optim.lr=1e-5"],
    "LoRA r16, adapters synced": LORA,
    "LoRA r16, merged weights synced": [*LORA, "model.lora.sync=merged"],
}
POOLS = ("generator", "learner", "reference")


def run(name: str, overrides: list[str], warmup: int, steps: int) -> dict:
    rows, wall = timed_steps([*COMMON, *overrides], warmup, steps)
    mean = lambda key: statistics.fmean(m.get(key, 0.0) for m in rows)  # noqa: E731
    return {
        "name": name,
        "overrides": overrides,
        "step_s": wall / steps,
        "peak_rss_gb": {p: max(m.get(f"perf/peak_rss_gb/{p}", 0.0) for m in rows) for p in POOLS},
        "sync_bytes": mean("sync/bytes"),
        "sync_s": mean("sync/seconds"),
        "probe_diff": max(m["sync/logprob_diff"] for m in rows),
        "parts": {k: mean(f"timing_s/{k}") for k in ("gen", "ref", "update_actor", "sync_weights")},
    }


def markdown(report: dict) -> str:
    m, runs = report["machine"], report["runs"]
    lines = [
        "# LoRA against full fine-tuning (`benchmarks/lora.py`)",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB; torch {m['torch']}, vLLM {m['vllm']}, "
        f"Ray {m['ray']}; {m['date']}. Model: {report['model']} ({report['params'] / 1e6:.0f}M parameters); "
        f"{report['steps']} timed steps after {report['warmup']}.",
        "",
        "| configuration | learner peak RSS (GB, per rank) | reference peak RSS (GB) | learner + reference, all "
        "actors (GB) | bytes per sync | sync (s) | step (s) | generation (s) | reference (s) | update (s) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in runs:
        rss = r["peak_rss_gb"]
        both = 2 * rss["learner"] + rss["reference"]
        p = r["parts"]
        lines.append(
            f"| {r['name']} | {rss['learner']:.2f} | {rss['reference']:.2f} | {both:.2f} | "
            f"{r['sync_bytes'] / 1e6:.2f} MB | {r['sync_s']:.3f} | {r['step_s']:.2f} | {p['gen']:.2f} | "
            f"{p['ref']:.2f} | {p['update_actor']:.2f} |"
        )
    lines += [
        "",
        "Reference (s) is the reference pool's forward for full fine-tuning, and the learner's own forward "
        "with the adapters off for LoRA (no reference pool: 0 GB). A reference of 0.00 GB means no such actor.",
        "Largest engine-learner logprob difference after a sync: "
        + ", ".join(f"{r['name']} {r['probe_diff']:.2g}" for r in runs)
        + ".",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = step_parser(3, 1, "benchmarks/results/lora")
    args = ap.parse_args()
    from grpo_ray.models.dims import model_dims

    runs = [run(name, overrides, args.warmup, args.steps) for name, overrides in RUNS.items()]
    report = {
        "machine": machine(),
        "model": MODEL,
        "params": model_dims(MODEL).params,
        "steps": args.steps,
        "warmup": args.warmup,
        "common": COMMON,
        "runs": runs,
    }
    write_report(args.out, "lora", report, markdown(report))


if __name__ == "__main__":
    main()
