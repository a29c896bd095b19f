import json
from collections import Counter

import pyarrow.parquet as pq
import pytest

from grpo_ray.data import DataError, load_rows, normalise, row_problem
from grpo_ray.data.prepare import PrepareError, prepare
from grpo_ray.rewards import load
from tests.conftest import run_cli

COLUMNS = {"data_source", "prompt", "ability", "reward_model", "extra_info"}
TINY_BYTES = "tiny://qwen2?layers=1&hidden=64&heads=2&kv_heads=1&seed=0"  # all 256 bytes: any text encodes


def test_synthetic_rows_are_seeded_and_gsm8k_shaped():
    a = load_rows("synthetic://select?size=50&seed=3")
    assert a == load_rows("synthetic://select?size=50&seed=3")
    assert a != load_rows("synthetic://select?size=50&seed=4")
    assert a != load_rows("synthetic://select?size=50&seed=3&split=test")
    row = a[0]
    assert set(row) == COLUMNS and row["prompt"][0]["role"] == "user"
    assert row["extra_info"]["answer"].endswith(f"#### {row['reward_model']['ground_truth']}")
    # the reference answer earns full reward from the same reward function training uses
    gsm8k = load("gsm8k")
    assert all(gsm8k(r["extra_info"]["answer"], r["reward_model"]["ground_truth"]) == 1.0 for r in a)


def test_no_constant_answer_scores_above_0_3_and_copying_a_count_is_a_third():
    rows = load_rows("synthetic://select?size=3000&seed=0")
    truths = Counter(r["reward_model"]["ground_truth"] for r in rows)
    assert max(truths.values()) / len(rows) < 0.2  # best constant: about 1/9
    # the answer is always one of the counts named in the prompt, never the same count twice
    import re

    for r in rows[:200]:
        counts = re.findall(r"\b(\d) ", r["prompt"][0]["content"])
        assert r["reward_model"]["ground_truth"] in counts and len(set(counts)) == len(counts) == 3


def test_load_rows_errors_name_file_and_row(tmp_path):
    good = load_rows("synthetic://select?size=3")
    bad = [good[0], {**good[1], "reward_model": {"style": "rule"}}, good[2]]
    p = tmp_path / "rows.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in bad))
    with pytest.raises(
        DataError, match=r"rows.jsonl row 1: 'reward_model.ground_truth' \(data.answer_key\) is missing"
    ):
        load_rows(str(p))
    p.write_bytes(b'{"a": 1}\n\xff\xfe\n')
    with pytest.raises(DataError, match="line 2: not a JSON object in UTF-8"):
        load_rows(str(p))
    (tmp_path / "broken.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataError, match="not a readable parquet file"):
        load_rows(str(tmp_path / "broken.parquet"))
    with pytest.raises(DataError, match="no such file"):
        load_rows(str(tmp_path / "missing.parquet"))
    with pytest.raises(DataError, match="unknown key 'sise'"):
        load_rows("synthetic://select?sise=3")


def test_rows_with_no_ground_truth_load_with_an_empty_answer_key(tmp_path):
    """An environment's rows (a game, a task the environment holds) may have no ground truth: refused with the way
    out named, taken with data.answer_key='', and handed on as ""."""
    from grpo_ray.types import Prompt

    p = tmp_path / "games.jsonl"
    p.write_text(json.dumps({"prompt": "Your move.", "data_source": "game"}) + "\n")
    with pytest.raises(DataError, match="is missing or empty .rows with no ground truth.*data.answer_key=''"):
        load_rows(str(p))
    (row,) = load_rows(str(p), answer_key="")
    assert row["prompt"] == [{"role": "user", "content": "Your move."}]
    assert Prompt.from_row(0, {**row, "prompt_ids": [1]}).ground_truth == ""


def test_skyrl_rows_load_as_skyrl_writes_them():
    """SkyRL's datasets keep the ground truth at reward_spec.ground_truth (and the environment in env_class): under
    the default data.answer_key it is found there, with no key to set; verl's place wins where a row has both."""
    row = {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "Mia has 7 pears. How many?"}],
        "env_class": "gsm8k",
        "reward_spec": {"method": "rule", "ground_truth": 7},
        "extra_info": {"split": "train", "index": 0},
    }
    got = normalise(row)
    assert got["reward_model"]["ground_truth"] == "7" and row_problem(got) is None
    both = normalise({**row, "reward_model": {"style": "rule", "ground_truth": "8"}})
    assert both["reward_model"]["ground_truth"] == "8"
    assert normalise(row, answer_key="extra_info.index")["reward_model"]["ground_truth"] == "0"  # a key named wins


