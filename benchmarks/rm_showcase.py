"""The learned-reward showcase, in one command: a tiny reward model trained by ``grpo-ray rm`` on preference pairs
of the quick start's task, then GRPO on its score alone, against GRPO on the rule reward, from the same start and
budget.

    python benchmarks/rm_showcase.py --out benchmarks/results/rm-showcase

1. ``grpo-ray rm recipes/tiny-cpu-rm.yaml``: a sequence classifier on the quick start's model shape and tokenizer
   learns from pairs (the right count over a wrong one) which answer is right; exported to <work>/rm/model.
2. ``recipes/tiny-cpu.yaml`` for --steps steps: ``rule`` (the gsm8k reward, as the quick start), and three runs on
   the reward model's score alone (``reward_model.model`` the export, the gsm8k reward at weight 0: scored and
   logged, not trained on): ``learned`` (``reward_model.sigmoid``: the probability of a good answer, with mean-only
   group advantages, ``algorithm.norm_adv_by_std=false``), ``learned-raw`` (the raw score, the recipe's std-normalised
   advantages) and ``learned-raw-mean`` (the raw score, mean-only advantages). The true score of every run is the
   gsm8k reward; the learned runs log its correlation with the learned one each step.

Writes each run's metrics (<name>.jsonl), curves.png (validation pass@1, the true reward, the learned score and its
correlation with the true one) and rm-showcase.md / .json.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench import fresh_work, machine, mean_of, rows_of, run_curves, run_summary, val_table, write_report  # noqa: E402
from benchmarks.distill_showcase import cli  # noqa: E402

RM_RECIPE = "recipes/tiny-cpu-rm.yaml"
RECIPE = "recipes/tiny-cpu.yaml"
KEY = "val/synthetic/select/pass@1"
COLORS = {"rule": "C1", "learned": "C0", "learned-raw": "C3", "learned-raw-mean": "C2"}
# the reward-model actor's CPU comes from the reference's and the reward pool's: both runs get the same layout
LAYOUT = [
    "reward_model.num_actors=1",
    "reward_model.num_cpus=0.25",
    "reference.num_cpus=0.125",
    "reward.num_cpus=0.125",
]


def summary(name: str, out: Path, seconds: float, overrides: list[str]) -> dict:
    run, rows = run_summary(name, out, seconds, overrides, KEY)
    train = [r for r in rows if r["step"] > 0 and "reward/gsm8k/mean" in r]
    corr = [r["reward_model/true_corr"] for r in train if "reward_model/true_corr" in r]
    return {
        **run,
        "true_first10": mean_of("reward/gsm8k/mean", train[:10]),
        "true_last10": mean_of("reward/gsm8k/mean", train[-10:]),
        "corr_mean": sum(corr) / len(corr) if corr else None,
        "corr_min": min(corr, default=None),
        "step_s_last10": mean_of("timing_s/step", train[-10:]),
    }


def markdown(report: dict) -> str:
    m, runs, rm = report["machine"], {r["name"]: r for r in report["runs"]}, report["rm"]
    rule, learned = runs["rule"], runs["learned"]
    ratio = lambda r: r["final"] / rule["final"] if rule["final"] else float("nan")  # noqa: E731
    lines = [
        f"# Learned-reward showcase ({m['date']}, {m['cpu']}, {m['cores']} cores)",
        "",
        f"`python benchmarks/rm_showcase.py --steps {report['steps']}`: **{report['seconds'] / 60:.1f} min in all**, "
        "the reward model's training included.",
        "",
        f"- Reward model: `grpo-ray rm {RM_RECIPE}`, {rm['steps']} steps of 32 preference pairs: held-out accuracy "
        f"{rm['val_start']:.3f} -> {rm['val_final']:.3f}, loss {rm['loss_start']:.3f} -> {rm['loss_final']:.3f} "
        f"({rm['seconds'] / 60:.1f} min).",
        f"- GRPO: `{RECIPE}`, {report['steps']} steps each, the same layout (`{' '.join(LAYOUT)}`): `rule` trains on "
        "the gsm8k reward; the others on the reward model's score alone, the gsm8k reward logged at weight 0: "
        "`learned` its sigmoid (`reward_model.sigmoid=true`) with mean-only group advantages "
        "(`algorithm.norm_adv_by_std=false`), `learned-raw` the raw score with the recipe's std-normalised ones, "
        "`learned-raw-mean` the raw score with mean-only ones.",
        f"- **The learned run's true pass@1 at the end is {ratio(learned):.2f}x the rule run's** (target: at least "
        f"0.8x); `learned-raw` {ratio(runs['learned-raw']):.2f}x, `learned-raw-mean` "
        f"{ratio(runs['learned-raw-mean']):.2f}x.",
        "",
        "| run | pass@1 at step 0 | at the end | true reward, first 10 steps -> last 10 | learned-true correlation "
        "(mean, min over steps) | step (s) | minutes |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report["runs"]:
        corr = f"{r['corr_mean']:.3f}, {r['corr_min']:.3f}" if r["corr_mean"] is not None else "(no reward model)"
        lines.append(
            f"| {r['name']} | {r['start']:.3f} | {r['final']:.3f} | {r['true_first10']:.3f} -> {r['true_last10']:.3f} "
            f"| {corr} | {r['step_s_last10']:.2f} | {r['seconds'] / 60:.1f} |"
        )
    lines += ["", *val_table(report["runs"]), "", "![curves](curves.png)"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=150, help="GRPO steps of each run")
    ap.add_argument("--test-freq", type=int, default=25)
    ap.add_argument("--out", default="benchmarks/results/rm-showcase")
    ap.add_argument("--work", default="runs/rm-showcase", help="runs and the fresh model cache go here")
    args = ap.parse_args()
    out, (work, env, common) = Path(args.out), fresh_work(args.work)
    start = time.perf_counter()

    t0 = time.perf_counter()
    cli("rm", ["rm", RM_RECIPE, *common, f"trainer.output_dir={work / 'rm'}"], work, env)
    rm_rows = rows_of(work / "rm" / "metrics.jsonl")
    val = [r for r in rm_rows if "val/rm/accuracy" in r]
    rm = {
        "steps": rm_rows[-1]["step"],
        "val_start": val[0]["val/rm/accuracy"],
        "val_final": val[-1]["val/rm/accuracy"],
        "loss_start": val[0]["val/rm/loss"],
        "loss_final": val[-1]["val/rm/loss"],
        "seconds": time.perf_counter() - t0,
    }

    runs = []
    where = [f"trainer.total_steps={args.steps}", f"trainer.test_freq={args.test_freq}", *LAYOUT]
    learned = [f"reward_model.model={work / 'rm' / 'model'}", "reward.functions=[{name: gsm8k, weight: 0.0}]"]
    mean_only = ["algorithm.norm_adv_by_std=false"]
    for name, overrides in {
        "rule": [],
        "learned": [*learned, "reward_model.sigmoid=true", *mean_only],
        "learned-raw": learned,
        "learned-raw-mean": [*learned, *mean_only],
    }.items():
        t0 = time.perf_counter()
        run_dir = work / name
        cli(name, ["train", RECIPE, *overrides, *common, *where, f"trainer.output_dir={run_dir}"], work, env)
        runs.append(summary(name, run_dir, time.perf_counter() - t0, overrides))
    seconds = time.perf_counter() - start

    out.mkdir(parents=True, exist_ok=True)
    for r in runs:
        shutil.copy(Path(r["dir"]) / "metrics.jsonl", out / f"{r['name']}.jsonl")
    shutil.copy(work / "rm" / "metrics.jsonl", out / "rm.jsonl")
    panels = [
        (KEY, "validation pass@1 (greedy, 256 held-out prompts)"),
        ("reward/gsm8k/mean", "true reward (gsm8k) of the training samples"),
        ("reward/reward_model/mean", "learned reward (as trained on) of the samples"),
        ("reward_model/true_corr", "learned-true correlation over a step's samples"),
    ]
    run_curves(runs, panels, out / "curves.png", "step", COLORS)
    report = {"machine": machine(), "steps": args.steps, "seconds": seconds, "rm": rm, "runs": runs}
    write_report(out, "rm-showcase", report, markdown(report))


if __name__ == "__main__":
    main()
