"""The on-policy schedule against one step off (``algorithm.max_staleness`` 0 vs 1), in one run.

    python benchmarks/pipeline.py --steps 6 --out benchmarks/results

The same recipe, model, prompts, seeds and thread budget under each schedule: a 14M-parameter Qwen2-shaped
model, 8 prompts x 8 samples x 64 response tokens (a random-init model over 384 tokens rarely stops
early), one generator on one core (fp32), one learner rank on the other (bf16 compute: the learner
is otherwise twice the generation's time, and the overlap can hide only the shorter phase), no KL term
(so no reference pool competes for the two cores). Each schedule runs --warmup steps, then --steps timed steps. Reported per
schedule: steps/s, the pools' idle shares (``perf/idle/*``), and the step's parts. Writes pipeline.json
and pipeline.md to --out.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench import machine, step_parser, timed_steps, write_report  # noqa: E402

MODEL = "tiny://qwen2?layers=6&hidden=512&heads=8&kv_heads=4&intermediate=1024&vocab=384&seed=0"
COMMON = [
    f"model.path={MODEL}",
    "data.train_batch_size=8",
    "algorithm.group_size=8",
    "data.response_prefix=''",
    "data.max_prompt_length=64",
    "generator.sampling.max_tokens=80",
    "generator.num_cpus=1",
    "learner.world_size=1",
    "learner.num_cpus=0.99",
    "learner.mini_batch_size=64",
    "learner.micro_batch_size=16",
    "algorithm.kl_coef=0",
    "reward.num_cpus=0.01",
    "learner.dtype=bfloat16",
    "trainer.max_sync_logprob_diff=0.05",
    "trainer.total_steps=1000",
]
SCHEDULES = {
    "on-policy": ["algorithm.max_staleness=0"],
    "one step off": ["algorithm.max_staleness=1", "algorithm.rollout_correction.rollout_is=token"],
    "one step off, bypass": ["algorithm.max_staleness=1", "algorithm.rollout_correction.bypass_mode=true"],
}
"""bypass: the sampler's logprobs are the old policy, so the learner runs no extra forward for stale samples."""
PARTS = (
    "timing_s/gen",
    "timing_s/reward",
    "timing_s/old_log_prob",
    "timing_s/update_actor",
    "sync/seconds",
    "timing_s/sync_weights",
    "perf/gen_overlap_s",
)


def run(name: str, overrides: list[str], warmup: int, steps: int) -> dict:
    rows, wall = timed_steps([*COMMON, *overrides], warmup, steps)
    mean = lambda key: statistics.fmean(r[key] for r in rows)  # noqa: E731
    return {
        "schedule": name,
        "overrides": overrides,
        "steps": steps,
        "wall_s": wall,
        "steps_per_s": steps / wall,
        "idle": {p: mean(f"perf/idle/{p}") for p in ("generator", "learner")},
        "parts": {k: mean(k) for k in PARTS},
        "response_length": mean("response_length/mean"),
        "staleness": max(r["rollout/staleness"] for r in rows),
        "mismatch_kl": mean("rollout_corr/kl"),
        "rows": rows,
    }


def markdown(report: dict) -> str:
    m, runs = report["machine"], report["runs"]
    base = runs[0]["steps_per_s"]
    lines = [
        "# Generation overlapping training: on-policy vs one step off",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB; torch {m['torch']}, vLLM {m['vllm']}, "
        f"Ray {m['ray']}; {m['date']}. `python benchmarks/pipeline.py --steps {report['steps']} "
        f"--warmup {report['warmup']}`: {report['params'] / 1e6:.1f}M parameters, 8 prompts x 8 samples, "
        f"responses of {runs[0]['response_length']:.0f} tokens on average; generator on 1 core, learner (1 rank) "
        "on the other; generator fp32, learner bf16 (FSDP2 mixed precision; this CPU has AMX); no KL term.",
        "",
        "| schedule | steps/s | vs on-policy | generator idle | learner idle | gen (s) | old logprobs (s) | update (s) "
        "| push (s) | sync wait (s) | gen overlapping the update (s) | staleness | mismatch KL |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in runs:
        p = r["parts"]
        lines.append(
            f"| {r['schedule']} | {r['steps_per_s']:.3f} | {r['steps_per_s'] / base:.2f}x | {r['idle']['generator']:.2f} "
            f"| {r['idle']['learner']:.2f} | {p['timing_s/gen']:.2f} | {p['timing_s/old_log_prob']:.2f} "
            f"| {p['timing_s/update_actor']:.2f} | {p['sync/seconds']:.2f} | {p['timing_s/sync_weights']:.2f} "
            f"| {p['perf/gen_overlap_s']:.2f} | {r['staleness']:.0f} | {r['mismatch_kl']:.1e} |"
        )
    lines += [
        "",
        "`sync wait` is the controller's wait in the push: the generation queued before it, the push "
        "and the probe. `gen overlapping the update`: from the engine's and the learner's clocks.",
        "",
    ]
    for r in runs[1:]:  # one step off: the step is the slower of the two phases, which then run side by side
        p = r["parts"]
        learner = p["timing_s/old_log_prob"] + p["timing_s/update_actor"]
        slower = "the learner" if learner > p["timing_s/gen"] else "generation"
        lines.append(
            f"- {r['schedule']}: learner {learner:.2f} s a step (old logprobs + update), generation "
            f"{p['timing_s/gen']:.2f} s; the step ({1 / r['steps_per_s']:.2f} s) is bound by {slower}, "
            f"the other phase idles for the difference."
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = step_parser(6, 2, "benchmarks/results")
    ap.add_argument("--only", nargs="*", help="schedules to run (default: all)")
    args = ap.parse_args()
    from grpo_ray.models.dims import model_dims

    params = model_dims(MODEL).params
    runs = [
        run(name, o, args.warmup, args.steps) for name, o in SCHEDULES.items() if not args.only or name in args.only
    ]
    report = {"machine": machine(), "steps": args.steps, "warmup": args.warmup, "params": params, "runs": runs}
    write_report(args.out, "pipeline", report, markdown(report))


if __name__ == "__main__":
    main()
