"""Predicted learner and reference memory (grpo_ray.fit) against the measured peaks, on CPU, for models of growing size.

    python benchmarks/memory.py --out benchmarks/results

Each configuration trains the tiny recipe's task for two steps with a given model and micro batch, reads
the learner's peak resident memory (``perf/peak_rss_gb/learner``, the largest over the ranks) and the
longest sequence of the step from the rollout dump, and compares them with ``fit.learner_memory`` at
that sequence length (the plan itself uses the recipe's maximum lengths, an upper bound). The CPU
runtime constant of the estimate was set from the smallest model; the larger ones test it.
Writes memory.json and memory.md to --out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from grpo_ray.telemetry.dumps import read_samples

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RECIPE = ROOT / "recipes" / "tiny-cpu.yaml"
CONFIGS = {
    "tiny (tiny-cpu)": [],
    "small 512x4": [
        "model.path=tiny://qwen2?layers=4&hidden=512&heads=8&kv_heads=2&vocab=4000&seed=0",
        "learner.micro_batch_size=32",
        "reference.micro_batch_size=32",
    ],
    "medium 1024x8": [
        "model.path=tiny://qwen2?layers=8&hidden=1024&heads=8&kv_heads=2&vocab=8000&tie=0&seed=0",
        "learner.micro_batch_size=8",
        "reference.micro_batch_size=8",
    ],
}


def measure(name: str, overrides: list[str], work: Path) -> dict:
    from grpo_ray.config import load_recipe
    from grpo_ray.models.dims import model_dims
    from grpo_ray.planner import memory

    out = work / name.split()[0]
    flags = [
        *overrides,
        "trainer.total_steps=2",
        "trainer.val_before_train=false",
        "trainer.test_freq=0",
        f"trainer.output_dir={out}",
        "trainer.resume=disable",
        "trainer.overwrite=true",
        "trainer.loggers=[jsonl]",
    ]
    subprocess.run(
        [sys.executable, "-m", "grpo_ray", "train", str(RECIPE), *flags],
        check=True,
        cwd=work,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    measured = max(m["perf/peak_rss_gb/learner"] for m in metrics)
    ref_measured = max(m["perf/peak_rss_gb/reference"] for m in metrics)
    rows = read_samples(out / "rollouts" / "train_data_step2.jsonl")
    seq = max(len(r["prompt_ids"]) + len(r["response_ids"]) for r in rows)
    recipe = load_recipe(RECIPE, flags)
    dims = model_dims(recipe.model.path)
    est = memory.learner_memory(dims, recipe, seq)
    ref = memory.reference_memory(dims, recipe, seq)
    return {
        "config": name,
        "parameters": dims.params,
        "micro_batch": recipe.learner.micro_batch_size,
        "seq": seq,
        "predicted_gb": round(est.total, 3),
        "measured_gb": measured,
        "ratio": round(est.total / measured, 3),
        "parts_gb": {k: round(v, 4) for k, v in est.parts.items()},
        "reference": {
            "micro_batch": recipe.reference.micro_batch_size,
            "predicted_gb": round(ref.total, 3),
            "measured_gb": ref_measured,
            "ratio": round(ref.total / ref_measured, 3),
            "parts_gb": {k: round(v, 4) for k, v in ref.parts.items()},
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="grpo-mem-") as work:
        results = [measure(name, flags, Path(work)) for name, flags in CONFIGS.items()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "memory.json").write_text(json.dumps(results, indent=1))
    lines = [
        "# Learner memory: `grpo-ray plan`'s estimate against the measured peak (CPU, 2 gloo ranks)",
        "",
        "| config | parameters | micro batch x seq | predicted GB | measured peak RSS GB | ratio |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {r['config']} | {r['parameters'] / 1e6:.1f}M | {r['micro_batch']} x {r['seq']} | "
        f"{r['predicted_gb']:.3f} | {r['measured_gb']:.3f} | {r['ratio']:.2f} |"
        for r in results
    ]
    lines += [
        "",
        "Reference actor (FSDP2 group of its own, 1 actor here), same runs:",
        "",
        "| config | parameters | micro batch x seq | predicted GB | measured peak RSS GB | ratio |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {r['config']} | {r['parameters'] / 1e6:.1f}M | {r['reference']['micro_batch']} x {r['seq']} | "
        f"{r['reference']['predicted_gb']:.3f} | {r['reference']['measured_gb']:.3f} | "
        f"{r['reference']['ratio']:.2f} |"
        for r in results
    ]
    lines += ["", "The memory a weight push adds (learner rank 0, engine) is measured against the plan in sync.md."]
    (out / "memory.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
