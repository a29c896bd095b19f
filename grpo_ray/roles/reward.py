"""The reward role: CPU-only actors scoring responses with the recipe's reward functions.

Each sample is scored in a child process (a one-process pool) under a time limit. A
function that raises scores 0 for its component and counts in ``errors``; a sample
past the limit scores 0 everywhere and counts in ``timeouts``, and the child is
replaced, so a hung function cannot hold the step.
"""

from __future__ import annotations

import multiprocessing as mp
import time

from grpo_ray.rewards import weighted_sum
from grpo_ray.rewards.runner import score_one
from grpo_ray.roles import RoleActor
from grpo_ray.types import Scores


class RewardWorker(RoleActor):
    def __init__(self, functions: list[tuple[str, float]], timeout_s: float, response_prefix: str = ""):
        self.functions, self.timeout_s, self.prefix = functions, timeout_s, response_prefix
        self.pool = self._new_pool()

    def _new_pool(self):
        return mp.get_context("spawn").Pool(1)

    def score(self, rollout_refs: list) -> Scores:
        """Scores of every completion of the rollouts behind `rollout_refs`, in order."""
        import ray

        rollouts = ray.get(rollout_refs)
        start = time.perf_counter()  # after the rollout arrived: waiting for generation is not reward work
        tasks = []
        for rollout in rollouts:
            for c in rollout.completions:
                p = rollout.prompts[c.prompt]
                extra = {"data_source": p.data_source, "extra_info": p.extra_info}
                tasks.append((self.functions, self.prefix + c.text, p.ground_truth, extra))
        results: list[tuple[dict[str, float], int] | None] = [None] * len(tasks)
        timeouts, i = 0, 0
        while i < len(tasks):
            pending = [self.pool.apply_async(score_one, t) for t in tasks[i:]]
            for offset, job in enumerate(pending):
                try:
                    results[i + offset] = job.get(timeout=self.timeout_s)
                except mp.TimeoutError:
                    timeouts += 1
                    self.pool.terminate()
                    self.pool = self._new_pool()
                    i += offset + 1  # resubmit what came after the hung sample
                    break
            else:
                i = len(tasks)
        zeros = {name: 0.0 for name, _ in self.functions}
        components = {name: [] for name, _ in self.functions}
        totals, errors = [], 0
        for res in results:
            comp, err = res if res is not None else (zeros, 0)
            errors += err
            for name, _ in self.functions:
                components[name].append(comp[name])
            totals.append(weighted_sum(comp, self.functions))
        return Scores(totals, components, errors, timeouts, time.perf_counter() - start)

    def shutdown(self) -> None:
        self.pool.terminate()
