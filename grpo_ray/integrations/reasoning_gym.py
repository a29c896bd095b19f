"""reasoning-gym's procedural tasks as data and a reward, with no glue (``pip install 'grpo-ray[envs]'``)::

    data.train_files=reasoning_gym://basic_arithmetic?size=2000&seed=0&max_terms=3
    data.val_files=[reasoning_gym://basic_arithmetic?size=100&seed=1&max_terms=3]
    reward.functions=[{name: reasoning_gym}]

A spec names a task of ``reasoning_gym`` and its configuration: ``size`` and ``seed`` (default 1000 and 0), every
other key the task's own (``reasoning_gym.create_dataset(task, size=, seed=, **config)``: values read as integers,
numbers, true/false, else text). Each entry is a row: its question as the prompt (one user message), its answer as
the ground truth, data_source ``reasoning_gym/<task>``, and the entry itself (question, answer, metadata) in
``extra_info.entry``. The same spec gives the same rows; validation takes another seed.

The reward ``reasoning_gym`` scores a response with the task's own ``score_answer`` (from
``reasoning_gym.get_score_answer_fn``; 0 to 1, partial credit where the task gives it) on the text in its last
``<answer>...</answer>`` (the format reasoning-gym's prompts ask for), or on the whole response when it has none.
"""

from __future__ import annotations

from urllib.parse import parse_qsl


def value(text: str):
    """A configuration value as written in a spec: an integer, a number, true/false, else the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def library():
    """reasoning_gym, or ValueError saying why it does not import (not installed, or a dependency's version)."""
    try:
        import reasoning_gym
    except ImportError as e:
        from grpo_ray.envs.base import import_trouble

        raise ValueError(import_trouble("reasoning-gym", e)) from None
    return reasoning_gym


def rows(spec: str) -> list[dict]:
    """The rows of a ``reasoning_gym://task?size=N&seed=S&key=value`` spec; ValueError saying what is wrong (the
    data layer says it as the spec's DataError)."""
    rg = library()
    task, _, query = spec.removeprefix("reasoning_gym://").partition("?")  # (no URL: "_" is not a scheme's)
    task = task.strip("/")
    config = {k: value(v) for k, v in parse_qsl(query)}
    size, seed = config.pop("size", 1000), config.pop("seed", 0)
    if task not in rg.factory.DATASETS:
        near = sorted(n for n in rg.factory.DATASETS if n[:4] == task[:4]) or sorted(rg.factory.DATASETS)[:8]
        raise ValueError(f"no reasoning-gym task {task!r} (some of its {len(rg.factory.DATASETS)}: {', '.join(near)})")
    try:
        dataset = rg.create_dataset(task, size=size, seed=seed, **config)
        entries = [dataset[i] for i in range(size)]
    except Exception as e:  # the task's own checks of its configuration: said as it says them
        raise ValueError(
            f"reasoning-gym's {task} refuses {config or 'its defaults'}: {type(e).__name__}: {e}"
        ) from None
    return [
        {
            "data_source": f"reasoning_gym/{task}",
            "prompt": [{"role": "user", "content": e["question"]}],
            "reward_model": {"style": "rule", "ground_truth": str(e["answer"])},
            "extra_info": {"index": i, "entry": e},
        }
        for i, e in enumerate(entries)
    ]


def reward(response: str, ground_truth: str, extra_info: dict | None = None, **extra) -> float:
    """The task's own score of the answer in `response` (its last <answer> tags' text, else all of it); a row
    that is not reasoning-gym's (no extra_info.entry) raises."""
    entry = (extra_info or {}).get("entry")
    if not isinstance(entry, dict) or "metadata" not in entry:
        raise ValueError("the reasoning_gym reward scores rows of reasoning_gym:// data (extra_info.entry)")
    rg = library()
    tagged = rg.utils.extract_answer(response)
    answer = tagged if tagged is not None else response.strip()
    return float(rg.get_score_answer_fn(entry["metadata"]["source_dataset"])(answer, entry))
