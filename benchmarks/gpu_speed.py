"""The planner's rates measured on a GPU, and its prediction of the learner's update checked there (torch only: a GPU
machine here has no Ray and no vLLM).

    python benchmarks/gpu_speed.py --out benchmarks/results/gpu/h200-speed          # on a GPU machine
    python benchmarks/gpu_speed.py --tiny --device cpu --out /tmp/gpu-speed-smoke    # the same code path here

1. ``grpo_ray.calibrate``'s torch parts on this device: the matmul grid per dtype, memory bandwidth, an optimizer
   step's cost per parameter, and the learner's own fixed costs per call and per layer (``Learner.update`` and its
   forward on tiny models, FSDP2 on a one-rank group). What needs a second GPU or vLLM (the group's collectives, the
   weight transport, the engine) is not measured: ``PUBLISHED_REST`` gives datasheet and assumed figures, marked so.
2. A real shape (default Qwen2.5-1.5B's, random init, bf16, 1,024-token sequences a quarter prompt, as
   ``benchmarks/gpu.py`` runs it): the update's measured seconds at each micro batch size (median of --steps after
   --warmup) against ``speed.predict``'s update phase on the rates of step 1.

Writes rates.json (this GPU's entry for grpo_ray/rates.json) and gpu-speed.json / gpu-speed.md to --out.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PUBLISHED_REST = {
    "collective": [2e-5, 1.5e11],
    "transport": 2.0e10,
    "engine": {
        "step_s": 0.004,
        "step_layer_s": 0.0,
        "seq_s": 2e-5,
        "prefill_s": 0.01,
        "request_s": 2e-5,
        "work_scale": 1.0,
        "reload_layer_s": 0.002,
        "reload_bps": 2.0e10,
    },
}
"""What one GPU without vLLM cannot measure: NVLink all-gathers in the FSDP2 group (20 us, 150 GB/s), a push over
InfiniBand to the engines' nodes (20 GB/s), a vLLM engine's decode step with CUDA graphs (4 ms, 20 us a sequence), its
generate call (10 ms) and reload (2 ms a layer, 20 GB/s): datasheet and assumed figures, not measured."""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="Qwen/Qwen2.5-1.5B-Instruct", help="a dims.KNOWN_DIMS name (its shape)")
    p.add_argument("--tiny", action="store_true", help="a tiny shape instead (a smoke test of the code path)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--micro", default="4,8")
    p.add_argument("--micro-batches", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", required=True)
    args = p.parse_args()

    import torch

    from benchmarks.gpu import TINY, build_model, recipe_for, step_row
    from grpo_ray.planner import calibrate, rates, speed
    from grpo_ray.roles.learner import Learner
    from grpo_ray.sync import free_port

    start = time.perf_counter()
    threads = 8
    measured = calibrate.torch_rates(args.device, threads)
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    args.gpu = next((g for g in ("b200", "h200", "h100") if g in name.lower()), "h100")
    rates = rates.Rates(
        device=args.gpu if args.device == "cuda" else "cpu",
        source=f"matmuls, memory and the learner's calls measured on one {name} ({date.today()}, "
        "benchmarks/gpu_speed.py); collectives, transport and engine: datasheet and assumed figures",
        threads={"1": measured},
        reward_sample_s=rates.FITTED["reward_sample_s"],
        hop_s=rates.FITTED["hop_s"],
        **PUBLISHED_REST,
    )
    print(f"rates measured in {time.perf_counter() - start:.0f}s", flush=True)

    shape_name = TINY if args.tiny else args.model
    work = Path(tempfile.mkdtemp(prefix="grpo-gpu-speed-"))
    dims = build_model(shape_name, work / "model", args.device)
    args.turns, args.profile = 1, False
    micros = [int(m) for m in args.micro.split(",")]
    learner = Learner(str(work / "model"), recipe_for(work / "model", args, micros[0], args.gpu), 0, 1, threads=threads)
    facts = learner.setup("127.0.0.1", free_port())
    rows = []
    for micro in micros:
        row = step_row(learner, dims, args, micro, facts["peak_tflops"])
        recipe = recipe_for(work / "model", args, micro, args.gpu)
        shape = speed.Shape(args.seq // 4, args.seq - args.seq // 4, "gpu.py's batches")
        predicted = speed.predict(recipe, dims, rates, shape, node_cpus=threads).phases["update"].seconds
        rows.append(
            {
                "micro_batch": micro,
                "samples": row.get("samples"),
                "measured_s": row.get("median_s"),
                "predicted_s": round(predicted, 4),
                "error": round(predicted / row["median_s"] - 1, 4) if row.get("median_s") else None,
                "mfu": row.get("mfu"),
                "out_of_memory": row.get("out_of_memory", False),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    learner.shutdown()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rates.save(out / "rates.json")
    result = {
        "date": str(date.today()),
        "device": name,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "model_shape": shape_name,
        "parameters": dims.params,
        "seq": args.seq,
        "rows": rows,
        "seconds": round(time.perf_counter() - start, 1),
        "command": "python benchmarks/gpu_speed.py "
        + " ".join(a for a in sys.argv[1:] if a not in (args.out, "--out")),
    }
    (out / "gpu-speed.json").write_text(json.dumps(result, indent=1))
    lines = [
        f"# The planner on {name} ({result['date']})",
        "",
        f"`{result['command']}`, {result['seconds']:.0f} s in all. Rates: {rates.source}.",
        "",
        f"The learner's update on {shape_name}'s shape ({dims.params / 1e9:.3g}B parameters, random init, bf16, FSDP2 "
        f"on one rank), {args.micro_batches} micro batches of {args.seq}-token sequences a step:",
        "",
        "| micro batch | measured (s) | predicted (s) | error | MFU |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if r["out_of_memory"]:
            lines.append(f"| {r['micro_batch']} | out of memory | | | |")
        else:
            lines.append(
                f"| {r['micro_batch']} | {r['measured_s']:.4f} | {r['predicted_s']:.4f} | {r['error']:+.1%} | "
                f"{r['mfu'] if r['mfu'] is not None else '-'} |"
            )
    (out / "gpu-speed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
