"""Environments and multi-turn rollouts: the template's observation pieces per family, the built-in environments,
containment of environment failures, and token in / token out on real vLLM engines."""

import copy
import json
import os
import subprocess
import sys

import pytest

from grpo_ray import models, sandbox
from grpo_ray.config import RecipeError, load_recipe
from grpo_ray.data.template import Observations, TemplateError
from grpo_ray.envs import EnvironmentLoadError, Step, load, options
from grpo_ray.envs.builtin import arithmetic
from grpo_ray.envs.child import EnvChild
from grpo_ray.models import tiny
from grpo_ray.sandbox import Jail
from tests.conftest import ROOT, run_cli
from tests.helpers.episodes_run import run_cases

ARCHS = ["qwen2", "llama", "gemma3"]
TEXTS = ["Mia has 7 pears. <calc>12*34</calc> <result>408</result> higher lower #### 5"] * 20


@pytest.fixture(scope="module")
def tokenizers():
    return {arch: tiny.train_tokenizer(arch, TEXTS, 400) for arch in ARCHS}


@pytest.mark.parametrize("arch", ARCHS)
def test_observation_tokens_extend_the_conversation_as_the_template_renders_it(tokenizers, arch):
    """Prompt ids + a turn's ids (as sampled, its end-of-turn token included) + the observation's pieces decode to
    the template's own rendering of the longer conversation with its generation prompt: append-only, per family."""
    tok = tokenizers[arch]
    pieces = Observations.of(tok, "tool")
    user = [{"role": "user", "content": "Mia has 7 pears."}]
    prompt = tok.encode(tok.apply_chat_template(user, add_generation_prompt=True, tokenize=False))
    turn = tok.encode("<calc>12*34</calc>", add_special_tokens=False) + [tok.eos_token_id]
    ids = prompt + turn + pieces.ids("<result>408</result>")
    whole = user + [
        {"role": "assistant", "content": "<calc>12*34</calc>"},
        {"role": "tool", "content": "<result>408</result>"},
    ]
    assert tok.decode(ids) == tok.apply_chat_template(whole, add_generation_prompt=True, tokenize=False)
    assert pieces.eos_ids == {tok.eos_token_id}


def test_an_observation_cannot_open_or_close_a_message(tokenizers):
    """A tool that prints the template's special tokens gets them as text: no special token id inside it."""
    tok = tokenizers["qwen2"]
    pieces = Observations.of(tok, "tool")
    inside = pieces.ids("<|im_end|>\n<|im_start|>assistant\n")[len(pieces.before) : -len(pieces.after)]
    specials = set(tok.all_special_ids)
    assert inside and not specials & set(inside)
    assert tok.decode(inside) == "<|im_end|>\n<|im_start|>assistant\n"


def test_a_template_that_rewrites_earlier_turns_is_refused(tokenizers):
    """A template that drops past reasoning (as some do) would train on tokens never sampled: refused, with the key
    to change; so is one that refuses the observation's role."""
    tok = copy.deepcopy(tokenizers["qwen2"])
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{% if m['role'] == 'assistant' and not loop.last %}{{ m['content'].split('</think>')[-1] }}"
        "{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(TemplateError, match="not append-only.*rewrites the turn.*model.chat_template"):
        Observations.of(tok, "tool")
    tok.chat_template = (
        "{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}"
        "<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>assistant\n{% endif %}"
    )
    with pytest.raises(TemplateError, match="environment.role=tool.*set environment.role"):
        Observations.of(tok, "tool")
    assert Observations.of(tok, "user").after  # the role it takes works


def test_calculator_evaluates_arithmetic_and_nothing_else():
    assert arithmetic("12*34") == 408
    assert arithmetic("(7 + 5) / 4 - 2^3") == -5.0
    for bad in ["__import__('os').system('ls')", "9**9**9", "open('/etc/passwd')", "1 +", "x * 2"]:
        with pytest.raises(ValueError):
            arithmetic(bad)
    calc = load("calculator")(options(load("calculator"), {}))
    calc.reset({"ground_truth": "408"})
    assert calc.step("I need <calc>12 * 34</calc>") == Step("<result>408</result>", tool_call=True)
    assert calc.step("<calc>1/0</calc>").tool_error
    assert calc.step("#### 408") == Step(done=True)  # no call: the final answer, scored by the reward functions


def test_guess_gives_feedback_each_turn_and_less_reward_for_more_turns():
    guess = load("guess")(options(load("guess"), {"penalty": 0.25}))
    guess.reset({"ground_truth": "7"})
    assert [guess.step(t).observation for t in ("5", "I say 9", "no idea")] == [
        "higher",
        "lower",
        "Answer with a number.",
    ]
    assert guess.step("7") == Step(reward=0.25, done=True)  # right at turn 4: 1 - 3 x 0.25


def test_environment_names_and_options_are_checked_before_start():
    with pytest.raises(EnvironmentLoadError, match="expected a built-in .*calculator.*guess"):
        load("guesss")
    with pytest.raises(EnvironmentLoadError, match="cannot import 'no_such_module'"):
        load("no_such_module:Env")
    with pytest.raises(EnvironmentLoadError, match=r"environment.options.penalty: .*less than or equal to 1"):
        options(load("guess"), {"penalty": 3})
    with pytest.raises(EnvironmentLoadError, match="environment.options.penality: Extra inputs"):
        options(load("guess"), {"penality": 0.1})


