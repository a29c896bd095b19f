"""The batched schedule's rules (grpo_ray/schedules/batched.py), run as the controller runs them: each step's batch
is generated with the weights of the last push sent before it was launched, so the rules alone say how stale every
batch is."""

import pytest

from grpo_ray import schedules
from grpo_ray.config import load_recipe

RECIPE = "recipes/tiny-cpu.yaml"


def staleness(k: int, steps: int, save_freq: int = 0, test_freq: int = 0) -> tuple[list[int], list[bool]]:
    """Each step's staleness (the learner's version less its batch's) and whether weights were pushed after it."""
    schedule = schedules.of(load_recipe(RECIPE, [f"algorithm.max_staleness={k}"]).algorithm)
    learner = engines = 0
    ahead: dict[int, int] = {}  # step -> the engines' version its batch was launched with
    out, pushed = [], []
    for step in range(1, steps + 1):
        saving = bool(save_freq and (step % save_freq == 0 or step == steps))
        validating = bool(test_freq and (step % test_freq == 0 or step == steps))
        generated = ahead.pop(step, engines)
        if schedule.launches_ahead(step, steps, saving):
            ahead[step + 1] = engines  # sent before this step's push, so generated with the weights before it
        out.append(learner - generated)
        learner += 1
        pushed.append(schedule.push_due(learner - engines, validating, saving))
        if pushed[-1]:
            engines = learner
    return out, pushed


def test_on_policy_trains_every_batch_on_the_weights_that_made_it():
    assert staleness(0, 6) == ([0] * 6, [True] * 6)


def test_one_step_off_is_one_version_behind_except_after_a_checkpoint():
    """tests/test_async.py's run (4 steps, a checkpoint every 2) measured [0, 1, 0, 1]: these rules say the same."""
    assert staleness(1, 4, save_freq=2)[0] == [0, 1, 0, 1]
    assert staleness(1, 6)[0] == [0, 1, 1, 1, 1, 1]


@pytest.mark.parametrize("k", [1, 2, 3, 8])
def test_no_batch_is_older_than_the_bound_and_the_bound_is_used(k):
    ages, pushed = staleness(k, 40)
    assert max(ages) == k and min(ages[1:]) >= 1
    # a push every k steps: each batch launched ahead then lags by 1 to k versions, never more
    assert [step for step, p in enumerate(pushed, 1) if p] == list(range(k, 41, k))


def test_validation_and_checkpoints_get_the_current_weights():
    _, pushed = staleness(3, 10, save_freq=5, test_freq=4)
    assert pushed[3] and pushed[4] and pushed[7] and pushed[9]  # after steps 4 and 8 (validation), 5 and 10 (saves)


def test_the_old_policy_is_recomputed_only_where_the_trained_forward_cannot_give_it():
    schedule = schedules.of(load_recipe(RECIPE, []).algorithm)
    assert not schedule.recomputes_old_policy(mini_batches=1, stale=False)  # one update on its own samples
    assert schedule.recomputes_old_policy(mini_batches=2, stale=False)
    assert schedule.recomputes_old_policy(mini_batches=1, stale=True)
    bypass = schedules.of(load_recipe(RECIPE, ["algorithm.rollout_correction.bypass_mode=true"]).algorithm)
    assert not bypass.recomputes_old_policy(mini_batches=2, stale=True)


def test_the_planner_counts_the_old_policy_where_the_learner_runs_it():
    """plan's old-policy phase is zero exactly where the schedule says the learner does not recompute: on-policy
    with one mini batch, or in bypass mode; one step off it is there."""
    from grpo_ray.planner import speed
    from tests.test_speed import DIMS, known_rates, tiny_recipe

    def old_policy(*overrides):
        p = speed.predict(tiny_recipe(*overrides), DIMS, known_rates(), speed.Shape(3, 2), node_cpus=2)
        return p.phases["old policy"].seconds

    assert old_policy() == 0.0
    assert old_policy("algorithm.max_staleness=1") > 0
    assert old_policy("algorithm.max_staleness=1", "algorithm.rollout_correction.bypass_mode=true") == 0.0


class EveryOther(schedules.Schedule):
    """A user's own schedule (this module is importable as tests.test_schedule): on-policy, weights pushed every
    second step only (so odd steps train samples one version old), the old policy always recomputed."""

    def overlapping(self):
        return False

    def launches_ahead(self, step, last_step, saving):
        return False

    def push_due(self, behind, validating, saving):
        return behind >= 2 or validating or saving

    def recomputes_old_policy(self, mini_batches, stale):
        return True

    def keeps_older_weights(self):
        return True


def test_a_schedule_is_a_recipe_value_and_a_users_own_is_one_class(tmp_path):
    """algorithm.schedule names a schedule or a user's module:Class; one that is not a Schedule is refused before
    start with one line."""
    from grpo_ray.cli import main

    own = schedules.of(load_recipe(RECIPE, ["algorithm.schedule=tests.test_schedule:EveryOther"]).algorithm)
    assert isinstance(own, EveryOther) and own.push_due(2, False, False) and not own.push_due(1, False, False)
    assert isinstance(schedules.of(load_recipe(RECIPE, []).algorithm), schedules.SCHEDULES["batched"])
    out = tmp_path / "run"
    code = main(["train", RECIPE, "algorithm.schedule=tests.test_schedule:staleness", f"trainer.output_dir={out}"])
    assert code == 2 and not out.exists()
