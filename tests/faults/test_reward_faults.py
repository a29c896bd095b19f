"""Item 3: reward code that raises, hangs, exits, eats memory, returns NaN, or reaches for the network or the disk."""

import json
import socket
import threading
import time

import pytest

from grpo_ray.config import RewardConfig, RewardFnConfig
from grpo_ray.roles.reward import RewardWorker
from grpo_ray.types import Completion, Prompt, Rollout

pytestmark = pytest.mark.slow

ODD = "tests.helpers.odd_rewards:odd"


def section(functions, timeout_s, sandbox=True):
    """A reward section of `functions` ((name, weight) pairs), 1 GB per child."""
    fns = [RewardFnConfig(name=n, weight=w) for n, w in functions]
    return RewardConfig(functions=fns, timeout_s=timeout_s, memory_mb=1024, sandbox=sandbox)


def rollout(truths_and_texts):
    prompts = [Prompt([1, 2], truth, "test") for truth, _ in truths_and_texts]
    comps = [Completion(i, [3], text, [], "stop") for i, (_, text) in enumerate(truths_and_texts)]
    return Rollout(prompts, comps, 0)


def test_misbehaving_rewards_score_zero_are_counted_and_the_worker_goes_on(ray_local):
    worker = (
        ray_local.remote(RewardWorker)
        .options(num_cpus=0.25)
        .remote(section([(ODD, 0.5), ("gsm8k", 1.0)], 3.0), "#### ")
    )
    ro = rollout(
        [
            ("7", "7"),
            ("raise", "x"),
            ("hang", "y"),
            ("8", "8"),
            ("exit", "z"),
            ("memory", "m"),
            ("nan", "n"),
            ("9", "1"),
        ]
    )
    start = time.perf_counter()
    scores = ray_local.get(worker.score.remote([ray_local.put(ro)]), timeout=120)
    elapsed = time.perf_counter() - start
    # odd() sees "#### 7" (the response prefix is part of what rewards see), so it pays 0; gsm8k pays 1
    assert scores.components["gsm8k"] == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert scores.components[ODD] == [0.0] * 8
    assert scores.totals == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert scores.timeouts == 1  # the hang
    assert scores.errors == 4  # the raise, the exit (seen at once), the 16 GiB allocation, the NaN
    assert elapsed < 30  # one 3 s limit and a few fresh children, not a 120 s hang
    again = ray_local.get(worker.score.remote([ray_local.put(rollout([("5", "5")]))]), timeout=60)
    assert again.totals == [1.0] and again.timeouts == again.errors == 0


