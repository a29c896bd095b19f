"""model.shared_prompt: auto against the faster of its two layouts, over step shapes drawn at random.

    python benchmarks/layout_auto.py [--shapes 24] [--seed 0] [--reps 2] [--out benchmarks/results/layout-auto]

For each shape (a model, prompts x group samples, a prompt length and a range of response lengths; random tokens,
seeded) one process times the update's work (forward, response logprobs, backward) plus the reference's forward
over every micro batch, packed and with shared prompts (``benchmarks/layout.py``'s ``measure``, median of `reps`
after a warm-up, fp32, 2 threads), and counts each layout's token slots and model calls (``layout_work``). The first
half of the shapes fits ``SHARED_SLOT_COST`` and ``FORWARD_COST`` (a grid: the pair with which auto loses the least
time on them). The second half, held out, is judged with those constants: which layout auto picks, and how much
slower it is than the faster one (its regret).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODELS = {  # the tiny CPU recipe's model and the peer benchmark's
    "0.4M": "tiny://qwen2?layers=2&hidden=128&heads=4&kv_heads=2&intermediate=256&vocab=128&bytes=0&seed=0",
    "14.3M": "tiny://qwen2?layers=6&hidden=512&heads=8&kv_heads=4&intermediate=1024&vocab=384&seed=0",
}


def draw(rng: random.Random) -> dict:
    """A step shape: model, prompts, group, prompt length, response lengths, micro batch size."""
    low = rng.choice([1, 8, 32, 64])
    return {
        "model": rng.choice(list(MODELS)),
        "prompts": rng.choice([2, 4]),
        "group": rng.choice([4, 8, 16]),
        "prompt_len": rng.choice([16, 32, 64, 128, 256]),
        "response": [low, low * rng.choice([1, 2, 4])],
        "micro": rng.choice([2, 4, 8]),
    }


def measure_shape(shape: dict, models: dict, reps: int) -> dict:
    from benchmarks.layout import measure
    from grpo_ray.algo.batching import layout_work

    model = models[shape["model"]]
    rng = random.Random(str(shape))
    vocab = model.config.vocab_size
    pairs = []
    for _ in range(shape["prompts"]):
        prompt = [rng.randrange(3, vocab) for _ in range(shape["prompt_len"])]
        pairs += [
            (prompt, [rng.randrange(3, vocab) for _ in range(rng.randint(*shape["response"]))])
            for _ in range(shape["group"])
        ]
    plain, shared = layout_work(pairs, shape["micro"], True)
    out = {"prompt_share": sum(len(p) for p, _ in pairs) / sum(len(p) + len(r) for p, r in pairs)}
    out["slots"] = {"packed": plain.slots, "shared": shared.slots}
    out["forwards"] = {"packed": plain.forwards, "shared": shared.forwards}
    for name, on in (("packed", False), ("shared", True)):
        r = measure(model, pairs, shape["micro"], True, on, reps)
        out[name + "_s"] = r["update_s"] + r["reference_s"]
    return out


def picks_shared(row: dict, slot_cost: float, forward_cost: float) -> bool:
    """``shared_pays`` with these constants on a measured shape."""
    from grpo_ray.algo.batching import LayoutWork, shared_pays

    with constants(slot_cost, forward_cost):
        return shared_pays(*(LayoutWork(row["slots"][k], row["forwards"][k]) for k in ("packed", "shared")))


@contextlib.contextmanager
def constants(slot_cost: float, forward_cost: float):
    from grpo_ray.algo import batching

    kept = batching.SHARED_SLOT_COST, batching.FORWARD_COST
    batching.SHARED_SLOT_COST, batching.FORWARD_COST = slot_cost, forward_cost
    try:
        yield
    finally:
        batching.SHARED_SLOT_COST, batching.FORWARD_COST = kept


def regret(row: dict, slot_cost: float, forward_cost: float) -> float:
    """How much slower the layout auto picks with these constants is than the faster one (0: it picked that)."""
    picked = row["shared_s"] if picks_shared(row, slot_cost, forward_cost) else row["packed_s"]
    return picked / min(row["shared_s"], row["packed_s"]) - 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/layout-auto")
    ap.add_argument(
        "--render", action="store_true", help="write the Markdown again from --out's JSON, measuring nothing"
    )
    args = ap.parse_args()
    from benchmarks.bench import machine, write_report

    if args.render:
        report = json.loads((Path(args.out) / "layout-auto.json").read_text())
        write_report(args.out, "layout-auto", report, markdown(report))
        return
    import torch

    from grpo_ray.models import load_causal_lm, resolve

    torch.set_num_threads(2)
    models = {name: load_causal_lm(resolve(path), torch.float32) for name, path in MODELS.items()}
    rng = random.Random(args.seed)
    rows = []
    for _ in range(args.shapes):
        shape = draw(rng)
        rows.append({**shape, **measure_shape(shape, models, args.reps)})
        print(rows[-1], flush=True)
    fit, held = rows[: len(rows) // 2], rows[len(rows) // 2 :]
    grid = [(round(0.8 + 0.05 * i, 2), 16 * j) for i in range(25) for j in range(17)]  # 0.8-2.0, 0-256 slots
    # the least time lost on the fitting shapes; among ties, the constants nearest to "slots alone" (1, 0)
    cost = min(grid, key=lambda c: (round(sum(regret(r, *c) for r in fit), 4), abs(c[0] - 1) + c[1] / 256))
    report = {"machine": machine(), "args": vars(args), "cost": cost, "fit": fit, "held_out": held}
    write_report(args.out, "layout-auto", report, markdown(report))


def markdown(report: dict) -> str:
    m, args, cost, fit, held = (report[k] for k in ("machine", "args", "cost", "fit", "held_out"))
    lines = [
        "# model.shared_prompt: auto against the faster layout",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB; torch {m['torch']}; {m['date']}. "
        f"`python benchmarks/layout_auto.py --shapes {args['shapes']} --seed {args['seed']} --reps {args['reps']}`: "
        "fp32, 2 threads; seconds of the update (forward, backward) and the reference's forward of one step's "
        "samples, median of the reps after a warm-up, each layout in the same process.",
        "",
        f"Fitted on the first {len(fit)} shapes: a shared slot costs **{cost[0]}** packed ones (`SHARED_SLOT_COST`), "
        f"a model call **{cost[1]}** (`FORWARD_COST`). Held out:",
        "",
        "| model | prompts x group | prompt | response | micro | prompt share | slots packed / shared | "
        "forwards packed / shared | packed (s) | shared (s) | auto picks | slower than the best by |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in held:
        pick = "shared" if picks_shared(r, *cost) else "packed"
        lines.append(
            f"| {r['model']} | {r['prompts']} x {r['group']} | {r['prompt_len']} | {r['response'][0]}-{r['response'][1]} "
            f"| {r['micro']} | {r['prompt_share']:.0%} | {r['slots']['packed']} / {r['slots']['shared']} | "
            f"{r['forwards']['packed']} / {r['forwards']['shared']} | {r['packed_s']:.3f} | {r['shared_s']:.3f} | "
            f"{pick} | {regret(r, *cost):.1%} |"
        )

    def lost(rows: list, c) -> str:
        r = [regret(x, *c) for x in rows]
        return f"{sum(r) / len(r):.1%} on average (worst {max(r):.1%})"

    fixed = {
        k: sum(r[k + "_s"] for r in held) / sum(min(r["packed_s"], r["shared_s"]) for r in held) - 1
        for k in ("packed", "shared")
    }
    lines += [
        "",
        f"Auto, held out: {lost(held, cost)} slower than the faster layout; on the fitting shapes "
        f"{lost(fit, cost)}. Token slots alone (cost 1, no per-call cost) would lose {lost(held, (1.0, 0))} held out, "
        f"{lost(fit, (1.0, 0))} on the fitting shapes. Always packed takes {fixed['packed']:.1%} longer in total "
        f"than the faster layout held out, always shared {fixed['shared']:.1%}.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
