"""verifiers v1 tasksets with no glue (grpo_ray/integrations/verifiers.py), with the library's own code from PyPI (the
`envs` extra): a taskset written with verifiers' classes (tests/helpers/vf_tasksets/toy_words) as rows, a spec that
cannot work refused in one line before any actor starts, and a run whose episodes verifiers plays itself, its
harness driving the model through the run's endpoint."""

import json
import os
import subprocess
import sys

import pytest

from grpo_ray.data import DataError, load_rows
from tests.conftest import LEAN, ROOT, run_cli

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
    from grpo_ray.integrations.verifiers import episode

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


def train(tmp_path, spec: str, *overrides: str) -> tuple[list[dict], list[dict]]:
    """Two steps of the agent twin on verifiers' rows of `spec`, verifiers playing each episode (the docs' command,
    with `overrides`): the steps' metrics and step 2's dump, the run checked to have ended well."""
    out = tmp_path / "run"
    res = run_cli(
        "train",
        "recipes/tiny-qwen2.5-7b-gsm8k-agent.yaml",
        f"data.train_files=[{spec}]",
        "data.val_files=[]",
        "environment.name=agent",
        "environment.options.program=grpo_ray.integrations.verifiers:episode",
        "environment.options.timeout_s=120",
        "reward.functions=[]",
        "trainer.total_steps=2",
        "trainer.val_before_train=false",
        *overrides,
        f"trainer.output_dir={out}",
        env=PYTHONPATH,
        timeout=900,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps] == [1, 2]
    dump = [json.loads(line) for line in (out / "rollouts" / "train_data_step2.jsonl").read_text().splitlines()]
    return steps, dump


@pytest.mark.slow
def test_verifiers_plays_its_episodes_through_the_endpoint_and_the_run_trains_on_them(tmp_path):
    """The agent twin on the toy taskset, verifiers' own SingleAgentEnv and `null` harness (its chat program, a uv
    script in its subprocess runtime, streaming through its interception server to this run's endpoint) playing
    each episode: the run trains on what the endpoint recorded, and each sample's reward is verifiers' score of that
    same reply (the share of the task's word's letters it holds)."""
    steps, dump = train(tmp_path, "verifiers://toy_words?size=8&words=8")
    assert all(m["env/errors"] == 0 and m["env/turns/mean"] == 1 for m in steps)
    samples = [s for d in dump for s in d["samples"]]
    assert samples and all(1 in s["loss_mask"] for s in samples)
    scores = []
    for d in dump:
        word = set(d["prompt"].rpartition("Say ")[2].split(".")[0])
        for s in d["samples"]:
            scores.append(len(word & set(s["response"])) / len(word))
            assert s["rewards"]["environment"] == pytest.approx(scores[-1]), (word, s["response"])
    assert len(set(scores)) > 1  # replies scored apart: the check above compares something


@pytest.mark.slow
@pytest.mark.smoke  # verifiers' own multi-turn env, offline: one end-to-end run of the library's path in CI's tier
def test_a_tasksets_own_env_plays_turn_by_turn_offline_and_the_run_trains_on_every_turn(tmp_path):
    """tests/helpers/vf_tasksets/toy_rounds exports its own `vf.Env` (the env is the run's user, answering each
    reply through `interaction.turn()`, as verifiers' TextArena env is written): three replies an episode, the env's
    "Again: say <word>." between them, recorded in one trajectory; each sample's reward is the env's score of those
    very replies. The agent processes have no network (the default): verifiers' chat program was prepared once, on
    the node, before they started, and runs there as it is."""
    steps, dump = train(
        tmp_path,
        "verifiers://toy_rounds?size=8&rounds=3",
        # CI's time: each episode starts verifiers' chat program (a Python process, ~15 s of CPU here), so two a
        # step; no reference, one learner rank, one engine
        "data.train_batch_size=1",
        "algorithm.group_size=2",
        *LEAN,
        "learner.mini_batch_size=2",
        "learner.micro_batch_size=2",
        "generator.num_engines=1",
        "environment.max_tokens=160",
    )
    assert all(m["env/errors"] == 0 and m["env/turns/mean"] == 3 for m in steps), steps
    scored = []
    for d in dump:
        word = d["prompt"].rpartition("Say ")[2].split(".")[0]
        for s in d["samples"]:
            turns = s["episode"]["turns"]
            assert len(turns) == 5 and turns[1::2] == [f"Again: say {word}."] * 2, turns
            scored.append(sum(len(set(word) & set(t)) / len(set(word)) for t in turns[0::2]) / 3)
            assert s["rewards"]["environment"] == pytest.approx(scored[-1]), (word, turns)
    assert len(set(scored)) > 1  # replies scored apart: the check above compares something


def test_an_env_seating_the_runs_model_twice_is_refused_in_grpo_rays_words():
    with pytest.raises(DataError) as e:
        load_rows("verifiers://toy_duel?size=1")
    said = str(e.value)
    assert "DuelEnvConfig seats speaker, echo on the run's model" in said and "exactly one seat" in said
    assert "verifiers refuses" not in said and "\n" not in said


def test_a_tasksets_own_env_is_the_one_its_episodes_run():
    from grpo_ray.integrations.verifiers import environment, seat

    env = environment({"id": "toy_rounds", "rounds": 2})
    assert type(env).__name__ == "RoundsEnv" and seat(env) == "player"
    assert env.config.player.runtime.type == "subprocess" and env.config.player.harness.id == "null"
    plain = environment({"id": "toy_words"})
    assert type(plain).__name__ == "SingleAgentEnv" and seat(plain) == "agent"


def test_the_harness_program_is_prepared_once_a_node_and_then_needs_no_network():
    """``prepare`` (run by the generator before its agent processes start) syncs verifiers' chat program in the
    node's uv cache; prepared again with every index and proxy unreachable it gives the same interpreter at once
    (from the cache, offline), and that interpreter has the program's packages."""
    from grpo_ray.integrations.verifiers import episode, prepare

    assert episode.prepare is prepare  # the agent program's preparation (grpo_ray.envs.agent.prepared)
    paths, kwargs = prepare()
    (digest, interpreter), *more = kwargs["prepared"].items()
    assert not more and paths == [os.path.dirname(os.path.dirname(interpreter))]
    dead = "http://127.0.0.1:9"
    offline = {**os.environ, "UV_DEFAULT_INDEX": f"{dead}/simple", "HTTPS_PROXY": dead, "HTTP_PROXY": dead}
    code = "from grpo_ray.integrations.verifiers import prepare; print(prepare()[1]['prepared'])"
    again = subprocess.run([sys.executable, "-c", code], env=offline, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and again.stdout.strip() == repr({digest: interpreter}), again.stderr[-2000:]
    imports = subprocess.run([interpreter, "-c", "import openai, mcp, httpx, tenacity"], capture_output=True)
    assert imports.returncode == 0, imports.stderr[-2000:]
