"""The built-in synthetic tasks, written like GSM8K word problems and scored by the ``gsm8k`` reward.

``select``: one person, up to three kinds of things with a count each; the question asks for one count::

    Mia has 4 apples, 7 pears and 2 plums. How many pears does Mia have?
    Give the final answer after ####.
    -> Mia has 7 pears.\\n#### 7

A ~200K-parameter model learns to copy the count by RL alone on a CPU in tens of steps, while
arithmetic such as ``(a+b) mod 10`` is not learned in hundreds. The counts of a prompt are
distinct digits 1-9, so any constant answer scores about 1/9.

``reasoning``: a multi-step word problem, two or three operations on small numbers, with a worked
solution of one line per step, then the answer (GSM8K's shape)::

    Mia has 6 apples. She buys 5 more. Then she gives away 3. How many apples does Mia have now?
    Give the final answer after ####.
    -> 6 + 5 = 11\\n11 - 3 = 8\\n#### 8

Its responses are 15-35 tokens (digits are single tokens), so response length, truncation and
per-token losses all show. Arithmetic this small is learnable by a tiny model from a warm start
(SFT on the worked solutions), not by RL from random weights. With ``answer_only=F`` a share F of
the rows keeps only the final ``#### N`` line (warm-start data of mixed quality).

``products``: one product of two 2-digit numbers in a word problem, with a tool-use trace for the
``calculator`` environment (``extra_info.messages``): the warm start of the tool-use showcase.

``shapes``: a picture (64 x 64 pixels, the vision twin's size) of 1 to ``max_count`` coloured squares on white,
and the question how many there are, the image in the row's ``images`` as a PNG file's bytes::

    <image> How many squares are in the picture? Give the final answer after ####.
    -> #### 3

With ``blank=1`` every picture is white (the same questions and answers, drawn from the same stream): the control
of a model that must read the pixels to answer.

Rows are generated procedurally from a seed: the same spec gives the same rows; the train and test
splits of one seed are different streams.
"""

from __future__ import annotations

import io
import itertools
import random

NAMES = ["Mia", "Tom", "Ava", "Leo", "Zoe", "Sam", "Eva", "Max"]
PRONOUN = {"Mia": "she", "Ava": "she", "Zoe": "she", "Eva": "she", "Tom": "he", "Leo": "he", "Sam": "he", "Max": "he"}
ITEMS = ["apples", "pears", "plums", "limes", "figs", "nuts", "eggs", "pens"]
INSTRUCTION = "Give the final answer after ####."
SOURCES = {
    "select": "synthetic/select",
    "reasoning": "synthetic/reasoning",
    "products": "synthetic/products",
    "shapes": "synthetic/shapes",
}


def _row(task: str, question: str, answer: int, solution: str, index: int, split: str) -> dict:
    """A problem as a row in the schema of `grpo_ray.data` (solution in extra_info.answer, as verl keeps it)."""
    return {
        "data_source": SOURCES[task],
        "prompt": [{"role": "user", "content": question}],
        "ability": task,
        "reward_model": {"style": "rule", "ground_truth": str(answer)},
        "extra_info": {"split": split, "index": index, "answer": solution, "question": question},
    }


def select_row(rng: random.Random, index: int = 0, split: str = "train", items: int = 3, pairs: int = 0) -> dict:
    """One "select a number" problem; with `pairs`, also a preference pair for reward-model training (``chosen``:
    the right answer, ``rejected``: another count of the prompt half the time, else any other digit)."""
    name = rng.choice(NAMES)
    kinds = rng.sample(ITEMS, items)
    counts = rng.sample(range(1, 10), items)
    asked = rng.randrange(items)
    listed = [f"{c} {item}" for c, item in zip(counts, kinds)]
    have = ", ".join(listed[:-1]) + f" and {listed[-1]}" if items > 1 else listed[0]
    question = f"{name} has {have}. How many {kinds[asked]} does {name} have? {INSTRUCTION}"
    answer = counts[asked]
    row = _row("select", question, answer, f"{name} has {answer} {kinds[asked]}.\n#### {answer}", index, split)
    if pairs:
        others = [c for c in counts if c != answer]
        wrong = (
            rng.choice(others)
            if others and rng.random() < 0.5
            else rng.choice([d for d in range(1, 10) if d != answer])
        )
        row.update(chosen=f"#### {answer}", rejected=f"#### {wrong}")
    return row


def _operation(rng: random.Random, x: int, subject: str, max_value: int, target: int | None = None):
    """One step applied to the running count `x`: (sentence, solution line, new count), or None when no step
    reaches `target`. Counts stay within 1..max_value. `subject` starts the sentence ("She", "Then she")."""
    ops = [("add", b) for b in range(1, 10) if x + b <= max_value]
    ops += [("sub", b) for b in range(1, 10) if x - b >= 1]
    ops += [("mul", k) for k in (2, 3) if k * x <= max_value]
    if target is not None:
        ops = [(op, b) for op, b in ops if {"add": x + b, "sub": x - b, "mul": x * b}[op] == target]
        if not ops:
            return None
    kind = rng.choice(sorted({op for op, _ in ops}))  # each kind of step equally likely, then its number
    op, b = rng.choice([o for o in ops if o[0] == kind])
    if op == "add":
        return f"{subject} {rng.choice(['buys', 'finds', 'gets'])} {b} more.", f"{x} + {b} = {x + b}", x + b
    if op == "sub":
        return f"{subject} {rng.choice(['gives away', 'eats', 'loses'])} {b}.", f"{x} - {b} = {x - b}", x - b
    return f"{subject} {'doubles' if b == 2 else 'triples'} them.", f"{x} * {b} = {x * b}", x * b