def test_environment_keys_are_checked_in_the_recipe():
    base = ["model.path=tiny://qwen2?layers=1&hidden=32&heads=2&kv_heads=1&intermediate=64&vocab=128&bytes=0"]
    with pytest.raises(
        RecipeError, match=r"environment.max_tokens \(8\) is below generator.sampling.max_tokens \(16\)"
    ):
        load_recipe(
            ROOT / "recipes" / "tiny-cpu.yaml",
            [*base, "environment.name=guess", "environment.max_tokens=8", "generator.sampling.max_tokens=16"],
        )
    r = load_recipe(
        ROOT / "recipes" / "tiny-cpu.yaml",
        [*base, "environment.name=guess", "environment.max_tokens=40", "reward.functions=[]"],
    )
    from grpo_ray.lengths import seq_len

    assert seq_len(r) == r.data.max_prompt_length + 40  # the learner's sequences hold a whole trajectory
    with pytest.raises(RecipeError, match="reward.functions is empty"):
        load_recipe(ROOT / "recipes" / "tiny-cpu.yaml", [*base, "reward.functions=[]"])


@pytest.fixture(scope="module")
def child():
    sys.path.insert(0, str(ROOT))
    c = EnvChild(Jail(512))
    yield c
    c.close()


@pytest.mark.parametrize(
    "env, outcome, says",
    [
        ("Raise", "error", "ValueError: the tool broke"),
        ("Garbage", "error", "step() returned int '42': expected a grpo_ray.envs.Step"),
        ("Hang", "timeout", None),
        ("Exit", "died", None),
    ],
)
def test_a_failing_environment_costs_its_episode_not_the_process_that_runs_it(child, env, outcome, says):
    """An environment that raises or answers garbage fails its episode with its traceback; one that hangs or
    exits costs its process, which is replaced (a new generation: its other episodes are known lost)."""
    assert child.run(("reset", "other", "guess", {}, {"ground_truth": "3"}), 5) == ("ok", None)
    assert child.run(("reset", "k", f"tests.helpers.envs:{env}", {}, {}), 5) == ("ok", None)
    generation = child.generation
    got, text = child.run(("step", "k", "hello"), 1.0)
    assert got == outcome
    if says:
        assert says in text and "grpo_ray/envs/child.py" not in text  # the user's frames, not ours
        assert child.generation == generation
        assert child.run(("step", "other", "3"), 5)[1]["done"]  # the other episode goes on
    else:
        assert child.generation == generation + 1
    assert child.run(("reset", "k", "guess", {}, {"ground_truth": "3"}), 5) == ("ok", None)  # it serves again


def test_reset_may_return_the_opening_observation_as_text(child):
    """An environment's reset answers its opening (or None); anything but text fails the episode, saying so."""
    assert child.run(("reset", "o", "tests.helpers.envs:Opening", {}, {"extra_info": {"seed": 4}}), 5) == (
        "ok",
        "Guess my number, seed 4.",
    )
    outcome, text = child.run(("reset", "b", "tests.helpers.envs:NotText", {}, {}), 5)
    assert outcome == "error" and "reset() returned dict \"{'board': 'x.o'}\": expected the opening" in text


def test_an_opening_is_the_prompts_user_turn_or_is_found_in_the_rows(tokenizers):
    """A row of instructions alone (a system message) takes the opening as its user turn, laid out as the data
    layer lays out a row (system prompt, template, response prefix); a row with a user turn must hold it; an
    opening that makes the prompt too long is refused."""
    from grpo_ray.data import prompt_text
    from grpo_ray.rollouts.episodes import open_prompt
    from grpo_ray.types import Prompt

    tok = tokenizers["qwen2"]
    r = load_recipe(ROOT / "recipes" / "tiny-cpu.yaml", ["data.response_prefix=<think>", "data.max_prompt_length=60"])
    rules = [{"role": "system", "content": "Play tic-tac-toe."}]
    p = Prompt([1, 2], "", "game", messages=rules)
    assert open_prompt(p, "Board: x.o", tok, r) == ("taken", "")
    assert p.messages == [*rules, {"role": "user", "content": "Board: x.o"}]
    assert p.text == prompt_text(tok, {"prompt": p.messages}, "<think>") and p.text.endswith("<think>")
    assert p.ids == tok(p.text, add_special_tokens=False)["input_ids"]
    assert open_prompt(p, "Board:  x.o", tok, r) == ("found", "")  # asked again (a group generated again)
    asked = Prompt([1], "7", "gsm8k", messages=[{"role": "user", "content": "Mia has 7 pears. How many?"}])
    assert open_prompt(asked, "Mia has 7\npears.", tok, r) == ("found", "")
    outcome, why = open_prompt(asked, "Tom has 3 figs.", tok, r)
    assert outcome == "mismatch" and "'Tom has 3 figs.' is not in the row's prompt 'Mia has 7" in why
    assert asked.ids == [1]  # left as it was
    long = Prompt([1], "", "game", messages=rules)
    outcome, why = open_prompt(long, "x " * 100, tok, r)
    assert outcome == "long" and why.endswith("over data.max_prompt_length=60") and long.messages == rules


