"""TextArena's games with no glue (grpo_ray/data/textarena.py, grpo_ray/integrations/textarena.py), with the library's
own code from PyPI (the `envs` extra), played in an environment process under the sandbox: the game's rules and
board open the episode, the model's turns are its moves, the other players move between them, the game's end is
the reward."""

import sys

import pytest

from grpo_ray.data import DataError, load_rows
from grpo_ray.envs import EnvironmentLoadError, load, options
from grpo_ray.envs.child import EnvChild
from grpo_ray.sandbox import Jail
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def child():
    sys.path.insert(0, str(ROOT))
    c = EnvChild(Jail(1024), preload=[("textarena", {})])
    yield c
    c.close()


def test_a_spec_gives_one_game_a_row_seeded_in_turn():
    rows = load_rows("textarena://GuessTheNumber-v0?size=3&seed=5")
    assert [r["extra_info"] for r in rows] == [
        {"index": i, "env_id": "GuessTheNumber-v0", "seed": 5 + i} for i in range(3)
    ]
    assert {r["data_source"] for r in rows} == {"textarena/GuessTheNumber-v0"}
    assert all(r["prompt"][-1]["role"] == "system" and r["reward_model"]["ground_truth"] == "" for r in rows)
    with pytest.raises(
        DataError,
        match=r"Numbr-v0\?size=3: textarena has no game 'GuessTheNumbr-v0' \(some of its \d+: GuessTheNumber-v0, Gues",
    ):
        load_rows("textarena://GuessTheNumbr-v0?size=3")
    with pytest.raises(DataError, match="unknown key 'max_number'; expected size and seed"):
        load_rows("textarena://GuessTheNumber-v0?max_number=9")


def test_a_single_player_game_opens_answers_each_move_and_ends_with_its_reward(child):
    """GuessTheNumber: its rules are the opening, each guess is answered higher or lower, the right one wins 1."""
    row = {"extra_info": {"env_id": "GuessTheNumber-v0", "seed": 3}}
    outcome, opening = child.run(("reset", "g", "textarena", {}, row), 30)
    assert outcome == "ok" and "You are playing Guess The Number." in opening
    assert child.run(("reset", "h", "textarena", {}, row), 30) == ("ok", opening)  # a group's episodes open alike
    low = child.run(("step", "g", "I guess [1]"), 10)[1]
    assert (low["observation"], low["reward"], low["done"]) == ("The target number is higher.", 0.0, False)
    answers = {g: child.run(("step", "g", f"[{g}]"), 10)[1] for g in range(2, 21)}
    won = next(g for g, a in answers.items() if a["done"])
    assert answers[won]["reward"] == 1.0 and all(answers[g]["observation"].endswith("higher.") for g in range(2, won))


def test_a_two_player_game_against_the_random_or_a_scripted_opponent(child):
    """TicTacToe, the model as O: the random opponent moves (seeded by the row: the same moves answer the same
    moves) and its move and the board come back; a user's opponent function plays instead when named."""
    row = {"extra_info": {"seed": 7}}
    given = {"env": "TicTacToe-v0", "num_players": 2}
    outcome, opening = child.run(("reset", "a", "textarena", given, row), 30)
    assert outcome == "ok" and "You are Player 0 in Tic Tac Toe." in opening and "Available Moves:" in opening
    replies = []
    for key in ("a", "b"):
        if key == "b":
            assert child.run(("reset", "b", "textarena", given, row), 30) == ("ok", opening)
        replies.append(child.run(("step", key, "[4]"), 10)[1]["observation"])
    assert replies[0] == replies[1] and "Player 0 placed their symbol (O) in cell 4." in replies[0]
    assert "[Player 1]" in replies[0] and "Player 1 placed their symbol (X)" in replies[0]
    scripted = {**given, "opponent": "tests.helpers.opponents:lowest"}
    assert child.run(("reset", "s", "textarena", scripted, row), 30)[0] == "ok"
    reply = child.run(("step", "s", "[4]"), 10)[1]["observation"]
    assert "Player 1 placed their symbol (X) in cell 0." in reply
    for move in ("[8]", "[7]"):  # X takes 0, 1, 2 (the lowest free cells): player 0 loses
        last = child.run(("step", "s", move), 10)[1]
    assert last["done"] and last["reward"] == -1.0


def test_options_are_checked_before_start():
    adapter = load("textarena")
    with pytest.raises(EnvironmentLoadError, match=r"environment.options: textarena has no game 'Chess' \(some of its"):
        options(adapter, {"env": "Chess"})
    with pytest.raises(EnvironmentLoadError, match=r"opponent='tests.helpers.nowhere:f': cannot import"):
        options(adapter, {"opponent": "tests.helpers.nowhere:f"})
    with pytest.raises(EnvironmentLoadError, match=r"environment.options.num_players: Input should be greater"):
        options(adapter, {"num_players": 0})


@pytest.mark.slow
def test_a_run_plays_the_games_of_a_textarena_spec(tmp_path):
    """`train` on textarena:// rows with the adapter, nothing else written: each group's prompt is its row's
    instructions and the game's opening, the game's reward is the episode's, validation counts won games."""
    import json

    from tests.conftest import run_cli

    out = tmp_path / "run"
    res = run_cli(
        "train",
        "recipes/tiny-cpu.yaml",
        "data.train_files=textarena://GuessTheNumber-v0?size=16&seed=0",
        "data.val_files=[textarena://GuessTheNumber-v0?size=4&seed=1000]",
        "data.answer_key=''",
        "data.max_prompt_length=600",
        "environment.name=textarena",
        "environment.max_tokens=64",
        "generator.sampling.max_tokens=8",
        "reward.functions=[]",
        "trainer.total_steps=2",
        f"trainer.output_dir={out}",
    )
    assert res.returncode == 0, res.stderr[-3000:]
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert "val/textarena/GuessTheNumber-v0/pass@1" in steps[-1] and steps[-1]["env/errors"] == 0
    dump = [json.loads(line) for line in (out / "rollouts" / "train_data_step2.jsonl").read_text().splitlines()]
    assert all("You are playing a text game." in d["prompt"] for d in dump)
    assert all("You are playing Guess The Number." in d["prompt"] for d in dump)
    seeds = {d["uid"] for d in dump}
    assert len(seeds) == len(dump)  # a group a game
    rewards = [s["rewards"]["environment"] for d in dump for s in d["samples"]]
    assert set(rewards) <= {0.0, 1.0}
