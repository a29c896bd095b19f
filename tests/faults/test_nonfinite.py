"""Item 4: a non-finite loss skips the optimizer step and the weight push; K such steps in a row stop the run."""

import pytest

from tests.faults.conftest import SCHEDULES, Run, dump, metrics

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("schedule", ["one-step-off"])  # on-policy skips in test_k_nan_steps_in_a_row_stop_the_run
def test_one_nan_step_is_skipped_and_the_run_goes_on(tmp_path, faults_env, schedule):
    out = tmp_path / "run"
    run = Run(out, ["trainer.total_steps=4", *SCHEDULES[schedule]], {**faults_env, "GRPO_RAY_FAULTS": "nan_loss@2"})
    assert run.wait() == 0, run.output()[-3000:]
    m = {row["step"]: row for row in metrics(out)}
    assert [m[s]["fault/skipped_steps"] for s in (1, 2, 3, 4)] == [0, 1, 1, 1]
    assert m[2]["actor/skipped_updates"] == m[2]["actor/updates"] == 1
    assert "sync/logprob_diff" not in m[2] and "sync/logprob_diff" in m[3]  # step 2's weights were not pushed
    # on-policy: step 1 pushes 1; step 2 pushes nothing; step 3 samples with 1 and pushes 2; step 4 samples with 2.
    # one step off: batch k+1 is sampled during step k, with what step k-1 pushed
    versions = {"on-policy": [{1}, {1}, {2}], "one-step-off": [{0}, {1}, {1}]}[schedule]
    assert [{row["policy_version"] for row in dump(out, s)} for s in (2, 3, 4)] == versions
    assert "non-finite loss or gradients: update skipped" in run.output()


def test_k_nan_steps_in_a_row_stop_the_run(tmp_path, faults_env):
    out = tmp_path / "run"
    run = Run(
        out,
        ["trainer.total_steps=8", "trainer.max_skipped_steps=3"],
        {**faults_env, "GRPO_RAY_FAULTS": "nan_loss@2,nan_loss@3,nan_loss@4"},
    )
    assert run.wait() == 1, run.output()[-3000:]
    assert "3 steps in a row had non-finite loss or gradients (trainer.max_skipped_steps=3)" in run.output()
    assert "Traceback" not in run.output()
    assert [row["step"] for row in metrics(out)] == [1, 2, 3]  # the third bad step is not logged as done
    m = {row["step"]: row for row in metrics(out)}  # on-policy: a skipped update pushes nothing
    assert [m[s]["fault/skipped_steps"] for s in (1, 2, 3)] == [0, 1, 2]
    assert "sync/logprob_diff" in m[1] and "sync/logprob_diff" not in m[2] and "sync/logprob_diff" not in m[3]
