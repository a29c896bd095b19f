"""Run multi-turn rollouts (grpo_ray.rollouts.episodes) on tiny models' vLLM engines, without Ray, and print one
JSON line per case: each trajectory as trained (ids, mask, logprobs, episode) and what the engine consumed and produced
per turn.

Run as a script (vLLM's engine start needs the __main__ guard): ``episodes_run.py CASES`` with CASES a JSON list
of [arch, environment, [key=value ...]]; one engine per arch. The end-of-turn token gets a logit bias: random
weights rarely end a turn otherwise (unless environment.stop is set: stop strings end turns then).
"""

import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def run_cases(cases: list, path: tuple[str, ...] = ()) -> tuple[list[dict], str]:
    """Run this script on `cases` in a process of its own (`path` put first on its PYTHONPATH): each case's result,
    and the process's stderr (what the runs said)."""
    import os
    import subprocess

    from tests.conftest import engine_env

    env = engine_env()
    env["PYTHONPATH"] = os.pathsep.join([*path, os.environ.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, __file__, json.dumps(cases)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600
    )
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, out.stderr[-3000:]
    return json.loads(line[7:]), out.stderr


if __name__ == "__main__":
    import vllm

    from grpo_ray import models
    from grpo_ray.config import load_recipe
    from grpo_ray.rollouts.episodes import Episodes
    from grpo_ray.types import Prompt

    QUESTIONS = [("Mia has 7 pears. How many pears?", "7"), ("Tom has 3 figs. How many figs?", "3")]
    out, engines, params = [], {}, vllm.SamplingParams
    for arch, env, overrides in json.loads(sys.argv[1]):
        recipe = load_recipe(
            ROOT / "recipes" / "tiny-cpu.yaml",
            [
                f"model.path=tiny://{arch}?layers=1&hidden=64&heads=2&kv_heads=1&intermediate=128&vocab=400&seed=0",
                f"environment.name={env}",
                "environment.max_turns=3",
                "environment.max_tokens=64",
                "generator.sampling.max_tokens=8",
                *overrides,
            ],
        )
        path = models.resolve(recipe.model.path)
        tok = models.load_tokenizer(path, recipe.model)
        if arch not in engines:
            engines[arch] = vllm.LLM(
                model=path,
                dtype="float32",
                enforce_eager=True,
                seed=0,
                max_model_len=128,
                kv_cache_memory_bytes=1 << 24,
                enable_chunked_prefill=False,
            )
        llm = engines[arch]
        llm.llm_engine.set_weight_version("0")  # as a generator labels its weights
        turns, step = [], type(llm.llm_engine).step

        def recording_step(engine, step=step, turns=turns):
            outs = step(engine)
            turns.extend(
                {"request": o.request_id, "prompt_ids": o.prompt_token_ids, "output_ids": list(o.outputs[0].token_ids)}
                for o in outs
                if o.finished
            )
            return outs

        llm.llm_engine.step = recording_step.__get__(llm.llm_engine)
        bias = {} if recipe.environment.stop else {tok.eos_token_id: 4.0}  # stop strings end turns by themselves
        vllm.SamplingParams = lambda **kw: params(**{**kw, "logit_bias": {**(kw.get("logit_bias") or {}), **bias}})  # noqa: B023
        env_first = env.endswith(("Opening", "Drifting"))  # rows of instructions: the opening is the task
        chats = [
            [{"role": "system", "content": "Play."}] if env_first else [{"role": "user", "content": q}]
            for q, _ in QUESTIONS
        ]
        texts = [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in chats]
        prompts = [
            Prompt(tok.encode(t, add_special_tokens=False), truth, "synthetic/select", {"seed": i}, i, t, m)
            for i, ((_, truth), t, m) in enumerate(zip(QUESTIONS, texts, chats))
        ]
        if recipe.environment.choices:  # the second row chooses the first of them
            prompts[1].env_choice = next(iter(recipe.environment.choices))
        episodes = Episodes(engines[arch], recipe, [str(ROOT)])
        completions = episodes.run(prompts, 3, [11, 12], recipe.generator.sampling)
        episodes.close()
        out.append(
            {
                "arch": arch,
                "env": env,
                "overrides": overrides,
                "prompts": [p.ids for p in prompts],
                "messages": [p.messages for p in prompts],
                "questions": [q for q, _ in QUESTIONS],
                "completions": [dataclasses.asdict(c) for c in completions],
                "engine": turns,
                "observation_ids": {k: episodes.observations.ids(f"turn {k}") for k in (1, 2)},
                "eos_id": tok.eos_token_id,
            }
        )
    print("RESULT " + json.dumps(out))
