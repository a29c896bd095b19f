import pytest
import yaml

from grpo_ray.config import RecipeError, dump_recipe, load_recipe, redact
from tests.conftest import ROOT, plan_cli, run_cli

TINY = ROOT / "recipes" / "tiny-cpu.yaml"


def write(tmp_path, text, name="r.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def recipe_with(tmp_path, **sections):
    base = yaml.safe_load(TINY.read_text())
    for dotted, value in sections.items():
        node = base
        *parents, last = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return write(tmp_path, yaml.safe_dump(base))


def error_of(path, overrides=()):
    with pytest.raises(RecipeError) as e:
        load_recipe(path, list(overrides))
    return str(e.value)


def test_tiny_recipe_loads_with_types_and_defaults():
    r = load_recipe(TINY)
    assert r.learner.world_size == 2
    assert r.generator.sampling.max_tokens == 1
    assert r.reward.functions[0].name == "gsm8k" and r.reward.functions[0].weight == 1.0
    assert r.algorithm.kl_estimator == "k3"
    assert r.generator.tensor_parallel_size == 1  # a default the file does not set


def test_overrides_apply_and_convert_types():
    r = load_recipe(
        TINY,
        [
            "trainer.total_steps=7",
            "learner.optim.lr=0.5",
            "generator.vllm_kwargs.block_size=32",
            "trainer.experiment_name=abc",
            "trainer.output_dir=out/${trainer.experiment_name}",
        ],
    )
    assert r.trainer.total_steps == 7 and r.learner.optim.lr == 0.5
    assert r.generator.vllm_kwargs == {"block_size": 32}
    assert r.trainer.output_dir == "out/abc"


def test_unknown_key_in_file_names_key_file_and_closest(tmp_path):
    p = recipe_with(tmp_path, learner__micro_batch_szie=4)
    msg = error_of(p)
    assert str(p) in msg and "unknown key 'learner.micro_batch_szie'" in msg
    assert "did you mean 'learner.micro_batch_size'?" in msg


def test_unknown_section_and_list_item_keys(tmp_path):
    assert "unknown key 'trainr'; did you mean 'trainer'?" in error_of(recipe_with(tmp_path, trainr={"seed": 1}))
    p = recipe_with(tmp_path, reward__functions=[{"name": "gsm8k", "wieght": 2}])
    assert "unknown key 'reward.functions[0].wieght'; did you mean 'reward.functions[0].weight'?" in error_of(p)


def test_unknown_key_in_override_names_the_override():
    msg = error_of(TINY, ["trainer.totl_steps=3"])
    assert (
        "override 'trainer.totl_steps=3': unknown key 'trainer.totl_steps'; did you mean 'trainer.total_steps'?" in msg
    )
    assert "expected key=value" in error_of(TINY, ["trainer.total_steps"])


def test_wrong_type_names_key():
    msg = error_of(TINY, ["learner.world_size=two"])
    assert "learner.world_size" in msg and "'two'" in msg


def test_missing_model_path(tmp_path):
    assert "model.path is required" in error_of(write(tmp_path, "data:\n  train_files: [a.parquet]\n"))


def test_malformed_yaml_and_missing_file(tmp_path):
    assert "not valid YAML" in error_of(write(tmp_path, "model: [unclosed\n"))
    assert "does not exist" in error_of(tmp_path / "nope.yaml")
    assert "top level must be a mapping" in error_of(write(tmp_path, "- a\n- b\n"))


def test_group_size_below_two():
    msg = error_of(TINY, ["algorithm.group_size=1", "learner.mini_batch_size=16", "learner.micro_batch_size=8"])
    assert "algorithm.group_size=1: must be >= 2 (GRPO compares samples of one prompt)" in msg


def test_batch_not_divisible_by_mini_batch():
    msg = error_of(TINY, ["learner.mini_batch_size=96", "learner.micro_batch_size=48"])
    assert (
        "data.train_batch_size (16) x algorithm.group_size (16) = 256 samples per step "
        "is not divisible by learner.mini_batch_size (96)"
    ) in msg


def test_mini_batch_not_divisible_by_micro_times_world():
    msg = error_of(TINY, ["learner.micro_batch_size=48"])
    assert (
        "learner.mini_batch_size (256) is not divisible by learner.micro_batch_size (48) x learner.world_size (2) = 96"
        in msg
    )


def test_an_engine_range_is_read_and_refused_where_engines_cannot_join(tmp_path):
    """generator.num_engines: min..max (in the file or an override) is num_engines=min, max_engines=max; a range
    the wrong way round, text that is not a range, and a colocated generator are refused, each in one line naming the
    keys; a streaming run takes one."""
    r = load_recipe(TINY, ["generator.num_engines=1..3"])
    assert (r.generator.num_engines, r.generator.max_engines) == (1, 3)
    r = load_recipe(recipe_with(tmp_path, generator__num_engines="2 .. 4"))
    assert (r.generator.num_engines, r.generator.max_engines) == (2, 4)
    assert load_recipe(TINY).generator.max_engines == 0
    r = load_recipe(recipe_with(tmp_path, generator__num_engines="2"))  # a count written as text, as before
    assert (r.generator.num_engines, r.generator.max_engines) == (2, 0)
    assert "generator.max_engines=1 is under generator.num_engines=3" in error_of(TINY, ["generator.num_engines=3..1"])
    assert "generator.num_engines='many': expected a count of engines or a range min..max (2..4)" in error_of(
        TINY, ["generator.num_engines=many"]
    )
    streaming = ["generator.num_engines=1..2", "algorithm.schedule=streaming", "algorithm.max_staleness=1"]
    assert load_recipe(TINY, streaming).generator.max_engines == 2
    colocated = ["generator.num_engines=1..2", "cluster.colocate=[[generator,learner]]", "learner.world_size=1"]
    assert "generator.max_engines=2 with the generator colocated (cluster.colocate)" in error_of(TINY, colocated)


def test_tensor_parallel_larger_than_node():
    msg = error_of(
        TINY,
        ["cluster.device=cuda", "cluster.devices_per_node=4", "cluster.nodes=2", "generator.tensor_parallel_size=8"],
    )
    assert "generator.tensor_parallel_size (8) is larger than cluster.devices_per_node (4)" in msg


def test_more_gpus_than_cluster_and_colocation_shares():
    """Counting GPUs is the fit check's (grpo_ray.placement.layout): the recipe loads, the layout says what has no
    room."""
    from grpo_ray import placement

    base = [
        "cluster.device=cuda",
        "cluster.gpu=h100",
        "cluster.devices_per_node=8",
        "cluster.nodes=2",
        "generator.num_engines=2",
        "generator.tensor_parallel_size=4",
        "learner.world_size=8",
        "learner.micro_batch_size=8",
        "learner.mini_batch_size=128",
        "reference.num_actors=4",
    ]
    _, problems = placement.layout(load_recipe(TINY, base))
    assert problems == [
        "reference: 4 actors of 1 GPUs need 4 GPUs on the cluster's nodes, which have 2 nodes x 8 GPUs "
        "= 16, 0 of them free for it; add nodes, colocate pools (cluster.colocate) or ask for fewer actors"
    ]
    # the reference on the learner's GPUs: 8 + 8 fits in 16
    assert placement.layout(load_recipe(TINY, base + ["cluster.colocate=[[learner,reference]]"]))[1] == []


def test_choices_and_positive_sizes():
    msg = error_of(TINY, ["algorithm.kl_estimator=k2", "learner.world_size=0"])
    assert "learner.world_size=0: must be positive" in msg
    msg = error_of(
        TINY, ["algorithm.kl_estimator=k2", "trainer.loggers=[console,swanlab]", "cluster.colocate=[[learner,critic]]"]
    )
    assert "algorithm.kl_estimator='k2': expected one of k1, k3" in msg
    assert "unknown logger 'swanlab'" in msg and "unknown pool 'critic'" in msg


def test_dump_redacts_secret_keys_and_env_values(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_supersecretvalue123")
    r = load_recipe(
        TINY, ["generator.vllm_kwargs.hf_token=${oc.env:HF_TOKEN}", "trainer.experiment_name=run-${oc.env:HF_TOKEN}"]
    )
    text = dump_recipe(r, tmp_path / "config.yaml").read_text()
    assert "hf_supersecretvalue123" not in text
    assert "hf_token: '***redacted***'" in text and "max_tokens: 1" in text
    assert redact({"api_key": "x", "n": ["a-s3cr3tval"]}, ["s3cr3tval"]) == {
        "api_key": "***redacted***",
        "n": ["a-***redacted***"],
    }


def test_cli_user_error_exits_2_without_traceback():
    res = run_cli("train", str(TINY), "learner.micro_batch_size=48")
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    assert res.stderr.startswith("grpo-ray: error: ") and "learner.mini_batch_size (256)" in res.stderr


def test_a_second_run_in_the_same_output_dir_is_refused_unless_overwrite(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    res = run_cli(
        "train",
        str(TINY),
        f"trainer.output_dir={tmp_path}",
        "trainer.total_steps=1",
        "trainer.resume=disable",
        "model.path=tiny://qwen2?layers=1&hidden=64&heads=2&kv_heads=1",
    )
    assert res.returncode == 2 and "already holds a run (metrics.jsonl)" in res.stderr
    assert "trainer.overwrite=true" in res.stderr and (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n'


def test_every_recipe_key_has_a_doc_and_grpo_ray_config_prints_it():
    from grpo_ray import recipe_docs

    keys = recipe_docs.keys()
    assert len(keys) > 120 and [k.path for k in keys if not k.doc] == []  # a field without a docstring fails here
    res = run_cli("config", "recipes/tiny-cpu.yaml", "trainer.total_steps=7")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    at = lines.index("trainer.total_steps  [int] default: 0  value: 7")
    assert lines[at + 1].strip().startswith("Steps to run")
    assert "reward.functions[].name  [str] default: (required)" in res.stdout
    assert sum(1 for line in lines if not line.startswith(" ")) == len(keys)


def test_the_json_schema_accepts_the_shipped_recipes_and_refuses_unknown_keys():
    import json

    import jsonschema
    import yaml

    res = run_cli("config", "--json-schema")
    schema = json.loads(res.stdout)
    for path in sorted((ROOT / "recipes").glob("*.yaml")):
        jsonschema.validate(yaml.safe_load(path.read_text()), schema)
    with pytest.raises(jsonschema.ValidationError, match="'trainr' was unexpected"):
        jsonschema.validate({"trainr": {}}, schema)
    with pytest.raises(jsonschema.ValidationError, match="'k2' is not one of"):
        jsonschema.validate({"algorithm": {"kl_estimator": "k2"}}, schema)
    jsonschema.validate({"generator": {"num_engines": "2..4"}}, schema)  # a range of engines
    with pytest.raises(jsonschema.ValidationError, match="'many' does not match"):
        jsonschema.validate({"generator": {"num_engines": "many"}}, schema)


def test_every_unknown_key_at_once_with_verl_and_nemo_rl_names_answered():
    msg = error_of(
        ROOT / "recipes" / "tiny-cpu.yaml",
        [
            "actor_rollout_ref.rollout.n=4",
            "trainer.n_gpus_per_node=8",
            "data.max_response_length=3",
            "grpo.num_prompts_per_step=8",
        ],
    )
    assert msg.startswith("4 problems:")
    for said in (
        "verl's actor_rollout_ref.rollout.n is algorithm.group_size here",
        "verl's trainer.n_gpus_per_node is cluster.devices_per_node here",
        "verl's data.max_response_length is generator.sampling.max_tokens here",
        "NeMo RL's grpo.num_prompts_per_step is data.train_batch_size here",
    ):
        assert said in msg
    assert "did you mean" not in msg  # no string-similarity guesses beside a known answer
    never = error_of(ROOT / "recipes" / "tiny-cpu.yaml", ["trainer.save_freq=-1"])
    assert "trainer.save_freq=-1: must be >= 0 (0 means never here, where verl writes -1)" in never


def test_verls_custom_reward_function_is_taken_as_reward_functions(tmp_path):
    """verl's custom_reward_function.path, .name (compute_score when not given) and .reward_kwargs, as overrides in
    any order or as the recipe's section, become one reward function of ours with its kwargs."""
    recipe = ROOT / "recipes" / "tiny-cpu.yaml"
    got = load_recipe(
        recipe,
        [
            "custom_reward_function.name=my_score",
            "custom_reward_function.reward_kwargs.scale=2",
            f"custom_reward_function.path={tmp_path}/r.py",
        ],
    ).reward.functions
    assert [(f.name, f.kwargs, f.sources) for f in got] == [(f"{tmp_path}/r.py:my_score", {"scale": 2}, [])]
    section = tmp_path / "verl.yaml"
    section.write_text(recipe.read_text() + f"\ncustom_reward_function:\n  path: {tmp_path}/r.py\n")
    assert [f.name for f in load_recipe(section).reward.functions] == [f"{tmp_path}/r.py:compute_score"]
    assert "custom_reward_function: no path given, expected custom_reward_function.path" in error_of(
        recipe, ["custom_reward_function.name=f"]
    )
    assert "custom_reward_function: unknown key 'paht'" in error_of(recipe, ["custom_reward_function.paht=r.py"])


def test_overrides_before_or_after_options_and_a_version():
    res = plan_cli("recipes/tiny-cpu.yaml", "--gpu", "cpu", "trainer.total_steps=3")
    assert res.returncode == 0 and "FITS" in res.stdout, res.stderr
    res = plan_cli("recipes/tiny-cpu.yaml", "--gpu", "cpu", "--bogus")
    assert res.returncode == 2 and "unrecognized arguments: --bogus" in res.stderr
    res = run_cli("--version")
    assert res.returncode == 0 and res.stdout.startswith("grpo-ray 0.")


def test_a_mapping_or_list_is_replaced_or_reset_from_the_command_line():
    """A GKE recipe becomes a plain one from the command line: a mapping value replaces the recipe's (an entry
    is still set with its dotted key), ~key puts a key (or one entry) back to its default."""
    gke = ROOT / "recipes" / "qwen2.5-32b-gsm8k-b200.yaml"
    assert load_recipe(gke).cluster.node_resources == {
        "generator": "generation",
        "learner": "training",
        "reference": "training",
    }
    plain = load_recipe(gke, ["cluster.node_resources={}", "~cluster.node_markers", "cluster.colocate=[]"])
    assert (plain.cluster.node_resources, plain.cluster.node_markers, plain.cluster.colocate) == ({}, {}, [])
    one = load_recipe(
        gke,
        [
            "cluster.node_resources={generator: gen}",
            "cluster.node_markers={gen: 1}",
            "cluster.node_resources.learner=gen",
        ],
    )
    assert one.cluster.node_resources == {"generator": "gen", "learner": "gen"}
    assert load_recipe(gke, ["~cluster.node_resources.reference"]).cluster.node_resources == {
        "generator": "generation",
        "learner": "training",
    }
    assert load_recipe(gke, ["~trainer"]).trainer.total_steps == 0  # a whole section back to its defaults
    assert "unknown key 'cluster.nodez'; did you mean 'cluster.nodes'?" in error_of(gke, ["~cluster.nodez"])
    res = plan_cli(str(gke), "--gpu", "h200", "~cluster.node_resources", "~cluster.node_markers")
    assert res.returncode == 0 and "node 1 8/8 GPUs: generator x1" in res.stdout, res.stdout + res.stderr
