"""verifiers v1 tasksets with no glue (grpo_ray/envs/verifiers_env.py), with the library's own code from PyPI (the
`envs` extra): a taskset written with verifiers' classes (tests/helpers/vf_tasksets/toy_words) as rows, a spec that
cannot work refused in one line before any actor starts, and a run whose episodes verifiers plays itself, its
harness driving the model through the run's endpoint."""

import json
import os
import sys

import pytest

from grpo_ray.data import DataError, load_rows
from tests.conftest import ROOT, run_cli

HOME = ROOT / "tests" / "helpers" / "vf_tasksets"  # where verifiers finds the test taskset (a top-level module)
PYTHONPATH = {"PYTHONPATH": os.pathsep.join(filter(None, [str(HOME), str(ROOT), os.environ.get("PYTHONPATH")]))}


@pytest.fixture(autouse=True)
def taskset_home():
    sys.path.insert(0, str(HOME))
    yield
    sys.path.remove(str(HOME))


def test_a_spec_gives_the_tasksets_tasks_as_rows():
    rows = load_rows("verifiers://toy_words?size=3&words=6")
    assert [r["prompt"] for r in rows][:2] == [
        [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Say pear."}],
        [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Say plum."}],
    ]
    assert [r["extra_info"]["idx"] for r in rows] == [0, 1, 2]
    assert rows[0]["extra_info"]["taskset"] == {"id": "toy_words", "words": 6} and rows[0]["data_source"] == (
        "verifiers/toy_words"
    )
    assert rows[0]["reward_model"]["ground_truth"] == ""
    shuffled = load_rows("verifiers://toy_words?size=6&words=6&seed=3")
    assert shuffled == load_rows("verifiers://toy_words?size=6&words=6&seed=3")  # the same spec, the same rows
    assert sorted(r["extra_info"]["idx"] for r in shuffled) == list(range(6))
    assert [r["extra_info"]["idx"] for r in shuffled] != list(range(6))
    assert len(load_rows("verifiers://toy_words?size=100")) == 4  # a taskset's 4 tasks (its words key's default)


@pytest.mark.parametrize(
    "spec, said",
    [
        ("verifiers://toy_wrds?size=2", "verifiers refuses taskset {'id': 'toy_wrds'}: ModuleNotFoundError"),
        ("verifiers://toy_words?size=2&wrds=3", "verifiers refuses taskset {'id': 'toy_words', 'wrds': 3}"),
    ],
)
def test_a_spec_that_cannot_work_is_one_line_naming_it(spec, said):
    with pytest.raises(DataError) as e:
        load_rows(spec)
    assert str(e.value).startswith(f"{spec}: {said}") and "\n" not in str(e.value)


def test_an_episode_of_a_row_that_is_not_a_verifiers_task_says_so():
    from grpo_ray.envs.verifiers_env import episode

    row = load_rows("synthetic://reasoning?size=1")[0]
    with pytest.raises(ValueError, match=r"verifiers episodes play rows of verifiers:// data \(extra_info.taskset"):
        episode("http://127.0.0.1:9/v1", row)


@pytest.mark.slow  # the same path as reasoning-gym's spec in CI (load_rows' DataError before any actor), 9 s more
def test_a_spec_that_cannot_work_stops_a_run_before_any_actor_starts(tmp_path):
    spec = "verifiers://toy_wrds?size=4"
    res = run_cli(
        "train",
        "recipes/tiny-qwen2.5-7b-gsm8k-agent.yaml",
        f"data.train_files=[{spec}]",
        f"trainer.output_dir={tmp_path / 'run'}",
        env=PYTHONPATH,
    )
    assert res.returncode != 0 and f"{spec}: verifiers refuses taskset" in res.stderr and "Traceback" not in res.stderr
    assert "actors placed" not in res.stdout


@pytest.mark.slow
def test_verifiers_plays_its_episodes_through_the_endpoint_and_the_run_trains_on_them(tmp_path):
    """The agent twin on the toy taskset, verifiers' own SingleAgentEnv and `null` harness (its chat program, a uv
    script in its subprocess runtime, streaming through its interception server to this run's endpoint) playing
    each episode: the run trains on what the endpoint recorded, and each sample's reward is verifiers' score of that
    same reply (the share of the task's word's letters it holds)."""
    out = tmp_path / "run"
    res = run_cli(
        "train",
        "recipes/tiny-qwen2.5-7b-gsm8k-agent.yaml",
        "data.train_files=[verifiers://toy_words?size=8&words=8]",
        "data.val_files=[]",
        "environment.name=agent",
        "environment.network=true",
        "environment.options.program=grpo_ray.envs.verifiers_env:episode",
        "environment.options.timeout_s=120",
        "reward.functions=[]",
        "trainer.total_steps=2",
        "trainer.val_before_train=false",
        f"trainer.output_dir={out}",
        env=PYTHONPATH,
        timeout=900,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps] == [1, 2]
    assert all(m["env/errors"] == 0 and m["env/turns/mean"] == 1 for m in steps)
    dump = [json.loads(line) for line in (out / "rollouts" / "train_data_step2.jsonl").read_text().splitlines()]
    samples = [s for d in dump for s in d["samples"]]
    assert samples and all(1 in s["loss_mask"] for s in samples)
    scores = []
    for d in dump:
        word = set(d["prompt"].rpartition("Say ")[2].split(".")[0])
        for s in d["samples"]:
            scores.append(len(word & set(s["response"])) / len(word))
            assert s["rewards"]["environment"] == pytest.approx(scores[-1]), (word, s["response"])
    assert len(set(scores)) > 1  # replies scored apart: the check above compares something
