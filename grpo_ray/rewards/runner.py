"""Scoring one response in a child process of a reward actor (light imports: no Ray, no torch)."""

from __future__ import annotations

import errno
import math
import socket

from grpo_ray.sandbox import failure_text as traceback_text

_LOADED: dict = {}
SOURCES: dict[str, str] = {}
"""The text of each file-form reward (``file.py:function``), sent by the driver."""
NETWORK = {"allowed": True}
"""Whether the sandbox lets reward code reach the network (reward.network), for the message when it is refused."""
SHOWN: list[str] = []
"""The node's folders the sandbox shows (empty: all of them), for the message when a file outside them is missing."""
OFFLINE_ERRNOS = {errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL, errno.ECONNREFUSED}


def score_one(
    functions: list[tuple[str, list[str], dict]], response: str, ground_truth: str, extra: dict
) -> tuple[dict[str, float], int, bool, dict[str, str]]:
    """Each function's score of one response (``functions``: name, the data sources it scores or [] for all, its
    keyword arguments), how many failed (raised or returned a non-finite number: those score 0), whether one ran
    out of memory (the child is then replaced), and what went wrong in each that failed (its traceback, or what it
    returned). A function that returns verl's dict also gives its other numbers (``{"score": 1.0, "acc": True}``):
    they are kept as ``name/key`` beside the scores, for the metrics. A function whose sources do not name the
    row's is not called: its score is NaN (no part of the row's reward)."""
    from grpo_ray.rewards import as_score, caller, load

    components, errors, out_of_memory, failures = {}, 0, False, {}
    for name, sources, kwargs in functions:
        if not scores(sources, extra.get("data_source")):
            components[name] = math.nan
            continue
        value = math.nan
        try:
            fn = _LOADED.get(name) or _LOADED.setdefault(name, caller(load(name, SOURCES.get(name))))
            answer = fn(response, ground_truth, extra.get("data_source"), extra.get("extra_info"), **kwargs)
            value = as_score(answer)
            if isinstance(answer, dict):
                components.update(
                    {f"{name}/{k}": float(v) for k, v in answer.items() if k != "score" and isinstance(v, (int, float))}
                )
        except MemoryError:
            out_of_memory = True
        except Exception as e:  # user code may raise anything: the sample scores 0, the step goes on
            failures[name] = failure_text(e)
        if not math.isfinite(value):
            errors += 1
            failures.setdefault(name, f"returned {value}: expected a finite number")
            value = 0.0
        components[name] = value
    return components, errors, out_of_memory, failures


def scores(sources: list[str], data_source: str | None) -> bool:
    """Whether a function of reward.functions whose `sources` are these scores a row of `data_source` (none named:
    every row); as ``RewardFnConfig.scores`` says it of a recipe's function."""
    return not sources or data_source in sources


def failure_text(e: BaseException, ours: tuple[str, ...] = ()) -> str:
    """The traceback of `e` from the reward function down (grpo-ray's own frames, and those of the files `ours`,
    left out), with a word on the sandbox when it was refused the network."""
    text = traceback_text(e, (__file__, __file__.replace("runner.py", "__init__.py"), *ours))
    if not NETWORK["allowed"] and refused_network(e):
        text += "(the reward sandbox has no network: set reward.network=true to let reward code reach it)\n"
    missing = getattr(e, "filename", None)
    if SHOWN and isinstance(e, FileNotFoundError) and isinstance(missing, str) and not shown(missing):
        text += (
            f"(the sandbox shows the node's system and Python folders, sys.path's and those named in the section's "
            f"`paths`, not {missing}: add its folder there)\n"
        )
    return text


def shown(path: str) -> bool:
    """Whether the sandbox shows `path` of the node (a scratch path counts as shown: it is the process's own)."""
    return not path.startswith("/") or any(path == s or path.startswith(s.rstrip("/") + "/") for s in [*SHOWN, "/tmp"])


def refused_network(e: BaseException | None, depth: int = 0) -> bool:
    """Whether `e`, or an error it wraps (urllib's reason, a cause), is a failed name lookup or connection."""
    if e is None or depth > 5:
        return False
    if isinstance(e, socket.gaierror) or getattr(e, "errno", None) in OFFLINE_ERRNOS:
        return True
    inner = getattr(e, "reason", None)
    return any(
        refused_network(x, depth + 1)
        for x in (inner if isinstance(inner, BaseException) else None, e.__cause__, e.__context__)
    )
