"""The built-in reward functions.

``gsm8k``  1.0 when the response ends with exactly one ``#### N`` and N equals the
           ground truth as a number (``1,000`` == ``1000`` == ``1000.0``), else 0.0.
``math``   1.0 when the response has exactly one ``\\boxed{...}`` and math-verify
           finds it equal to the ground truth (LaTeX-aware), else 0.0.
``format`` 1.0 when the answer format of the row's task is present exactly once:
           a final ``#### N`` line, or one ``\\boxed{}`` for ``math*`` data sources.
``auto``   the row's own task, chosen by its ``data_source`` as verl's default scoring does:
           ``gsm8k`` for GSM8K-style sources (``#### N``), ``math`` for MATH ones (``\\boxed{}``);
           an unknown source raises (the sample scores 0 and counts in ``reward/errors``).

What is not paid (reward hacking): an empty answer; several ``####`` or several
``\\boxed{}`` answers; several numbers after ``####`` ("every number listed");
anything after the final answer ("answer hidden in garbage").
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

MARK = "####"
# One number, optionally signed, with thousands separators or decimals, optional $ and trailing period.
_NUMBER = r"\$?\s*(-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)\s*\.?"
_FINAL = re.compile(rf"{re.escape(MARK)}\s*{_NUMBER}\s*$")


def to_number(text: str) -> Decimal | None:
    """``"1,000"`` -> 1000; ``"-2.50"`` -> -2.5; anything else -> None."""
    try:
        return Decimal(text.strip().replace(",", "").replace("$", "").rstrip("."))
    except InvalidOperation:
        return None


def extract_gsm8k_answer(response: str) -> str | None:
    """The number of the single final ``#### N`` of `response`, or None when that format is absent."""
    if response.count(MARK) != 1:
        return None
    match = _FINAL.search(response)
    return match.group(1) if match else None


def gsm8k_reward(response: str, ground_truth: str, **extra) -> float:
    answer = extract_gsm8k_answer(response)
    if answer is None:
        return 0.0
    got, want = to_number(answer), to_number(ground_truth)
    return float(got is not None and want is not None and got == want)


def boxed_contents(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}`` (braces balanced) in `text`, in order."""
    out = []
    start = 0
    while (i := text.find("\\boxed{", start)) != -1:
        depth, j = 1, i + len("\\boxed{")
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        if depth:
            break  # unbalanced: no answer from here on
        out.append(text[i + len("\\boxed{") : j - 1])
        start = j
    return out


def math_reward(response: str, ground_truth: str, **extra) -> float:
    from math_verify import parse, verify

    boxed = boxed_contents(response)
    if len(boxed) != 1 or not boxed[0].strip():
        return 0.0
    gold = parse(f"${ground_truth}$", parsing_timeout=None)
    pred = parse(f"$\\boxed{{{boxed[0]}}}$", parsing_timeout=None)
    if not gold or not pred:
        return 0.0
    return float(verify(gold, pred, timeout_seconds=None))


def format_reward(response: str, ground_truth: str = "", data_source: str = "", **extra) -> float:
    if data_source.startswith("math"):
        boxed = boxed_contents(response)
        return float(len(boxed) == 1 and bool(boxed[0].strip()))
    return float(extract_gsm8k_answer(response) is not None)


AUTO_SOURCES = {
    "gsm8k": gsm8k_reward,
    "openai/gsm8k": gsm8k_reward,
    "synthetic/": gsm8k_reward,
    "math": math_reward,
    "hendrycks": math_reward,
    "lighteval/math": math_reward,
    "huggingfaceh4/math-500": math_reward,
}
"""data_source prefix (lower case) -> the reward of its task."""


def reward_for_source(data_source: str):
    """The reward function of a data source, or None when no prefix of AUTO_SOURCES matches."""
    source = data_source.lower()
    return next((fn for prefix, fn in AUTO_SOURCES.items() if source.startswith(prefix)), None)


def auto_reward(response: str, ground_truth: str, data_source: str = "", **extra) -> float:
    fn = reward_for_source(data_source)
    if fn is None:
        raise ValueError(f"no built-in reward for data_source {data_source!r}")
    return fn(response, ground_truth, data_source=data_source, **extra)
