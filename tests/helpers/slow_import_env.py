"""An environment whose module takes 2 s to import (as a library that pulls in a web stack does)."""

import time

from grpo_ray.envs import Environment, Step

time.sleep(2)


class Slow(Environment):
    def reset(self, row):
        pass

    def step(self, turn):
        return Step("ok", done=True)
