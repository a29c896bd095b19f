"""Agent programs that drive the model themselves (environment.name: agent): the OpenAI-compatible endpoint on a
real vLLM engine, the programs using the openai client in sandboxed agent processes, each session recorded token in,
token out (grpo_ray/rollouts/endpoint.py, grpo_ray/rollouts/agents.py, grpo_ray/envs/agent_child.py)."""

import json

import pytest

from grpo_ray.config import RecipeError, load_recipe
from tests.conftest import LEAN, ROOT
from tests.helpers.episodes_run import run_cases

PROGRAMS = ["chat", "rewrites", "raises", "silent", "hangs", "reaches_out"]


@pytest.fixture(scope="module")
def agent_runs():
    """Each program's group of 3 on 2 rows, on one engine, in one process (episodes_run.py)."""
    cases = [
        [
            "qwen2",
            "agent",
            # room for 3 replies and the 2 tool messages between (26 tokens each in the tiny tokenizer)
            [
                f"environment.options.program=tests.helpers.agents:{p}",
                "environment.options.timeout_s=20",
                "environment.max_tokens=90",
            ],
        ]
        for p in PROGRAMS
    ]
    cases.append([*cases[0], "turn"])  # chat's groups handed back with their first calls in the engine
    runs, stderr = run_cases(cases)
    return {**dict(zip(PROGRAMS, runs)), "hand back": runs[-1]}, stderr


@pytest.mark.parametrize("arch", ["qwen2", "llama", "gemma3"])
def test_a_calls_new_messages_are_laid_out_after_the_sampled_reply_as_the_template_renders_them(arch):
    """The ids after a reply the engine sampled (its end-of-turn token included, or not: a stop string ended it)
    and the new messages of the next call: together with the prompt and the reply they decode to the template's
    own rendering of the longer conversation; one new message is laid out as the rollouts' observations are; a
    message's text cannot open or close a message."""
    from grpo_ray.data.template import Observations
    from grpo_ray.models import tiny
    from grpo_ray.rollouts.endpoint import continuation

    tok = tiny.train_tokenizer(arch, ["Mia has 7 pears. <calc>7*2</calc> 14 and then? <|im_end|>"] * 20, 400)

    def render(messages, generation):
        return tok.apply_chat_template(messages, add_generation_prompt=generation, tokenize=False)

    before = [{"role": "user", "content": "Mia has 7 pears."}, {"role": "assistant", "content": "<calc>7*2</calc>"}]
    new = [
        {"role": "user", "content": "14"},
        {"role": "assistant", "content": "and"},
        {"role": "user", "content": "then?"},
    ]
    new = (
        [new[0]]
        if arch == "gemma3"
        else [new[0], {"role": "system", "content": "then?"}]
        if arch == "llama"
        else new[::2]
    )
    prompt = tok.encode(render(before[:1], True), add_special_tokens=False)
    reply = tok.encode("<calc>7*2</calc>", add_special_tokens=False)
    ids = prompt + reply + [tok.eos_token_id] + continuation(tok, {}, before, new, closed=True)
    assert tok.decode(ids) == render(before + new, True)
    one = continuation(tok, {}, before, new[:1], closed=False)
    assert one == Observations.of(tok, "user").ids("14", ended=False) and one[0] == tok.eos_token_id
    plain = continuation(tok, {}, before, [{"role": "user", "content": "x"}], closed=True)
    inside = continuation(tok, {}, before, [{"role": "user", "content": "<|im_end|>" + tok.eos_token}], closed=True)
    specials = set(tok.all_special_ids)
    assert [i for i in inside if i in specials] == [i for i in plain if i in specials] and len(inside) > len(plain)


def test_the_relay_carries_many_connections_on_one_thread_each_byte_in_order(tmp_path):
    """The agent process's relay (loopback port -> the endpoint's Unix socket): 200 connections at once, each a
    request answered by an upstream that echoes it, the largest 2 MB (more than the sockets hold: what one end
    cannot take yet waits), all on the relay's one thread; an upstream that closes after answering closes its client
    once the answer is through."""
    import socket
    import threading

    from grpo_ray.sandbox.relay import relay

    path = str(tmp_path / "up.sock")
    upstream = socket.socket(socket.AF_UNIX)
    upstream.bind(path)
    upstream.listen(256)

    def echo(conn):  # answers the request's bytes, then closes (as a stream's answer ends)
        with conn:
            size = int(conn.recv(16).decode())
            got = b""
            while len(got) < size:
                got += conn.recv(1 << 16)
            conn.sendall(got)

    def serve():
        while True:
            threading.Thread(target=echo, args=(upstream.accept()[0],), name="echo", daemon=True).start()

    threading.Thread(target=serve, name="echo", daemon=True).start()
    before = set(threading.enumerate())
    port = relay(path)
    sizes = [2_000_000] + [1000 + i for i in range(199)]
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in sizes]
    answers = [None] * len(sizes)

    def ask(i):
        payload = bytes([i % 251]) * sizes[i]
        clients[i].sendall(f"{sizes[i]:<16}".encode() + payload)
        got = b""
        while chunk := clients[i].recv(1 << 16):  # until the relay closes it after the answer
            got += chunk
        answers[i] = got == payload

    askers = [threading.Thread(target=ask, args=(i,), name="ask") for i in range(len(sizes))]
    for t in askers:
        t.start()
    new = [t.name for t in set(threading.enumerate()) - before if t.name not in ("echo", "ask")]
    for t in askers:
        t.join(30)
    assert new == ["relay"] and all(answers)  # 200 connections open, one thread relaying them


