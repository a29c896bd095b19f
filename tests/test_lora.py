"""LoRA (model.lora): adapters train, the base stays frozen and is the reference, the engines get the adapters
alone (vLLM's LoRA support) or the merged weights, checkpoints hold the adapters, export writes both an adapter
directory and a merged model."""

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from grpo_ray import models
from grpo_ray.config import LoraConfig, load_recipe
from grpo_ray.models import dims, lora
from tests.conftest import ROOT, TINY, engine_env, run_cli
from tests.test_checkpoint import assert_same_metrics, metrics, whole_and_resumed

LORA = ["model.lora.rank=4", "model.lora.alpha=8", "learner.optim.lr=1e-2"]
ONE_STEP_OFF = ["algorithm.max_staleness=1", "algorithm.rollout_correction.rollout_is=token"]


def test_merged_weights_are_peft_merge_under_the_base_names():
    """What a sync sends (every rank's rows merged; here one process holds all rows) is what peft's own merge
    gives, under the base model's names, for every adapted weight of the base model, and nothing else (the rest is
    frozen: the engines hold it as they loaded it)."""
    path = models.resolve(TINY.format(arch="qwen2"))
    base_names = set(dict(models.load_causal_lm(path, torch.float32).named_parameters()))
    model = lora.wrap(
        models.load_causal_lm(path, torch.float32), LoraConfig(rank=4, alpha=8, target_modules=["q_proj", "down_proj"])
    )
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_()  # B starts at zero: make the adapters matter
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(lora.is_adapter(n) for n in trainable)
    sent = {name: rows() for name, (shape, rows) in lora.engine_weights(model, lambda p: p.detach()).items()}
    adapted = {f"model.layers.{i}.{m}.weight" for i in range(2) for m in ("self_attn.q_proj", "mlp.down_proj")}
    assert set(sent) == adapted and adapted < base_names
    merged = dict(model.merge_and_unload().named_parameters())
    begun = models.load_causal_lm(path, torch.float32).state_dict()
    for name, tensor in sent.items():
        assert torch.allclose(tensor, merged[name], atol=1e-6) and not torch.equal(tensor, begun[name]), name


def test_plan_counts_adapters_only_and_no_reference():
    from grpo_ray.planner.fit import check

    full = load_recipe(ROOT / "recipes" / "llama3.1-8b-math-4node.yaml")
    adapted = load_recipe(ROOT / "recipes" / "llama3.1-8b-math-4node.yaml", ["model.lora.rank=32"])
    a, b = ({p.pool: p for p in check(r).memory} for r in (full, adapted))
    assert "reference" in a and "reference" not in b
    assert b["learner"].parts["optimizer"] < a["learner"].parts["optimizer"] / 50
    assert b["learner"].parts["grads"] < a["learner"].parts["grads"] / 50
    assert b["learner"].total < a["learner"].total
    assert "LoRA rank 32" in b["learner"].note


# multi-turn trajectories (an environment answering each turn, tests/helpers/envs.py's Echo; stop strings end the
# random model's turns), so adapters are trained on trajectories with masked observations
MULTI_TURN = [
    "environment.name=tests.helpers.envs:Echo",
    "environment.stop=[a,e,i,o,u]",
    "environment.max_tokens=80",
    "generator.sampling.max_tokens=6",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return whole_and_resumed(tmp_path_factory, [*LORA, *ONE_STEP_OFF, *MULTI_TURN], kill=False)


@pytest.mark.slow
def test_lora_run_one_step_off_syncs_the_adapters_and_resumes_exactly(runs):
    whole, killed = runs
    assert_same_metrics(whole, killed)  # a checkpoint of adapters and their optimizer state resumes exactly
    rows = metrics(whole)
    assert max(r["sync/logprob_diff"] for r in rows) < 1e-3  # the engine applies the learner's adapters every step
    params = dims.model_dims(load_recipe(ROOT / "recipes" / "tiny-cpu.yaml").model.path).params
    assert all(0 < r["sync/bytes"] < params * 4 / 5 for r in rows)  # the adapters alone, not the model
    assert rows[0]["actor/kl_loss"] == 0 and all(r["actor/kl_loss"] > 0 for r in rows[1:])  # adapters off = reference
    assert all(r["timing_s/ref"] > 0 for r in rows)
    # one step off: the old policy of a stale batch is the learner's adapters of that version (a snapshot)
    assert [r["rollout/staleness"] for r in rows] == [0, 1, 0, 1]  # step 3 waits for the checkpoint of step 2
    assert max(abs(r["rollout_corr/kl"]) for r in rows) < 1e-5
    assert all(r["env/turns/mean"] > 1.2 and 0 < r["env/masked_share"] < 1 for r in rows)  # trajectories, masked
    placement = json.loads((whole / "placement.json").read_text())
    assert {p: len(a) for p, a in placement.items()} == {
        "generator": 1,
        "learner": 2,
        "reference": 0,
        "teacher": 0,
        "reward_model": 0,
        "judge": 0,
        "reward": 1,
    }
    meta = json.loads((whole / "checkpoints" / "step_4" / "manifest.json").read_text())["files"]
    shards = sum(entry["size"] for name, entry in meta.items() if name.startswith("learner/"))
    assert shards < params * 4  # adapters + Adam moments: less than the fp32 weights alone (full: 3x them)


@pytest.mark.slow
def test_lora_export_writes_adapters_and_a_merged_model(runs, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    whole, _ = runs
    res = run_cli("export", str(whole / "checkpoints" / "step_4"), "--out", str(tmp_path / "hf"))
    assert res.returncode == 0, res.stderr[-3000:]
    path = models.resolve(load_recipe(ROOT / "recipes" / "tiny-cpu.yaml").model.path)
    ids = torch.tensor([list(range(3, 60))])
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    adapted = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), tmp_path / "hf" / "adapter"
    )
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        m, a, b = (x(ids).logits for x in (merged, adapted, base))
    assert (m - a).abs().max() < 1e-4  # the adapters on the base are the merged model
    assert (m - b).abs().max() > 1e-3  # and they trained
    gen = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "helpers" / "vllm_generate.py"), str(tmp_path / "hf")],
        capture_output=True,
        text=True,
        timeout=300,
        env=engine_env(),  # the engine in that process: one start less
    )
    assert gen.returncode == 0 and "RESULT " in gen.stdout, gen.stderr[-3000:]  # vLLM serves the merged model


