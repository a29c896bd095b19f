"""The vision showcase, in one command (issue 77): a tiny vision-language model learns to count the squares of a
picture, SFT warm start then GRPO, and the same commands on the same questions with the pictures blanked do not
(the model reads the pixels).

    python benchmarks/vision_showcase.py --out benchmarks/results/vision-showcase

Each arm: ``grpo-ray sft recipes/tiny-cpu-vision.yaml`` for a short warm start, then ``grpo-ray train`` of the same
recipe from the model it made (lr 1e-4, temperature 0.7: at the recipe's 1e-3 and 1.0 a warm start collapses onto one
answer, benchmarks/results/vision-sft). The blanked arm's rows are the same questions and answers on white pictures
(``synthetic://shapes?...&blank=1``), its validation too. Writes each run's metrics, curves.png and
vision-showcase.md / .json.
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

RECIPE = "recipes/tiny-cpu-vision.yaml"
KEY = "val/synthetic/shapes/pass@1"
COMMONEST = 0.289
"""Greedy pass@1 of always answering the commonest count on the validation pictures (benchmarks/results/vision-sft)."""


def rows(blank: int, split: str = "train") -> str:
    size = 20000 if split == "train" else 128
    return f'["synthetic://shapes?size={size}&seed=0&max_count=4&blank={blank}{"&split=test" if split != "train" else ""}"]'


def markdown(report: dict) -> str:
    m, arms = report["machine"], report["arms"]
    lines = [
        f"# Vision showcase ({m['date']}, {m['cpu']}, {m['cores']} cores)",
        "",
        f"`python benchmarks/vision_showcase.py --sft-steps {report['sft_steps']} --steps {report['steps']}`: "
        f"**{report['seconds'] / 60:.1f} min in all**, both arms. `{RECIPE}`'s model (Gemma 3's vision-language "
        "shape, a 2-layer SigLIP tower, random weights) counts the coloured squares (1 to 4) of a 64 x 64 picture. "
        f"Greedy pass@1 on 128 held-out pictures; answering the commonest count scores {COMMONEST}. The blanked arm: "
        "the same questions and answers, every picture white, in training and validation.",
        "",
    ]
    for arm in arms:
        sft, grpo = arm["sft"], arm["grpo"]
        lines += [
            f"- **{arm['name']}**: SFT {sft['steps']} steps (loss {sft['loss_first10']:.2f} -> "
            f"{sft['loss_last10']:.2f}), then GRPO {report['steps']} steps: **greedy pass@1 {grpo['start']:.3f} -> "
            f"{grpo['final']:.3f} ({grpo['final'] - grpo['start']:+.3f})**, best {grpo['best']:.3f}; train score "
            f"(T=0.7) {grpo['score_first10']:.3f} over the first 10 steps -> {grpo['score_last10']:.3f} over the last "
            f"10; {grpo['step_s_last10']:.2f} s a step.",
        ]
    lines += ["", "GRPO's validation:", "", *val_table([a["grpo"] for a in arms]), "", "![curves](curves.png)"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sft-steps", type=int, default=100)
    ap.add_argument("--steps", type=int, default=200, help="GRPO steps")
    ap.add_argument("--test-freq", type=int, default=25)
    ap.add_argument("--out", default="benchmarks/results/vision-showcase")
    ap.add_argument("--work", default="runs/vision-showcase", help="the runs go here")
    args = ap.parse_args()
    out, (work, env, common) = Path(args.out), fresh_work(args.work)
    start, arms = time.perf_counter(), []
    for name, blank in (("pictures", 0), ("blanked", 1)):
        data = [f"data.train_files={rows(blank)}", f"data.val_files={rows(blank, 'test')}"]
        sft = [
            *(f"{k}={v}" for k, v in {"trainer.total_steps": args.sft_steps, "data.train_batch_size": 64}.items()),
            "learner.mini_batch_size=64",
            "learner.micro_batch_size=32",
            f"trainer.test_freq={args.sft_steps}",
            "trainer.save_freq=0",
        ]
        cli(
            f"{name}-sft", ["sft", RECIPE, *common, *data, *sft, f"trainer.output_dir={work / name / 'sft'}"], work, env
        )
        grpo = [
            f"model.path={work / name / 'sft' / 'model'}",
            f"trainer.total_steps={args.steps}",
            f"trainer.test_freq={args.test_freq}",
            "learner.optim.lr=1e-4",
            "generator.sampling.temperature=0.7",
        ]
        t = time.perf_counter()
        cli(
            f"{name}-grpo",
            ["train", RECIPE, *common, *data, *grpo, f"trainer.output_dir={work / name / 'grpo'}"],
            work,
            env,
        )
        summary, got = run_summary(name, work / name / "grpo", time.perf_counter() - t, grpo[1:], KEY)
        train = [r for r in got if r["step"] > 0 and "critic/score/mean" in r]
        summary |= {
            "best": max(summary["val"].values()),
            "score_first10": mean_of("critic/score/mean", train[:10]),
            "score_last10": mean_of("critic/score/mean", train[-10:]),
            "step_s_last10": mean_of("timing_s/step", train[-10:]),
        }
        arms.append({"name": name, "sft": sft_summary(work / name / "sft", KEY), "grpo": summary})
    seconds = time.perf_counter() - start

    out.mkdir(parents=True, exist_ok=True)
    for arm in arms:
        for part in ("sft", "grpo"):
            shutil.copy(work / arm["name"] / part / "metrics.jsonl", out / f"{arm['name']}-{part}.jsonl")
    panels = [(KEY, "validation pass@1 (greedy, 128 pictures)"), ("critic/score/mean", "train score (T=0.7)")]
    run_curves([a["grpo"] for a in arms], panels, out / "curves.png", "GRPO step", hline=(COMMONEST, "commonest"))
    report = {"machine": machine(), "sft_steps": args.sft_steps, "steps": args.steps, "seconds": seconds, "arms": arms}
    write_report(out, "vision-showcase", report, markdown(report))


if __name__ == "__main__":
    main()
