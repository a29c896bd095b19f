"""Checkpoints: kill after a saved step and resume exactly; another world size; bad checkpoints refused."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from grpo_ray import checkpoint
from tests.conftest import ONE_STEP_OFF, ROOT, engine_env, run_cli

pytestmark = pytest.mark.slow
COMMON = [
    "trainer.total_steps=4",
    "trainer.save_freq=2",
    "trainer.test_freq=0",
    "trainer.val_before_train=false",
    "trainer.dump_freq=0",
]
SAME = (
    "critic/score/mean",
    "actor/grad_norm",
    "actor/pg_loss",
    "actor/entropy",
    "actor/kl_loss",
    "response_length/mean",
    "rollout/policy_version",
)


def metrics(out):
    return [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]


def whole_and_resumed(tmp_path_factory, extra=(), recipe="recipes/tiny-cpu.yaml", kill=True):
    """An uninterrupted 4-step run, and the same run SIGKILLed after step 2's checkpoint, then restarted.

    `kill=False` (where what is checked is the resume, not the kill: each SIGKILL start costs a run's start-up,
    and this pair already kills for real): a copy of the uninterrupted run as that kill leaves it, its step 2
    checkpoint, metrics and dumps up to step 3, and nothing later, is restarted instead."""
    whole, killed = tmp_path_factory.mktemp("whole"), tmp_path_factory.mktemp("killed")
    res = run_cli("train", recipe, *COMMON, *extra, f"trainer.output_dir={whole}", timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    if kill:
        sigkill_after_step_3(recipe, extra, killed)
    else:
        shutil.copytree(whole, killed, dirs_exist_ok=True)
        shutil.rmtree(killed / "checkpoints" / "step_4")
        (killed / "rollouts" / "train_data_step4.jsonl").unlink(missing_ok=True)
        kept = [line for line in (killed / "metrics.jsonl").read_text().splitlines() if json.loads(line)["step"] <= 3]
        (killed / "metrics.jsonl").write_text("".join(line + "\n" for line in kept))
    assert checkpoint.complete_steps(killed / "checkpoints") == [2]
    resumed = run_cli("train", recipe, *COMMON, *extra, f"trainer.output_dir={killed}", timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stdout and "(step 2)" in resumed.stdout
    return whole, killed


def sigkill_after_step_3(recipe, extra, out):
    """Run into `out` and SIGKILL the driver, its local Ray cluster and every actor once step 3 is logged."""
    cmd = [sys.executable, "-m", "grpo_ray", "train", recipe, *COMMON, *extra, f"trainer.output_dir={out}"]
    errors = out.parent / f"{out.name}.stderr"
    with errors.open("w") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
    try:
        deadline, said = time.time() + 600, []
        for line in proc.stdout:
            said.append(line)
            if line.startswith("step:3 ") or time.time() > deadline:
                break
        assert said and said[-1].startswith("step:3 "), "".join(said)[-2000:] + errors.read_text()[-3000:]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def assert_same_metrics(whole, killed):
    a, b = metrics(whole), metrics(killed)
    assert [r["step"] for r in b] == [1, 2, 3, 4]  # nothing repeated, nothing skipped
    for ra, rb in zip(a, b):
        for key in SAME:
            assert rb[key] == pytest.approx(ra[key], rel=1e-6, abs=1e-9), (ra["step"], key)


@pytest.fixture
def runs(resumed_runs):
    """The one-step-off pair of tests/conftest.py (test_async.py checks its schedule)."""
    return resumed_runs


@pytest.mark.smoke
def test_resume_after_sigkill_repeats_the_uninterrupted_run(runs):
    whole, killed = runs
    assert_same_metrics(whole, killed)
    assert checkpoint.complete_steps(killed / "checkpoints") == [2, 4]
    state = checkpoint.load_state(killed / "checkpoints" / "step_4")
    assert state["step"] == 4 and state["version"] == 4 and state["data"] == {"epoch": 0, "index": 64}
    info = json.loads((killed / "checkpoints" / "step_4" / "training_info.json").read_text())
    assert info["consumed_samples"] == 64
    assert (killed / "checkpoints" / "step_4" / "tokenizer.json").is_file()


def test_resume_into_another_learner_world_size(runs, tmp_path):
    whole, killed = runs
    res = run_cli(
        "train",
        "recipes/tiny-cpu.yaml",
        *COMMON,
        *ONE_STEP_OFF,
        "trainer.total_steps=3",
        "learner.world_size=1",
        f"trainer.resume={killed / 'checkpoints' / 'step_2'}",
        f"trainer.output_dir={tmp_path}",
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    step3 = metrics(tmp_path)[-1]
    assert step3["step"] == 3
    for key in SAME:  # one rank adds up in another order than two: equal to float precision
        assert step3[key] == pytest.approx(metrics(whole)[2][key], rel=1e-4, abs=1e-6), key


@pytest.mark.smoke
def test_half_written_and_corrupted_checkpoints_are_refused(runs, tmp_path):
    _, killed = runs
    out = tmp_path / "run"
    shutil.copytree(killed, out)
    root = out / "checkpoints"
    (root / ".tmp_step_6" / "learner").mkdir(parents=True)  # a save killed mid-write
    (root / ".tmp_step_6" / "learner" / "__0_0.distcp").write_bytes(b"partial")
    said = []
    assert checkpoint.find_resume(out, "auto", said.append) == root / "step_4"
    shard = sorted((root / "step_4" / "learner").glob("*.distcp"))[0]
    shard.write_bytes(shard.read_bytes()[:100])  # truncated
    assert checkpoint.find_resume(out, "auto", said.append) == root / "step_2"
    assert "checkpoint step_4 is not whole" in said[-1] and shard.name in said[-1] and "truncated" in said[-1]
    with pytest.raises(checkpoint.CheckpointError, match=rf"cannot be loaded: .*{shard.name} is truncated"):
        checkpoint.find_resume(out, str(root / "step_4"))
    (root / "step_2" / "learner" / ".metadata").unlink()
    assert checkpoint.find_resume(out, "auto", said.append) is None
    assert ".metadata is missing" in said[-1]
    res = run_cli(
        "train", "recipes/tiny-cpu.yaml", *COMMON, f"trainer.output_dir={out}", f"trainer.resume={root / 'step_4'}"
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr and shard.name in res.stderr


@pytest.mark.smoke
def test_export_matches_the_learner_and_loads_in_vllm(runs, tmp_path, ray_local):
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_ray.config import load_recipe
    from grpo_ray.models import resolve
    from grpo_ray.roles.learner import Learner

    _, killed = runs
    ckpt = killed / "checkpoints" / "step_4"
    res = run_cli("export", str(ckpt), "--out", str(tmp_path / "hf"), "--max-shard-size", "500KB")
    assert res.returncode == 0, res.stderr[-3000:]
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()  # sharded, with an index
    ids = list(range(3, 60))
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1]
    exported = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
    # the learner's own code path: one FSDP2 rank loads the checkpoint and scores the same text
    recipe = load_recipe(ROOT / "recipes" / "tiny-cpu.yaml", ["learner.world_size=1"])
    learner = ray_local.remote(Learner).options(num_cpus=0.5).remote(resolve(recipe.model.path), recipe, 0, 1)
    host, port = ray_local.get(learner.address.remote())
    ray_local.get(learner.setup.remote(host, port))
    state = checkpoint.load_state(ckpt)
    ray_local.get(learner.load.remote(str(ckpt / "learner"), state["scheduler"]))
    learned = torch.tensor(ray_local.get(learner.probe_logprobs.remote(ids)))
    ray_local.kill(learner)
    assert (exported - learned).abs().max().item() < 1e-5
    base = AutoModelForCausalLM.from_pretrained(resolve(recipe.model.path), dtype=torch.float32)
    assert any(not torch.equal(a, b) for a, b in zip(base.parameters(), model.parameters()))  # trained weights
    gen = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "helpers" / "vllm_generate.py"), str(tmp_path / "hf")],
        capture_output=True,
        text=True,
        timeout=300,
        env=engine_env(),  # the engine in that process: one start less
    )
    assert gen.returncode == 0 and "RESULT " in gen.stdout, gen.stderr[-3000:]


@pytest.mark.smoke
def test_eval_takes_a_checkpoint(runs, tmp_path):
    from grpo_ray.data import load_rows

    _, killed = runs
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in load_rows("synthetic://select?size=40&items=1&split=test")))
    res = run_cli(
        "eval",
        str(killed / "checkpoints" / "step_4"),
        "--data",
        str(rows),
        "--recipe",
        "recipes/tiny-cpu.yaml",
        "--out",
        str(tmp_path / "eval"),
    )
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert result["rows"] == 40 and 0 <= result["metrics"]["val/synthetic/select/pass@1"] <= 1
