"""The environment libraries users bring, in one training run (CI's tier): a row of each plays its library's own
code through grpo-ray's adapter, chosen by the row (``env_class``, as SkyRL's datasets choose): a TextArena game, a
Harbor task scored by its own tests, skyrl-gym's gsm8k_multi_turn, and an OpenEnv environment written against
openenv-core. reasoning-gym's rows and reward train in tests/test_dapo.py's run, verifiers' tasksets through an
agent program in tests/test_verifiers.py's (a taskset's own multi-turn env, CI's tier too)."""

import json

import pytest

from grpo_ray.data import load_rows
from grpo_ray.telemetry.dumps import read_samples
from tests.conftest import LEAN, ROOT, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.smoke]

TASKS = ROOT / "tests" / "helpers" / "harbor_tasks"
HARBOR = {"harbor/unchanged": 1.0, "harbor/count": 0.0, "harbor/tests/greeting": 0.0}
"""Each Harbor task's verdict on what an untrained model does (it writes no bash block that changes /app)."""
CHOICES = {
    "textarena": {"name": "textarena"},
    "harbor": {"name": "harbor"},
    "skyrl": {"name": "skyrl_gym", "options": {"env": "gsm8k_multi_turn"}},
    "openenv": {"name": "openenv", "options": {"env": "tests.helpers.openenv_envs:Count"}},
}
SKYRL = "skyrl/gsm8k"
OPENENV = "openenv/count"


def rows() -> list[dict]:
    """Three rows of each library, one of each in every batch of four, each naming its environment."""
    games = load_rows("textarena://GuessTheNumber-v0?size=3&seed=0", "prompt", "reward_model.ground_truth")
    tasks = load_rows(f"harbor://{TASKS}", "prompt", "reward_model.ground_truth")
    questions = [("Mia has 7 pears. How many pears?", "7"), ("Tom has 3 figs and 2 more. How many?", "5")]
    skyrl = [
        {
            "data_source": SKYRL,
            "prompt": [{"role": "user", "content": q}],
            "reward_spec": {"method": "rule", "ground_truth": a},  # SkyRL's schema, read as it is
            "extra_info": {"index": i},
        }
        for i, (q, a) in enumerate(questions * 2)
    ][:3]
    count = [
        {
            "data_source": OPENENV,
            "prompt": [{"role": "system", "content": "Say something; every turn is answered."}],
            "reward_model": {"style": "rule", "ground_truth": ""},
            "extra_info": {"index": i},
        }
        for i in range(3)  # (OpenEnv's Count takes no task: no reset_key)
    ]
    out = []
    for group in zip(games, tasks, skyrl, count):
        for label, row in zip(CHOICES, group):
            if "reward_model" in row:  # (the file's other rows answer "none": skyrl's need the default answer key)
                rm = row["reward_model"]
                row = {**row, "reward_model": {**rm, "ground_truth": rm["ground_truth"] or "none"}}
            out.append({**row, "env_class": label})
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("libraries")
    data = tmp / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows()))
    out = tmp / "run"
    res = run_cli(
        "train",
        "recipes/tiny-cpu.yaml",
        f"data.train_files=[{data}]",
        "data.val_files=[]",
        "data.shuffle=false",
        "data.train_batch_size=4",
        "data.max_prompt_length=640",
        "algorithm.group_size=2",
        *LEAN,
        "learner.mini_batch_size=8",
        "learner.micro_batch_size=4",
        "environment.name=textarena",
        f"environment.choices={json.dumps(CHOICES)}",
        "environment.max_turns=2",
        "environment.max_tokens=64",
        "environment.stop=[a,e,i,o,u]",
        "environment.workers=1",
        f"environment.paths=[{TASKS}]",  # the Harbor tasks, named by rows of a file: shown to the sandbox
        "generator.sampling.max_tokens=8",
        "reward.functions=[]",
        "trainer.total_steps=2",
        "trainer.test_freq=0",
        "trainer.val_before_train=false",
        "trainer.dump_freq=1",
        f"trainer.output_dir={out}",
        timeout=900,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    dump = [s for step in (1, 2) for s in read_samples(out / "rollouts" / f"train_data_step{step}.jsonl")]
    return steps, dump


def test_every_library_plays_its_rows_and_no_episode_fails(run):
    steps, dump = run
    assert [m["step"] for m in steps] == [1, 2] and all(m["env/errors"] == 0 for m in steps)
    sources = {s["data_source"] for s in dump}
    assert {SKYRL, OPENENV, "textarena/GuessTheNumber-v0"} <= sources and sources & set(HARBOR), sources


def test_each_library_rewards_by_its_own_rules(run):
    """TextArena's game: won or lost, its opening (the game's rules) the prompt's user turn; Harbor's task: its own
    tests' verdict; skyrl-gym's: its gsm8k_multi_turn's reward, 0 to 1; OpenEnv's Count: 0.25 a turn and 0.01 a
    character of it, summed over the turns."""
    _, dump = run
    for s in dump:
        reward, source, episode = s["rewards"]["environment"], s["data_source"], s["episode"]
        if source.startswith("textarena/"):
            assert reward in (0.0, 1.0) and "You are playing Guess The Number." in s["prompt"]
        elif source in HARBOR:
            assert reward == HARBOR[source], (source, reward)
        elif source == SKYRL:
            assert 0.0 <= reward <= 1.0
        else:
            turns = episode["turns"][0::2]
            assert reward == pytest.approx(sum(0.25 + 0.01 * len(t) for t in turns)), (reward, turns)