def test_plain_rows_under_other_keys_load_with_a_key_mapping(shared_data, tmp_path):
    """MATH-500 as it is ({problem, solution, answer, ...}): the prompt and answer keys named, no data_source."""
    path = str(shared_data / "math500" / "test.jsonl")
    rows = load_rows(path, prompt_key="problem", answer_key="answer")
    assert len(rows) == 500 and rows[0]["prompt"] == [{"role": "user", "content": rows[0]["problem"]}]
    assert rows[0]["reward_model"]["ground_truth"] == rows[0]["answer"] and rows[0]["data_source"] == "test"
    with pytest.raises(
        DataError, match=r"test.jsonl row 0: 'prompt' \(data.prompt_key\) is missing; the row has 'problem', "
    ):
        load_rows(path)
    nested = tmp_path / "nested.jsonl"
    nested.write_text(json.dumps({"q": {"text": "What is 2+2?"}, "a": {"value": 4}, "data_source": "quiz"}) + "\n")
    (row,) = load_rows(str(nested), prompt_key="q.text", answer_key="a.value")
    assert row["reward_model"]["ground_truth"] == "4" and row["data_source"] == "quiz"
    with pytest.raises(DataError, match=r"'a.missing' \(data.answer_key\) is missing"):
        load_rows(str(nested), prompt_key="q.text", answer_key="a.missing")


