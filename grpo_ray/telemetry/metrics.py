"""Step metrics: reductions of the small things the controller gathers, and the loggers that write them."""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import textwrap
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from grpo_ray.telemetry import perf
from grpo_ray.types import RolloutStats, Scores, Work

CONSOLE_KEYS = {
    "critic/score/mean": "score",
    "sft/loss": "loss",
    "response_length/mean": "len",
    "actor/kl_loss": "kl",
    "actor/entropy": "ent",
    "actor/grad_norm": "gnorm",
    "sync/logprob_diff": "sync",
    "timing_s/step": "s",
    "reward/errors": "err",
    "reward/timeouts": "tmo",
}
"""The metrics a console step line shows, under a short label (the files keep every metric, by its full name)."""
CONSOLE_WIDTH = 120
LEGEND = textwrap.fill(
    "step lines: "
    + ", ".join(f"{short}={key}" for key, short in CONSOLE_KEYS.items())
    + ", val/SOURCE@k=val/SOURCE/pass@k; every metric by its full name in metrics.jsonl and "
    "TensorBoard",
    CONSOLE_WIDTH,
    subsequent_indent="  ",
)
START = time.time()
"""When the command began (the CLI sets it as it starts): start-up lines count their seconds from here."""


def since_start() -> str:
    """The prefix of a start-up line: seconds since the command began, e.g. ``[ 12.3s]``."""
    return f"[{time.time() - START:5.1f}s]"


def console_line(step: int, metrics: dict[str, float], eta: str = "") -> str:
    """One step on one line of at most CONSOLE_WIDTH columns: the CONSOLE_KEYS under their short labels, the
    failures only when some failed, validation after them (the ones that do not fit are counted)."""
    parts = [f"step:{step}"]
    for key, short in CONSOLE_KEYS.items():
        if key in metrics and (metrics[key] or not key.startswith("reward/")):
            v = metrics[key]
            parts.append(f"{short}:{v:.0f}" if key == "response_length/mean" else f"{short}:{v:.3g}")
    if eta:
        parts.append(f"eta:{eta}")
    vals = [f"{k.replace('/pass@', '@')}:{metrics[k]:.3g}" for k in sorted(metrics) if k.startswith("val/")]
    line = " ".join(parts)
    for i, val in enumerate(vals):
        more = f" +{len(vals) - i - 1} val" if i < len(vals) - 1 else ""
        if len(line) + 1 + len(val) + len(more) > CONSOLE_WIDTH:
            return f"{line} +{len(vals) - i} val"
        line += " " + val
    return line


def eta(seconds: float) -> str:
    """12:34, or 1h02m past an hour."""
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}h{m % 60:02d}m" if m >= 60 else f"{m}:{s:02d}"


def rollout_metrics(stats: list[RolloutStats], scores: list[Scores]) -> dict[str, float]:
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
        "response_length/clip_ratio": sum(s.truncated for s in stats) / len(responses),
        "prompt_length/mean": statistics.fmean(prompts),
        "prompt_length/max": max(prompts),
        "global_seqlen/mean": statistics.fmean(p + r for p, r in zip(prompts, responses)),
        "global_seqlen/max": max(p + r for p, r in zip(prompts, responses)),
        "reward/errors": sum(s.errors for s in scores),
        "reward/timeouts": sum(s.timeouts for s in scores),
        "rollout/policy_version": min(s.policy_version for s in stats),
        "timing_s/gen": max(s.seconds for s in stats),
        "timing_s/reward": max(s.seconds for s in scores),
    }
    out.update(env_metrics([s.env for s in stats if s.env]))
    for name in scores[0].components:  # over the rows each function scores (NaN: a data source it does not)
        values = [v for s in scores for v in s.components[name] if not math.isnan(v)]
        if values:
            out[f"reward/{reward_label(name)}/mean"] = statistics.fmean(values)
    for key in sorted({k for s in scores for k in s.extras}):  # a verl dict's other numbers, where they came
        values = [v for s in scores for v in s.extras.get(key, []) if math.isfinite(v)]
        if values:
            out[f"reward/{reward_label(key)}/mean"] = statistics.fmean(values)
    return out


def reward_label(name: str) -> str:
    """A reward function's name in metrics: a file's by its stem (``my_reward:score``), never the machine's path."""
    path, _, attr = name.rpartition(":")
    return f"{Path(path).stem}:{attr}" if path.endswith(".py") else name


