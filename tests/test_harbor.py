"""Harbor tasks with no glue and no container runtime: ``harbor://`` rows from task directories in Harbor's format
(tests/helpers/harbor_tasks: instruction.md, task.toml, environment/Dockerfile, tests/test.sh), and episodes in the
sandboxed environment process, each turn's commands in the task's /app, the task's own tests scoring the end."""

import json
from pathlib import Path

import pytest

from grpo_ray.data import DataError, load_rows
from grpo_ray.envs.child import EnvChild
from grpo_ray.integrations.harbor import SYSTEM
from grpo_ray.sandbox import Jail
from grpo_ray.telemetry.dumps import read_samples
from tests.conftest import ROOT, run_cli

TASKS = ROOT / "tests" / "helpers" / "harbor_tasks"


@pytest.fixture(scope="module")
def child():
    c = EnvChild(Jail(512))
    yield c
    c.close()


@pytest.fixture(scope="module")
def rows():
    return {r["data_source"]: r for r in load_rows(f"harbor://{TASKS.relative_to(ROOT)}")}


def play(child, key: str, row: dict, *turns, options=None, last=False) -> list:
    """Reset, then each turn (the last one told `last`); each step's answer as (outcome, value)."""
    assert child.run(("reset", key, "harbor", options or {}, row), 10) == ("ok", None)
    told = [(t, last and i == len(turns) - 1) for i, t in enumerate(turns)]
    return [child.run(("step", key, t, False, at_limit), 30) for t, at_limit in told]


def bash(commands: str) -> str:
    return f"I will run:\n```bash\n{commands}\n```"


def test_each_task_is_a_row_its_instruction_the_users_message(rows):
    assert sorted(rows) == [
        "harbor/count",
        "harbor/tests/greeting",
        "harbor/unchanged",
    ]  # task.toml's [task] name, else the folder's
    greeting = rows["harbor/tests/greeting"]
    assert greeting["prompt"] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": (TASKS / "greeting" / "instruction.md").read_text()},
    ]
    assert greeting["extra_info"]["task"] == str(TASKS / "greeting")
    assert load_rows(f"harbor://{TASKS / 'count'}")[0]["data_source"] == "harbor/count"  # one task's folder


@pytest.mark.parametrize(
    "make, says",
    [
        (lambda p: None, "is not a directory"),
        (lambda p: p.mkdir(), "holds no Harbor task"),
        (lambda p: (p / "t" / "tests").mkdir(parents=True), "t is not a Harbor task: it has no instruction.md and no"),
        (
            lambda p: [
                (p / "tests").mkdir(parents=True),
                (p / "tests" / "test.sh").write_text("true"),
                (p / "instruction.md").write_text("x"),
                (p / "task.toml").write_text("[verifier\n"),
            ],
            "task.toml: Expected ']'",
        ),
    ],
)
def test_what_is_not_a_task_is_said_naming_it(tmp_path, make, says):
    make(tmp_path / "tasks")
    with pytest.raises(DataError, match=says):
        load_rows(f"harbor://{tmp_path / 'tasks'}")


def test_a_task_done_scores_by_its_own_tests_in_the_sandbox(child, rows):
    """The turns' commands run in /app, one after another; a turn with no bash block ends the episode and the
    task's test.sh (its task.toml env given) writes the reward: 1 where the file is right, 0 where it is not."""
    greeting = rows["harbor/tests/greeting"]
    steps = play(child, "g1", greeting, bash("pwd; echo hello > greeting.txt"), bash("cat greeting.txt"), "Done.")
    assert [s[0] for s in steps] == ["ok"] * 3
    assert steps[0][1]["observation"] == "exit code 0\n/app\n" and steps[0][1]["tool_call"]
    assert steps[1][1]["observation"] == "exit code 0\nhello\n"
    assert steps[2][1]["done"] and steps[2][1]["reward"] == 1.0
    wrong = play(child, "g2", greeting, bash("echo goodbye > greeting.txt"), "Done.")
    assert wrong[-1][1]["done"] and wrong[-1][1]["reward"] == 0.0


def test_partial_credit_from_reward_json_and_the_last_turn_is_scored(child, rows):
    """count's test writes {"reward": files made / 3} to reward.json. The turn limit's turn (last) runs its
    commands, then the tests, in one step; a cut turn's commands are not run."""
    steps = play(child, "c1", rows["harbor/count"], bash("touch a.txt"), bash("touch b.txt"), last=True)
    assert not steps[0][1]["done"] and steps[1][1]["done"]
    assert steps[1][1]["reward"] == pytest.approx(2 / 3, abs=1e-3)
    assert child.run(("reset", "c2", "harbor", {}, rows["harbor/count"]), 10) == ("ok", None)
    cut = child.run(("step", "c2", bash("touch a.txt b.txt c.txt"), True), 30)[1]
    assert cut["done"] and cut["reward"] == 0.0


