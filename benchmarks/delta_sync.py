"""Delta pushes against whole ones, at the 122M shape, in one run (issue 56's targets).

    python benchmarks/delta_sync.py --steps 6 --repeats 3 --out benchmarks/results/delta-sync

The same GRPO run twice, each pool on a core of its own: a 122M-parameter Qwen2-shaped model, bf16 engine, one
learner rank with float32 master weights, AdamW at the recipes' lr 1e-6 (4 prompts x 4 samples of 16 tokens a step:
a small step, so that the pushes show), pushed with ``trainer.weight_transport=collective`` and ``=delta``. Per
push after the first (which is whole either way): the bytes against a whole push's, the elements and tensors that
changed, the push's seconds as the engine sees it (sync/seconds), its load and the learner's share (gather, cast,
finding the changes). The engines' weights are bit-identical when every sample and training metric of the runs
is (same seeds: any weight that differed would change the sampled answers or the losses). ``delta_storage`` is the
same changes through the storage transport's files. Each run's push is also predicted by ``grpo-ray plan``'s sync
phase (with this machine's calibration when there is one: ``grpo-ray plan --calibrate``) and compared with the
measured ``timing_s/sync_weights``, the time the planner's phase stands for. With --repeats R the three runs are
made R times in turn (a slower minute falls on all three): the table gives each figure's median over the rounds,
and the push's time against a whole push's is given per round, as the median with its least and most. Writes
delta-sync.json and delta-sync.md to --out.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench import machine, timed_steps, write_report  # noqa: E402

MODEL = "tiny://qwen2?layers=8&hidden=1024&heads=8&kv_heads=2&vocab=8000&tie=0&seed=0"
COMMON = [
    f"model.path={MODEL}",
    "data.train_batch_size=4",
    "algorithm.group_size=4",
    "data.response_prefix=''",
    "data.max_prompt_length=96",
    "generator.sampling.max_tokens=16",
    "generator.dtype=bfloat16",
    "generator.num_cpus=1",
    "learner.world_size=1",
    "learner.num_cpus=0.99",
    "learner.mini_batch_size=16",
    "learner.micro_batch_size=16",
    "learner.optim.lr=1e-6",
    "algorithm.kl_coef=0",
    "reward.num_cpus=0.01",
    "cluster.cpu_threads=reserved",
    "trainer.max_sync_logprob_diff=0.05",
    "trainer.bucket_mb=32",
    "reward.functions=[{name: 'benchmarks.delta_sync:distinct', weight: 1.0}]",  # random weights score 0 at the task
]


def distinct(response: str, ground_truth: str = "", **extra) -> float:
    """The share of distinct characters in the answer: a reward random weights' answers differ in, so that the
    learner's gradients are not zero (the task's own scores 0 for all of them)."""
    return len(set(response)) / max(len(response), 1)


SAME = ("critic/", "actor/", "response_length/", "rollout_corr/")
"""Metrics that differ if any engine weight did."""


def run(transport: str, steps: int) -> dict:
    rows, wall = timed_steps([*COMMON, f"trainer.weight_transport={transport}"], 0, steps)
    later = rows[1:]  # the first push is whole for every transport
    mean = lambda key: statistics.fmean(r.get(key, 0.0) for r in later)  # noqa: E731
    return {
        "transport": transport,
        "rows": rows,
        "wall_s": wall,
        "push_s": mean("sync/seconds"),
        "load_s": mean("sync/load_s"),
        "gather_s": mean("sync/gather_s"),
        "cast_s": mean("sync/cast_s"),
        "delta_s": mean("sync/delta_s"),
        "bytes": mean("sync/bytes"),
        "bytes_share": mean("sync/bytes_share") if "delta" in transport else 1.0,
        "changed_share": mean("sync/changed_share") if "delta" in transport else 1.0,
        "tensors_touched": mean("sync/tensors_touched") if "delta" in transport else 0.0,
        "first_push_s": rows[0]["sync/seconds"],
        "sync_s": mean("timing_s/sync_weights"),
        **planned(transport, later),
    }


def planned(transport: str, rows: list[dict]) -> dict:
    """The plan's sync phase for the run's recipe at its measured lengths, and the rates' source."""
    from grpo_ray.config import load_recipe
    from grpo_ray.models.dims import model_dims
    from grpo_ray.planner import speed
    from grpo_ray.planner.rates import rates_for

    r = load_recipe(ROOT / "recipes/tiny-cpu.yaml", [*COMMON, f"trainer.weight_transport={transport}"])
    mean = lambda key: round(statistics.fmean(row[key] for row in rows))  # noqa: E731
    shape = speed.Shape(mean("prompt_length/mean"), mean("response_length/mean"))
    rates = rates_for(r)
    phase = speed.predict(r, model_dims(r.model.path), rates, shape).phases["sync"]
    return {"planned_s": phase.seconds, "planned": phase.detail, "rates": rates.source}


