"""The streaming schedule against on-policy and one step off, on a long-tailed workload, in one run.

    python benchmarks/streaming.py --steps 10 --warmup 2 --out benchmarks/results

The workload: a 2.4M-parameter Qwen2-shaped model built offline (random weights, 128-token vocabulary), 16 prompts x
4 samples a step, answers up to 320 tokens. Random weights stop at the end-of-text token about once in 128 draws, so
answer lengths are roughly geometric: about 75 tokens on average, and nearly every batch has a few cut at 320, the
tail a batched step waits for. Each pool on cores of its own (``cluster.cpu_threads: reserved``): the generator on
one core, the learner (one rank, bf16) on the other; no KL term (no reference pool). Every schedule runs --warmup
steps, then --steps timed ones.

Reported per schedule: trained tokens/s (the response tokens of the samples trained, over the timed steps' wall
time), steps/s, the engine's idle share (streaming: its loop's time with nothing to run; batched: perf/idle/generator),
the learner's wait on generation, goodput (tokens trained / tokens generated), staleness, the engines' pause per push
and the sampler/learner mismatch. Writes streaming.json and streaming.md to --out.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench import machine, step_parser, timed_steps, write_report  # noqa: E402

MODEL = "tiny://qwen2?layers=4&hidden=256&heads=4&kv_heads=2&intermediate=512&vocab=128&bytes=0&seed=0"
MODEL_122M = "tiny://qwen2?layers=8&hidden=1024&heads=8&kv_heads=2&vocab=8000&tie=0&seed=0"
"""--model 122m: the shape benchmarks/sync.py pushes (the pause per push at that size, and its share of a step)."""
COMMON = [
    "data.train_batch_size=16",
    "algorithm.group_size=4",
    "data.response_prefix=''",
    "data.max_prompt_length=96",
    "generator.num_cpus=1",
    "learner.world_size=1",
    "learner.num_cpus=0.99",
    "learner.mini_batch_size=64",
    "learner.micro_batch_size=16",
    "learner.dtype=bfloat16",
    "algorithm.kl_coef=0",
    "reward.num_cpus=0.01",
    "cluster.cpu_threads=reserved",
    "trainer.max_sync_logprob_diff=0.05",
    "trainer.total_steps=1000",
]
SAMPLES = 16 * 4
"""Samples trained a step."""
CORRECTED = ["algorithm.rollout_correction.rollout_is=token"]
SCHEDULES = {
    "on-policy": ["algorithm.max_staleness=0"],
    "one step off": ["algorithm.max_staleness=1", *CORRECTED],
    "streaming, max_staleness 1": ["algorithm.schedule=streaming", "algorithm.max_staleness=1", *CORRECTED],
    "streaming, max_staleness 2": ["algorithm.schedule=streaming", "algorithm.max_staleness=2", *CORRECTED],
}


def run(name: str, overrides: list[str], warmup: int, steps: int, model: str, max_tokens: int) -> dict:
    shape = [f"model.path={model}", f"generator.sampling.max_tokens={max_tokens}"]
    rows, wall = timed_steps([*shape, *COMMON, *overrides], warmup, steps)
    mean = lambda key, default=0.0: statistics.fmean(r.get(key, default) for r in rows)  # noqa: E731
    tokens = sum(r["response_length/mean"] for r in rows) * SAMPLES
    streams = "algorithm.schedule=streaming" in overrides
    return {
        "schedule": name,
        "overrides": overrides,
        "steps": steps,
        "wall_s": wall,
        "steps_per_s": steps / wall,
        "trained_tokens_per_s": tokens / wall,
        "engine_idle": mean("perf/engine_idle_share") if streams else mean("perf/idle/generator"),
        "learner_wait_share": mean("perf/learner_idle_share") if streams else mean("perf/idle/learner"),
        "goodput": rows[-1].get("rollout/goodput", 1.0),
        "staleness_mean": mean("rollout/staleness/mean"),
        "staleness_max": max(r.get("rollout/staleness/max", 0) for r in rows),
        "versions_per_trajectory_max": max(r.get("rollout/versions_per_trajectory/max", 1) for r in rows),
        "pause_s": mean("sync/pause_s"),
        "step_s": mean("timing_s/step"),
        "response_length": mean("response_length/mean"),
        "mismatch_kl": mean("rollout_corr/kl"),
        "rows": rows,
    }


def markdown(report: dict) -> str:
    m, runs = report["machine"], report["runs"]
    base = {r["schedule"]: r["trained_tokens_per_s"] for r in runs}
    lines = [
        "# Streaming against on-policy and one step off, on a long-tailed workload",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB; torch {m['torch']}, vLLM {m['vllm']}, "
        f"Ray {m['ray']}; {m['date']}. `python benchmarks/streaming.py --steps {report['steps']} "
        f"--warmup {report['warmup']}{report['flags']}`: {report['params'] / 1e6:.1f}M parameters, 16 prompts x 4 "
        f"samples a step, answers up to {report['max_tokens']} tokens (random weights: roughly geometric lengths, a "
        "few cut at the limit in nearly every batch); generator on 1 core, learner (1 rank, bf16) on the other (`cluster.cpu_threads: reserved`); no KL.",
        "",
        "| schedule | trained tokens/s | vs on-policy | vs one step off | steps/s | engine idle | learner waits "
        "| goodput | staleness mean / max | versions per answer, max | pause per push (s) | mismatch KL |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    on, off = base.get("on-policy"), base.get("one step off")
    for r in runs:
        tps = r["trained_tokens_per_s"]
        lines.append(
            f"| {r['schedule']} | {tps:.0f} | {f'{tps / on:.2f}x' if on else ''} | {f'{tps / off:.2f}x' if off else ''} "
            f"| {r['steps_per_s']:.3f} | {r['engine_idle']:.2f} | {r['learner_wait_share']:.2f} | {r['goodput']:.3f} "
            f"| {r['staleness_mean']:.2f} / {r['staleness_max']:.0f} | {r['versions_per_trajectory_max']:.0f} "
            f"| {r['pause_s']:.3f} ({r['pause_s'] / r['step_s']:.1%} of a {r['step_s']:.2f} s step) "
            f"| {r['mismatch_kl']:.1e} |"
        )
    lines += [
        "",
        "`engine idle`: streaming, the share of the engine loop's time with nothing to run; batched, "
        "perf/idle/generator. `learner waits`: streaming, the share of the step spent waiting for groups "
        "(perf/learner_idle_share); batched, perf/idle/learner. `pause per push`: what the requests in flight "
        "waited while the engine loaded a push (sync/pause_s; batched schedules push between batches, nothing waits).",
        "",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = step_parser(10, 2, "benchmarks/results")
    ap.add_argument("--only", nargs="*", help="schedules to run (default: all)")
    ap.add_argument("--model", choices=["2.4m", "122m"], default="2.4m")
    ap.add_argument("--max-tokens", type=int, default=320)
    args = ap.parse_args()
    from grpo_ray.models.dims import model_dims

    model = MODEL_122M if args.model == "122m" else MODEL
    runs = [
        run(name, o, args.warmup, args.steps, model, args.max_tokens)
        for name, o in SCHEDULES.items()
        if not args.only or name in args.only
    ]
    flags = "".join(
        [
            f" --model {args.model}" if args.model != "2.4m" else "",
            f" --max-tokens {args.max_tokens}" if args.max_tokens != 320 else "",
            " --only " + " ".join(f"'{o}'" for o in args.only) if args.only else "",
        ]
    )
    report = {
        "machine": machine(),
        "steps": args.steps,
        "warmup": args.warmup,
        "flags": flags,
        "max_tokens": args.max_tokens,
        "params": model_dims(model).params,
        "runs": runs,
    }
    write_report(args.out, "streaming", report, markdown(report))


if __name__ == "__main__":
    main()
