"""Per-turn credit (``algorithm.adv_estimator: grpo_turn``): each model turn of a multi-turn trajectory gets its own
advantage from its return from that turn on, against the group's returns at the same turn; by hand here, laid on
the turns' tokens in the learner, and end to end in a run whose dumps hold each sample's per-turn advantages."""

import json
import math

import pytest

from grpo_ray.algo.advantage import grpo_turn, per_token, per_turn_advantages, turn_rewards, turn_spans
from tests.conftest import LEAN, run_cli


def by_hand(values: list[float], norm: bool = True) -> list[float]:
    """GRPO's advantage of each of `values` (one group), with the unbiased std, written out."""
    mean = sum(values) / len(values)
    if all(v == values[0] for v in values):
        return [0.0] * len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return [(v - mean) / (std + 1e-6) if norm else v - mean for v in values]


def test_each_turn_is_credited_with_its_return_against_the_groups_at_that_turn():
    # returns from each turn on: A 1.5, 1.0; B 0.0; C 0.5, 0.3, 0.3
    group = [[0.5, 1.0], [0.0], [0.2, 0.0, 0.3]]
    (out,) = grpo_turn([group], True)
    first = by_hand([1.5, 0.0, 0.5])  # turn 0: GRPO on the whole returns
    second = by_hand([1.0, 0.3])  # turn 1: the two trajectories that had one
    assert out[0] == pytest.approx([first[0], second[0]])
    assert out[1] == pytest.approx([first[1]])
    assert out[2] == pytest.approx([first[2], second[1], 0.0])  # turn 2: C alone, nothing to compare with
    (plain,) = grpo_turn([group], False)
    assert plain[0] == pytest.approx([1.5 - 2 / 3, 1.0 - 0.65])
    (equal,) = grpo_turn([[[0.5], [0.5]]], True)
    assert equal == [[0.0], [0.0]]  # a group without signal, as GRPO's


def test_the_rest_of_a_total_is_the_last_turns_and_single_turn_samples_are_grpo():
    """The reward functions' score (the total less the environment's rewards) counts at the last turn; samples of
    one turn each get GRPO's advantages."""
    placed = per_turn_advantages("grpo_turn", [2.0, 0.5], [[0.5, 0.5], [0.5]], 2, False)
    # returns: first 2.0 (turn 0), 1.5 (turn 1: its 0.5 and the functions' 1.0); second 0.5
    assert placed[0] == pytest.approx([0.75, 0.0]) and placed[1] == pytest.approx([-0.75])
    single = per_turn_advantages("grpo_turn", [1.0, 0.0, 0.0, 1.0], [[0.0]] * 4, 4, True)
    assert [a for (a,) in single] == pytest.approx(by_hand([1.0, 0.0, 0.0, 1.0]))


def test_turns_are_the_masks_runs_and_their_tokens_get_their_advantage():
    mask = [1, 1, 0, 0, 1, 0, 1, 1, 1]
    assert turn_spans(mask) == [(0, 2), (4, 5), (6, 9)]
    assert turn_rewards([0.25], mask) == [0.25, 0.0, 0.0]  # an episode that failed before its last steps
    assert turn_rewards([0.1, 0.2, 0.3, 0.4], mask) == [0.1, 0.2, 0.3]
    assert per_token([[1.0, -2.0, 3.0]], [mask]) == [[1.0, 1.0, 0.0, 0.0, -2.0, 0.0, 3.0, 3.0, 3.0]]
    with pytest.raises(ValueError, match="2 per-turn advantages for a trajectory of 3 model turns"):
        per_token([[1.0, 2.0]], [mask])


TWIN = "recipes/tiny-qwen2.5-7b-gsm8k-agent.yaml"
TOOL = [
    "environment.name=tests.helpers.envs:Echo",
    "environment.stop=[a,e,i,o,u]",
    "algorithm.adv_estimator=grpo_turn",
    "trainer.dump_freq=1",
    "trainer.total_steps=2",
    "trainer.val_before_train=false",
    "trainer.test_freq=0",
    # CI's time: the twin's engines and schedule, without its reference pool and second learner rank (3 actors fewer)
    *LEAN,
]


@pytest.mark.slow
@pytest.mark.smoke
def test_a_run_trains_each_turn_on_its_own_advantage(tmp_path):
    """The agent twin (one step off, on 2 engines, one learner rank and no reference: CI's run of a multi-turn
    recipe, checked as every twin is) with a tool that answers and rewards every turn 0.25 (never done; turns end at
    stop strings, the episode at the turn or token limit): each dumped sample's advantage is a list, one per model
    turn of its loss mask, equal to grpo_turn of the dumped rewards at their turns and the reward functions' score
    at the last."""
    from tests.test_recipes import check_twin_run

    out = tmp_path / "run"
    res = run_cli("train", TWIN, *TOOL, f"trainer.output_dir={out}", timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    check_twin_run(TWIN, out, overrides=TOOL)
    several = False
    for line in (out / "rollouts" / "train_data_step2.jsonl").read_text().splitlines():
        group = json.loads(line)["samples"]
        turns = [turn_rewards(s["episode"]["rewards"], s["loss_mask"]) for s in group]
        placed = [[*t[:-1], t[-1] + s["score"] - sum(t)] for s, t in zip(group, turns)]
        returns = [[sum(p[k:]) for k in range(len(p))] for p in placed]
        expected = [[0.0] * len(r) for r in returns]
        for k in range(max(map(len, returns))):
            at = [i for i, r in enumerate(returns) if len(r) > k]
            if len(at) > 1:
                for i, a in zip(at, by_hand([returns[i][k] for i in at])):
                    expected[i][k] = a
        for s, e in zip(group, expected):
            assert s["advantage"] == pytest.approx(e, abs=1e-5)
        several |= any(len(e) > 1 and len(set(e)) > 1 for e in expected)
    assert several  # some trajectory's turns got different advantages
