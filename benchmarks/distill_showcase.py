"""The on-policy distillation showcase, in one command: a teacher trained by GRPO, a smaller student warmed up by
SFT on the same data, then from that same start and budget three runs: distillation alone, GRPO alone, both.

    python benchmarks/distill_showcase.py --out benchmarks/results/distill-showcase

1. The teacher: ``recipes/tiny-cpu-reasoning.yaml`` (its SFT warm start trains first, in a fresh model cache under
   the work directory) for --teacher-steps GRPO steps, saved and exported (``grpo-ray export``).
2. The student: ``recipes/tiny-cpu-reasoning-sft.yaml`` on a smaller tiny Qwen2 (--student), the same SFT data,
   tokenizer and epochs.
3. From the student: ``recipes/tiny-cpu-reasoning.yaml`` with ``model.path`` the student, for --steps steps each:
   ``distill`` (``teacher.model`` the teacher, ``teacher.reward_weight=0``: the reward is scored and logged, not
   trained on), ``grpo`` (no teacher), ``distill+reward`` (``teacher.reward_weight=1``).

Writes each run's metrics (<name>.jsonl), curves.png and distill-showcase.md / .json.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench import fresh_work, machine, mean_of, rows_of, run_curves, run_summary, val_table, write_report  # noqa: E402

RECIPE = "recipes/tiny-cpu-reasoning.yaml"
SFT_RECIPE = "recipes/tiny-cpu-reasoning-sft.yaml"
STUDENT = "tiny://qwen2?layers=2&hidden=96&heads=3&kv_heads=1&intermediate=192&vocab=256&bytes=0&text=reasoning&seed=0"
KEY = "val/synthetic/reasoning/pass@1"
TEACHER_KEY = "teacher/" + KEY
COLORS = {"distill": "C0", "grpo": "C1", "distill+reward": "C2"}


def cli(name: str, args: list[str], work: Path, env: dict) -> str:
    """`python -m grpo_ray ARGS`, its output kept in <work>/<name>.log; stops the showcase if it fails."""
    start = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "grpo_ray", *args], cwd=ROOT, capture_output=True, text=True, env=env)
    (work / f"{name}.log").write_text(res.stdout + res.stderr)
    if res.returncode:
        raise SystemExit(f"{name}: exit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
    print(f"{name}: {time.perf_counter() - start:.0f}s", flush=True)
    return res.stdout


def summary(name: str, out: Path, seconds: float, overrides: list[str]) -> dict:
    run, rows = run_summary(name, out, seconds, overrides, KEY)
    train = [r for r in rows if r["step"] > 0 and "critic/score/mean" in r]
    return {
        **run,
        "best": max(run["val"].values()),
        "gain": run["final"] - run["start"],
        "score_last10": mean_of("critic/score/mean", train[-10:]),
        "reverse_kl_first10": mean_of("distill/reverse_kl", train[:10]),
        "reverse_kl_last10": mean_of("distill/reverse_kl", train[-10:]),
        "step_s_last10": mean_of("timing_s/step", train[-10:]),
        "teacher_s_last10": mean_of("timing_s/teacher", train[-10:]),
        "teacher_val": rows[0].get(TEACHER_KEY),  # the teacher pool's own greedy answers, before training
    }


def plot(runs: list[dict], teacher_val: float, out: Path) -> None:
    panels = [
        (KEY, "validation pass@1 (greedy, 256 held-out problems)"),
        ("critic/score/mean", "train score (the reward, T=0.7)"),
        ("distill/reverse_kl", "reverse KL to the teacher per token"),
    ]
    run_curves(runs, panels, out, "step", COLORS, (teacher_val, "teacher"))


def markdown(report: dict) -> str:
    m, runs, t = report["machine"], report["runs"], report["teacher"]
    lines = [
        f"# On-policy distillation showcase ({m['date']}, {m['cpu']}, {m['cores']} cores)",
        "",
        f"`python benchmarks/distill_showcase.py --steps {report['steps']} --teacher-steps {report['teacher_steps']}`: "
        f"**{report['seconds'] / 60:.1f} min in all**, both warm starts and the teacher's training included.",
        "",
        f"- Teacher: `{RECIPE}` ({t['parameters']:,} parameters) from its SFT warm start, {report['teacher_steps']} "
        f"GRPO steps: greedy pass@1 {t['start']:.3f} -> {t['final']:.3f} ({t['seconds'] / 60:.1f} min, warm start "
        "included).",
        "- The teacher's pass@1 as each distillation run measures it before training (`teacher/val/.../pass@1`: the "
        "teacher pool's greedy answers by transformers' generate, not an engine): "
        + ", ".join(f"{r['name']} {r['teacher_val']:.3f}" for r in runs if r["teacher_val"] is not None)
        + f", against {t['final']:.3f} from the engines at the end of the teacher's training; the dashed line.",
        f"- Student: `{SFT_RECIPE}` on `{report['student_name']}` ({report['student_parameters']:,} parameters), "
        f"the same SFT data and epochs: greedy pass@1 {report['student_sft_val']:.3f} after SFT "
        f"({report['student_sft_seconds'] / 60:.1f} min).",
        f"- From the student, {report['steps']} steps each of `{RECIPE}` (16 prompts x 16 samples, T=0.7, lr 1e-4): "
        "`distill` (`teacher.reward_weight=0`: the reward is scored and logged, not trained on), `grpo` (no "
        "teacher), `distill+reward` (`teacher.reward_weight=1`); `teacher.kl_coef=1` in both distillation runs.",
        "",
        "| run | pass@1 at step 0 | at the end | gain | best | train score (last 10 steps) | reverse KL, first "
        "10 -> last 10 steps | step (s) | teacher (s a step) | minutes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in runs:
        kl = f"{r['reverse_kl_first10']:.3f} -> {r['reverse_kl_last10']:.3f}" if r["name"] != "grpo" else "(no teacher)"
        lines.append(
            f"| {r['name']} | {r['start']:.3f} | {r['final']:.3f} | {r['gain']:+.3f} | {r['best']:.3f} | "
            f"{r['score_last10']:.3f} | {kl} | {r['step_s_last10']:.2f} | {r['teacher_s_last10']:.2f} | "
            f"{r['seconds'] / 60:.1f} |"
        )
    lines += ["", *val_table(runs)]
    lines += ["", "![curves](curves.png)"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60, help="steps of each student run")
    ap.add_argument("--teacher-steps", type=int, default=100)
    ap.add_argument("--test-freq", type=int, default=10)
    ap.add_argument("--student", default=STUDENT)
    ap.add_argument("--out", default="benchmarks/results/distill-showcase")
    ap.add_argument("--work", default="runs/distill-showcase", help="runs and the fresh model cache go here")
    args = ap.parse_args()
    out, (work, env, common) = Path(args.out), fresh_work(args.work)
    start = time.perf_counter()

    t0 = time.perf_counter()
    teacher_run = work / "teacher"
    n = args.teacher_steps
    teach = [f"trainer.output_dir={teacher_run}", f"trainer.total_steps={n}", f"trainer.save_freq={n}"]
    cli("teacher", ["train", RECIPE, *common, *teach, f"trainer.test_freq={n}"], work, env)
    teacher_model = work / "teacher-model"
    cli(
        "export",
        ["export", str(teacher_run / "checkpoints" / f"step_{args.teacher_steps}"), "--out", str(teacher_model)],
        work,
        env,
    )
    teacher = summary("teacher", teacher_run, time.perf_counter() - t0, [])

    t0 = time.perf_counter()
    student_run = work / "student-sft"
    cli(
        "student-sft",
        ["sft", SFT_RECIPE, f"model.path={args.student}", f"trainer.output_dir={student_run}"]
        + ["trainer.overwrite=true", "trainer.loggers=[jsonl]"],
        work,
        env,
    )
    student_sft_seconds = time.perf_counter() - t0
    student_sft_val = [r[KEY] for r in rows_of(student_run / "metrics.jsonl") if KEY in r][-1]
    student = student_run / "model"

    runs = []
    with_teacher = [f"teacher.model={teacher_model}", "teacher.num_cpus=0.25", "teacher.kl_coef=1.0"]
    for name, overrides in {
        "distill": [*with_teacher, "teacher.reward_weight=0"],
        "grpo": [],
        "distill+reward": [*with_teacher, "teacher.reward_weight=1"],
    }.items():
        t0 = time.perf_counter()
        run_dir = work / name
        where = [
            f"trainer.output_dir={run_dir}",
            f"trainer.total_steps={args.steps}",
            f"trainer.test_freq={args.test_freq}",
        ]
        cli(name, ["train", RECIPE, f"model.path={student}", *overrides, *common, *where], work, env)
        runs.append(summary(name, run_dir, time.perf_counter() - t0, overrides))
    seconds = time.perf_counter() - start

    from grpo_ray.models.dims import model_dims

    teacher["parameters"] = model_dims(str(teacher_model)).params
    out.mkdir(parents=True, exist_ok=True)
    for r in runs:
        shutil.copy(Path(r["dir"]) / "metrics.jsonl", out / f"{r['name']}.jsonl")
    shutil.copy(teacher_run / "metrics.jsonl", out / "teacher.jsonl")
    shutil.copy(student_run / "metrics.jsonl", out / "student-sft.jsonl")
    measured = [r["teacher_val"] for r in runs if r["teacher_val"] is not None]
    plot(runs, measured[0] if measured else teacher["final"], out / "curves.png")
    report = {
        "machine": machine(),
        "steps": args.steps,
        "teacher_steps": args.teacher_steps,
        "seconds": seconds,
        "teacher": teacher,
        "student_name": args.student,
        "student_parameters": model_dims(str(student)).params,
        "student_sft_val": student_sft_val,
        "student_sft_seconds": student_sft_seconds,
        "runs": runs,
    }
    write_report(out, "distill-showcase", report, markdown(report))


if __name__ == "__main__":
    main()
