"""What a reward actor's sandboxed child costs a sample: handed one sample at a time (``RewardChild.run``, each a
round trip) against a step's samples at once (``run_many``, what ``RewardWorker`` does: the child answers each as
it is scored), with the cores idle and beside a process running fp32 matmuls on 2 threads (a reference's forward).

    python benchmarks/reward_child.py [--samples 256] [--out benchmarks/results/reward-child]

The built-in gsm8k rule reward in its sandboxed child, as a default recipe runs it; the median of 9 calls.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def matmuls(stop) -> None:
    import torch

    torch.set_num_threads(2)
    a = torch.randn(512, 512)
    while not stop.is_set():
        for _ in range(20):
            a @ a


def per_sample(score, tasks: list, reps: int = 9) -> float:
    seconds = []
    for _ in range(reps):
        start = time.perf_counter()
        score(tasks)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds) / len(tasks)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--out", default="benchmarks/results/reward-child")
    args = ap.parse_args()

    from benchmarks.bench import machine
    from grpo_ray.config import RewardConfig
    from grpo_ray.rewards.child import RewardChild
    from grpo_ray.sandbox import Jail

    w = RewardConfig()
    child = RewardChild(Jail.of(w))
    functions = [(f.name, f.weight) for f in w.functions]
    tasks = [
        (functions, f"#### {i % 10}", "7", {"data_source": "gsm8k", "extra_info": {}}) for i in range(args.samples)
    ]
    ways = {
        "one at a time (run)": lambda ts: [child.run(t, w.timeout_s) for t in ts],
        "at once (run_many)": lambda ts: child.run_many(ts, w.timeout_s),
    }
    ctx = mp.get_context("spawn")
    rows = []
    for load in ("idle", "beside 2-thread matmuls"):
        stop, busy = ctx.Event(), None
        if load != "idle":
            busy = ctx.Process(target=matmuls, args=(stop,))
            busy.start()
            time.sleep(3)  # torch imported, the matmuls running
        for way, score in ways.items():
            assert all(outcome == "ok" for outcome, _ in score(tasks[:4]))
            rows.append({"load": load, "way": way, "per_sample_s": per_sample(score, tasks)})
            print(json.dumps(rows[-1]), flush=True)
        if busy:
            stop.set()
            busy.join()
    child.close()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "machine": machine(),
        "command": "python benchmarks/reward_child.py " + " ".join(sys.argv[1:]),
        "samples": args.samples,
        "rows": rows,
    }
    (out / "reward-child.json").write_text(json.dumps(report, indent=1))
    m = report["machine"]
    lines = [
        f"# A reward child's cost a sample ({m['date']}, {m['cpu']}, {m['cores']} cores)",
        "",
        f"`{report['command']}`: {args.samples} samples of the built-in gsm8k reward in its sandboxed child, the "
        "median of 9 calls.",
        "",
        "| cores | handed | a sample |",
        "| --- | --- | --- |",
        *[f"| {r['load']} | {r['way']} | {r['per_sample_s'] * 1e6:.1f} us |" for r in rows],
    ]
    (out / "reward-child.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
