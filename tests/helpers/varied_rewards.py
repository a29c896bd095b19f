"""Users' rewards that ignore what the model knows. `half`: half the responses (by a hash of their text)
score 1, varying within a group: runs that must train from random weights (a delta that changes, groups that DAPO
keeps) use it. `flat`: every response scores 1."""

import zlib


def half(response: str, ground_truth: str, **extra) -> float:
    return float(zlib.crc32(response.encode()) % 2)


def flat(response: str, ground_truth: str, **extra) -> float:
    """The same score for every response: every group's advantages 0 (a signal beside the reward is all that trains)."""
    return 1.0
