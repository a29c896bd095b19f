"""Reward actors: failures and time-outs are counted and score 0; the step goes on."""

import time

import pytest

from grpo_ray.roles.reward import RewardWorker
from grpo_ray.types import Completion, Prompt, Rollout

pytestmark = pytest.mark.slow


def rollout(truths_and_texts):
    prompts = [Prompt([1, 2], truth, "test") for truth, _ in truths_and_texts]
    comps = [Completion(i, [3], text, [], "stop") for i, (_, text) in enumerate(truths_and_texts)]
    return Rollout(prompts, comps, 0)


def test_raising_hanging_and_dying_rewards_score_zero_and_are_counted(ray_local):
    worker = ray_local.remote(RewardWorker).options(num_cpus=0.25).remote(
        [("tests.helpers.odd_rewards:odd", 0.5), ("gsm8k", 1.0)], 3.0, "#### ")
    ro = rollout([("7", "7"), ("raise", "x"), ("hang", "y"), ("8", "8"), ("exit", "z"), ("9", "1")])
    start = time.perf_counter()
    scores = ray_local.get(worker.score.remote([ray_local.put(ro)]), timeout=120)
    elapsed = time.perf_counter() - start
    # odd() sees "#### 7" (the response prefix is part of what rewards see), so it pays 0; gsm8k pays 1
    assert scores.components["gsm8k"] == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    assert scores.components["tests.helpers.odd_rewards:odd"] == [0.0] * 6
    assert scores.totals == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    assert scores.errors == 1      # the raise
    assert scores.timeouts == 2    # the hang, and the process that died (its result never comes)
    assert elapsed < 30            # two 3 s limits and a fresh child each, not a 120 s hang
    # the worker is still usable afterwards
    again = ray_local.get(worker.score.remote([ray_local.put(rollout([("5", "5")]))]), timeout=60)
    assert again.totals == [1.0] and again.timeouts == 0