def test_dataset_directories_load_with_their_split(tmp_path):
    import datasets

    rows = [{"question": f"What is {i}+1?", "answer": i + 1} for i in range(6)]
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(rows[:4]), "test": datasets.Dataset.from_list(rows[4:])}
    ).save_to_disk(str(tmp_path / "saved"))
    keys = {"prompt_key": "question", "answer_key": "answer"}
    train = load_rows(str(tmp_path / "saved"), **keys)
    test = load_rows(f"{tmp_path / 'saved'}?split=test", **keys)
    assert [r["reward_model"]["ground_truth"] for r in train + test] == ["1", "2", "3", "4", "5", "6"]
    assert train[0]["data_source"] == "saved"
    with pytest.raises(DataError, match="no split 'validation'; it has train, test"):
        load_rows(f"{tmp_path / 'saved'}?split=validation", **keys)
    files = tmp_path / "files"
    files.mkdir()
    (files / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert len(load_rows(str(files), **keys)) == 6  # a folder of data files, read by datasets
    with pytest.raises(DataError, match="unknown key 'splt'"):
        load_rows(f"{files}?splt=train", **keys)


def test_prepare_gsm8k_from_shared_files(shared_data, tmp_path):
    reports = prepare("gsm8k", str(shared_data / "gsm8k"), tmp_path)
    counts = {r.split: (r.read, r.kept) for r in reports}
    assert counts == {"train": (7473, 7473), "test": (1319, 1319)}
    table = pq.read_table(tmp_path / "train.parquet")
    assert set(table.column_names) == COLUMNS and table.num_rows == 7473
    rows = load_rows(str(tmp_path / "train.parquet"))  # our own loader accepts what we wrote
    assert rows[0]["data_source"] == "gsm8k" and rows[0]["reward_model"]["ground_truth"] == "72"
    assert "####" in rows[0]["prompt"][0]["content"]


def test_every_gsm8k_training_answer_scores_one_against_its_ground_truth(shared_data, tmp_path):
    prepare("gsm8k", str(shared_data / "gsm8k"), tmp_path)
    gsm8k, fmt = load("gsm8k"), load("format")
    rows = load_rows(str(tmp_path / "train.parquet"))
    scores = [gsm8k(r["extra_info"]["answer"], r["reward_model"]["ground_truth"]) for r in rows]
    assert len(scores) == 7473 and min(scores) == 1.0
    assert all(fmt(r["extra_info"]["answer"], "", data_source="gsm8k") == 1.0 for r in rows)
    assert any("," in r["extra_info"]["answer"].rsplit("####", 1)[1] for r in rows)  # separators were exercised


def test_prepare_math500_from_shared_file(shared_data, tmp_path):
    (report,) = prepare("math500", str(shared_data / "math500" / "test.jsonl"), tmp_path)
    assert (report.split, report.read, report.kept) == ("test", 500, 500)
    rows = load_rows(str(tmp_path / "test.parquet"))
    assert rows[0]["data_source"] == "math500" and "\\boxed{}" in rows[0]["prompt"][0]["content"]
    assert {"subject", "level", "unique_id"} <= set(rows[0]["extra_info"])


def test_prepare_any_data_with_keys_and_an_instruction(shared_data, tmp_path):
    """custom: MATH-500's rows read by their keys (no built-in knowledge), an instruction of the user's appended,
    the other fields kept in extra_info; a chat-message prompt under a nested key; --instruction replaces GSM8K's."""
    src = shared_data / "math500" / "test.jsonl"
    (report,) = prepare(
        "custom",
        str(src),
        tmp_path / "a",
        prompt_key="problem",
        answer_key="answer",
        instruction="Answer in \\boxed{}.",
        file_split="train",
    )
    assert (report.split, report.read, report.kept) == ("train", 500, 500)
    rows = load_rows(str(tmp_path / "a" / "train.parquet"))
    first = json.loads(src.read_text().splitlines()[0])
    assert rows[0]["prompt"] == [{"role": "user", "content": f"{first['problem'].strip()} Answer in \\boxed{{}}."}]
    assert rows[0]["reward_model"]["ground_truth"] == first["answer"] and rows[0]["data_source"] == "test"
    assert rows[0]["extra_info"]["subject"] == first["subject"] and "problem" not in rows[0]["extra_info"]
    chat = tmp_path / "chat.jsonl"
    chat.write_text(
        json.dumps(
            {
                "data_source": "mine",
                "conv": {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]},
                "label": 4,
            }
        )
        + "\n"
        + json.dumps({"conv": {"messages": []}, "label": 1})
        + "\n"
    )
    with pytest.raises(PrepareError, match="1 of 2 rows are bad"):
        prepare("custom", str(chat), tmp_path / "b", prompt_key="conv.messages", answer_key="label")
    (report,) = prepare(
        "custom",
        str(chat),
        tmp_path / "b",
        prompt_key="conv.messages",
        answer_key="label",
        instruction="Think.",
        max_bad_fraction=0.5,
    )
    (row,) = load_rows(str(tmp_path / "b" / "test.parquet"))
    assert row["prompt"][1]["content"] == "2+2? Think." and row["prompt"][0]["content"] == "Be brief."
    assert (row["data_source"], row["reward_model"]["ground_truth"]) == ("mine", "4")
    assert report.dropped == {"'conv.messages' (data.prompt_key) must be text or a non-empty list of chat messages": 1}
    prepare("gsm8k", str(shared_data / "gsm8k" / "test.jsonl"), tmp_path / "c", instruction="")
    assert "####" not in load_rows(str(tmp_path / "c" / "test.parquet"))[0]["prompt"][0]["content"]
    res = run_cli(
        "prepare-data",
        "custom",
        "--source",
        str(src),
        "--prompt-key",
        "problem",
        "--instruction",
        "Go.",
        "--out",
        str(tmp_path / "d"),
    )
    assert res.returncode == 0 and "test: 500 rows read, 500 kept" in res.stdout, res.stdout + res.stderr


def test_bad_rows_are_dropped_and_counted(shared_data, tmp_path):
    lines = (shared_data / "gsm8k" / "test.jsonl").read_bytes().splitlines()[:100]
    lines[3] = json.dumps({"question": "no answer here"}).encode()
    lines[7] = json.dumps({"question": "  ", "answer": "#### 3"}).encode()
    lines[9] = b'{"question": "\xff\xfe", "answer": "#### 1"}'
    src = tmp_path / "src"
    src.mkdir()
    (src / "test.jsonl").write_bytes(b"\n".join(lines))
    (report,) = prepare("gsm8k", str(src), tmp_path / "out", max_bad_fraction=0.05)
    assert (report.read, report.kept) == (100, 97)
    assert report.dropped == {"missing answer": 1, "empty prompt": 1, "not UTF-8 JSON": 1}
    assert "test.jsonl:4: missing answer" in report.examples[0]
    with pytest.raises(PrepareError, match=r"3 of 100 rows are bad .*\n.*test.jsonl:4: missing answer"):
        prepare("gsm8k", str(src), tmp_path / "out2", max_bad_fraction=0.02)
    assert not (tmp_path / "out2" / "test.parquet").exists()