def reasoning_row(
    rng: random.Random,
    index: int = 0,
    split: str = "train",
    min_steps: int = 2,
    max_steps: int = 3,
    max_value: int = 40,
    answer_only: float = 0.0,
) -> dict:
    """One multi-step problem: a start count, `min_steps`-`max_steps` operations (+, -, x2 / x3), the question.
    The answer is drawn first, uniform over 2..max_value, and the last step made to reach it, so that no
    constant answer pays more than 1 time in max_value - 1 (a tiny model under RL otherwise learns to guess
    the commonest answers). A share `answer_only` of the rows has a solution without its worked lines (just
    ``#### N``), as warm-start data of mixed quality has: a model taught on both modes answers some problems
    without working them out, and mostly wrong."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    answer, steps = rng.randint(2, max_value), rng.randint(min_steps, max_steps)
    for attempt in itertools.count(1):
        if attempt % 1000 == 0:  # no start reaches this answer (one step to a large one): draw another
            answer = rng.randint(2, max_value)
        x = rng.randint(2, min(12, max_value))
        sentences, lines = [f"{name} has {x} {item}."], []
        for i in range(steps):
            subject = PRONOUN[name].capitalize() if i == 0 else f"Then {PRONOUN[name]}"
            step = _operation(rng, x, subject, max_value, answer if i == steps - 1 else None)
            if step is None:
                break
            sentence, line, x = step
            sentences.append(sentence)
            lines.append(line)
        else:
            break
    question = " ".join(sentences) + f" How many {item} does {name} have now? {INSTRUCTION}"
    if answer_only and rng.random() < answer_only:
        lines = []
    return _row("reasoning", question, x, "".join(line + "\n" for line in lines) + f"#### {x}", index, split)


CONTAINERS = ["boxes", "bags", "crates", "trays", "rows", "shelves"]


def products_row(
    rng: random.Random, index: int = 0, split: str = "train", digits: int = 2, answer_only: float = 0.0
) -> dict:
    """One word problem whose answer is a product of two `digits`-digit numbers, more than a tiny model can work
    out in its head, and its tool-use trace for the ``calculator`` environment in ``extra_info.messages``::

        Eva has 37 boxes of pens with 24 pens in each box. How many pens does Eva have? Give the final ...
        -> assistant <calc>37 * 24</calc> / tool <result>888</result> / assistant #### 888

    ``extra_info.answer`` is the worked solution as text (``37 * 24 = 888\n#### 888``). A share `answer_only` of
    the traces answers at once without the tool (``#### 888`` alone), as warm-start data of mixed quality would: a
    model taught on both calls the tool on some problems and guesses (mostly wrong) on the others."""
    name, item, box = rng.choice(NAMES), rng.choice(ITEMS), rng.choice(CONTAINERS)
    a, b = (rng.randint(10 ** (digits - 1), 10**digits - 1) for _ in range(2))
    question = (
        f"{name} has {a} {box} of {item} with {b} {item} in each. How many {item} does {name} have? {INSTRUCTION}"
    )
    answer = a * b
    if answer_only and rng.random() < answer_only:
        messages = [{"role": "assistant", "content": f"#### {answer}"}]
    else:
        messages = [
            {"role": "assistant", "content": f"<calc>{a} * {b}</calc>"},
            {"role": "tool", "content": f"<result>{answer}</result>"},
            {"role": "assistant", "content": f"#### {answer}"},
        ]
    row = _row("products", question, answer, f"{a} * {b} = {answer}\n#### {answer}", index, split)
    row["extra_info"]["messages"] = messages
    return row


SHAPE_COLOURS = [(220, 40, 40), (40, 160, 40), (40, 60, 220), (230, 180, 30)]


def shapes_row(rng: random.Random, index: int = 0, split: str = "train", max_count: int = 4, blank: int = 0) -> dict:
    """One picture of 1..`max_count` squares in a 4 x 4 grid of cells (they never touch), each of a random colour,
    and the question how many there are; with `blank`, the picture white, the rest as without (same stream)."""
    from PIL import Image, ImageDraw

    count = rng.randint(1, max_count)
    image = Image.new("RGB", (64, 64), "white")
    draw = ImageDraw.Draw(image)
    for cell in rng.sample(range(16), count):
        x, y = (cell % 4) * 16 + 3, (cell // 4) * 16 + 3
        draw.rectangle([x, y, x + 9, y + 9], fill=rng.choice(SHAPE_COLOURS))
    png = io.BytesIO()
    (Image.new("RGB", (64, 64), "white") if blank else image).save(png, format="PNG")
    question = f"<image> How many squares are in the picture? {INSTRUCTION}"
    row = _row("shapes", question, count, f"#### {count}", index, split)
    row["images"] = [png.getvalue()]
    return row


TASKS = {"select": select_row, "reasoning": reasoning_row, "products": products_row, "shapes": shapes_row}


def make_rows(size: int, seed: int = 0, split: str = "train", task: str = "select", **options) -> list[dict]:
    """`size` problems of `task` from `seed`; train and test splits of one seed never share a stream.
    `options` are the task's keyword arguments (select: items; reasoning: min_steps, max_steps, max_value)."""
    # select keeps the stream it had before there was a second task, so its rows are the same as then
    rng = random.Random(f"{seed}/{split}" if task == "select" else f"{task}/{seed}/{split}")
    return [TASKS[task](rng, i, split, **options) for i in range(size)]


def corpus(task: str = "select", size: int = 2000, seed: int = 0) -> list[str]:
    """Text of a task (questions and worked answers) to train a tiny tokenizer on."""
    rows = make_rows(size, seed, task=task)
    return [
        "\n".join(
            [r["extra_info"]["question"], r["extra_info"]["answer"]]
            + [m["content"] for m in r["extra_info"].get("messages", ())]
        )
        for r in rows
    ]