@pytest.mark.slow
def test_export_of_a_warm_started_lora_run_never_trains(runs, tmp_path):
    """A LoRA checkpoint of a run on an sft:// model, exported where that warm start was never trained (an empty
    cache): export reads the base the checkpoint recorded and trains nothing; where that base is gone too, it
    writes the adapters alone and says so."""
    import shutil

    import yaml
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    whole, _ = runs
    path = models.resolve(load_recipe(ROOT / "recipes" / "tiny-cpu.yaml").model.path)
    ckpt = tmp_path / "step_4"
    shutil.copytree(whole / "checkpoints" / "step_4", ckpt)
    base = tmp_path / "sft-model"  # where the warm start's model was when the run trained
    shutil.copytree(path, base)
    config = yaml.safe_load((ckpt / "config.yaml").read_text())
    config["model"]["path"] = "sft://recipes/tiny-cpu-reasoning-sft.yaml"
    (ckpt / "config.yaml").write_text(yaml.safe_dump(config))
    info = json.loads((ckpt / "training_info.json").read_text())
    assert info["model_path"] == path  # what the run recorded: its base, resolved
    (ckpt / "training_info.json").write_text(json.dumps({**info, "model_path": str(base)}))
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"] = {
        **manifest["files"],
        **{n: (ckpt / n).stat().st_size for n in ("config.yaml", "training_info.json")},
    }
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    empty = {"GRPO_RAY_CACHE": str(tmp_path / "empty-cache")}

    res = run_cli("export", str(ckpt), "--out", str(tmp_path / "merged"), env=empty, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "SFT" not in res.stdout and not (tmp_path / "empty-cache").exists()  # nothing trained, nothing built
    ids = torch.tensor([list(range(3, 60))])
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)(ids).logits
        adapted = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), tmp_path / "merged" / "adapter"
        )(ids).logits
    assert (merged - adapted).abs().max() < 1e-4

    shutil.rmtree(base)  # the warm start's model is not on this machine either
    res = run_cli("export", str(ckpt), "--out", str(tmp_path / "alone"), env=empty, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "is not on this machine: wrote the adapters alone" in res.stdout
    assert not list((tmp_path / "alone").glob("*.safetensors")) and not (tmp_path / "empty-cache").exists()
    with torch.no_grad():
        alone = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), tmp_path / "alone" / "adapter"
        )(ids).logits
    assert (alone - adapted).abs().max() < 1e-6  # the same adapters


@pytest.mark.slow
@pytest.mark.parametrize("mode", [pytest.param("adapters", marks=pytest.mark.smoke), "merged"])
def test_engine_takes_each_update_of_the_adapters(ray_local, tmp_path, mode):
    """The anchors' silent no-op (an adapter sync that never reaches the engine) cannot pass here: after a LoRA
    step the engine's logprobs differ from the learner's until the push, and match them after it; a push sends
    the adapters alone (a small share of the model), or the adapted weights merged (the frozen rest stays as the
    engine loaded it)."""
    from grpo_ray.controller import GRPOController
    from grpo_ray.setup_run import setup_run
    from tests.conftest import tiny_rollouts

    recipe = load_recipe(
        ROOT / "recipes" / "tiny-cpu.yaml",
        [
            *LORA,
            f"model.lora.sync={mode}",
            f"model.path={TINY.format(arch='qwen2')}",
            f"trainer.output_dir={tmp_path}",
            "data.train_batch_size=3",
            "algorithm.group_size=4",
            "learner.mini_batch_size=12",
            "learner.micro_batch_size=6",
            "trainer.bucket_mb=1",
        ],
    )
    c = GRPOController(recipe, setup_run(recipe))
    try:
        c.start()
        assert not c.pools.actors["reference"]
        assert c.engines.probe() < 1e-5  # the same base weights on both sides
        for version in (1, 2):
            rollouts = [
                ray_local.put(dataclasses.replace(r, policy_version=version - 1))
                for r in tiny_rollouts(vocab=300, prompts=6, group=2, seed=version)
            ]
            ray_local.get(
                [
                    l.train.remote(rollouts, torch.linspace(-2, 2, 12).tolist(), version - 1)
                    for l in c.pools.actors["learner"]
                ]
            )
            assert c.engines.probe() > 1e-3  # the adapters moved the learner; the engine has not seen it yet
            c.version = version
            synced = c.engines.sync()
            assert synced["sync/logprob_diff"] < 1e-5
            shape = dims.model_dims(recipe.model.path)
            if mode == "adapters":
                assert synced["sync/bytes"] < 4 * shape.params / 10
            else:  # each adapted weight merged (all-linear: every linear layer's), in fp32, and nothing else
                assert synced["sync/bytes"] == 4 * shape.pushed(recipe.model) > 4 * shape.params / 2
    finally:
        c.shutdown()
