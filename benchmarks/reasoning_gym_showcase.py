"""The reasoning-gym showcase, in one command: a tiny model learns one of reasoning-gym's tasks through the built-in
``reasoning_gym://`` data spec and reward (no glue): SFT warm start, then GRPO.

    python benchmarks/reasoning_gym_showcase.py --out benchmarks/results/reasoning-gym-showcase

``grpo-ray train recipes/tiny-cpu-reasoning-gym.yaml`` in a fresh model cache under the work directory, so its warm
start (``recipes/tiny-cpu-reasoning-gym-sft.yaml``) trains first and the command's time includes it. Writes the warm
start's metrics (sft.jsonl), GRPO's (grpo.jsonl), curves.png and reasoning-gym-showcase.md / .json.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench import fresh_work, machine, mean_of, run_curves, run_summary, sft_summary, val_table, write_report  # noqa: E402
from benchmarks.distill_showcase import cli  # noqa: E402

RECIPE = "recipes/tiny-cpu-reasoning-gym.yaml"
KEY = "val/reasoning_gym/chain_sum/pass@1"


def markdown(report: dict) -> str:
    m, grpo, sft = report["machine"], report["grpo"], report["sft"]
    lines = [
        f"# reasoning-gym showcase ({m['date']}, {m['cpu']}, {m['cores']} cores)",
        "",
        f"`python benchmarks/reasoning_gym_showcase.py --steps {report['steps']}`: **{report['seconds'] / 60:.1f} min "
        f"in all**, the warm start included. `{RECIPE}` (reasoning-gym's `chain_sum`, two single-digit terms, "
        "through `reasoning_gym://` rows and the built-in `reasoning_gym` reward) from its SFT warm start "
        "(`recipes/tiny-cpu-reasoning-gym-sft.yaml`). Greedy pass@1 on 256 validation rows (seed 1). The task "
        f"has {report['distinct']} distinct problems, so the training rows (other seeds) hold every validation "
        "problem too: this measures learning the task, not answering unseen problems.",
        "",
        f"- Warm start: {sft['steps']} SFT steps of 64 answers, loss {sft['loss_first10']:.2f} over the first 10 "
        f"steps -> {sft['loss_last10']:.2f} over the last 10; greedy pass@1 "
        + " -> ".join(f"{v:.3f} (step {s})" for s, v in sorted(sft["val"].items()))
        + f" ({sft['seconds']:.0f} s).",
        f"- GRPO: {report['steps']} steps of 64 problems x 16 samples at temperature 1.0, lr 1e-4, one update a "
        f"step; **greedy pass@1 {grpo['start']:.3f} -> {grpo['final']:.3f} ({grpo['final'] - grpo['start']:+.3f})**, "
        f"best {grpo['best']:.3f}; train score (T=1) {grpo['score_first10']:.3f} over the first 10 steps -> "
        f"{grpo['score_last10']:.3f} over the last 10; {grpo['step_s_last10']:.2f} s a step; "
        f"{grpo['seconds'] / 60:.1f} min.",
        "",
        *val_table([grpo]),
        "",
        "![curves](curves.png)",
    ]
    return "\n".join(lines) + "\n"


def distinct_problems() -> int:
    """How many distinct questions the recipe's training rows hold (the task's problems, as its generator draws
    them)."""
    from grpo_ray.config import load_recipe
    from grpo_ray.integrations import reasoning_gym

    recipe = load_recipe(ROOT / RECIPE)
    return len({r["prompt"][0]["content"] for r in reasoning_gym.rows(recipe.data.train_files[0])})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200, help="GRPO steps")
    ap.add_argument("--test-freq", type=int, default=20)
    ap.add_argument("--out", default="benchmarks/results/reasoning-gym-showcase")
    ap.add_argument("--work", default="runs/reasoning-gym-showcase", help="runs and the fresh model cache go here")
    args = ap.parse_args()
    out, (work, env, common) = Path(args.out), fresh_work(args.work)
    where = [f"trainer.total_steps={args.steps}", f"trainer.test_freq={args.test_freq}"]
    start = time.perf_counter()
    stdout = cli("grpo", ["train", RECIPE, *common, *where, f"trainer.output_dir={work / 'grpo'}"], work, env)
    seconds = time.perf_counter() - start

    warm = Path(stdout.split("SFT warm start: model at ")[1].split()[0]).parent
    sft = sft_summary(warm, KEY)
    grpo, rows = run_summary("grpo", work / "grpo", seconds, [], KEY)
    train = [r for r in rows if r["step"] > 0 and "critic/score/mean" in r]
    grpo |= {
        "best": max(grpo["val"].values()),
        "score_first10": mean_of("critic/score/mean", train[:10]),
        "score_last10": mean_of("critic/score/mean", train[-10:]),
        "step_s_last10": mean_of("timing_s/step", train[-10:]),
    }

    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(warm / "metrics.jsonl", out / "sft.jsonl")
    shutil.copy(work / "grpo" / "metrics.jsonl", out / "grpo.jsonl")
    panels = [
        (KEY, "validation pass@1 (greedy, 256 rows)"),
        ("critic/score/mean", "train score (T=1)"),
        ("actor/entropy", "entropy"),
    ]
    run_curves([grpo], panels, out / "curves.png", "GRPO step")
    report = {
        "machine": machine(),
        "steps": args.steps,
        "seconds": seconds,
        "distinct": distinct_problems(),
        "sft": sft,
        "grpo": grpo,
    }
    write_report(out, "reasoning-gym-showcase", report, markdown(report))


if __name__ == "__main__":
    main()