def test_long_prompts_are_dropped_with_a_tokenizer(shared_data, tmp_path):
    from transformers import AutoTokenizer

    from grpo_ray import models
    from tests.conftest import TINY

    tok = AutoTokenizer.from_pretrained(models.resolve(TINY.format(arch="qwen2")))
    (report,) = prepare(
        "math500",
        str(shared_data / "math500" / "test.jsonl"),
        tmp_path,
        tokenizer=tok,
        max_prompt_tokens=400,
        max_bad_fraction=0.9,
    )
    assert (
        0 < report.dropped["prompt over 400 tokens"] < 500
        and report.kept == 500 - report.dropped["prompt over 400 tokens"]
    )


def test_prepare_data_cli_and_hub_error(shared_data, tmp_path):
    res = run_cli("prepare-data", "gsm8k", "--source", str(shared_data / "gsm8k"), "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert "train: 7473 rows read, 7473 kept, 0 dropped (none)" in res.stdout
    res = run_cli(
        "prepare-data",
        "gsm8k",
        "--source",
        "no-such-org/no-such-set",
        "--out",
        str(tmp_path / "x"),
        env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "cannot load 'no-such-org/no-such-set' from the hub" in res.stderr and "--source" in res.stderr


def test_prepare_data_cli_measures_prompts_with_the_recipes_model(shared_data, tmp_path):
    from tests.conftest import ROOT

    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        (ROOT / "recipes" / "tiny-cpu.yaml")
        .read_text()
        .replace(
            "tiny://qwen2?layers=2&hidden=128&heads=4&kv_heads=2&intermediate=256&vocab=128&bytes=0&seed=0",
            "tiny://qwen2?layers=1&hidden=64&heads=2&kv_heads=1",
        )
        .replace("max_prompt_length: 96", "max_prompt_length: 300")
    )
    res = run_cli(
        "prepare-data",
        "math500",
        "--source",
        str(shared_data / "math500" / "test.jsonl"),
        "--out",
        str(tmp_path / "out"),
        "--recipe",
        str(recipe),
        "--max-bad-fraction",
        "0.9",
    )
    assert res.returncode == 0, res.stderr
    dropped = int(res.stdout.split("prompt over 300 tokens ")[1].split(")")[0])
    assert 0 < dropped < 500 and f"500 rows read, {500 - dropped} kept" in res.stdout


# --- the multi-step reasoning task and SFT targets ------------------------------------------------------------


def test_reasoning_task_is_seeded_and_its_worked_solutions_are_right():
    a = load_rows("synthetic://reasoning?size=400&seed=3")
    assert a == load_rows("synthetic://reasoning?size=400&seed=3")
    assert a != load_rows("synthetic://reasoning?size=400&seed=4")
    test = load_rows("synthetic://reasoning?size=400&seed=3&split=test")
    assert not {r["extra_info"]["question"] for r in a} & {r["extra_info"]["question"] for r in test}
    gsm8k = load("gsm8k")
    steps = Counter()
    for r in a:
        assert set(r) == COLUMNS and r["data_source"] == "synthetic/reasoning"
        *lines, final = r["extra_info"]["answer"].splitlines()
        steps[len(lines)] += 1
        for line in lines:  # "6 + 5 = 11": one operation per line, and its result right
            x, op, y, eq, z = line.split()
            assert eq == "=" and {"+": int(x) + int(y), "-": int(x) - int(y), "*": int(x) * int(y)}[op] == int(z)
            assert 1 <= int(z) <= 40
        assert lines[0].split()[0] in r["extra_info"]["question"]  # the start count is read from the question
        for later, earlier in zip(lines[1:], lines):
            assert later.split()[0] == earlier.split()[-1]  # each step starts from the last result
        assert final == f"#### {lines[-1].split()[-1]}" == f"#### {r['reward_model']['ground_truth']}"
        assert gsm8k(r["extra_info"]["answer"], r["reward_model"]["ground_truth"]) == 1.0
    assert set(steps) == {2, 3}
    # answers spread evenly: guessing the commonest answer pays about 1 time in 39
    truths = Counter(r["reward_model"]["ground_truth"] for r in load_rows("synthetic://reasoning?size=4000"))
    assert max(truths.values()) / 4000 < 0.05


def test_answer_only_rows_drop_the_worked_lines_of_about_that_share():
    rows = load_rows("synthetic://reasoning?size=1000&seed=0&answer_only=0.5")
    bare = [r for r in rows if r["extra_info"]["answer"].startswith("####")]
    assert 400 <= len(bare) <= 600
    gsm8k = load("gsm8k")
    assert all(gsm8k(r["extra_info"]["answer"], r["reward_model"]["ground_truth"]) == 1.0 for r in rows)
    assert all(r["extra_info"]["answer"].count("\n") >= 2 for r in rows if r not in bare)
    with pytest.raises(DataError, match="answer_only=2.0 must be between 0 and 1"):
        load_rows("synthetic://reasoning?answer_only=2")


def test_products_rows_are_products_with_their_traces_and_their_keys_are_checked():
    rows = load_rows("synthetic://products?size=400&seed=0&answer_only=0.5")
    gsm8k = load("gsm8k")
    for r in rows:
        a, b = map(int, r["extra_info"]["answer"].split(" = ")[0].split(" * "))
        assert 10 <= a <= 99 and 10 <= b <= 99 and r["reward_model"]["ground_truth"] == str(a * b)
        assert gsm8k(r["extra_info"]["messages"][-1]["content"], r["reward_model"]["ground_truth"]) == 1.0
    assert 150 <= sum(len(r["extra_info"]["messages"]) == 1 for r in rows) <= 250
    with pytest.raises(DataError, match="digits=5 must be between 1 and 4"):
        load_rows("synthetic://products?digits=5")


def test_reasoning_responses_are_10_to_40_tokens_with_the_tiny_tokenizer():
    from transformers import AutoTokenizer

    from grpo_ray import models

    tok = AutoTokenizer.from_pretrained(
        models.resolve("tiny://qwen2?layers=1&hidden=64&heads=2&kv_heads=1&vocab=256&bytes=0&text=reasoning")
    )
    assert [tok.decode([t]) for t in tok("12 + 7 = 19")["input_ids"] if tok.decode([t]).strip().isdigit()] == list(
        "12719"
    )  # digits are single tokens
    lengths = [len(tok(r["extra_info"]["answer"])["input_ids"]) for r in load_rows("synthetic://reasoning?size=300")]
    assert 10 <= min(lengths) and max(lengths) <= 40


def test_one_step_problems_with_answers_no_start_reaches_still_end():
    rows = load_rows("synthetic://reasoning?size=300&seed=0&min_steps=1&max_steps=1&max_value=99")
    assert len(rows) == 300 and all(r["extra_info"]["answer"].count("\n") == 1 for r in rows)


def test_reasoning_spec_errors():
    for spec, message in [
        ("synthetic://reasoning?items=3", "unknown key 'items'"),
        ("synthetic://reasoning?max_value=5", "max_value=5 must be between 10 and 99"),
        ("synthetic://reasoning?min_steps=3&max_steps=2", "min_steps must not exceed max_steps"),
        ("synthetic://sum?size=3", "unknown synthetic task 'sum'"),
    ]:
        with pytest.raises(DataError, match=message):
            load_rows(spec)


def test_sft_targets_from_prepared_gsm8k_rows(shared_data, tmp_path):
    """GSM8K's worked solution is kept in extra_info.answer, so `grpo-ray sft` trains on the real rows."""
    from transformers import AutoTokenizer

    from grpo_ray import models
    from grpo_ray.config import load_recipe
    from grpo_ray.setup_run import usable_rows

    prepare("gsm8k", str(shared_data / "gsm8k"), tmp_path)
    recipe = load_recipe(
        "recipes/tiny-cpu-reasoning-sft.yaml",
        ["model.path=" + TINY_BYTES, "data.max_prompt_length=400", "sft.max_target_length=300"],
        command="sft",
    )
    tok = AutoTokenizer.from_pretrained(models.resolve(TINY_BYTES))
    dropped = {}
    rows = usable_rows([str(tmp_path / "test.parquet")], tok, recipe, dropped, "sft")
    assert len(rows) + dropped[str(tmp_path / "test.parquet")] == 1319 and len(rows) > 500
    row = rows[0]
    assert row["target_ids"][-1] == tok.eos_token_id
    assert tok.decode(row["target_ids"][:-1]) == row["extra_info"]["answer"]
    assert row["extra_info"]["answer"].rstrip().endswith("#### " + row["reward_model"]["ground_truth"])


def test_sft_rows_without_a_target_name_the_file_and_row(tmp_path):
    from transformers import AutoTokenizer

    from grpo_ray import models
    from grpo_ray.config import load_recipe
    from grpo_ray.setup_run import usable_rows

    rows = load_rows("synthetic://reasoning?size=3")
    rows[2]["extra_info"].pop("answer")
    p = tmp_path / "rows.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows))
    recipe = load_recipe("recipes/tiny-cpu-reasoning-sft.yaml", ["model.path=" + TINY_BYTES], command="sft")
    tok = AutoTokenizer.from_pretrained(models.resolve(TINY_BYTES))
    with pytest.raises(DataError, match=r"rows.jsonl row 2: no text or messages at sft.target_key='extra_info.answer'"):
        usable_rows([str(p)], tok, recipe, {}, "sft")


@pytest.mark.parametrize("arch", ["qwen2", "llama", "gemma3"])
def test_sft_traces_are_laid_out_as_a_rollout_lays_them_out(arch, tmp_path):
    """A multi-turn SFT target (the products task's tool-use trace) becomes the ids a calculator rollout makes of
    the same turns: each assistant turn and its end-of-turn token (trained), each tool message as the chat
    template's observation (``Observations.ids``, not trained). Answer-only traces are one turn."""
    from transformers import AutoTokenizer

    from grpo_ray import models
    from grpo_ray.config import load_recipe
    from grpo_ray.data.template import Observations
    from grpo_ray.setup_run import usable_rows

    name = TINY_BYTES.replace("qwen2", arch)
    recipe = load_recipe(
        "recipes/tiny-cpu-agent-sft.yaml",
        [f"model.path={name}", "data.max_prompt_length=200", "sft.max_target_length=200"],
        command="sft",
    )
    tok = AutoTokenizer.from_pretrained(models.resolve(name))
    spec = "synthetic://products?size=40&seed=3&answer_only=0.5"
    rows = usable_rows([spec], tok, recipe, {}, "sft")
    assert len(rows) == 40
    encode = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    observations = Observations.of(tok, "tool")
    kinds = Counter()
    for row in rows:
        turns = [m["content"] for m in row["extra_info"]["messages"] if m["role"] == "assistant"]
        answer = row["reward_model"]["ground_truth"]
        assert turns[-1] == f"#### {answer}"
        expected, mask = encode(turns[0]) + [tok.eos_token_id], [1] * (len(encode(turns[0])) + 1)
        if len(turns) == 2:
            seen = observations.ids(f"<result>{answer}</result>", ended=True)
            expected += seen + encode(turns[1]) + [tok.eos_token_id]
            mask += [0] * len(seen) + [1] * (len(encode(turns[1])) + 1)
            assert turns[0].startswith("<calc>") and answer in tok.decode(seen)
        assert row["target_ids"] == expected and row["target_mask"] == mask
        kinds[len(turns)] += 1
    assert kinds[1] >= 10 and kinds[2] >= 10  # both kinds of trace


def test_sft_traces_of_a_wrong_shape_name_the_file_and_row(tmp_path):
    from transformers import AutoTokenizer

    from grpo_ray import models
    from grpo_ray.config import load_recipe
    from grpo_ray.setup_run import usable_rows

    rows = load_rows("synthetic://products?size=3")
    rows[1]["extra_info"]["messages"] = [{"role": "tool", "content": "<result>1</result>"}]
    p = tmp_path / "traces.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows))
    recipe = load_recipe("recipes/tiny-cpu-agent-sft.yaml", ["model.path=" + TINY_BYTES], command="sft")
    tok = AutoTokenizer.from_pretrained(models.resolve(TINY_BYTES))
    with pytest.raises(DataError, match=r"traces.jsonl row 1: sft.target_key='extra_info.messages' holds messages: "):
        usable_rows([str(p)], tok, recipe, {}, "sft")


def test_checked_rows_are_kept_and_found_again_only_for_the_same_bytes_tokenizer_and_limits(tmp_path, monkeypatch):
    """A second check of the same file with the same model and limits reads the kept rows (equal to a fresh check,
    drops counted the same); changed bytes, another limit, a damaged entry or another chat template check afresh."""
    from grpo_ray import models
    from grpo_ray.config import load_recipe
    from grpo_ray.data import checked
    from grpo_ray.setup_run import usable_rows
    from tests.conftest import ROOT, TINY

    monkeypatch.setenv("GRPO_RAY_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": "x " * n, "answer": str(n)}) + "\n" for n in (3, 60, 5)))
    model = TINY.format(arch="qwen2")
    keys = [f"model.path={model}", "data.prompt_key=prompt", "data.answer_key=answer"]
    recipe = lambda *o: load_recipe(ROOT / "recipes/tiny-cpu.yaml", [*keys, *o])  # noqa: E731
    tokenizer = models.load_tokenizer(models.resolve(model), recipe().model)

    def check(r, fresh: bool):
        reads = []
        monkeypatch.setattr("grpo_ray.setup_run.load_rows", lambda *a: reads.append(a) or load_rows(*a))
        dropped, first = {}, []
        rows = usable_rows([str(data)], tokenizer, r, dropped, "train", first)
        assert bool(reads) == fresh
        return rows, dropped, first

    short = recipe("data.max_prompt_length=40")
    first_check = check(short, fresh=True)
    assert [r["answer"] for r in first_check[0]] == ["3", "5"] and first_check[1] == {str(data): 1}
    assert "rows.jsonl row 1 is over data.max_prompt_length=40" in first_check[2][0]
    assert check(short, fresh=False) == first_check  # the kept rows: the same rows, ids, drops and reason
    assert len(list(checked.folder().glob("*.json"))) == 1
    check(recipe("data.max_prompt_length=96"), fresh=True)  # another limit
    check(recipe("data.max_prompt_length=40", "data.system_prompt='Think.'"), fresh=True)  # another rendering
    data.write_text(data.read_text().replace('"5"', '"6"'))  # the same size, other bytes
    assert [r["answer"] for r in check(short, fresh=True)[0]] == ["3", "6"]
    for entry in checked.folder().glob("*.json"):
        entry.write_text(entry.read_text()[:100])  # cut short: not trusted, made again
    assert [r["answer"] for r in check(short, fresh=True)[0]] == ["3", "6"]
    templated = models.load_tokenizer(models.resolve(model), recipe("model.chat_template=plain").model)
    assert checked.key(str(data), templated, short, "train") != checked.key(str(data), tokenizer, short, "train")
    assert checked.key(str(data), tokenizer, short, "sft") is None  # SFT rows carry more of the recipe: not kept


def test_question_and_answer_rows_need_no_gsm8k_marker(tmp_path):
    """`eval` and prepare-data take {question, answer} rows whose answer is the final answer alone (text or a
    number), as users write them, beside GSM8K's 'solution #### 42'; a worked solution with no marker is refused
    saying so, not as a missing answer."""
    from grpo_ray.jobs.evaluate import eval_rows

    rows = [
        {"question": "Six times seven?", "answer": "42"},
        {"question": "Half of 7?", "answer": 3.5},
        {"question": "How many?", "answer": "Two and two.\nSo #### 1,004"},
        {"question": "Why?", "answer": "First, two.\nThen, four."},
    ]
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = eval_rows(str(path))
    assert [r["reward_model"]["ground_truth"] for r in got] == ["42", "3.5", "1004"]
    from grpo_ray.data.prepare import gsm8k_row

    assert gsm8k_row(rows[3], "test", 3) == (None, "answer is a worked solution without GSM8K's '#### <final answer>'")
