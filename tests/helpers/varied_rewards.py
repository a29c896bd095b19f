"""A user's reward that varies within a group whatever the model knows: half the responses (by a hash of their text)
score 1. Runs that must train from random weights (a delta that changes, groups that DAPO keeps) use it."""

import zlib


def half(response: str, ground_truth: str, **extra) -> float:
    return float(zlib.crc32(response.encode()) % 2)
