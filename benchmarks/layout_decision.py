"""What deciding and cutting a step's forwards costs in Python, each step, in the reference and on each learner rank.

    python benchmarks/layout_decision.py [--out benchmarks/results/layout-decision]

For two step shapes (the tiny recipe's: 16 prompts of 21 tokens x 16 one-token responses; a GSM8K-like one: 64
prompts of 120 tokens x 8 responses of 200), times ``layout_work`` (what ``model.shared_prompt: auto`` weighs: both
layouts counted) and ``shared_micro_batches`` (the shared layout's cut) as they are, against the cut as it was before
``SharedCount``: the layout's slots counted again for the whole run at every sample added. Median of 7 calls.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def cut_by_recount(indices, pairs, size):
    """The cut before SharedCount: shared_tokens of the whole run again for every sample added."""
    from grpo_ray.algo.batching import shared_tokens

    budget = size * max(len(pairs[i][0]) + len(pairs[i][1]) for i in indices)
    micros = []
    for i in indices:
        if not micros or shared_tokens([pairs[j] for j in micros[-1] + [i]]) > budget:
            micros.append([])
        micros[-1].append(i)
    return micros


def timed(fn, reps: int = 7) -> float:
    seconds = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/layout-decision")
    args = ap.parse_args()
    from benchmarks.bench import machine
    from grpo_ray.algo.batching import layout_work, shared_micro_batches

    rng = random.Random(0)
    shapes = {"tiny recipe": (16, 16, 21, 1, 128), "GSM8K-like": (64, 8, 120, 200, 8)}
    rows = []
    for name, (prompts, group, plen, rlen, micro) in shapes.items():
        pairs = []
        for _ in range(prompts):
            prompt = [rng.randrange(3, 1000) for _ in range(plen)]
            pairs += [(prompt, [rng.randrange(3, 1000) for _ in range(rng.randint(1, rlen))]) for _ in range(group)]
        indices = list(range(len(pairs)))
        assert shared_micro_batches(indices, pairs, micro) == cut_by_recount(indices, pairs, micro)
        rows.append(
            {
                "shape": name,
                "samples": len(pairs),
                "micro": micro,
                "layout_work_s": timed(lambda p=pairs, m=micro: layout_work(p, m, True)),
                "cut_s": timed(lambda p=pairs, m=micro: shared_micro_batches(list(range(len(p))), p, m)),
                "cut_by_recount_s": timed(lambda p=pairs, m=micro: cut_by_recount(list(range(len(p))), p, m)),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"machine": machine(), "command": "python benchmarks/layout_decision.py", "rows": rows}
    (out / "layout-decision.json").write_text(json.dumps(report, indent=1))
    m = report["machine"]
    lines = [
        f"# Deciding and cutting a step's forwards ({m['date']}, {m['cpu']}, {m['cores']} cores)",
        "",
        f"`{report['command']}`",
        "",
        "| shape | samples | micro batch | layout_work (both layouts counted) | the shared cut | the cut before "
        "(recounting the run at every sample) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['shape']} | {r['samples']} | {r['micro']} | {r['layout_work_s'] * 1e3:.1f} ms | "
            f"{r['cut_s'] * 1e3:.1f} ms | {r['cut_by_recount_s'] * 1e3:.1f} ms |"
        )
    (out / "layout-decision.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
