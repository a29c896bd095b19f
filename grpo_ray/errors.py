"""The one error type for user mistakes: the CLI prints its message, without a traceback, and exits 2."""


class UserError(ValueError):
    """Something the user gave (recipe, data, model name, reward) that cannot be used; the message says what to fix."""


class RunError(RuntimeError):
    """The run cannot go on (a pool call failed past recovery, a weight sync went wrong); the message says which."""


class Preempted(RunError):
    """SIGTERM (a preemption notice): the run stopped after a step, with a checkpoint when one fit in the grace
    period."""


class StateLost(RunError):
    """A pool that keeps copies of its state (the learner, trainer.fault_tolerance=all) lost an actor and no copy
    survived to start it again from (one lost on its way to the keeper): the job starts the run again from its
    newest whole checkpoint (``grpo_ray.jobs.launch.kept_going``)."""
