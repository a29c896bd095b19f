"""The reward role: CPU-only actors scoring responses with the recipe's reward functions.

A multi-turn trajectory (``grpo_ray.rollouts.episodes``) is scored on its last turn, its answer, and its environment's
reward is one more component, ``environment``, of weight 1.

Each sample is scored in a child process under a time limit and a memory limit, sandboxed where
the OS allows (``grpo_ray.sandbox``). A function that raises or returns a non-finite number
scores 0 for its component and counts in ``errors``; a sample whose child hangs (past the time
limit), exits or runs out of memory scores 0 everywhere and counts in ``timeouts`` (hung) or
``errors`` (exited, out of memory), and the child is replaced, so the step always completes. The
first failure of each function is written to the actor's log and handed to the controller, which
shows it on the console.
"""

from __future__ import annotations

import math
import sys
import time

from grpo_ray import rewards
from grpo_ray.algo.batching import Span, samples
from grpo_ray.config import RULES, RewardConfig
from grpo_ray.faults import lost_at
from grpo_ray.rewards import search_here, weighted_sum
from grpo_ray.rewards.child import RewardChild
from grpo_ray.rewards.runner import scores
from grpo_ray.roles import RoleActor, Seat, log_to_file
from grpo_ray.sandbox import Jail
from grpo_ray.types import Scores

ENVIRONMENT = "environment"
"""The reward component of a multi-turn trajectory's environment (the sum of its rewards), weight 1."""
LOST = {
    "timeout": "ran past reward.timeout_s",
    "died": "exited (a crash, os._exit, or killed)",
    "memory": "ran out of memory (reward.memory_mb)",
}


class RewardWorker(RoleActor):
    @classmethod
    def start_args(cls, seat: Seat) -> tuple:
        """The reward functions and the code they are imported from; whether samples are an environment's
        trajectories, and whether a reward model's row styles are handed on."""
        r = seat.recipe
        code = rewards.shipped([f.name for f in r.reward.functions])
        styles = r.reward_model.by_style and bool(r.reward_model.model)
        return (r.reward, r.data.response_prefix, code, bool(r.environment.name), styles)

    def __init__(
        self,
        reward: RewardConfig,
        response_prefix: str = "",
        code: tuple[dict, list] = ({}, []),
        environment: bool = False,
        styles: bool = False,
    ):
        """The recipe's reward section; `code`: the text of each file-form function and the directories module
        forms are imported from (``grpo_ray.rewards.shipped``); `environment`: samples are multi-turn
        trajectories, whose environment's reward is a component; `styles`: each completion's row style is handed
        back (reward_model.by_style)."""
        log_to_file()
        sources, dirs = code
        search_here(*dirs)  # before the child starts: it is spawned with this sys.path
        self.functions = [(f.name, f.weight) for f in reward.functions]
        self.calls = rewards.calls(reward.functions)
        self.weights = self.functions + ([(ENVIRONMENT, 1.0)] if environment else [])
        self.timeout_s, self.prefix = reward.timeout_s, response_prefix
        self.child = RewardChild(Jail.of(reward), sources)
        self.reported: set[str] = set()
        self.styles = styles
        self.asked = 0
        """Calls of ``score`` so far (the fault tests' count)."""

    def isolation(self) -> str:
        """What the reward child is isolated from (``grpo_ray.sandbox``'s layers, and what is missing)."""
        return self.child.isolation

    def score(self, rollout_refs: list, spans: list[Span] | None = None) -> Scores:
        """Scores of the completions of the rollouts behind `rollout_refs` (those in `spans` of each, or all),
        in order."""
        import ray

        self.asked += 1
        lost_at(RULES, self.asked)  # fault test: the actor dies as its share is asked for
        return self.score_rollouts(ray.get(rollout_refs), spans)

    def score_rollouts(self, rollouts: list, spans: list[Span] | None = None) -> Scores:
        """``score`` on rollouts at hand (plan's calibration scores some without Ray)."""
        start = time.perf_counter()  # after the rollout arrived: waiting for generation is not reward work
        components = {name: [] for name, _ in self.weights}
        totals, errors, timeouts, first, extras = [], 0, 0, {}, []
        pairs = list(samples(rollouts, spans))
        tasks = [
            # a trajectory's answer is its last turn (after the response prefix only when it is the first)
            (
                self.calls,
                self.prefix + c.text if not c.episode or len(c.episode.turns) == 1 else c.episode.turns[-1],
                p.ground_truth,
                {"data_source": p.data_source, "extra_info": p.extra_info},
            )
            for p, c in pairs
        ]
        outcomes = (
            self.child.run_many(tasks, self.timeout_s) if self.functions else [("ok", ({}, 0, False, {}))] * len(tasks)
        )
        for (p, c), (outcome, result) in zip(pairs, outcomes):
            comp, failed, failures = (
                (result[0], result[1], result[3])
                if outcome == "ok"
                else (self.zeros(p.data_source), 1, {"(the reward child)": f"scoring a sample, it {LOST[outcome]}"})
            )
            errors += failed if outcome != "timeout" else 0
            timeouts += outcome == "timeout"
            for name, text in failures.items():
                if name not in self.reported:  # each function's first failure, once per actor
                    self.reported.add(name)
                    first[name] = text
                    print(f"reward {name} failed on a {p.data_source} sample:\n{text}", file=sys.stderr, flush=True)
            if c.episode:
                comp = {**comp, ENVIRONMENT: c.episode.reward}
            for name, _ in self.weights:
                components[name].append(comp[name])
            extras.append({k: v for k, v in comp.items() if k not in components})
            totals.append(weighted_sum(comp, self.weights))
        named = sorted({k for e in extras for k in e})
        return Scores(
            totals,
            components,
            errors,
            timeouts,
            time.perf_counter() - start,
            first,
            {k: [e.get(k, math.nan) for e in extras] for k in named},
            [p.style for p, _ in pairs] if self.styles else [],
        )

    def zeros(self, data_source: str) -> dict[str, float]:
        """The scores of a sample the child lost: 0, NaN from a function that does not score its source."""
        return {name: 0.0 if scores(srcs, data_source) else math.nan for name, srcs, _ in self.calls}

    def shutdown(self) -> None:
        self.child.close()
