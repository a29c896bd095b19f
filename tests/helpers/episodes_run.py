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


def hand_back(llm, episodes, recipe, prompts, turns: list, mode: str) -> dict:
    """Both rows' groups of 3 sent to a streaming engine's driver (``Looping``) and handed back, as a preemption
    notice has them: "turn", with every first turn in the engine and none stepped (the engine's step held, the
    loop's calls let through; an agent program's: its first call); "step", once every first turn has been answered
    (each trajectory then in its environment's 0.5 s call: tests.helpers.envs:Slow). Then a group of row 0 run on
    the same engine."""
    import threading
    import time

    from grpo_ray.roles.drivers import Looping

    engine, hold = llm.llm_engine, threading.Event()
    added, add, step = [], engine.add_request, engine.step

    def recording_add(rid, *args, **kwargs):
        added.append((rid, time.monotonic()))
        return add(rid, *args, **kwargs)

    def holding_step():
        while hold.is_set():
            if driver.loop.calls or driver.loop.adds:  # the loop runs its calls and adds its requests, unstepped
                return []
            time.sleep(0.001)
        return step()

    engine.add_request, engine.step = recording_add, holding_step
    driver = Looping(llm, 0)
    start = lambda p, n, seed, loop: episodes.start(p, n, seed, recipe.generator.sampling, loop)  # noqa: E731
    if mode == "turn":
        hold.set()
    driver.submit(prompts, 3, [11, 12], start)
    while (len(added) if mode == "turn" else len(turns)) < 6:
        time.sleep(0.001)
    asked = time.monotonic()
    back = driver.hand_back()
    handed, unfinished, finished = time.monotonic(), engine.has_unfinished_requests(), len(turns)
    ours = lambda rid: rid.split("/")[0] in ("0", "1")  # noqa: E731 (the handed-back groups' requests)
    hold.clear()

    def held() -> list[int]:  # the episodes each environment process holds; an agent's: programs, sessions open
        if episodes.agents:
            return [sum(len(c.pending) for c in episodes.agents.children), len(episodes.agents.endpoint.sessions)]
        counts = []
        for child in episodes.children:
            child.run(("reset", "probe", "tests.helpers.envs:Slow", {}, {}), 10)
            counts.append(int(child.run(("step", "probe", "held?"), 10)[1]["observation"]) - 1)
            child.run(("drop", "probe"), 10)
        return counts

    while any(held()) and time.monotonic() < handed + 20:
        time.sleep(0.1)
    after = episodes.run(prompts[:1], 3, [13], recipe.generator.sampling, loop=driver.loop)
    driver.loop.stop()
    engine.add_request, engine.step = add, step
    return {
        "mode": mode,
        "back": back,
        "hand_back_s": handed - asked,
        "unfinished_after": unfinished,
        "turns_finished": [finished, len([t for t in turns if ours(t["request"])])],
        "added_after": [rid for rid, at in added if at > handed and ours(rid)],
        "in_flight": driver.loop.in_flight(),
        "groups_left": len(driver.groups),
        "held": held(),
        "after": [dataclasses.asdict(c)["episode"] for c in after],
    }


if __name__ == "__main__":
    import vllm

    from grpo_ray import models
    from grpo_ray.config import load_recipe
    from grpo_ray.rollouts.episodes import Episodes
    from grpo_ray.types import Prompt

    QUESTIONS = [("Mia has 7 pears. How many pears?", "7"), ("Tom has 3 figs. How many figs?", "3")]
    out, engines, params = [], {}, vllm.SamplingParams
    for arch, env, overrides, *mode in json.loads(sys.argv[1]):
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
        if mode:  # a notice's hand-back (a 4th item: its mode)
            out.append(
                {
                    "arch": arch,
                    "env": env,
                    "overrides": overrides,
                    **hand_back(llm, episodes, recipe, prompts, turns, *mode),
                }
            )
            episodes.close()
            continue
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
