"""Weight sync against a raw broadcast of the same bytes, and the memory a sync adds, on CPU (gloo).

    python benchmarks/sync.py --out benchmarks/results

For a model of 122M parameters (float32, the wire dtype of a float32 engine) with 2 learner ranks and one
vLLM engine, it pushes the weights `--reps` times through the real pools (controller -> learner ranks ->
gloo -> the engine's worker extension -> vLLM's in-place reload) and reports per push:
  - seconds and GB/s end to end (the slowest side), against ``torch.distributed.broadcast`` of the same bytes
    over gloo between as many processes, in the same run;
  - where the time goes: on learner rank 0 gather (FSDP all-gathers waited on), cast (copies into buckets),
    broadcast (waits on the wire); on the engine broadcast (waits) and load (vLLM's reload); then the probe;
  - a sync as the controller runs it: the push with the probe as part of it (``push(probe=True)``: the engine's
    at the end of its receive call, the learner's started once it has sent),
    against the push and then the probe;
  - the extra peak RSS of learner rank 0 and of the engine during the push (peak since a reset just before,
    minus RSS then), against the bound 2 FSDP units + 2 buckets.
Writes sync.json and sync.md to --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = "tiny://qwen2?layers=8&hidden=1024&heads=8&kv_heads=2&vocab=8000&tie=0&seed=0"


def measure(model: str, bucket_mb: int, reps: int) -> dict:
    import ray

    from benchmarks.bench import run_child
    from grpo_ray import sync
    from grpo_ray.config import load_recipe
    from grpo_ray.controller import GRPOController
    from grpo_ray.engines import probe_diff
    from grpo_ray.jobs.launch import connect
    from grpo_ray.roles import fsdp, mark_rss, peak_rss_since_mark
    from grpo_ray.setup_run import setup_run

    out_dir = tempfile.mkdtemp(prefix="grpo-sync-")
    r = load_recipe(
        ROOT / "recipes" / "tiny-cpu.yaml",
        [
            f"model.path={model}",
            f"trainer.bucket_mb={bucket_mb}",
            "algorithm.kl_coef=0",
            "data.response_prefix=''",
            f"trainer.output_dir={out_dir}",
            "trainer.loggers=[jsonl]",
            "trainer.val_before_train=false",
        ],
    )
    inputs = setup_run(r)
    connect(r)
    c = GRPOController(r, inputs)
    rows = []
    try:
        c.start(("learner", "generator"))
        learner0, engine = c.pools.actors["learner"][0], c.pools.actors["generator"][0]
        c.engines.push(0)  # warm-up
        for k in range(1, reps + 1):
            before = ray.get([a.__ray_call__.remote(lambda _: mark_rss()) for a in (learner0, engine)])
            start = time.perf_counter()
            pushed, received = c.engines.push(k)
            push_s = time.perf_counter() - start
            peaks = ray.get([a.__ray_call__.remote(lambda _: peak_rss_since_mark()) for a in (learner0, engine)])
            start = time.perf_counter()
            diff = c.engines.probe()
            probe_s = time.perf_counter() - start
            start = time.perf_counter()  # the same push and probe as a sync runs them: each side probes in its call
            fused = c.engines.push(k, probe=True)
            fused_s = time.perf_counter() - start
            rows.append(
                {
                    "push_s": push_s,
                    "probe_s": probe_s,
                    "logprob_diff": diff,
                    "fused_s": fused_s,
                    "fused_diff": probe_diff([r["probe"] for r in fused[1]], fused[0][0]["probe"]),
                    "learner": pushed[0],
                    "engine": received[0],
                    "extra_rss_gb": {"learner": peaks[0] - before[0], "engine": peaks[1] - before[1]},
                }
            )
        metas = c.pools.metas
    finally:
        c.shutdown()
        ray.shutdown()
    nbytes = sum(m.numel * m.torch_dtype.itemsize for m in metas)
    raw = run_child(
        "broadcast", {"world": 1 + r.generator.num_engines, "bytes": nbytes, "reps": reps}, {"OMP_NUM_THREADS": "1"}
    )
    from grpo_ray.models.dims import model_dims
    from grpo_ray.planner import memory

    dims = model_dims(inputs.model_path)
    plan = {
        "learner": 2 * memory.bucket_bytes(dims, r) / 1e9,
        "engine": memory.generator_memory(dims, r, 0.0).parts["sync_buffers"],
    }
    med = lambda f: statistics.median(f(row) for row in rows)  # noqa: E731
    push_s = med(lambda row: row["push_s"])
    bound = 2 * fsdp.largest_unit_bytes(metas) + 2 * sync.largest_bucket_bytes(metas, bucket_mb << 20)
    return {
        "model": model,
        "parameters": sum(m.numel for m in metas),
        "wire_dtype": metas[0].dtype,
        "bytes": nbytes,
        "bucket_mb": bucket_mb,
        "reps": reps,
        "push_s": push_s,
        "push_GBps": nbytes / push_s / 1e9,
        "raw_broadcast_s": raw["seconds"],
        "raw_GBps": nbytes / raw["seconds"] / 1e9,
        "ratio": raw["seconds"] / push_s,
        "phases_s": {
            "learner gather": med(lambda row: row["learner"].get("gather", 0.0)),
            "learner cast": med(lambda row: row["learner"].get("cast", 0.0)),
            "learner broadcast wait": med(lambda row: row["learner"].get("wire", 0.0)),
            "learner total": med(lambda row: row["learner"]["seconds"]),
            "engine broadcast wait": med(lambda row: row["engine"]["wire"]),
            "engine load": med(lambda row: row["engine"]["load"]),
            "engine total": med(lambda row: row["engine"]["seconds"]),
            "probe": med(lambda row: row["probe_s"]),
        },
        "fused_s": med(lambda row: row["fused_s"]),
        "logprob_diff_max": max(max(row["logprob_diff"], row["fused_diff"]) for row in rows),
        "extra_rss_gb": {side: max(row["extra_rss_gb"][side] for row in rows) for side in ("learner", "engine")},
        "plan_gb": plan,
        "bound_gb": bound / 1e9,
        "unit_gb": fsdp.largest_unit_bytes(metas) / 1e9,
        "bucket_gb": sync.largest_bucket_bytes(metas, bucket_mb << 20) / 1e9,
    }


def markdown(report: dict) -> str:
    target = lambda ok: "met" if ok else "**missed**"  # noqa: E731
    m = report["machine"]
    lines = [
        f"# Weight sync: {report['runs'][0]['parameters'] / 1e6:.0f}M parameters, 2 learner ranks -> 1 vLLM engine (gloo)",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB; torch {m['torch']}, vLLM {m['vllm']}, "
        f"Ray {m['ray']}; {m['date']}. Median of {report['runs'][0]['reps']} pushes after a warm-up.",
        "",
        "| bucket | wire | bytes | push (s) | push GB/s | raw broadcast GB/s | ratio | probe diff |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report["runs"]:
        lines.append(
            f"| {r['bucket_mb']} MiB | {r['wire_dtype']} | {r['bytes'] / 1e6:.0f} MB | {r['push_s']:.3f} | "
            f"{r['push_GBps']:.2f} | {r['raw_GBps']:.2f} | **{r['ratio']:.2f}** | {r['logprob_diff_max']:.1e} |"
        )
    lines += [
        "",
        "Where the time goes (seconds, median; each side's wall time on its own thread, so the sides overlap):",
        "",
        "| bucket | " + " | ".join(report["runs"][0]["phases_s"]) + " |",
        "| --- |" + " --- |" * len(report["runs"][0]["phases_s"]),
    ]
    for r in report["runs"]:
        lines.append(f"| {r['bucket_mb']} MiB | " + " | ".join(f"{v:.3f}" for v in r["phases_s"].values()) + " |")
    lines += [
        "",
        "A sync as the controller runs it, push and probe (seconds, median): one after the other, and with "
        "the probe as part of the push (the engine's at the end of its receive call, the learner's started once it "
        "has sent, while the engine loads):",
        "",
        "| bucket | push, then probe | push with the probe |",
        "| --- | --- | --- |",
    ]
    for r in report["runs"]:
        lines.append(f"| {r['bucket_mb']} MiB | {r['push_s'] + r['phases_s']['probe']:.3f} | {r['fused_s']:.3f} |")
    lines += [
        "",
        "Extra peak RSS during a push (GB; peak since a reset just before the push, minus RSS then), against "
        "the bound 2 FSDP units + 2 buckets (largest unit and bucket, wire dtype):",
        "",
        "| bucket | unit | bucket size | bound | learner rank 0 | / bound | plan | engine | / bound | plan |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report["runs"]:
        x, b, p = r["extra_rss_gb"], r["bound_gb"], r["plan_gb"]
        lines.append(
            f"| {r['bucket_mb']} MiB | {r['unit_gb']:.3f} | {r['bucket_gb']:.3f} | {b:.3f} | {x['learner']:.3f} | "
            f"{x['learner'] / b:.2f} | {p['learner']:.3f} | {x['engine']:.3f} | {x['engine'] / b:.2f} | "
            f"{p['engine']:.3f} |"
        )
    lines += [
        "",
        "plan: what `grpo-ray plan` counts for it (learner: 2 buckets, of which `sync_extra` is what the step's working set does not already cover; generator: `sync_buffers`).",
    ]
    best = max(r["ratio"] for r in report["runs"])
    lines += [
        "",
        f"Sync at {best:.2f} x the raw broadcast's GB/s (target >= 0.5: {target(best >= 0.5)}); "
        "extra memory within 1.25 x the bound: "
        + target(all(max(r["extra_rss_gb"].values()) <= 1.25 * r["bound_gb"] for r in report["runs"]))
        + ".",
    ]
    before = report.get("before")
    if before:
        lines += [
            "",
            f"Before (commit {before['commit']}, {before['date']}, this machine: {before['what']}):",
            "",
            "| bucket | push (s) | push GB/s | extra RSS learner rank 0 | extra RSS engine |",
            "| --- | --- | --- | --- | --- |",
        ]
        for bucket, b in before["runs"].items():
            lines.append(
                f"| {bucket} MiB | {b['push_s']:.3f} | {b['GBps']:.2f} | {b['extra_rss_gb']['learner']:.3f} | "
                f"{b['extra_rss_gb']['engine']:.3f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    from benchmarks.bench import machine, write_report

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--bucket-mb", type=int, nargs="+", default=[32, 256])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    report = {"machine": machine(), "runs": [measure(args.model, b, args.reps) for b in args.bucket_mb]}
    out = Path(args.out)
    if (out / "sync-before.json").is_file():  # the pre-streaming sync, measured once at the same model
        report["before"] = json.loads((out / "sync-before.json").read_text())
    write_report(out, "sync", report, markdown(report))


if __name__ == "__main__":
    main()
