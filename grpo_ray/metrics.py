"""Step metrics: reductions of the small things the controller gathers, and the loggers that write them."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from grpo_ray.types import RolloutStats, Scores

CONSOLE_KEYS = ("critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/kl_loss", "actor/entropy",
                "actor/grad_norm", "sync/logprob_diff", "timing_s/step")


def rollout_metrics(stats: list[RolloutStats], scores: list[Scores], max_tokens: int) -> dict[str, float]:
    """Score, reward-component, length and timing metrics of one step."""
    totals = [t for s in scores for t in s.totals]
    responses = [n for s in stats for n in s.response_lengths]
    prompts = [n for s in stats for n in s.prompt_lengths]
    out = {
        "critic/score/mean": statistics.fmean(totals),
        "critic/score/max": max(totals),
        "critic/score/min": min(totals),
        "response_length/mean": statistics.fmean(responses),
        "response_length/max": max(responses),
        "response_length/clip_ratio": sum(n >= max_tokens for n in responses) / len(responses),
        "prompt_length/mean": statistics.fmean(prompts),
        "global_seqlen/mean": statistics.fmean(p + r for p, r in zip(prompts, responses)),
        "reward/errors": sum(s.errors for s in scores),
        "reward/timeouts": sum(s.timeouts for s in scores),
        "rollout/policy_version": min(s.policy_version for s in stats),
        "timing_s/gen": max(s.seconds for s in stats),
        "timing_s/reward": max(s.seconds for s in scores),
    }
    for name in scores[0].components:
        out[f"reward/{name}/mean"] = statistics.fmean(v for s in scores for v in s.components[name])
    return out


class MetricsLog:
    """Writes each step's metrics to the loggers the recipe names: console, jsonl, tensorboard."""

    def __init__(self, output_dir: Path, loggers: list[str]):
        self.console = "console" in loggers
        self.jsonl = open(output_dir / "metrics.jsonl", "a") if "jsonl" in loggers else None
        self.tb = None
        if "tensorboard" in loggers:
            from tensorboardX import SummaryWriter

            self.tb = SummaryWriter(str(output_dir / "tensorboard"))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if self.console:
            shown = " ".join(f"{k}:{metrics[k]:.4g}" for k in CONSOLE_KEYS if k in metrics)
            print(f"step:{step} {shown}", flush=True)
        if self.jsonl:
            self.jsonl.write(json.dumps({"step": step, **metrics}) + "\n")
            self.jsonl.flush()
        if self.tb:
            for k, v in metrics.items():
                self.tb.add_scalar(k, v, step)
            self.tb.flush()

    def close(self) -> None:
        if self.jsonl:
            self.jsonl.close()
        if self.tb:
            self.tb.close()
