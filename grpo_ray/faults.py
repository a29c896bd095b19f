"""Fault injection for the fault tests: ``GRPO_RAY_FAULTS="point@N[,point@N...]"``.

A named point in the code asks ``fault_at(point, n)``; it is true the first time that point is
reached at step (or weight version) N, if the environment lists it -- once per run: the first
process to get there leaves a marker in ``GRPO_RAY_FAULTS_DIR``, so a replaced actor or a resumed
job does not fail again. Nothing else is faked: the processes really exit, the loss really is NaN.

    nan_loss@N            the learner's loss is NaN at its step N (so are the gradients: the update is skipped)
    exit_mid_sync@N       a generator exits after the first bucket of weight version N
    stale_prefix_cache@N  a generator keeps its prefix cache across the push of weight version N
    skew_weights@N        a generator loads weight version N scaled by 1.5 (the probe after the push must see it)
    exit_mid_stream@N     a streaming generator exits when asked for groups at weight version N, groups in flight
    exit_mid_checkpoint@N the driver exits after the learners wrote step N's shards, before the commit
    exit_reward_model@N   the last reward-model actor exits at its N-th scoring call
    exit_reference@N      the last reference actor exits at its N-th scoring call (exit_teacher@N: the teacher's)
    exit_reward@N         the first rule-reward actor to be asked for its N-th share exits
    exit_learner@N        the last learner rank exits after its first optimizer step of its N-th step
    exit_learner_push@N   the last learner rank exits as it starts to push weight version N
    exit_learner_save@N   the last learner rank exits as it starts to save a checkpoint after its N-th step
    exit_learner_copy@N   the last learner rank exits as it first copies its state with N steps done (the copy
                          of step N's checkpoint where one is saved, else the copy as step N + 1 starts): the copy
                          never reaches the keeper
    exit_generator@N      an engine holding weight version N exits as it is asked for a batch (batched schedule)
    hold_<pool>@N         where exit_<pool>@N exits, waits instead, for a test to remove its node (its marker
                          file says when)
    hang_judge@N          the first judge actor hangs at its N-th call (past reward_model.judge.timeout_s)
    ray_start_timeout@N   the driver's N-th try to start a local Ray cluster fails as Ray's does when its raylet
                          gives up on a slow dashboard agent (the one fault raised here, not met for real: Ray's
                          15 s wait cannot be made to pass on demand)
"""

from __future__ import annotations

import os
import time

ENV, DIR_ENV = "GRPO_RAY_FAULTS", "GRPO_RAY_FAULTS_DIR"


def fault_at(point: str, n: int) -> bool:
    name = f"{point}@{n}"
    if name not in os.environ.get(ENV, "").replace(" ", "").split(","):
        return False
    try:
        os.close(os.open(os.path.join(os.environ.get(DIR_ENV, "."), name), os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False


def lost_at(pool: str, n: int, here: bool = True) -> None:
    """A pool's points at its `n`-th call (or step), on the actor where `here`: ``exit_<pool>@n`` exits the process;
    ``hold_<pool>@n`` waits there, for a test to remove its node (its marker file says when)."""
    if here and fault_at(f"exit_{pool}", n):
        os._exit(1)
    if here and fault_at(f"hold_{pool}", n):
        time.sleep(600)