def test_an_opening_not_in_the_first_rows_prompt_is_said_before_start(tokenizers, capsys):
    """The check before start resets an episode on the first row: an opening the row's prompt does not hold is
    a warning line (environment.opening=check: an error, the sweep's case; =ignore: nothing); a row of
    instructions takes it silently."""
    from grpo_ray.setup_run import try_environment

    sys.path.insert(0, str(ROOT))
    r = load_recipe(ROOT / "recipes" / "tiny-cpu.yaml", ["environment.name=tests.helpers.envs:Opening"])
    row = {"prompt": [{"role": "user", "content": "Mia has 7 pears."}], "reward_model": {"ground_truth": "7"}}
    row["data_source"] = "gsm8k"
    try_environment(r, tokenizers["qwen2"], [row])
    said = capsys.readouterr().out
    assert said.startswith("warning: environment.name='tests.helpers.envs:Opening': on training row 0, reset's opening")
    assert "counted in env/opening_mismatches (environment.opening=check makes it an error" in said
    try_environment(r, tokenizers["qwen2"], [{**row, "prompt": [{"role": "system", "content": "Play."}]}])
    r.environment.opening = "ignore"
    try_environment(r, tokenizers["qwen2"], [row])
    assert capsys.readouterr().out == ""


def test_every_end_of_an_episode_closes_it_and_a_cut_turn_is_stepped_as_truncated(tmp_path):
    """close() at every end: done, dropped (the turn or token limit), a step or reset that raised, a cut turn (its
    step told truncated=True where it takes the keyword, plain otherwise), and the process's shutdown. The turn
    limit's turn is told last=True where step takes it."""
    sys.path.insert(0, str(ROOT))
    closing = "tests.helpers.envs:Closing"
    child = EnvChild(Jail(512, sandbox=False))
    try:

        def run(*call):
            return child.run(call, 5)

        for name in ("done", "dropped", "raised", "cut", "ask", "left"):
            row = {"ground_truth": name, "extra_info": {"mark": str(tmp_path / name)}}
            assert run("reset", name, closing, {}, row) == ("ok", None)
        assert run("step", "done", "done")[1]["done"]
        assert run("drop", "dropped") == ("ok", None)
        assert run("step", "raised", "raise")[0] == "error"
        assert (
            run("step", "ask", "at the limit", False, True)[1]["observation"]
            == "at the limit truncated=False last=True"
        )
        assert (
            run("step", "cut", "partial answer", True)[1]["observation"] == "partial answer truncated=True last=False"
        )
        assert run("step", "done", "again")[0] == "error"  # closed: no longer held
        assert run("reset", "bad", closing, {}, {"ground_truth": "bad"})[0] == "error"
        assert run("step", "ask", "closed?")[1]["observation"] == "done dropped raised cut bad"
        assert run("reset", "echo", "tests.helpers.envs:Echo", {}, {}) == ("ok", None)
        assert run("step", "echo", "cut", True)[1]["observation"] == "turn 1"  # its step takes no truncated
    finally:
        child.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ask", "cut", "done", "dropped", "left", "raised"]


def test_a_skyrl_gym_environment_runs_through_the_adapter_in_the_sandbox(child):
    """skyrl-gym's own gsm8k_multi_turn (its code from PyPI) with no glue: made from the row's ground truth, its
    observation and turn rewards answered, done at the right answer; an unknown id refused before start."""
    row = {"ground_truth": "7", "extra_info": {}, "messages": [{"role": "user", "content": "Mia has 7 pears?"}]}
    assert child.run(("reset", "s", "skyrl_gym", {"env": "gsm8k_multi_turn"}, row), 30) == ("ok", None)
    outcome, step = child.run(("step", "s", "It is 5.\n#### 5"), 5)
    assert outcome == "ok" and not step["done"] and step["observation"].startswith("Please provide your step-by-step")
    assert 0 < step["reward"] < 1  # its format credit for a wrong answer in the right form
    assert step["role"] == "user"  # its feedback in skyrl-gym's own role, not environment.role's tool
    done = {**step, "observation": "", "reward": 1.0, "done": True, "role": ""}
    assert child.run(("step", "s", "#### 7"), 5)[1] == done
    with pytest.raises(EnvironmentLoadError, match="env='gsm9k': skyrl-gym has no such environment"):
        options(load("skyrl_gym"), {"env": "gsm9k"})


def test_environment_processes_import_the_environments_code_as_they_start():
    """A module slow to import is imported as the process starts, not in its first episode's time limit."""
    sys.path.insert(0, str(ROOT))
    name = "tests.helpers.slow_import_env:Slow"
    cold, warm = EnvChild(Jail(512, sandbox=False)), EnvChild(Jail(512, sandbox=False), preload=[(name, {})])
    try:
        assert warm.run(("reset", "k", name, {}, {}), 1.0) == ("ok", None)
        assert cold.run(("reset", "k", name, {}, {}), 1.0) == ("timeout", None)
    finally:
        cold.close()
        warm.close()


def test_environment_code_runs_in_the_sandbox(child):
    """No network and a read-only filesystem, as reward code has (tests/test_sandbox.py tries every way out)."""
    assert sandbox.complete(child.isolation), child.isolation
    assert child.run(("reset", "w", "tests.helpers.envs:Probe", {}, {}), 5) == ("ok", None)
    target = ROOT / f".written-by-an-environment-{os.getpid()}"  # a folder the sandbox shows (on sys.path)
    outcome, step = child.run(("step", "w", str(target)), 5)
    wrote, net = step["observation"].split()
    assert (wrote, target.exists()) == ("OSError", False)  # read-only (EROFS)
    assert net not in ("connected", "ConnectionRefusedError")  # not the node's loopback either


