"""The teacher pool of on-policy distillation against the raw component, and what it adds to a step, in one run.

    python benchmarks/distill.py --out benchmarks/results/distill

1. **Pool against a bare forward**: one teacher actor (the teacher role, ``Reference`` with ``pool="teacher"``:
   its FSDP2 group of one, packed micro batches, the values cut back to each response) scores batches of rollouts
   passed as Ray object refs, against a bare transformers forward of the same model in a Ray actor with the same
   threads, on the same batches (every sequence the same length, so the bare side pads nothing); both timed from
   the driver, the Ray hop included on both sides. Tokens/s, the median over --reps calls after one warm-up, for
   each model in --models.
2. **A step with and without the teacher**: the controller's steps of the distillation twin
   (``recipes/tiny-qwen2.5-1.5b-gsm8k-distill.yaml``: one step off) with a teacher the policy's own size, with the
   12M teacher above (39x the policy), and the same recipe without a teacher (``~teacher.model``); the median step
   time of each, and how much of the teacher's time ran during the previous update (``perf/frozen_overlap_s``).

Writes distill.json and distill.md to --out.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench import heading, machine, step_parser, timed_steps, write_report  # noqa: E402
from benchmarks.gpu import batch, pool_against_bare  # noqa: E402

TWIN = "recipes/tiny-qwen2.5-1.5b-gsm8k-distill.yaml"
MODELS = {  # name: (samples a call, tokens a sequence, micro batch)
    "tiny://qwen2?layers=2&hidden=128&heads=4&kv_heads=2&intermediate=256&vocab=128&bytes=0&seed=1": (64, 128, 16),
    "tiny://qwen2?layers=4&hidden=512&heads=8&kv_heads=2&intermediate=1536&vocab=128&bytes=0&seed=1": (32, 256, 8),
}


class BareForward:
    """A transformers forward of the model at `path` and its logprobs of each response, micro batch by micro batch
    (every sequence the same length: no padding)."""

    def __init__(self, path: str, threads: int, micro: int):
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.micro = micro

    def logprobs(self, rollout_refs: list) -> list[list[float]]:
        import ray
        import torch

        pairs = [(r.prompts[c.prompt].ids, c.token_ids) for r in ray.get(rollout_refs) for c in r.completions]
        out = []
        with torch.no_grad():
            for i in range(0, len(pairs), self.micro):
                chunk = pairs[i : i + self.micro]
                ids = torch.tensor([p + r for p, r in chunk])
                n = len(chunk[0][0])
                logits = self.model(ids).logits[:, n - 1 : -1]
                out += torch.log_softmax(logits, -1).gather(2, ids[:, n:, None])[..., 0].tolist()
        return out


def pool_vs_bare(name: str, samples: int, seq: int, micro: int, reps: int, threads: int) -> dict:
    import ray

    from grpo_ray import models
    from grpo_ray.config import load_recipe
    from grpo_ray.models.dims import model_dims
    from grpo_ray.roles.reference import Reference

    path = models.resolve(name)
    recipe = load_recipe(ROOT / TWIN, [f"teacher.model={name}", f"teacher.micro_batch_size={micro}"])
    options = dict(num_cpus=threads, runtime_env={"env_vars": {"OMP_NUM_THREADS": str(threads)}})
    pool = ray.remote(Reference).options(**options).remote(path, recipe, 0, 1, threads, "teacher")
    ray.get(pool.setup.remote(*ray.get(pool.address.remote())))
    bare = ray.remote(BareForward).options(**options).remote(path, threads, micro)
    ray.get(bare.__ray_ready__.remote())  # loaded before anything is timed: its start would take the pool's CPUs
    vocab = model_dims(path).vocab
    refs = [ray.put(batch(vocab, samples, seq, seed=k)[0][0]) for k in range(reps + 1)]

    def timed(call) -> tuple[list[float], list]:
        seconds, first = [], None
        for k, ref in enumerate(refs):
            start = time.perf_counter()
            got = call(ref)
            if k:
                seconds.append(time.perf_counter() - start)
            else:
                first = got
        return seconds, first

    pool_s, pool_lps = timed(lambda ref: ray.get(pool.logprobs.options(num_returns=2).remote([ref])[0]))
    bare_s, bare_lps = timed(lambda ref: ray.get(bare.logprobs.remote([ref])))
    ray.get(pool.shutdown.remote())
    for a in (pool, bare):
        ray.kill(a)
    return {
        "model": name,
        "parameters": model_dims(path).params,
        "samples": samples,
        "seq": seq,
        "micro_batch": micro,
        "threads": threads,
        **pool_against_bare(samples * seq, pool_s, bare_s, pool_lps, bare_lps),
    }


def step_times(warmup: int, steps: int) -> dict:
    from grpo_ray.config import load_recipe

    student, larger = load_recipe(ROOT / TWIN).model.path, list(MODELS)[1]
    cases = {
        "with teacher": [f"teacher.model={student}"],
        "with a 39x teacher": [f"teacher.model={larger}"],
        "without": ["~teacher.model"],
    }
    out = {}
    for name, overrides in cases.items():
        # the run's length and no checkpoint: the next batch is launched ahead at every timed step
        length = [f"trainer.total_steps={warmup + steps + 1}", "trainer.save_freq=0", "teacher.validate=false"]
        rows, _ = timed_steps([*overrides, *length], warmup, steps, TWIN)
        out[name] = {
            "step_s": [r["timing_s/step"] for r in rows],
            "median_step_s": statistics.median(r["timing_s/step"] for r in rows),
            "median_teacher_s": statistics.median(r.get("timing_s/teacher", 0.0) for r in rows),
            "median_update_s": statistics.median(r["timing_s/update_actor"] for r in rows),
            "median_frozen_overlap_s": statistics.median(r.get("perf/frozen_overlap_s", 0.0) for r in rows),
        }
    out["ratio"] = out["with teacher"]["median_step_s"] / out["without"]["median_step_s"]
    out["larger_ratio"] = out["with a 39x teacher"]["median_step_s"] / out["without"]["median_step_s"]
    return out


def markdown(report: dict) -> str:
    lines = [
        *heading("Distillation teacher pool", report),
        "The teacher pool (one actor: the teacher role on an FSDP2 group of one) against a bare transformers forward "
        "in a Ray actor with the same threads, on the same batches passed as object refs, timed from the driver "
        f"(median of {report['reps']} calls after one warm-up; fp32):",
        "",
        "| teacher | parameters | batch | threads | pool tokens/s | bare tokens/s | pool / bare | largest logprob gap |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report["pool_vs_bare"]:
        lines.append(
            f"| `{r['model'].split('?')[1][:40]}...` | {r['parameters']:,} | {r['samples']} x {r['seq']} tokens, "
            f"micro {r['micro_batch']} | {r['threads']} | {r['pool_tokens_per_s']:.0f} | {r['bare_tokens_per_s']:.0f} "
            f"| {r['pool_over_bare']:.2f} | {r['max_abs_logprob_gap']:.2g} |"
        )
    s = report["steps_with_and_without"]
    lines += [
        "",
        f"The distillation twin (`{TWIN}`, one step off: the teacher scores batch s+1 while the learner trains "
        f"batch s), median of {report['steps']} steps after {report['warmup']}:",
        "",
        "| teacher | step s | teacher s | of it during the last update s | update s | step / without |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    labels = {"with teacher": "the policy's size", "with a 39x teacher": "39x the policy's size", "without": "none"}
    for name, ratio in (("with teacher", s["ratio"]), ("with a 39x teacher", s["larger_ratio"]), ("without", 1.0)):
        w = s[name]
        lines.append(
            f"| {labels[name]} | {w['median_step_s']:.3f} | {w['median_teacher_s']:.3f} | "
            f"{w['median_frozen_overlap_s']:.3f} | {w['median_update_s']:.3f} | **{ratio:.2f}x** |"
        )
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = step_parser(steps=10, warmup=3, out="benchmarks/results/distill")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import ray

    ray.init(address="local", num_cpus=2 * args.threads, include_dashboard=False, log_to_driver=False)
    try:
        rows = [pool_vs_bare(name, *shape, args.reps, args.threads) for name, shape in MODELS.items()]
    finally:
        ray.shutdown()
    report = {
        "machine": machine(),
        "reps": args.reps,
        "steps": args.steps,
        "warmup": args.warmup,
        "pool_vs_bare": rows,
        "steps_with_and_without": step_times(args.warmup, args.steps),
        "command": "python benchmarks/distill.py " + " ".join(sys.argv[1:]),
    }
    write_report(args.out, "distill", report, markdown(report))


if __name__ == "__main__":
    main()
