"""A reward module that is found and whose own import of something else fails (for the bad-input sweep)."""

import no_such_dependency_of_a_reward  # noqa: F401


def score(response, ground_truth, **extra):
    return 0.0