def test_a_command_longer_than_an_argument_may_be_runs(child, rows):
    """A turn's commands reach bash as a file, not as an argument (Linux holds one argument to 128 KiB): a block of
    200 KB runs as a short one does, not failing the episode."""
    (outcome, step), *_ = play(child, "l1", rows["harbor/count"], bash(": " + "x" * 200_000 + "\necho long-ok"))
    assert (outcome, step["observation"]) == ("ok", "exit code 0\nlong-ok\n")


def test_commands_see_their_task_not_the_node(child, rows):
    """A task's commands write only its /app, /logs and /tmp (the node's filesystem read-only, the tests not there
    before the end), see no token of the generator's environment, and are killed at their time limit."""
    if not child.isolation.startswith("network+"):
        pytest.skip(f"no sandbox on this OS: {child.isolation}")
    marker, system = ROOT / "written-by-a-harbor-task", Path("/usr/written-by-a-harbor-task")
    turn = bash(f"ls /tests; touch {marker} {system}; touch /tmp/ok && echo tmp-ok; env | sort")
    (outcome, step), *_ = play(child, "s1", rows["harbor/count"], turn)
    said = step["observation"]
    assert outcome == "ok" and said.startswith("exit code 0\n") and step["tool_call"]
    assert "ls: cannot access '/tests'" in said and "tmp-ok" in said
    assert f"touch: cannot touch '{system}': Read-only file system" in said
    assert not marker.exists() and not system.exists()  # (the repository may lie under /tmp: the task's own /tmp)
    env = dict(line.split("=", 1) for line in said.splitlines() if "=" in line and line[0].isupper())
    assert set(env) <= {"PATH", "HOME", "LANG", "TERM", "PWD", "SHLVL", "_", "OLDPWD"} and env["HOME"] == "/tmp"
    (outcome, step), *_ = play(child, "s2", rows["harbor/count"], bash("sleep 30"), options={"command_timeout_s": 0.5})
    assert outcome == "ok" and step["observation"].startswith("timed out after 0.5 s") and step["tool_error"]


def test_a_flood_keeps_its_end_and_what_a_command_leaves_running_is_stopped(child, rows):
    """A command that floods its output until its limit costs the process no memory (the observation keeps the
    end); one that leaves a process in the background answers as it exits, not at its limit, and the process is
    stopped then (no pid of it is left)."""
    limit = {"command_timeout_s": 1.0, "output_chars": 100}
    (outcome, step), *_ = play(child, "f1", rows["harbor/count"], bash("yes flood"), options=limit)
    assert outcome == "ok" and step["observation"] == "timed out after 1.0 s\n" + ("flood\n" * 20)[-100:]
    leave = bash("sleep 300 & echo $! > /app/pid; echo started")
    state = "s=$(awk '/^State/ {print $2}' /proc/$(cat pid)/status 2>/dev/null); echo ${s:-gone}"
    (outcome, step), after = play(child, "f2", rows["harbor/count"], leave, bash(state))
    assert outcome == "ok" and step["observation"] == "exit code 0\nstarted\n"
    assert after[1]["observation"] in ("exit code 0\ngone\n", "exit code 0\nZ\n")  # killed (a zombie where the
    # node's init does not reap)


def test_tests_that_write_no_reward_fail_the_episode_with_their_output(tmp_path):
    """No reward file, several rewards in reward.json, or a reward.txt that is not a number: the episode fails
    (counted, env/errors) saying which, never a silent 0."""
    task = tmp_path / "silent"
    (task / "tests").mkdir(parents=True)
    (task / "instruction.md").write_text("Do nothing.")
    (task / "tests" / "test.sh").write_text("echo 'checked nothing'\n")
    (row,) = load_rows(f"harbor://{task}")
    child = EnvChild(Jail(512, paths=[str(task)]))  # a task is shown to the sandbox where the recipe names it
    outcome, text = play(child, "n1", row, "Nothing to do.")[0]
    assert outcome == "error" and "silent's tests (exit code 0) wrote no /logs/verifier/reward.txt" in text
    assert "checked nothing" in text
    (task / "tests" / "test.sh").write_text('echo \'{"a": 1, "b": 0}\' > /logs/verifier/reward.json\n')
    outcome, text = play(child, "n2", row, "Nothing to do.")[0]
    assert outcome == "error" and "wrote rewards ['a', 'b']: which is the reward is unsaid" in text
    (task / "tests" / "test.sh").write_text("echo passed > /logs/verifier/reward.txt\n")
    outcome, text = play(child, "n3", row, "Nothing to do.")[0]
    assert outcome == "error" and "silent's tests wrote reward.txt 'passed\\n': not a number" in text
    child.close()


