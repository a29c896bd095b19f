"""Reward functions that misbehave on purpose, selected by the ground truth."""

import os
import time


def odd(response: str, ground_truth: str, **extra) -> float:
    if ground_truth == "raise":
        raise ValueError("reward code bug")
    if ground_truth == "hang":
        time.sleep(120)
    if ground_truth == "exit":
        os._exit(3)
    return 1.0 if response.strip() == ground_truth else 0.0