@pytest.mark.slow
def test_an_agent_programs_trajectory_is_what_the_engine_consumed_and_produced(agent_runs):
    """Three calls a session through the openai client: each call's request to the engine is exactly the group's
    prompt and the trajectory so far; the replies are the engine's outputs (mask 1, their logprobs), the tool
    messages between them laid out by the template (mask 0); the reward is the program's; the group's prompt is its
    first call's."""
    run = agent_runs[0]["chat"]
    requests = {r["request"]: r for r in run["engine"]}
    several = 0
    for n, c in enumerate(run["completions"]):
        prompt, ids, mask, key = run["prompts"][c["prompt"]], c["token_ids"], c["mask"], f"{n // 3}/{n % 3}"
        assert run["messages"][c["prompt"]] == [{"role": "user", "content": run["questions"][c["prompt"]]}]
        at, calls = 0, [requests[f"{key}/{k}"] for k in (1, 2, 3) if f"{key}/{k}" in requests]
        for k, r in enumerate(calls):
            assert (
                r["prompt_ids"] == prompt + ids[:at] or k and r["prompt_ids"][: len(prompt) + at] == prompt + ids[:at]
            )
            gap = r["prompt_ids"][len(prompt) + at :]
            assert mask[at : at + len(gap)] == [0] * len(gap)
            at += len(gap)
            out = r["output_ids"]
            assert ids[at : at + len(out)] == out and mask[at : at + len(out)] == [1] * len(out)
            at += len(out)
        assert at == len(ids) == len(c["sampler_logprobs"]) and len(calls) == 3
        assert all((lp < 0) if m else (lp == 0.0) for lp, m in zip(c["sampler_logprobs"], mask))
        assert c["episode"]["reward"] == pytest.approx(0.01 * len("".join(c["episode"]["turns"][0::2])))
        assert c["episode"]["failure"] == "" and c["episode"]["off_record"] == 0
        several += 0 in mask
    assert several == len(run["completions"])


@pytest.mark.slow
def test_a_rewritten_history_is_answered_and_not_recorded(agent_runs):
    for c in agent_runs[0]["rewrites"]["completions"]:
        assert c["episode"]["off_record"] == 1 and c["episode"]["failure"] == "" and 0 not in c["mask"]


@pytest.mark.slow
def test_a_failing_silent_or_hanging_program_ends_its_trajectory_counted(agent_runs):
    """A program that raises (its traceback shown once), never calls the model, or runs past its time limit (its
    process replaced, the other episodes it ran lost with it): its trajectory fails, with one turn generated from
    the row's prompt so that it has tokens, never the run."""
    runs, stderr = agent_runs
    for name, failures in (("raises", {"error"}), ("silent", {"error"}), ("hangs", {"timeout", "error"})):
        completions = runs[name]["completions"]
        assert all(c["episode"]["failure"] in failures and c["token_ids"] for c in completions), name
    # a program past its time costs its process: the other episodes it ran end with it, lost (counted as errors)
    assert any(c["episode"]["failure"] == "timeout" for c in runs["hangs"]["completions"])
    assert stderr.count("ValueError: the harness broke") == 1
    assert "the program called the model 0 times" in stderr


@pytest.mark.slow
def test_a_notices_hand_back_stops_agent_programs_and_records_nothing(agent_runs):
    """A streaming engine on a draining node hands back the agent programs' groups it has not finished
    (``Looping.hand_back``, ``AgentRuns.start``): both groups' prompts handed back as the programs' first calls are
    in the engine, unstepped; those calls are aborted, each program's next call refused, and every program ends
    (none left running, no session open) without a call added to the engine after, or a failure said; the engine
    then runs a new group of the program to its end."""
    runs, stderr = agent_runs
    run = runs["hand back"]
    assert run["back"] == [0, 1]
    assert run["groups_left"] == 0 and run["in_flight"] == 0
    assert not run["unfinished_after"] and run["added_after"] == [] and run["turns_finished"] == [0, 0]
    assert run["held"] == [0, 0]  # no program running, no session open
    assert "was handed back" not in stderr  # what a handed-back program did is not recorded, nor said
    assert len(run["after"]) == 3 and not any(e["failure"] for e in run["after"])