def test_reward_code_has_no_network_and_writes_only_to_its_scratch_dir(ray_local, tmp_path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    threading.Thread(target=lambda: server.accept(), daemon=True).start()
    port = server.getsockname()[1]
    target = tmp_path / "outside.txt"
    cases = [(f"connect:127.0.0.1:{port}", "a"), (f"write:{target}", "b"), ("scratch", "c")]

    sandboxed = ray_local.remote(RewardWorker).options(num_cpus=0.25).remote(section([(ODD, 1.0)], 10.0, sandbox=True))
    if not ray_local.get(sandboxed.isolation.remote()).startswith("network+filesystem"):
        pytest.skip("this OS does not allow user namespaces: only time and memory limits apply (see the README)")
    scores = ray_local.get(sandboxed.score.remote([ray_local.put(rollout(cases))]), timeout=60)
    assert scores.totals == [0.0, 0.0, 1.0]  # no connection, no write outside, the scratch dir is writable
    assert not target.exists()

    # the same code without the sandbox reaches both: the test can tell the difference
    open_worker = (
        ray_local.remote(RewardWorker).options(num_cpus=0.25).remote(section([(ODD, 1.0)], 10.0, sandbox=False))
    )
    assert ray_local.get(open_worker.isolation.remote()).startswith("none")
    scores = ray_local.get(open_worker.score.remote([ray_local.put(rollout(cases[:2]))]), timeout=60)
    assert scores.totals == [1.0, 1.0] and target.exists()
    server.close()


FLAKY = """
def score(response, ground_truth, **extra):
    if response.removeprefix("####").strip() != ground_truth:
        raise ZeroDivisionError("planted: wrong answers divide by zero")
    return 1.0
"""


def test_a_reward_failing_on_most_samples_is_shown_once_and_stops_the_run(tmp_path):
    """The function passes the check before start (the ground truth scores 1), then raises on the model's wrong
    answers: its traceback is on the console once, in the reward actor's log, and the run stops after
    reward.max_error_steps steps over reward.max_error_share, exit code 1, the traceback in the reason."""
    from tests.conftest import ROOT, run_cli

    (tmp_path / "flaky.py").write_text(FLAKY)
    res = run_cli(
        "train",
        str(ROOT / "recipes" / "tiny-cpu.yaml"),
        f"trainer.output_dir={tmp_path / 'run'}",
        "reward.functions=[{name: flaky.py:score}]",
        "reward.max_error_steps=2",
        "trainer.total_steps=10",
        "trainer.val_before_train=false",
        cwd=tmp_path,
        timeout=600,
    )
    assert res.returncode == 1, res.stderr[-3000:]
    frame = f'File "{tmp_path / "flaky.py"}", line 4, in score'
    assert res.stdout.count("failed; its first failure") == 1 and res.stdout.count(frame) == 1
    assert "ZeroDivisionError: planted: wrong answers divide by zero" in res.stdout
    assert " err:" in res.stdout  # reward/errors on the step line, since some failed
    assert "run stopped: reward functions failed on" in res.stderr and "for 2 steps in a row" in res.stderr
    assert frame in res.stderr  # the reason carries the traceback
    assert frame in (tmp_path / "run" / "logs" / "reward-0.log").read_text()
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps] == [1] and steps[0]["reward/errors"] > 0.5 * 256


@pytest.mark.parametrize(
    "recipe, overrides, first, stopped, log",
    [
        (
            "tiny-cpu.yaml",
            [  # turns ended by common letters and digits: most reach step (a turn cut at max_tokens does not)
                "environment.name=tests.helpers.envs:Raise",
                "environment.max_tokens=64",
                "environment.stop=[a,e,i,o,u,s,t,0,1,2,3,4,5,6,7,8,9]",
                "generator.sampling.max_tokens=8",
            ],
            "ValueError: the tool broke",
            "run stopped: environment tests.helpers.envs:Raise failed on",
            "generator-0.log",
        ),
        (
            "tiny-qwen2.5-1.5b-gsm8k-judge.yaml",
            [  # one engine, one judge, one learner rank: the pools' sizes are tests/test_judge.py's
                "reward_model.judge.pattern=(NEVER-IN-A-REPLY)",
                "algorithm.max_staleness=0",
                "generator.num_engines=1",
                "reward_model.num_actors=1",
                "learner.world_size=1",
            ],
            "replies had no score matching reward_model.judge.pattern='(NEVER-IN-A-REPLY)'",
            "run stopped: the judge failed on 100% of the samples",
            "judge-0.log",
        ),
    ],
    ids=["environment", "judge"],
)
def test_an_environment_or_judge_failing_on_most_samples_is_said_once_and_stops_the_run(
    recipe, overrides, first, stopped, log, tmp_path
):
    """As failing reward functions: the first failure on the console once (not only in the actor's log), the run
    stopped after reward.max_error_steps steps over reward.max_error_share, exit code 1."""
    from tests.conftest import ROOT, run_cli

    res = run_cli(
        "train",
        str(ROOT / "recipes" / recipe),
        f"trainer.output_dir={tmp_path / 'run'}",
        "reward.max_error_steps=2",
        "trainer.total_steps=6",
        "trainer.test_freq=0",
        "trainer.val_before_train=false",
        *overrides,
        timeout=900,
    )
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-3000:]
    assert res.stdout.count("failed; its first failure") == 1 and res.stdout.count(first) == 1, res.stdout[-3000:]
    assert stopped in res.stderr and "for 2 steps in a row" in res.stderr, res.stderr[-3000:]
    assert (tmp_path / "run" / "logs" / log).read_text()  # and the actor's own log has it
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps] == [1]
