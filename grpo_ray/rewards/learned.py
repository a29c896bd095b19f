"""A learned reward beside the reward functions: the reward model's scores joined to theirs, and the numbers that
show reward hacking (the learned reward climbing while the true one, a rule reward, does not)."""

from __future__ import annotations

import dataclasses
import math
import re
import statistics

from grpo_ray.types import Scores

PLACEHOLDER = re.compile(r"\{(prompt|response|ground_truth)\}")
"""The placeholders of a judge's rubric (reward_model.judge.template)."""
COMPONENT = "reward_model"
"""The reward model's component of each sample's reward."""
STYLED = {
    "rule": lambda rule, model: rule,
    "model": lambda rule, model: model,
    "both": lambda rule, model: rule + model,
}
"""A row's reward by its ``reward_model.style`` (with reward_model.by_style): from the reward functions' total and
the weighted model score."""


def judge_prompt(template: str, prompt, response: str) -> str:
    """A judge's rubric for one sample: `template` with ``{prompt}`` (the prompt's user turns, or its text),
    ``{response}`` and ``{ground_truth}`` filled in, in one pass (other braces stay as they are: a rubric may show
    JSON; a response that quotes a placeholder is not filled again)."""
    turns = [text_of(m["content"]) for m in prompt.messages if m.get("role") != "system"]
    fills = {
        "prompt": "\n\n".join(turns) if turns else prompt.text,
        "response": response,
        "ground_truth": str(prompt.ground_truth),
    }
    return PLACEHOLDER.sub(lambda m: fills[m.group(1)], template)


def text_of(content) -> str:
    """A message's text: its content, or the text of its content parts (a prompt with images holds them as parts
    beside its text: ``data.images.with_image_parts``; a judge that reads images is shown them before its rubric)."""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if part.get("type") == "text")


def read_score(reply: str, pattern: str) -> float:
    """The score in a judge's `reply`: the first group of `pattern`'s last match, as a number; NaN when nothing
    matches or the match is not a finite number (the caller scores it the default and counts it)."""
    matches = list(re.finditer(pattern, reply))
    if not matches:
        return math.nan
    try:
        value = float(matches[-1].group(1))
    except (TypeError, ValueError):
        return math.nan
    return value if math.isfinite(value) else math.nan


def fill_unread(values: list[float], default: float) -> tuple[list[float], int]:
    """`values` with each NaN (a judge's reply without a score) replaced by `default`, and how many were."""
    unread = sum(math.isnan(v) for v in values)
    return [default if math.isnan(v) else v for v in values], unread


def with_model(
    scores: list[Scores],
    values: list[float],
    weight: float,
    normalize: bool,
    rules: list[tuple[str, float]],
    sigmoid: bool = False,
) -> tuple[list[Scores], dict[str, float]]:
    """`scores` (one per reward actor's share, in sample order) with the reward model's `values` (one per sample, in
    the same order) as the component ``reward_model``, each through the logistic function when `sigmoid` (the
    Bradley-Terry probability of a good response), then standardised over the step's samples when `normalize`, and
    `weight` x it added to each total (where the shares carry row styles: a ``rule`` row's total stays the reward
    functions', a ``model`` row's is the model's alone); and its metrics: the raw score's mean and spread, and,
    when `rules` (the reward functions: name, weight) give a true reward, their correlation over the samples and
    the gap of the means."""
    if len(values) != sum(len(s.totals) for s in scores):
        raise ValueError(f"{len(values)} reward-model scores for {sum(len(s.totals) for s in scores)} samples")
    used = [1 / (1 + math.exp(-v)) if v > -700 else 0.0 for v in values] if sigmoid else list(values)
    used = standardised(used) if normalize else used
    out, k = [], 0
    for s in scores:
        part, k = used[k : k + len(s.totals)], k + len(s.totals)
        styles = s.styles or ["both"] * len(part)
        totals = [STYLED[style](t, weight * x) for t, x, style in zip(s.totals, part, styles)]
        out.append(dataclasses.replace(s, totals=totals, components={**s.components, COMPONENT: part}))
    metrics = {
        "reward_model/score/mean": statistics.fmean(values),
        "reward_model/score/std": statistics.pstdev(values),
    }
    styles = [style for s in scores for style in s.styles]
    if styles:  # the share of samples whose reward the model is part of
        metrics["reward_model/rows_scored"] = sum(style != "rule" for style in styles) / len(styles)
    truth = true_reward(scores, rules)
    if truth:
        metrics["reward_model/gap"] = statistics.fmean(values) - statistics.fmean(truth)
        try:
            metrics["reward_model/true_corr"] = statistics.correlation(values, truth)
        except statistics.StatisticsError:  # one of them constant over the step: no correlation to report
            pass
    return out, metrics


def standardised(values: list[float]) -> list[float]:
    """`values` less their mean, over their standard deviation (left centred when they are all equal)."""
    mean, std = statistics.fmean(values), statistics.pstdev(values)
    return [(v - mean) / std if std > 1e-12 else v - mean for v in values]


def true_reward(scores: list[Scores], rules: list[tuple[str, float]]) -> list[float]:
    """Each sample's rule reward, the true score beside a learned one: the reward functions' weighted sum, or their
    plain sum when every weight is 0 (functions logged, not trained on), each over the functions that score the
    sample's data source; empty without reward functions."""
    if not rules:
        return []
    weights = [(n, w) for n, w in rules] if any(w for _, w in rules) else [(n, 1.0) for n, _ in rules]
    out = []
    for s in scores:
        for i in range(len(s.totals)):
            out.append(math.fsum(w * v for n, w in weights if not math.isnan(v := s.components[n][i])))
    return out