def env_metrics(values: list[dict[str, list[float]]]) -> dict[str, float]:
    """Multi-turn rollouts' metrics from each rollout's values per trajectory (``rollouts.episodes.episode_values``):
    per trajectory (turns, tool calls, the environment's reward), counts (tool errors, environment failures and
    timeouts), shares (trajectories ended by the turn or the token limit, tokens masked out of the loss), tokens per
    model turn and the seconds spent in environment calls (summed over trajectories)."""
    if not values:
        return {}
    t = {k: sum(sum(v[k]) for v in values) for k in values[0]}
    n = max(t["trajectories"], 1)
    return {
        "env/turns/mean": t["turns"] / n,
        "env/tool_calls/mean": t["tool_calls"] / n,
        "env/reward/mean": t["reward"] / n,
        "env/tool_errors": t["tool_errors"],
        "env/errors": t["errors"],
        "env/timeouts": t["timeouts"],
        "env/opening_mismatches": t["opening_mismatches"],
        "env/off_record_calls": t["off_record_calls"],
        "env/ended_by_turns": t["ended_by_turns"] / n,
        "env/ended_by_tokens": t["ended_by_tokens"] / n,
        "env/masked_share": 1 - t["model_tokens"] / max(t["tokens"], 1),
        "env/tokens_per_turn": t["model_tokens"] / max(t["turns"], 1),
        "env/seconds": t["seconds"],
    }


def perf_metrics(
    stats: list[RolloutStats], trained: dict, step_seconds: float, facts: dict, devices: float, recipe
) -> dict[str, float]:
    """Throughput and MFU of the learner (over update time and over the whole step); MFU only where the device's
    peak is known (``perf.device_peak_tflops``), from the FLOPs the learner counted of the forwards it ran
    (``actor/flops``: the update's, and the old-policy pass when it ran, in the layout they ran)."""
    seq_lens = [p + r for s in stats for p, r in zip(s.prompt_lengths, s.response_lengths)]
    flops = trained["actor/flops"]
    update = trained["timing_s/update_actor"] + trained["timing_s/old_log_prob"]
    world = recipe.learner.world_size
    out = {
        "perf/total_num_tokens": sum(seq_lens),
        "perf/throughput": perf.throughput(sum(seq_lens), step_seconds, devices),
    }
    peak = facts["peak_tflops"]
    if peak:  # unknown device and no cluster.peak_tflops: no MFU (said once at start), never a failed run
        out.update(
            {
                "perf/mfu/actor": perf.mfu(flops, update, peak, world),
                "perf/mfu/step": perf.mfu(flops, step_seconds, peak, world),
                "perf/peak_tflops_per_device": peak,
            }
        )
    return out


def pool_metrics(work: dict[str, list[Work]], actors: dict[str, int], step_seconds: float) -> dict[str, float]:
    """Per pool with actors: perf/idle/<pool>, the share of the step its actors had no work (their busy time
    over actors x step time), and perf/work_balance/<pool>, the fewest samples an actor processed over the most
    (1: even; 0: an actor had none)."""
    out = {}
    for pool, done in work.items():
        n = actors.get(pool, 0)
        if not n:
            continue
        counts = [w.samples for w in done] + [0] * (n - len(done))  # actors given no share did nothing
        out[f"perf/idle/{pool}"] = max(0.0, 1 - sum(w.seconds for w in done) / (n * step_seconds))
        out[f"perf/work_balance/{pool}"] = min(counts) / max(counts) if max(counts) else 0.0
    return out


def validation_totals(scores: list[Scores], functions: list) -> tuple[list[float], Callable[[str], float]]:
    """Each validation sample's reward and the reward a sample of a data source that passes has: the reward
    functions' weighted sum and the sum of the positive weights of those that score the source; when no weight is
    positive (the functions are logged while a learned reward trains), their plain sum and their count. A reward
    model's score never decides a pass."""
    if any(f.weight > 0 for f in functions) or not functions:
        return [t for s in scores for t in s.totals], lambda source: sum(
            f.weight for f in functions if f.weight > 0 and f.scores(source)
        )
    names = [f.name for f in functions]
    totals = [
        sum(v for n in names if not math.isnan(v := s.components[n][i])) for s in scores for i in range(len(s.totals))
    ]
    return totals, lambda source: float(sum(f.scores(source) for f in functions))


def validation_metrics(
    sources: list[str], totals: list[float], n: int, perfect: float | Callable[[str], float]
) -> dict[str, float]:
    """val/<data_source>/pass@1, and pass@n when n > 1; a sample passes with the full combined reward (`perfect`:
    the same for every source, or the source's), or, where no reward function scores its source (an environment
    is the reward: a game), with a positive one."""
    correct: dict[str, list[int]] = defaultdict(list)
    for i, source in enumerate(sources):
        full = perfect(source) if callable(perfect) else perfect
        floor = full - 1e-9 if full > 0 else math.ulp(0.0)  # positive, where no function scores the source
        correct[source].append(sum(t >= floor for t in totals[i * n : (i + 1) * n]))
    out = {}
    for source, counts in correct.items():
        out[f"val/{source}/pass@1"] = statistics.fmean(perf.pass_at_k(n, c, 1) for c in counts)
        if n > 1:
            out[f"val/{source}/pass@{n}"] = statistics.fmean(perf.pass_at_k(n, c, n) for c in counts)
    return out


TABLE_ROWS = 16
"""Sample rollouts a tracker gets per validation."""


