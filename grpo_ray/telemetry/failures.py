"""User code's failures during a run (reward functions, the environment, a judge's replies): the first of each kind
said once on the console, the rest counted in metrics and kept in the pool's logs; a run of steps that fail on too
many samples (``reward.max_error_share``, ``reward.max_error_steps``) stops the run with the failure."""

from __future__ import annotations

from collections.abc import Callable

from grpo_ray.config import GENERATOR, RULES
from grpo_ray.errors import RunError


class Failures:
    def __init__(self, say: Callable[[str], None], log_dir: Callable[[], object], reward, environment: str = ""):
        """`reward`: the recipe's reward section (its error limits); `environment`: environment.name."""
        self.say, self.log_dir, self.w, self.environment = say, log_dir, reward, environment
        self.first: dict[str, str] = {}
        """The first failure of each user function (a reward function, the environment by kind, the judge), shown
        once on the console, by what failed."""
        self.failing_steps: dict[str, int] = {}
        """Per kind of user code (reward functions, the environment, the judge), the steps in a row over
        reward.max_error_share."""

    def rewards(self, scores: list, counted: bool = True) -> list:
        """`scores`, after showing the first failure of each reward function once; a training batch (`counted`)
        whose functions failed on more than reward.max_error_share of its samples max_error_steps times in a row
        stops the run with the failure."""
        for name, text in ((n, t) for s in scores for n, t in s.failures.items()):
            self.show_first(f"reward {name}", "counted in reward/errors and reward/timeouts", RULES, text)
        if counted:
            share = sum(s.errors + s.timeouts for s in scores) / sum(len(s.totals) for s in scores)
            self.count("reward functions", share, "reward ")
        return scores

    def episodes(self, stats: list, counted: bool = True) -> None:
        """Multi-turn rollouts: the environment's first failure of each kind shown once; a training batch
        (`counted`) whose trajectories failed (an error, a timeout, a lost process) over reward.max_error_share
        max_error_steps times in a row stops the run, as failing reward functions do."""
        env = self.environment
        for s in stats:
            for kind, text in s.failures.items():
                where = "env/opening_mismatches" if kind == "opening" else "env/errors and env/timeouts"
                self.show_first(f"environment {env} ({kind})", f"counted in {where}", GENERATOR, text)
        values = [s.env for s in stats if s.env]
        if counted and values:
            failed = sum(sum(v["errors"]) + sum(v["timeouts"]) for v in values)
            self.count(f"environment {env}", failed / sum(sum(v["trajectories"]) for v in values), "environment ")

    def show_first(self, what: str, counted: str, pool: str, text: str) -> None:
        """Say `what` failed with its first failure `text`, once a run; the next are `counted` in metrics and kept
        in the `pool`'s logs."""
        if what in self.first:
            return
        self.first[what] = text
        self.say(
            f"{what} failed; its first failure (the next are {counted}, logs in {self.log_dir()}/{pool}-*.log):\n"
            f"{text.rstrip()}"
        )

    def count(self, what: str, share: float, prefix: str) -> None:
        """One more step in a row where `what` (user code) failed on over reward.max_error_share of the samples, or
        none; reward.max_error_steps of them stop the run with the last first failure whose key starts `prefix`."""
        w = self.w
        n = self.failing_steps[what] = self.failing_steps.get(what, 0) + 1 if share > w.max_error_share else 0
        if w.max_error_steps and n >= w.max_error_steps:
            last = next((t for k, t in reversed(self.first.items()) if k.startswith(prefix)), "")
            raise RunError(
                f"{what} failed on {share:.0%} of the samples, over reward.max_error_share={w.max_error_share:g} for "
                f"{n} steps in a row (reward.max_error_steps): fix it, or raise the limits. Its failure:\n"
                f"{last.rstrip()}"
            )