def identical(a: list[dict], b: list[dict]) -> tuple[int, list[str]]:
    """How many training values the two runs share, and the keys of those that differ."""
    keys = [k for r in a for k in r if k.startswith(SAME)]
    differ = sorted({k for ra, rb in zip(a, b) for k in ra if k.startswith(SAME) and ra[k] != rb.get(k)})
    return len(keys), differ


def median_run(rounds: list[dict]) -> dict:
    """One transport's runs over the rounds: each figure's median, the rows and rates of the first."""
    out = dict(rounds[0])
    for key, value in rounds[0].items():
        if isinstance(value, float) and key != "wall_s":
            out[key] = statistics.median(r[key] for r in rounds)
    out["push_s_rounds"] = [r["push_s"] for r in rounds]
    return out


def markdown(report: dict) -> str:
    m, runs = report["machine"], report["runs"]
    whole = runs[0]
    lines = [
        "# Delta pushes against whole ones, 122M parameters, bf16 engine",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores; torch {m['torch']}, vLLM {m['vllm']}, Ray {m['ray']}; {m['date']}. "
        f"`python benchmarks/delta_sync.py --steps {report['steps']} --repeats {report['repeats']}`: the same GRPO "
        "run with each transport, AdamW lr 1e-6 on float32 master weights, one learner rank and the engine on a core "
        "each; means over the pushes after the first, the median of the rounds.",
        "",
        "| transport | bytes a push | of a whole push | elements changed | tensors touched | push (s) | engine load (s) "
        "| learner gather + cast + changes (s) | first push (s) | sync phase (s) | planned (s) | error |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in runs:
        lines.append(
            f"| {r['transport']} | {r['bytes'] / 1e6:.1f} MB | {r['bytes_share']:.1%} | {r['changed_share']:.2%} "
            f"| {r['tensors_touched']:.0f} | {r['push_s']:.3f} | {r['load_s']:.3f} "
            f"| {r['gather_s']:.3f} + {r['cast_s']:.3f} + {r['delta_s']:.3f} | {r['first_push_s']:.3f} "
            f"| {r['sync_s']:.3f} | {r['planned_s']:.3f} | {r['planned_s'] / r['sync_s'] - 1:+.0%} |"
        )
    lines += ["", f"Planned with the rates {whole['rates']}."]
    for r, (n, differ) in zip(runs[1:], report["identical"]):
        ratios = [w / d for w, d in zip(whole["push_s_rounds"], r["push_s_rounds"])]
        lines.append(
            f"{r['transport']}: push {statistics.median(ratios):.2f}x faster ({min(ratios):.2f} to "
            f"{max(ratios):.2f} over {len(ratios)} rounds), {r['bytes_share']:.1%} of the bytes. "
            + (
                f"Bit-identical: all {n} training values equal the collective run's (sampled answers, losses, "
                "gradients)."
                if not differ
                else f"NOT identical: {len(differ)} keys differ ({', '.join(differ[:5])})."
            )
        )
    lines.append("")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/delta-sync")
    args = ap.parse_args()
    transports = ("collective", "delta", "delta_storage")
    rounds = [[run(t, args.steps) for t in transports] for _ in range(args.repeats)]
    runs = [median_run([r[i] for r in rounds]) for i in range(len(transports))]
    report = {
        "machine": machine(),
        "steps": args.steps,
        "repeats": args.repeats,
        "runs": runs,
        "identical": [identical(rounds[0][0]["rows"], r["rows"]) for r in rounds[0][1:]],
    }
    write_report(args.out, "delta-sync", report, markdown(report))


if __name__ == "__main__":
    main()