def sample_table(rollout, totals: list[float]) -> list[dict]:
    """The first TABLE_ROWS samples of a rollout with their rewards, as a tracker's table rows."""
    return [
        {"prompt": rollout.prompts[c.prompt].text, "response": c.text, "reward": reward}
        for c, reward in zip(rollout.completions[:TABLE_ROWS], totals)
    ]


class MetricsLog:
    """Writes each step's metrics to the loggers the recipe names: console, jsonl, tensorboard, and the trackers
    (W&B, MLflow: grpo_ray.telemetry.trackers) given to it. A run resumed
    after step `done` continues the same files, the steps after `done` written again.

    The console gets one line a step of at most CONSOLE_WIDTH columns. On a terminal (or with bar=True) a
    progress bar starts with the first step (steps done, ETA from step times only, current score); elsewhere
    (``ray job submit``, CI, a pipe) each line ends with that ETA instead.
    """

    def __init__(
        self,
        output_dir: Path,
        loggers: list[str],
        total_steps: int = 0,
        done: int = 0,
        trackers=(),
        bar: bool | None = None,
    ):
        output_dir.mkdir(parents=True, exist_ok=True)
        self.output_dir = output_dir
        self.console = "console" in loggers
        self.total_steps = total_steps
        self.use_bar = self.console and sys.stdout.isatty() if bar is None else bar
        self.bar = None
        """The progress bar: made as the first step is logged, so its rate and ETA count steps only."""
        self.first_step: tuple[int, float] | None = None
        """(step, time) of the first step this process logged: the ETA without a bar counts from it."""
        self.jsonl = open(output_dir / "metrics.jsonl", "a") if "jsonl" in loggers else None
        self.trackers = list(trackers)
        """grpo_ray.telemetry.trackers workers (W&B, MLflow), each in a thread of its own."""
        self.tb = None
        if "tensorboard" in loggers:
            from tensorboardX import SummaryWriter

            # resumed after step `done`: TensorBoard drops what an earlier writer logged from the next step on (the
            # steps redone after the checkpoint), so no step shows twice
            # each writer a file of its own, named in the order they start (TensorBoard reads them by name): the
            # default name (start second + host) is the same for two writers started within a second, and the
            # second file would replace the first
            self.tb = SummaryWriter(
                str(output_dir / "tensorboard"),
                purge_step=done + 1 if done else None,
                filename_suffix=f".{time.time_ns()}.{os.getpid()}",
            )

    def say(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line)
        else:
            print(line, flush=True)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if self.jsonl:  # first: a console line means the step is on record
            self.jsonl.write(json.dumps({"step": step, "time": round(time.time(), 3), **metrics}) + "\n")
            self.jsonl.flush()
        if self.console:
            self.console_step(step, metrics)
        if self.tb:
            for k, v in metrics.items():
                self.tb.add_scalar(k, v, step)
            self.tb.flush()
        for tracker in self.trackers:
            tracker.log(step, metrics)

    def console_step(self, step: int, metrics: dict[str, float]) -> None:
        if step > 0 and self.first_step is None:
            self.first_step = (step, time.monotonic())
            self.say(LEGEND)
            if self.use_bar:
                from tqdm import tqdm

                # counted from the first step's end: the rate and ETA come from the steps after it
                self.bar = tqdm(total=self.total_steps, initial=step, unit="step", dynamic_ncols=True)
        left = ""
        if self.bar is None and self.first_step and step > self.first_step[0] and self.total_steps > step:
            first, since = self.first_step
            left = eta((time.monotonic() - since) / (step - first) * (self.total_steps - step))
        self.say(console_line(step, metrics, left))
        if self.bar is not None and step > self.first_step[0]:
            self.bar.update(1)
            self.bar.set_postfix(score=f"{metrics.get('critic/score/mean', 0):.3f}")

    def table(self, step: int, rows: list[dict]) -> None:
        """Sample rollouts (prompt, response, reward) to the trackers."""
        for tracker in self.trackers:
            tracker.table(step, rows)

    def file(self, path: Path) -> None:
        """A file of the run (placement, plot) to the trackers."""
        for tracker in self.trackers:
            tracker.call("file", Path(path))

    def note(self, key: str, value: str) -> None:
        """A fact of the run (the exported model's path) to the trackers."""
        for tracker in self.trackers:
            tracker.call("note", key, value)

    def finish(self, best: str | None = None) -> None:
        """The run's plot (and the best validation's line) to the trackers."""
        if not self.trackers or not (self.output_dir / "metrics.jsonl").is_file():
            return
        from grpo_ray.telemetry.plot import plot_runs

        self.file(plot_runs([str(self.output_dir)], self.output_dir / "plot.png"))
        if best:
            self.note("best_validation", best)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()
        if self.bar is not None:
            self.bar.close()
        if self.jsonl:
            self.jsonl.close()
        if self.tb:
            self.tb.close()
