"""The built-in synthetic task: "select a number", written like a GSM8K word problem.

A prompt names one person and three kinds of things with a count each, then asks
for one of the counts::

    Mia has 4 apples, 7 pears and 2 plums. How many pears does Mia have?
    Give the final answer after ####.

The answer is GSM8K-shaped (``Mia has 7 pears.\\n#### 7``), so the same ``gsm8k``
reward scores it. Why this task: the answer has to be read from the prompt, which
a ~200K-parameter model learns by RL alone on a CPU in tens of steps, while
arithmetic such as ``(a+b) mod 10`` is not learned in hundreds. The counts in a
prompt are distinct digits 1-9 and the asked item is uniform, so any constant
answer scores about 1/9 and copying a random count from the prompt about 1/3.

Rows are generated procedurally from a seed: the same spec gives the same rows.
"""

from __future__ import annotations

import random

NAMES = ["Mia", "Tom", "Ava", "Leo", "Zoe", "Sam", "Eva", "Max"]
ITEMS = ["apples", "pears", "plums", "limes", "figs", "nuts", "eggs", "pens"]
INSTRUCTION = "Give the final answer after ####."
DATA_SOURCE = "synthetic/select"


def make_row(rng: random.Random, num_items: int = 3, index: int = 0, split: str = "train") -> dict:
    """One synthetic problem as a row in the schema of `grpo_ray.data.schema`."""
    name = rng.choice(NAMES)
    items = rng.sample(ITEMS, num_items)
    counts = rng.sample(range(1, 10), num_items)
    asked = rng.randrange(num_items)
    listed = [f"{c} {item}" for c, item in zip(counts, items)]
    have = ", ".join(listed[:-1]) + f" and {listed[-1]}" if num_items > 1 else listed[0]
    question = f"{name} has {have}. How many {items[asked]} does {name} have? {INSTRUCTION}"
    answer = counts[asked]
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question}],
        "ability": "select",
        "reward_model": {"style": "rule", "ground_truth": str(answer)},
        "extra_info": {
            "split": split,
            "index": index,
            "answer": f"{name} has {answer} {items[asked]}.\n#### {answer}",
            "question": question,
        },
    }


def make_rows(size: int, seed: int = 0, num_items: int = 3, split: str = "train") -> list[dict]:
    """`size` problems from `seed`; train and test splits of one seed never share a stream."""
    rng = random.Random(f"{seed}/{split}")
    return [make_row(rng, num_items, i, split) for i in range(size)]


def corpus(size: int = 2000, seed: int = 0) -> list[str]:
    """Text of the task (questions and answers) to train a tiny tokenizer on."""
    rows = make_rows(size, seed)
    return [r["extra_info"]["question"] + "\n" + r["extra_info"]["answer"] for r in rows]