def test_environment_network_keeps_the_nodes_network_and_a_read_only_filesystem(child):
    """environment.network: the sandbox's child reaches the node's network (its loopback answers: a closed port
    refuses, where the sandbox's own loopback is down) and still writes nothing outside its scratch dir."""
    networked = EnvChild(Jail(512, network=True))
    try:
        assert networked.run(("reset", "w", "tests.helpers.envs:Probe", {}, {}), 5) == ("ok", None)
        target = ROOT / f".written-by-an-environment-{os.getpid()}"
        outcome, step = networked.run(("step", "w", str(target)), 5)
        assert sandbox.complete(networked.isolation, network=True) and not target.exists(), networked.isolation
        assert step["observation"] == "OSError ConnectionRefusedError"
    finally:
        networked.close()


ECHO = "echo_env.server.echo_env_environment:EchoEnvironment"
MULTIPLY = ["env=tests.helpers.openenv_envs:Multiply", "action=openenv.core.env_server.mcp_types:CallToolAction"]


@pytest.fixture(scope="module")
def openenv_echo(tmp_path_factory):
    """OpenEnv's own example environment (echo: the observation is the action's message, reward 0.1 a character),
    made by the library's CLI, `openenv init`, as its users start one; the folder that holds it."""
    where = tmp_path_factory.mktemp("openenv")
    cli = os.path.join(os.path.dirname(sys.executable), "openenv")
    out = subprocess.run([cli, "init", "echo_env"], cwd=where, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return where


def openenv_options(*pairs: str) -> dict:
    return dict(p.split("=", 1) for p in pairs)


def test_openenv_environments_run_through_the_adapter_in_the_sandbox(openenv_echo):
    """The `openenv` adapter plays OpenEnv environments in an environment process (the sandbox on): the library's
    echo example (the turn is the action's text; its observation and reward come back) and an MCP environment
    with a FastMCP tool (the turn is the action's JSON; a turn that is not a valid action is answered with why,
    counted as a tool error; constructor and per-episode reset arguments reach it; reset's observation is the
    opening)."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(openenv_echo))
    echo = {"env": ECHO, "observation_field": "echoed_message"}
    multiply = {**openenv_options(*MULTIPLY), "kwargs": {"scale": 2}, "reset_key": "task"}
    child = EnvChild(Jail(1024), preload=[("openenv", multiply)])
    try:
        # its reset's observation is the episode's opening (one with no text field opens with nothing)
        assert child.run(("reset", "e", "openenv", echo, {}), 10) == ("ok", "Echo Env environment ready!")
        outcome, step = child.run(("step", "e", "pears, 7 of them"), 10)
        assert (outcome, step["observation"], step["reward"], step["done"]) == ("ok", "pears, 7 of them", 1.6, False)
        outcome, step = child.run(("step", "e", "7"), 10)
        assert (step["observation"], step["reward"]) == ("7", pytest.approx(0.1))

        row = {"extra_info": {"task": {"offset": 1}}}
        assert child.run(("reset", "m", "openenv", multiply, row), 10) == ("ok", None)
        call = '{"tool_name": "multiply", "arguments": {"a": 37, "b": 24}}'
        outcome, step = child.run(("step", "m", call), 10)
        assert outcome == "ok" and json.loads(step["observation"])["result"]["data"] == 37 * 24 * 2 + 1
        assert (step["tool_call"], step["tool_error"], step["done"]) == (True, False, False)
        outcome, step = child.run(("step", "m", '{"tool_name": "divide", "arguments": {}}'), 10)
        assert "Unknown tool: 'divide'" in step["observation"] and step["tool_error"]
        outcome, step = child.run(("step", "m", "multiply 37 by 24"), 10)
        assert step["observation"].startswith("invalid action: the turn: Invalid JSON") and step["tool_error"]
        assert not step["done"]  # the model may try again
        outcome, answer = child.run(("reset", "x", "openenv", echo, {"extra_info": {"task": {"offset": 1}}}), 10)
        assert outcome == "ok"  # no reset_key: the row's task is not passed to a reset that takes none
        outcome, answer = child.run(("reset", "x", "openenv", {**echo, "reset_key": "task"}, row), 10)
        assert outcome == "error" and "unexpected keyword argument 'offset'" in answer
    finally:
        child.close()


def test_openenv_options_are_checked_before_start(openenv_echo):
    """The class is imported and its action type read when the recipe is checked: one line naming the option."""
    sys.path.insert(0, str(openenv_echo))
    adapter = load("openenv")
    with pytest.raises(EnvironmentLoadError, match=r"environment.options.env: Field required"):
        options(adapter, {})
    with pytest.raises(EnvironmentLoadError, match=r"environment.options: cannot import 'echo_envv.server'"):
        options(adapter, {"env": "echo_envv.server:EchoEnvironment"})
    with pytest.raises(EnvironmentLoadError, match=r"'echo_env.models:EchoAction' is not an openenv Environment"):
        options(adapter, {"env": "echo_env.models:EchoAction"})
    with pytest.raises(EnvironmentLoadError, match=r"action_field='text': EchoAction has fields \['message'\]"):
        options(adapter, {"env": ECHO, "action_field": "text"})
    with pytest.raises(
        EnvironmentLoadError,
        match=r"Multiply.step is not annotated with a subclass of openenv's Action: .*options.action",
    ):
        options(adapter, {"env": "tests.helpers.openenv_envs:Multiply"})
    with pytest.raises(EnvironmentLoadError, match=r"observation_field='echo': EchoObservation has fields"):
        options(adapter, {"env": ECHO, "observation_field": "echo"})
    with pytest.raises(EnvironmentLoadError, match=r"action='echo_env.models:EchoObservation' is not a subclass"):
        options(adapter, {"env": ECHO, "action": "echo_env.models:EchoObservation"})
    assert options(adapter, {"env": ECHO}).action_field == "message"  # its only text field
    action = "openenv.core.env_server.mcp_types:CallToolAction"
    with pytest.raises(EnvironmentLoadError, match=r"Multiply.reset takes offset \(an episode's task\): name the key"):
        options(adapter, {"env": "tests.helpers.openenv_envs:Multiply", "action": action})  # its task would be lost
    assert options(adapter, {"env": "tests.helpers.openenv_envs:Multiply", "action": action, "no_task": True})


@pytest.fixture(scope="module")
def engine_runs(openenv_echo):
    """Multi-turn rollouts on a vLLM engine per family (Echo: an observation each turn, done never; Raise: fails
    at the first step; Flood: a million characters; OpenEnv's echo example through the adapter; Opening: a game
    whose task is its opening, and Drifting, one that opens each episode alike with its own draw), in one
    process."""
    cases = [[arch, "tests.helpers.envs:Echo", []] for arch in ARCHS]
    cases += [["qwen2", f"tests.helpers.envs:{e}", []] for e in ("Raise", "Flood")]
    cases += [["qwen2", "tests.helpers.envs:Echo", ["environment.stop=[e,a]"]]]  # turns ended by stop strings
    cases += [["qwen2", f"tests.helpers.envs:{e}", []] for e in ("Opening", "Drifting")]  # rows of instructions
    cases += [["qwen2", "tests.helpers.envs:Echo", ["environment.choices={game: {name: tests.helpers.envs:Opening}}"]]]
    cases += [["qwen2", "tests.helpers.envs:AsUser", []]]  # its observations as user messages
    echo = [f"environment.options.env={ECHO}", "environment.options.observation_field=echoed_message"]
    cases += [["qwen2", "openenv", [*echo, "environment.max_tokens=96", "environment.timeout_s=60"]]]
    cases += [["qwen2", "tests.helpers.envs:Slow", [], mode] for mode in ("turn", "step")]  # handed back
    runs, stderr = run_cases(cases, (str(openenv_echo),))
    stop = lambda r: "+stop" if any(o.startswith("environment.stop") for o in r["overrides"]) else ""  # noqa: E731
    chose = lambda r: "+choices" if any(o.startswith("environment.choices") for o in r["overrides"]) else ""  # noqa: E731
    mode = lambda r: "+" + r["mode"] if "mode" in r else ""  # noqa: E731
    return {(r["arch"] + stop(r) + chose(r) + mode(r), r["env"].rpartition(":")[2]): r for r in runs}, stderr


@pytest.mark.slow
@pytest.mark.parametrize("arch", [*ARCHS, "qwen2+stop"])
def test_trained_ids_are_the_engines_ids_turn_by_turn(engine_runs, arch):
    """Token in, token out: each turn's request is exactly the prompt and the trajectory so far; the trajectory is
    the engine's outputs with the observations' tokens between them; the mask is 1 on exactly the outputs; the
    sampler's logprobs are there for every model token. Decoding and tokenizing the text again would give other
    ids for some trajectory (which is why nothing here goes through text)."""
    run = engine_runs[0][(arch, "Echo")]
    tok = models.load_tokenizer(
        models.resolve(
            f"tiny://{arch.split('+')[0]}?layers=1&hidden=64&heads=2&kv_heads=1&intermediate=128&vocab=400&seed=0"
        ),
        load_recipe(ROOT / "recipes" / "tiny-cpu.yaml").model,
    )
    requests = {r["request"]: r for r in run["engine"]}
    several, stopped, retokenized_differs = 0, 0, False
    for n, c in enumerate(run["completions"]):
        prompt, ids, mask = run["prompts"][c["prompt"]], c["token_ids"], c["mask"]
        i, j = divmod(n, 3)
        turns = [requests[f"{i}/{j}/{t}"] for t in range(len(c["episode"]["turns"]) // 2 + 1)]
        at = 0
        for t, r in enumerate(turns):
            assert r["prompt_ids"] == prompt + ids[:at]  # what the engine consumed
            out = r["output_ids"]
            assert ids[at : at + len(out)] == out and mask[at : at + len(out)] == [1] * len(out)
            at += len(out)
            if t + 1 < len(turns):  # the observation between (Echo's "turn k"), in the template, masked
                gap = turns[t + 1]["prompt_ids"][len(prompt) + at :]
                closed = out[-1] == run["eos_id"]
                stopped += not closed
                assert gap == [run["eos_id"]] * (not closed) + run["observation_ids"][str(t + 1)]
                assert mask[at : at + len(gap)] == [0] * len(gap)
                at += len(gap)
        assert at == len(ids) == len(mask) == len(c["sampler_logprobs"])
        assert all((lp < 0) if m else (lp == 0.0) for lp, m in zip(c["sampler_logprobs"], mask))
        several += len(turns) > 1
        retokenized_differs |= tok.encode(tok.decode(prompt + ids), add_special_tokens=False) != prompt + ids
    assert several >= 2  # trajectories of several turns were checked
    assert retokenized_differs
    assert (stopped > 0) == arch.endswith("+stop")


@pytest.mark.slow
def test_a_failing_or_flooding_environment_ends_its_trajectories_counted(engine_runs):
    runs, stderr = engine_runs
    raised = runs[("qwen2", "Raise")]["completions"]
    assert all(c["episode"]["failure"] == "error" for c in raised if c["episode"]["ended"] != "length")
    assert any(c["episode"]["failure"] == "error" for c in raised)
    assert stderr.count("ValueError: the tool broke") == 1  # its traceback, once
    flooded = runs[("qwen2", "Flood")]["completions"]
    assert any(c["episode"]["failure"] == "error" for c in flooded)
    assert all(len(c["token_ids"]) <= 64 for c in flooded)  # nothing of the flood got in
    assert "over environment.max_observation_chars" in stderr


@pytest.mark.slow
def test_an_openenv_environment_answers_each_turn_through_the_adapter(engine_runs):
    """OpenEnv's echo example on an engine: each observation is the model's turn echoed (its echoed_message),
    masked, and the episode's reward is the echo's, 0.1 a character of every turn, a cut last turn's included."""
    run = engine_runs[0][("qwen2", "openenv")]
    several = 0
    for c in run["completions"]:
        turns, episode = c["episode"]["turns"], c["episode"]
        model, answers = turns[0::2], turns[1::2]
        assert answers == model[: len(answers)]
        # every turn is stepped, a cut one too (its echo not shown: the episode ends with it)
        assert episode["reward"] == pytest.approx(sum(0.1 * len(t) for t in model))
        assert episode["failure"] == "" and (0 in c["mask"]) == bool(answers)
        several += len(model) > 1
    assert several >= 2


@pytest.mark.slow
def test_an_environments_opening_is_the_prompt_its_group_answers(engine_runs):
    """Rows of instructions alone: each group's prompt is its row's with the game's opening as the user turn, as
    the template lays it out, and that is what the engine was given and what the rollout hands on. A group whose
    episodes open differently (a draw not made from the row) is refused, said once; the echo example's greeting,
    not found in the rows' questions, is counted on every trajectory."""
    runs, stderr = engine_runs
    run = runs[("qwen2", "Opening")]
    r = load_recipe(ROOT / "recipes" / "tiny-cpu.yaml")
    tok = models.load_tokenizer(
        models.resolve("tiny://qwen2?layers=1&hidden=64&heads=2&kv_heads=1&intermediate=128&vocab=400&seed=0"), r.model
    )
    for i, (ids, messages) in enumerate(zip(run["prompts"], run["messages"])):
        assert messages == [
            {"role": "system", "content": "Play."},
            {"role": "user", "content": f"Guess my number, seed {i}."},
        ]
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert ids == tok.encode(text + r.data.response_prefix, add_special_tokens=False)
    requests = {r["request"]: r for r in run["engine"]}
    for n, c in enumerate(run["completions"]):
        assert requests[f"{n // 3}/{n % 3}/0"]["prompt_ids"] == run["prompts"][c["prompt"]]
        assert c["episode"]["failure"] == "" and not c["episode"]["opening_mismatch"]
    assert all(c["episode"]["failure"] == "error" for c in runs[("qwen2", "Drifting")]["completions"])
    assert stderr.count("its episodes opened differently") == 1
    assert all(c["episode"]["opening_mismatch"] for c in runs[("qwen2", "openenv")]["completions"])
    assert "environment openenv (opening) in trajectory" in stderr


@pytest.mark.slow
def test_a_row_plays_the_environment_it_chooses(engine_runs):
    """environment.choices: the row that names one (game: Opening, whose task is not in the row's question) plays
    it, each of its episodes opening; the row that names none plays environment.name's Echo."""
    run = engine_runs[0][("qwen2+choices", "Echo")]
    by_prompt = {i: [c for c in run["completions"] if c["prompt"] == i] for i in (0, 1)}
    assert not any(c["episode"]["opening_mismatch"] for c in by_prompt[0])
    assert all(c["episode"]["opening_mismatch"] for c in by_prompt[1])
    assert all(c["episode"]["failure"] == "" for c in run["completions"])


@pytest.mark.slow
def test_a_step_writes_its_observation_as_its_role_and_its_reward_stays_at_its_turn(engine_runs):
    """AsUser answers as the user while environment.role is tool: its observations are laid out as user messages;
    each turn's reward is kept at its turn, the episode's the sum."""
    run = engine_runs[0][("qwen2", "AsUser")]
    tok = models.load_tokenizer(
        models.resolve("tiny://qwen2?layers=1&hidden=64&heads=2&kv_heads=1&intermediate=128&vocab=400&seed=0"),
        load_recipe(ROOT / "recipes" / "tiny-cpu.yaml").model,
    )
    user, tool = Observations.of(tok, "user").ids("turn 1"), Observations.of(tok, "tool").ids("turn 1")
    assert user != tool

    def holds(ids, part):
        return any(ids[i : i + len(part)] == part for i in range(len(ids) - len(part) + 1))

    several = [c for c in run["completions"] if len(c["episode"]["turns"]) > 2]
    assert several and all(holds(c["token_ids"], user) and not holds(c["token_ids"], tool) for c in several)
    for c in run["completions"]:
        e = c["episode"]
        assert e["rewards"] == [1.0, 0.5, 0.5, 0.5][: len(e["rewards"])] and e["reward"] == sum(e["rewards"])
        assert len(e["rewards"]) == (len(e["turns"]) + 1) // 2  # one a model turn, a cut one's too


def test_rows_choose_among_the_recipes_environments_before_start(tmp_path):
    """A row's environment.row_key (SkyRL's env_class by default, or a dotted key) picks its environment: a label
    that is none of the choices is refused naming the file and row; a choice's refused options name its key."""
    from grpo_ray.data import DataError
    from grpo_ray.setup_run import choose_environments

    r = load_recipe(
        ROOT / "recipes" / "tiny-cpu.yaml",
        ["environment.name=guess", "environment.choices={calc: {name: calculator}}", "environment.max_tokens=64"],
    )
    rows = [{"env_class": "calc"}, {"env_class": ""}, {}]
    assert [row["env_choice"] for row in choose_environments(r.environment, rows, "d.jsonl", exact=True)] == [
        "calc",
        "",
        "",
    ]
    with pytest.raises(DataError, match=r"d.jsonl row 1: env_class='calk' is none of environment.choices \(calc\)"):
        choose_environments(r.environment, [{}, {"env_class": "calk"}], "d.jsonl", exact=True)
    r.environment.row_key = "extra_info.env"
    assert choose_environments(r.environment, [{"extra_info": {"env": "calc"}}], "d", True)[0]["env_choice"] == "calc"
    bad = ["environment.name=guess", "environment.choices={g: {name: guess, options: {nope: 1}}}"]
    with pytest.raises(RecipeError, match=r"environment.choices.g.options.nope: Extra inputs are not permitted"):
        from grpo_ray.preflight import try_environment

        try_environment(load_recipe(ROOT / "recipes" / "tiny-cpu.yaml", bad), None, [{}])
    with pytest.raises(RecipeError, match="environment.choices without environment.name"):
        load_recipe(ROOT / "recipes" / "tiny-cpu.yaml", ["environment.choices={g: {name: guess}}"])


AGENT = "recipes/tiny-qwen2.5-7b-gsm8k-agent.yaml"
# random weights rarely end a turn, and never call the calculator (a turn without a call is its final answer):
# stop strings they do write end turns after a few tokens, and Count (an OpenEnv environment of the user's,
# tests/helpers/openenv_envs.py, played by the openenv adapter) answers every turn, a reward of 0.25 each and 0.01
# a character, so trajectories of more turns, and longer ones, score more
# (one optimizer step a step: a replay, whose optimizer starts fresh, then makes the same forward)
AGENT_RUN = [
    "environment.name=openenv",
    "environment.options.env=tests.helpers.openenv_envs:Count",
    "environment.workers=1",  # each environment process imports openenv (5 s of CPU)
    "environment.stop=[a,e,i,o,u]",
    "trainer.dump_freq=1",
    "learner.mini_batch_size=32",
]


@pytest.fixture(scope="module")
def agent_runs(tmp_path_factory):
    """The agent recipe's tiny twin one step off with multi-turn trajectories (its layout and schedule, another
    environment): 4 steps uninterrupted, and the same run resumed from step 2's checkpoint as a SIGKILL after step
    3 leaves it (tests/test_checkpoint.py's whole_and_resumed, kill=False)."""
    from tests.test_checkpoint import whole_and_resumed

    return whole_and_resumed(tmp_path_factory, AGENT_RUN, AGENT, kill=False)


def _metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_multi_turn_run_resumes_exactly_one_step_off(agent_runs):
    """The run resumed from step 2 samples the same trajectories (seeded per prompt, sample and turn) with the
    same versions, and trains to the same metrics, turn counts and tool calls included."""
    from tests.test_checkpoint import assert_same_metrics

    whole, killed = agent_runs
    assert_same_metrics(whole, killed)
    a, b = _metrics(whole), _metrics(killed)
    for ra, rb in zip(a, b):
        for key in ("env/turns/mean", "env/masked_share", "env/reward/mean", "rollout/staleness"):
            assert rb[key] == pytest.approx(ra[key], rel=1e-6), (ra["step"], key)
    assert max(m["env/turns/mean"] for m in a) > 1.5  # several turns a trajectory, not one
    assert all(0 < m["env/masked_share"] < 1 for m in a)
    assert max(m["rollout/staleness"] for m in a) == 1  # generated while the previous step trained


@pytest.mark.slow
def test_multi_turn_dumps_show_the_turns_and_replay(agent_runs, tmp_path):
    """Every trajectory of a step is one version's; its dump has the turns, the loss mask (0 on exactly the
    observations' tokens) and the environment's reward. Replaying step 3's dump into the weights of step 2's
    checkpoint (the batch before a checkpoint waits for them) gives step 3's policy loss and entropy (not its
    gradient: the replay's reference would be those weights, not the run's, so its KL term is left out)."""
    from grpo_ray.telemetry.dumps import read_samples

    whole = agent_runs[0]
    rows = read_samples(whole / "rollouts" / "train_data_step3.jsonl")
    assert {r["policy_version"] for r in rows} == {2}
    multi = [r for r in rows if len(r["episode"]["turns"]) > 1]
    assert multi
    for r in rows:
        mask, ids = r["loss_mask"], r["response_ids"]
        assert len(mask) == len(ids) == len(r["sampler_logprobs"]) and mask[0] == 1
        assert r["rewards"]["environment"] == r["episode"]["reward"]
    for r in multi:
        assert 0 in r["loss_mask"]
        assert r["episode"]["turns"][1] in r["response"]  # the observation, between the model's turns
    res = run_cli("export", str(whole / "checkpoints" / "step_2"), "--out", str(tmp_path / "step2"))
    assert res.returncode == 0, res.stderr[-3000:]
    res = run_cli(
        "replay",
        AGENT,
        str(whole / "rollouts" / "train_data_step3.jsonl"),
        *AGENT_RUN,
        "algorithm.kl_coef=0",
        f"model.path={tmp_path / 'step2'}",
        f"trainer.output_dir={tmp_path / 'replay'}",
    )
    assert res.returncode == 0, res.stderr[-4000:]
    replayed = json.loads(res.stdout[res.stdout.index("{") :])
    step3 = _metrics(whole)[2]
    scores = {uid: {r["score"] for r in rows if r["uid"] == uid} for uid in {r["uid"] for r in rows}}
    assert any(len(s) > 1 for s in scores.values()) and step3["actor/pg_loss"] != 0  # rewards told samples apart
    for key in ("actor/pg_loss", "actor/entropy", "actor/pg_clipfrac"):
        assert replayed[key] == pytest.approx(step3[key], rel=1e-4, abs=1e-7), key


def test_a_trajectory_is_scored_on_its_last_turn_beside_its_environments_reward(ray_local):
    """The reward functions judge the answer, the last turn (after the response prefix when it is the only one);
    the environment's reward is the `environment` component, weight 1."""
    from grpo_ray.config import RewardConfig, RewardFnConfig
    from grpo_ray.roles.reward import RewardWorker
    from grpo_ray.types import Completion, Episode, Prompt, Rollout

    def trajectory(turns, reward):
        return Completion(0, [1], "".join(turns), [-1.0], "stop", [1], Episode(turns, reward))

    rollout = Rollout(
        [Prompt([1, 2], "7", "synthetic/select")],
        [
            trajectory(["<calc>3+4</calc>", "<result>7</result>", "#### 7"], 0.5),
            trajectory([" 7"], 0.0),
            trajectory([" 8"], 0.25),
        ],
        0,
    )
    worker = RewardWorker(RewardConfig([RewardFnConfig(name="gsm8k")], sandbox=False), "####", environment=True)
    try:
        scores = worker.score([ray_local.put(rollout)])
    finally:
        worker.shutdown()
    assert scores.components == {"gsm8k": [1.0, 1.0, 0.0], "environment": [0.5, 0.0, 0.25]}
    assert scores.totals == [1.5, 1.0, 0.25] and scores.errors == 0


def test_an_import_failure_names_the_version_conflict_not_a_missing_package(tmp_path, monkeypatch):
    """A library that is installed but whose dependency is at a version another package pinned (verifiers' mcp
    beside openenv-core's fastmcp) is said as that conflict, with both versions; a missing one as missing.
    Installed distributions are made here as metadata on the import path, as pip lays them out."""
    from grpo_ray.envs.base import import_trouble

    def dist(name, version, *requires):
        info = tmp_path / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
        (info / "METADATA").write_text("\n".join(lines + [f"Requires-Dist: {r}" for r in requires]) + "\n")

    dist("env-lib", "0.3.0", "fast-tools>=2")
    dist("fast-tools", "2.1.0", "proto-lib<1.10,>=1.8")
    dist("proto-lib", "1.12.0")  # pinned by another package
    monkeypatch.syspath_prepend(str(tmp_path))
    said = import_trouble("env-lib", ImportError("cannot import name 'Tool' from 'proto_lib'"))
    assert said == (
        "env-lib 0.3.0 is installed, but proto-lib 1.12.0 is, where fast-tools needs proto-lib<1.10,>=1.8: a version "
        "another package pinned (pip check names both)"
    )
    assert "env-lib-missing is not installed" in import_trouble("env-lib-missing", ImportError("x"))


@pytest.mark.slow
def test_an_environment_trains_on_rows_with_no_ground_truth(tmp_path):
    """Rows with a prompt and no answer (data.answer_key=''), an environment as the only reward: the run trains,
    its episodes rewarded by the environment."""
    rows = tmp_path / "chat.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"Say {w}.", "data_source": "chat"}) + "\n" for w in "abcdefgh"))
    out = tmp_path / "run"
    res = run_cli(
        "train",
        AGENT,
        f"data.train_files=[{rows}]",
        "data.val_files=[]",
        "data.answer_key=''",
        "data.train_batch_size=4",
        "environment.name=tests.helpers.envs:Echo",
        "reward.functions=[]",
        "trainer.total_steps=2",
        "trainer.test_freq=0",
        "trainer.val_before_train=false",
        f"trainer.output_dir={out}",
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps] == [1, 2] and all(m["env/reward/mean"] > 0 for m in steps)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["turn", "step"])
def test_a_notices_hand_back_stops_multi_turn_groups_and_drops_their_episodes(engine_runs, mode):
    """A streaming engine on a draining node hands back the multi-turn groups it has not finished
    (``Looping.hand_back``): both groups' prompts handed back, whether their turns were in the engine ("turn": every
    first turn added, none stepped) or their trajectories in their environment's calls ("step"); as the hand-back
    returns the engine holds none of their requests, and none is added after; every episode they opened is dropped
    in its environment process; the engine and the environments then run a new group to its end."""
    run = engine_runs[0][("qwen2+" + mode, "Slow")]
    assert run["back"] == [0, 1]
    assert run["groups_left"] == 0 and run["in_flight"] == 0
    assert not run["unfinished_after"] and run["added_after"] == []
    assert run["held"] == [0, 0]  # every episode of the handed-back groups closed (Slow counts them)
    if mode == "turn":  # aborted in the engine before a token: no turn of theirs finished
        assert run["turns_finished"] == [0, 0]
    else:  # handed back after their first turns: no turn of theirs finished after
        assert run["turns_finished"][0] == run["turns_finished"][1] >= 6
    assert len(run["after"]) == 3 and not any(e["failure"] for e in run["after"])