COOKBOOK = """#!/bin/bash
apt-get update
apt-get install -y curl

curl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh
source $HOME/.local/bin/env

uvx \\
  -p 3.13 \\
  -w pytest==8.4.1 \\
  pytest /tests/test_outputs.py -rA

if [ $? -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""
"""harbor-cookbook's usual tests/test.sh (its simple-task's shape): curl by apt-get, uv by its installer, pytest by
uvx, and a fallback that writes 0 whatever failed."""


def task_with(root: Path, name: str, test_sh: str) -> Path:
    task = root / name
    (task / "tests").mkdir(parents=True)
    (task / "instruction.md").write_text("Create /app/hello.txt holding 'Hello, world!'.")
    (task / "tests" / "test.sh").write_text(test_sh)
    (task / "tests" / "test_outputs.py").write_text("def test_it():\n    assert open('/app/hello.txt').read()\n")
    return task


def test_tests_that_install_at_verify_time_are_refused_before_start_without_the_network(tmp_path):
    """The cookbook's test.sh fetches curl, uv and pytest as it verifies: with no network (the default) it can only
    fail and write its fallback's 0, so the recipe is refused before any actor starts, naming the task and the
    line; with environment.network=true it is taken (what needs no root, uv into HOME, can install there)."""
    from grpo_ray import envs
    from grpo_ray.config import load_recipe

    task = task_with(tmp_path / "tasks", "simple-task", COOKBOOK)
    task_with(tmp_path / "tasks", "plain", (TASKS / "greeting" / "tests" / "test.sh").read_text())
    keys = ["environment.name=harbor", f"data.train_files=[harbor://{tmp_path / 'tasks'}]", "data.val_files=[]"]
    recipe = load_recipe(ROOT / "recipes" / "tiny-qwen2.5-7b-gsm8k-agent.yaml", keys)
    with pytest.raises(envs.EnvironmentLoadError) as e:
        envs.check(recipe)
    said = str(e.value)
    assert f"the Harbor task {task} installs at verify time (tests/test.sh line 2: apt-get update)" in said
    assert "environment.network=true" in said and "\n" not in said
    from grpo_ray.integrations.harbor import installs

    assert [f.split(":")[0] for f in installs(task)] == ["line 2", "line 3", "line 5", "line 8"]
    envs.check(load_recipe(ROOT / "recipes" / "tiny-qwen2.5-7b-gsm8k-agent.yaml", [*keys, "environment.network=true"]))
    plain = [k.replace("tasks", "tasks/plain") if k.startswith("data.train") else k for k in keys]
    envs.check(load_recipe(ROOT / "recipes" / "tiny-qwen2.5-7b-gsm8k-agent.yaml", plain))


def test_tests_calling_a_command_the_node_lacks_fail_the_episode_not_score_0(tmp_path):
    """Tests whose tool is not on the node (here, the cookbook's uvx with its installs taken out) fail and their
    fallback writes 0: that 0 is the node's, not the answer's, so the episode fails, counted, saying which command
    and showing the tests' output; the same tests with a tool the node has score the answer."""
    verdict = "if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n"
    tests = "#!/bin/bash\necho checking\n{}\n" + verdict
    task = task_with(tmp_path, "simple-task", tests.format("uvx-not-on-this-node pytest /tests/test_outputs.py -rA"))
    (row,) = load_rows(f"harbor://{task}")
    child = EnvChild(Jail(512, paths=[str(task)]))
    try:
        done = bash("echo 'Hello, world!' > hello.txt")
        outcome, text = play(child, "m1", row, done, "Done.")[-1]
        assert outcome == "error", text
        assert "simple-task's tests could not run here: 'uvx-not-on-this-node' (test.sh line 3) not found" in text
        assert "checking" in text  # the tests' output, kept in the generator's log with the failure
        (task / "tests" / "test.sh").write_text(tests.format("grep -q Hello /app/hello.txt"))
        outcome, step = play(child, "m2", row, done, "Done.")[-1]
        assert outcome == "ok" and step["reward"] == 1.0
    finally:
        child.close()


def test_the_network_can_be_the_verifiers_alone(tmp_path):
    """environment.network with options.network=verifier: the tests reach the node's network (a server on its
    loopback), the turns' commands do not (a network namespace each); with the default, all do. Asked for without
    environment.network, it is refused before start."""
    import socketserver
    import threading

    from grpo_ray import envs
    from grpo_ray.config import load_recipe

    server = socketserver.TCPServer(("127.0.0.1", 0), socketserver.BaseRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    reach = f"(exec 3<>/dev/tcp/127.0.0.1/{server.server_address[1]}) 2>/dev/null"
    verdict = f"if {reach}; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n"
    task = task_with(tmp_path, "fetching", "#!/bin/bash\n" + verdict)
    (row,) = load_rows(f"harbor://{task}")
    child = EnvChild(Jail(512, network=True, paths=[str(task)]))
    try:
        probe = bash(f"if {reach}; then echo reached; else echo cut off; fi")
        turn, end = play(child, "v1", row, probe, "Done.", options={"network": "verifier"})
        assert turn[1]["observation"] == "exit code 0\ncut off\n" and end[1]["reward"] == 1.0
        turn, end = play(child, "v2", row, probe, "Done.")
        assert turn[1]["observation"] == "exit code 0\nreached\n" and end[1]["reward"] == 1.0
    finally:
        child.close()
        server.shutdown()
    keys = ["environment.name=harbor", f"data.train_files=[harbor://{task}]", "environment.options.network=verifier"]
    with pytest.raises(envs.EnvironmentLoadError, match="environment.network is false: there is none to give"):
        envs.check(load_recipe(ROOT / "recipes" / "tiny-qwen2.5-7b-gsm8k-agent.yaml", keys))


def test_the_verifiers_home_can_be_kept_from_episode_to_episode(tmp_path):
    """options.verifier_cache: what the tests leave in their HOME (uv and its caches, in the cookbook's tests) is
    there for the next episode's tests in the process; the turns' commands do not see it. Without it, each episode's
    tests start from an empty HOME."""
    seen = 'if [ -f "$HOME/seen" ]; then echo 1; else touch "$HOME/seen"; echo 0; fi > /logs/verifier/reward.txt\n'
    task = task_with(tmp_path, "caching", "#!/bin/bash\n" + seen)
    (row,) = load_rows(f"harbor://{task}")
    child = EnvChild(Jail(512, paths=[str(task)]))
    try:
        kept = {"verifier_cache": True}
        look = bash("ls /cache 2>&1; echo $HOME")
        turn, end = play(child, "k1", row, look, "Done.", options=kept)
        assert "ls: cannot access '/cache'" in turn[1]["observation"] and "/tmp" in turn[1]["observation"]
        assert end[1]["reward"] == 0.0
        assert play(child, "k2", row, "Done.", options=kept)[-1][1]["reward"] == 1.0
        assert [play(child, f"n{i}", row, "Done.")[-1][1]["reward"] for i in range(2)] == [0.0, 0.0]
    finally:
        child.close()


@pytest.mark.slow
def test_a_run_trains_on_harbor_tasks_each_scored_by_its_own_tests(tmp_path):
    """The agent twin on the three tasks, environment harbor, two turns: the run trains, no episode fails, and each
    sample's reward is its task's verdict on what the untrained model did (it writes no bash block that changes
    /app: unchanged's tests give 1, the others' 0), the turn limit's turn scored as the last."""
    out = tmp_path / "run"
    res = run_cli(
        "train",
        "recipes/tiny-qwen2.5-7b-gsm8k-agent.yaml",
        f"data.train_files=[harbor://{TASKS}]",
        "data.val_files=[]",
        "data.train_batch_size=3",
        "data.max_prompt_length=640",
        "learner.mini_batch_size=24",
        "learner.micro_batch_size=4",
        "environment.name=harbor",
        "environment.max_turns=2",
        "reward.functions=[]",
        "trainer.total_steps=2",
        "trainer.val_before_train=false",
        f"trainer.output_dir={out}",
        timeout=900,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps] == [1, 2] and all(m["env/errors"] == 0 for m in steps)
    dump = read_samples(out / "rollouts" / "train_data_step2.jsonl")
    expected = {"harbor/unchanged": 1.0, "harbor/count": 0.0, "harbor/tests/greeting": 0.0}
    assert {row["data_source"] for row in dump} == set(expected)
    assert all(row["score"] == expected[row["data_source"]] for row in dump)
