"""Reward functions that misbehave on purpose, selected by the ground truth."""

import os
import socket
import time


def odd(response: str, ground_truth: str, **extra) -> float:
    if ground_truth == "raise":
        raise ValueError("reward code bug")
    if ground_truth == "hang":
        time.sleep(120)
    if ground_truth == "exit":
        os._exit(3)
    if ground_truth == "memory":
        blob = bytearray(16 << 30)  # 16 GiB: past any sane reward memory limit
        return float(len(blob))
    if ground_truth == "nan":
        return float("nan")
    if ground_truth.startswith("connect:"):  # pays 1 only when the network is reachable
        host, port = ground_truth.removeprefix("connect:").rsplit(":", 1)
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
            return 1.0
        except OSError:
            return 0.0
    if ground_truth.startswith("write:"):  # pays 1 only when the file could be written
        try:
            with open(ground_truth.removeprefix("write:"), "w") as f:
                f.write("written by reward code")
            return 1.0
        except OSError:
            return 0.0
    if ground_truth == "scratch":  # writing in the working directory (the scratch dir) is allowed
        with open("scratch.txt", "w") as f:
            f.write("ok")
        return 1.0
    return 1.0 if response.strip() == ground_truth else 0.0
