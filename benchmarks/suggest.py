"""How good ``grpo-ray plan --suggest``'s first choice is: the layouts it considered, measured, on tiny twins.

    python benchmarks/suggest.py [--others 3] [--warmup 2] [--steps 5] [--out benchmarks/results/suggest]

For each recipe in TWINS (tiny CPU twins of the scale recipes, and the quick start's) the recipe as it is runs
first (``bench.timed_steps``: the real pools on a local Ray cluster, the median of --steps timed steps after
--warmup); then the planner runs as ``grpo-ray plan RECIPE --suggest --prompt-tokens P`` does, P the mean prompt
that run measured (the plan's own default, data.max_prompt_length, is a bound: 4.5x the quick start's prompts): the
committed rates table, every layout ``speed.layouts`` lists that loads, fits and can be placed, ranked by predicted
step time (layouts whose prediction is the same counted once). Measured the same way: the three it ranks first,
--others more drawn at random (--seed) from the rest of what it considered, and every layout it considered that
differs from its first choice in one setting (the first choice's neighbours). Every run samples past end of
sequence (generator.sampling.ignore_eos), so a response has the length the plan assumes whatever the random-init
model writes. The first choice passes when its measured step is within 10% of the best measured.

Each run also reads the peak resident memory of the learner's and the reference's actors (``perf/peak_rss_gb/*``)
and compares it with ``grpo_ray.fit``'s estimate at the step's longest sequence (``benchmarks/memory.py``'s
comparison, here over every measured layout). Writes suggest.json and suggest.md to --out. With --rank-only and
--reuse, the planner as it is now ranks again against an earlier run's measurements, measuring nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TWINS = [
    "recipes/tiny-cpu.yaml",
    "recipes/tiny-qwen2.5-0.5b-gsm8k-1gpu.yaml",
    "recipes/tiny-qwen2.5-1.5b-gsm8k-1gpu.yaml",
    "recipes/tiny-qwen2.5-1.5b-gsm8k-1node.yaml",
    "recipes/tiny-gemma3-1b-math500-1node.yaml",
    "recipes/tiny-llama3.1-8b-math-4node.yaml",
]
FLAGS = ["generator.sampling.ignore_eos=true", "trainer.total_steps=1000"]
"""Every run's overrides: responses of the planned length, and a run long enough for the timed steps."""
WITHIN = 0.10


def considered(recipe: str, prompt_tokens: int) -> tuple[list, object]:
    """What ``plan --suggest --prompt-tokens`` ranks for `recipe` (all of it, fastest first), and the recipe's own
    prediction."""
    from grpo_ray.config import load_recipe
    from grpo_ray.models.dims import model_dims
    from grpo_ray.planner import rates, speed, suggest

    r = load_recipe(ROOT / recipe, FLAGS)
    d, rates = model_dims(r.model.path), rates.rates_for(r)
    shape = speed.default_shape(r, prompt_tokens)
    ranked = suggest.suggest(lambda more: load_recipe(ROOT / recipe, FLAGS + more), r, d, rates, shape, 0, top=None)
    return ranked, speed.predict(r, d, rates, shape)


def run(recipe: str, overrides: list[str], warmup: int, steps: int) -> dict:
    """A layout's measured step and its pools' memory against the plan's."""
    from benchmarks.bench import memory_against_fit, timed_steps
    from grpo_ray.config import load_recipe

    t = time.perf_counter()
    rows, _ = timed_steps([*FLAGS, *overrides], warmup, steps, recipe=recipe)
    memory = memory_against_fit(load_recipe(ROOT / recipe, [*FLAGS, *overrides]), rows)
    return {
        "overrides": overrides,
        "step_s": statistics.median(m["timing_s/step"] for m in rows),
        "seq": max(int(m["global_seqlen/max"]) for m in rows),
        "prompt_tokens": statistics.fmean(m["prompt_length/mean"] for m in rows),
        "memory": memory,
        "seconds": time.perf_counter() - t,
    }


def neighbours(ranked: list, first: list[str]) -> list[int]:
    """The indices of the layouts that differ from `first` in one setting (engines, ranks, schedule, layout or micro
    batch): the search around the first choice."""
    return [i for i, s in enumerate(ranked) if sum(a != b for a, b in zip(s.overrides, first)) == 1]