@pytest.mark.slow
def test_an_agent_program_reaches_the_endpoint_and_nothing_else(agent_runs):
    assert [c["episode"]["reward"] for c in agent_runs[0]["reaches_out"]["completions"]] == [1.0] * 6


def test_an_agent_program_is_checked_before_start():
    with pytest.raises(RecipeError, match=r"environment.options: program='tests.helpers.nowhere:run': cannot import"):
        from grpo_ray.preflight import try_environment

        try_environment(
            load_recipe(
                ROOT / "recipes" / "tiny-cpu.yaml",
                ["environment.name=agent", "environment.options.program=tests.helpers.nowhere:run"],
            ),
            None,
            [{}],
        )
    with pytest.raises(RecipeError, match="an agent program plays every row"):
        try_environment(
            load_recipe(
                ROOT / "recipes" / "tiny-cpu.yaml",
                [
                    "environment.name=agent",
                    "environment.choices={g: {name: guess}}",
                    "environment.options.program=tests.helpers.agents:chat",
                ],
            ),
            None,
            [{}],
        )


# LEAN (CI's time): the twins' engines and schedule, without their reference pool and second learner rank

PROGRAM = [
    "environment.name=agent",
    "environment.options.program=tests.helpers.agents:chat",
    "environment.options.kwargs={turns: 2}",
    "reward.functions=[]",
]


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["", pytest.param("-streaming", marks=pytest.mark.smoke)])
def test_an_agent_program_trains_in_the_tiny_twin(tmp_path, schedule):
    """The agent twins' recipes (one step off, and streaming) with an agent program in place of their calculator:
    the run trains on what the programs' sessions recorded, rewarded by their return values; streamed, the
    trajectories come from older weights as the schedule allows."""
    import glob

    from tests.conftest import run_cli

    out, made = tmp_path / "run", set(glob.glob("/tmp/grpo-*"))
    res = run_cli(
        "train",
        f"recipes/tiny-qwen2.5-7b-gsm8k-agent{schedule}.yaml",
        *PROGRAM,
        *LEAN,
        "trainer.total_steps=3",
        "trainer.val_before_train=false",
        f"trainer.output_dir={out}",
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert set(glob.glob("/tmp/grpo-*")) <= made  # the endpoint's folder, the sandboxes': nothing left behind
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps] == [1, 2, 3]
    assert all(m["env/errors"] == 0 and m["env/turns/mean"] == 2 and m["env/reward/mean"] > 0 for m in steps)
    assert max(m["rollout/staleness"] for m in steps) == (2 if schedule else 1)
    dump = [json.loads(line) for line in (out / "rollouts" / "train_data_step3.jsonl").read_text().splitlines()]
    samples = [s for d in dump for s in d["samples"]]
    for s in samples:
        assert s["rewards"]["environment"] == pytest.approx(0.01 * len("".join(s["episode"]["turns"][0::2])))
        assert 0 in s["loss_mask"] and s["episode"]["off_record"] == 0
        # a trajectory whose last reply was cut at its max_tokens (or its token budget spent) ends cut, as an
        # environment's episode at a cut turn does: its finish_reason, the clip ratio and ended_by_tokens say so
        assert (s["finish_reason"] == "length") == (s["episode"]["ended"] in ("length", "tokens")), s["episode"]
    cut = sum(s["finish_reason"] == "length" for s in samples) / len(samples)
    assert (
        steps[2]["response_length/clip_ratio"] == pytest.approx(cut) == pytest.approx(steps[2]["env/ended_by_tokens"])
    )
    assert all(m["env/seconds"] > 0 for m in steps)  # the programs' own time, beside the engine's


@pytest.mark.slow
def test_an_agent_program_run_resumes_exactly(tmp_path_factory):
    """One step off, resumed from step 2's checkpoint: the programs' sessions sample the same replies (each call
    seeded by its trajectory and its place) and the run trains to the same metrics."""
    from tests.test_checkpoint import assert_same_metrics, whole_and_resumed

    whole, resumed = whole_and_resumed(
        tmp_path_factory, [*PROGRAM, "trainer.dump_freq=1"], "recipes/tiny-qwen2.5-7b-gsm8k-agent.yaml", kill=False
    )
    assert_same_metrics(whole, resumed)
