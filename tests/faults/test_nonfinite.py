"""Item 4: a non-finite loss skips the optimizer step and the weight push; K such steps in a row stop the run."""

import pytest

from tests.faults.conftest import Run, dump, metrics

pytestmark = pytest.mark.slow


def test_one_nan_step_is_skipped_and_the_run_goes_on(nan_run):
    """One step off (on-policy skips in test_k_nan_steps_in_a_row_stop_the_run); the run tests/faults/test_secrets.py
    reads too."""
    out, output, _ = nan_run
    m = {row["step"]: row for row in metrics(out)}
    assert [m[s]["fault/skipped_steps"] for s in (1, 2, 3, 4)] == [0, 1, 1, 1]
    assert m[2]["actor/skipped_updates"] == m[2]["actor/updates"] == 1
    assert "sync/logprob_diff" not in m[2] and "sync/logprob_diff" in m[3]  # step 2's weights were not pushed
    # one step off: batch k+1 is sampled during step k, with what step k-1 pushed (step 2 pushed nothing)
    assert [{row["policy_version"] for row in dump(out, s)} for s in (2, 3, 4)] == [{0}, {1}, {1}]
    assert "non-finite loss or gradients: update skipped" in output


def test_k_nan_steps_in_a_row_stop_the_run(tmp_path, faults_env):
    """Its first start of a local Ray cluster fails as Ray's does on a busy machine (grpo_ray.jobs.launch.start_local):
    the start is tried again, said in one line, and the run goes on (no run of its own for that)."""
    out = tmp_path / "run"
    run = Run(
        out,
        ["trainer.total_steps=8", "trainer.max_skipped_steps=3"],
        {**faults_env, "GRPO_RAY_FAULTS": "nan_loss@2,nan_loss@3,nan_loss@4,ray_start_timeout@1"},
    )
    assert run.wait() == 1, run.output()[-3000:]
    assert run.output().count("Ray's local start timed out") == 1 and "starting it again (2 of 3)" in run.output()
    assert run.output().count("Ray up: a local cluster") == 1
    assert "3 steps in a row had non-finite loss or gradients (trainer.max_skipped_steps=3)" in run.output()
    assert "Traceback" not in run.output()
    assert [row["step"] for row in metrics(out)] == [1, 2, 3]  # the third bad step is not logged as done
    m = {row["step"]: row for row in metrics(out)}  # on-policy: a skipped update pushes nothing
    assert [m[s]["fault/skipped_steps"] for s in (1, 2, 3)] == [0, 1, 2]
    assert "sync/logprob_diff" in m[1] and "sync/logprob_diff" not in m[2] and "sync/logprob_diff" not in m[3]