def twin(recipe: str, others: int, warmup: int, steps: int, seed: int, earlier: dict, rank_only: bool) -> dict:
    def measure(overrides: list[str], rank: int, predicted: float) -> dict:
        key = json.dumps([recipe, overrides])
        if rank_only and key not in earlier:
            return {"overrides": overrides, "rank": rank, "predicted_s": predicted, "step_s": math.nan, "memory": {}}
        m = earlier.get(key) or run(recipe, overrides, warmup, steps)
        m = {**m, "rank": rank, "predicted_s": predicted}
        print(json.dumps({"recipe": recipe, **m}), flush=True)
        return m

    as_is = measure([], 0, 0.0)
    ranked, now = considered(recipe, round(as_is["prompt_tokens"]))
    as_is["predicted_s"] = now.step
    rng = random.Random(seed)
    rest = list(range(3, len(ranked)))
    picks = list(range(min(3, len(ranked)))) + sorted(rng.sample(rest, min(others, len(rest))))
    picks += [i for i in neighbours(ranked, ranked[0].overrides) if i not in picks]
    if rank_only:  # and every layout the earlier run measured: the best measured is over all of them
        picks += [i for i, x in enumerate(ranked) if json.dumps([recipe, x.overrides]) in earlier and i not in picks]
    measured = [measure(ranked[i].overrides, i + 1, ranked[i].prediction.step) for i in picks]
    best = min([m for m in [*measured, as_is] if not math.isnan(m["step_s"])], key=lambda m: m["step_s"])
    first = measured[0]
    return {
        "recipe": recipe,
        "considered": len(ranked),
        "prompt_tokens": round(as_is["prompt_tokens"]),
        "measured": measured,
        "as_is": as_is,
        "first_over_best": first["step_s"] / best["step_s"],
        "first_over_as_is": first["step_s"] / as_is["step_s"],
        "passes": first["step_s"] <= (1 + WITHIN) * best["step_s"],
    }


def markdown(report: dict) -> str:
    m = report["machine"]
    passed = sum(t["passes"] for t in report["twins"])
    lines = [
        f"# plan --suggest's first choice against the measured layouts ({m['date']}, {m['cpu']}, {m['cores']} cores)",
        "",
        f"`{report['command']}`",
        "",
        f"**The first choice within {WITHIN:.0%} of the best measured layout on {passed} of "
        f"{len(report['twins'])} twins.** Measured per twin: the planner's top three, {report['others']} more of "
        "the layouts it considered drawn at random, the first choice's neighbours (one setting changed) and the recipe "
        "as it is (rank 0); step seconds are the median of "
        f"{report['steps']} steps after {report['warmup']}.",
        "",
        "| twin | prompt tokens | layouts considered | first choice: predicted / measured | best measured (rank) | "
        "first / best | first / as is |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for t in report["twins"]:
        first = t["measured"][0]
        best = min([*t["measured"], t["as_is"]], key=lambda x: x["step_s"])
        lines.append(
            f"| {Path(t['recipe']).stem} | {t['prompt_tokens']} | {t['considered']} | "
            f"{first['predicted_s']:.3f} / {first['step_s']:.3f} s "
            f"| {best['step_s']:.3f} s ({best['rank']}) | {t['first_over_best']:.2f} | {t['first_over_as_is']:.2f} |"
        )
    lines += ["", "Every measured layout:", "", "| twin | rank | predicted s | measured s | overrides |"]
    lines.append("| --- | --- | --- | --- | --- |")
    for t in report["twins"]:
        for x in [*t["measured"], t["as_is"]]:
            lines.append(
                f"| {Path(t['recipe']).stem} | {x['rank']} | {x['predicted_s']:.3f} | {x['step_s']:.3f} | "
                f"{' '.join(x['overrides']) or '(as is)'} |"
            )
    e = report["memory_errors"]
    lines += [
        "",
        "Memory: `grpo_ray.fit`'s estimate at each run's longest sequence against the peak resident memory measured, "
        "over the same runs:",
        "",
        "| pool | runs | mean absolute error | worst | within 10% |",
        "| --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {pool} | {v['n']} | {v['mape']:.1%} | {v['worst']:+.1%} | {v['within_10']} of {v['n']} |"
        for pool, v in e.items()
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--others", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", nargs="*", help="twins to run (default: TWINS)")
    ap.add_argument(
        "--reuse", help="an earlier run's suggest.json or log (its JSON lines): its measurements of the same layouts"
    )
    ap.add_argument(
        "--rank-only",
        action="store_true",
        help="rank with today's model against --reuse's measurements, measuring nothing (a layout it lacks: nan)",
    )
    ap.add_argument("--out", default="benchmarks/results/suggest")
    args = ap.parse_args()
    from benchmarks.bench import machine, memory_errors

    earlier = {}
    if args.reuse and args.reuse.endswith(".json"):  # an earlier suggest.json
        for t in json.loads(Path(args.reuse).read_text())["twins"]:
            for m in [*t["measured"], t["as_is"]]:
                earlier[json.dumps([t["recipe"], m["overrides"]])] = m
    elif args.reuse:  # an earlier run's log
        for line in Path(args.reuse).read_text().splitlines():
            if line.startswith("{"):
                m = json.loads(line)
                earlier[json.dumps([m.pop("recipe"), m["overrides"]])] = m
    twins = [
        twin(t, args.others, args.warmup, args.steps, args.seed, earlier, args.rank_only) for t in (args.only or TWINS)
    ]
    report = {
        "machine": machine(),
        "command": "python benchmarks/suggest.py " + " ".join(sys.argv[1:]),
        "others": args.others,
        "warmup": args.warmup,
        "steps": args.steps,
        "twins": twins,
        "memory_errors": memory_errors([m for t in twins for m in [*t["measured"], t["as_is"]]]),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "suggest.json").write_text(json.dumps(report, indent=1))
    (out / "suggest.md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
