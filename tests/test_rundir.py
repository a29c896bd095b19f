"""Nothing of a run is lost unless asked: reruns, damaged checkpoints, exports, evaluations, prepared data, and a
resumed run's TensorBoard (no actor starts in any of these tests)."""

import json

import pytest

from grpo_ray import checkpoint, rundir
from grpo_ray.config import RecipeError, TrainerConfig
from tests.conftest import SHARED_DATA

CONFIG = "model: {path: 'tiny://qwen2?layers=1', lora: {rank: 0}}\n"


def a_run(out, steps=3):
    """What a finished run without checkpoints leaves: metrics, dumps, TensorBoard, config."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "x": s}) + "\n" for s in range(1, steps + 1)))
    (out / "rollouts").mkdir(exist_ok=True)
    (out / "rollouts" / "train_data_step1.jsonl").write_text('{"step": 1}\n')
    (out / "tensorboard").mkdir(exist_ok=True)
    (out / "tensorboard" / "events.out.tfevents.1").write_bytes(b"x")
    (out / "config.yaml").write_text("old: recipe\n")
    (out / "trackers.json").write_text('{"mlflow": {"run_id": "the-old-run"}}')
    return {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}


def files(out):
    return {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}


def a_checkpoint(out, step):
    """A whole checkpoint directory (manifest matching its files), as checkpoint.commit writes it."""
    ckpt = out / "checkpoints" / f"step_{step}"
    (ckpt / "learner").mkdir(parents=True)
    (ckpt / "learner" / ".metadata").write_bytes(b"meta")
    (ckpt / "learner" / "__0_0.distcp").write_bytes(b"shard" * 10)
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": step}))
    (ckpt / "config.yaml").write_text(CONFIG)
    listed = {str(p.relative_to(ckpt)): p.stat().st_size for p in ckpt.rglob("*") if p.is_file()}
    (ckpt / "manifest.json").write_text(json.dumps({"step": step, "files": listed}))
    return ckpt


def test_a_rerun_without_a_checkpoint_is_refused_and_touches_nothing(tmp_path):
    """The quick start's command run twice truncated the first run's metrics to its step-0 lines, overwrote its
    dumps and added a second TensorBoard file, without a word."""
    out = tmp_path / "run"
    before = a_run(out)
    with pytest.raises(
        RecipeError,
        match=r"already holds a run \(metrics.jsonl, tensorboard, rollouts, trackers.json\) and no "
        r"whole checkpoint to resume; nothing was changed",
    ):
        rundir.prepare(out, TrainerConfig(), "new: recipe\n")
    assert files(out) == before
    with pytest.raises(RecipeError, match="trainer.resume=disable"):
        rundir.prepare(out, TrainerConfig(resume="disable"), "new: recipe\n")
    assert files(out) == before


def test_the_cli_refuses_a_rerun_before_any_actor(tmp_path, capsys):
    import ray

    from grpo_ray.cli import main

    out = tmp_path / "run"
    before = a_run(out)
    rc = main(["train", "recipes/tiny-cpu.yaml", f"trainer.output_dir={out}"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("grpo-ray: error: trainer.output_dir=") and "set_aside" in err, err
    assert not ray.is_initialized()
    assert files(out) == before  # config.yaml not rewritten either


def test_overwrite_removes_the_run_files_only(tmp_path):
    out = tmp_path / "run"
    a_run(out)
    (out / "notes.txt").write_text("mine")
    a_checkpoint(out, 2)
    said = []
    assert rundir.prepare(out, TrainerConfig(resume="disable", overwrite=True), CONFIG, said.append) is None
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "notes.txt"]  # config.yaml: rewritten at start
    assert "removed (trainer.overwrite)" in said[0] and "trackers.json" in said[0]  # new tracker runs, not the old


def test_overwrite_keeps_what_the_run_did_not_write_and_the_trackers_stores(tmp_path):
    """A model folder of the user's at <output_dir>/model is moved aside, not removed; an export of the project's
    that the user added a note to (or changed) is moved aside too; the MLflow store (mlflow.db, every earlier run's
    history) and W&B's offline runs are kept, and each is said."""
    from grpo_ray import checkpoint

    out = tmp_path / "run"
    a_run(out)
    (out / "model").mkdir()
    (out / "model" / "config.json").write_text("the user's model")
    (out / "mlflow.db").write_bytes(b"SQLite format 3\0 runs of every start")
    (out / "wandb" / "offline-run-1").mkdir(parents=True)
    (out / "wandb" / "offline-run-1" / "run.wandb").write_bytes(b"not yet synced")
    kept = {k: v for k, v in files(out).items() if k.parts[0] in ("mlflow.db", "wandb")}
    said = []
    assert rundir.prepare(out, TrainerConfig(resume="disable", overwrite=True), CONFIG, said.append) is None
    assert (tmp_path / "run" / "model.user-1" / "config.json").read_text() == "the user's model"
    assert {k: v for k, v in files(out).items() if k.parts[0] in ("mlflow.db", "wandb")} == kept
    assert not (out / "metrics.jsonl").exists() and not (out / "model").exists()
    assert any("model.user-1" in line for line in said) and "wandb, mlflow.db kept" in said[-1]

    export = out / "model"  # an export of the project's, as written: replaced; with a note beside it: moved aside
    export.mkdir()
    (export / "model.safetensors").write_bytes(b"weights")
    (export / checkpoint.EXPORTED).write_text(json.dumps({"checkpoint": "x", "files": checkpoint._files(export)}))
    assert checkpoint.own_export(export)
    (export / "notes.md").write_text("how I made it")
    assert not checkpoint.own_export(export)
    (export / "notes.md").unlink()
    (export / "model.safetensors").write_bytes(b"weights, edited")  # the same size or not: contents are compared
    assert not checkpoint.own_export(export)
    (export / "model.safetensors").write_bytes(b"weights")
    assert checkpoint.own_export(export)
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    rundir.prepare(out, TrainerConfig(resume="disable", overwrite=True), CONFIG, said.append)
    assert not export.exists() and not (out / "model.user-2").exists()


def test_set_aside_keeps_each_previous_run_under_a_new_name(tmp_path):
    out = tmp_path / "run"
    first = a_run(out)
    said = []
    assert rundir.prepare(out, TrainerConfig(set_aside=True), CONFIG, said.append) is None
    assert files(tmp_path / "run.1") == first and not any(out.iterdir())
    second = a_run(out, steps=5)
    rundir.prepare(out, TrainerConfig(set_aside=True), CONFIG, said.append)
    assert files(tmp_path / "run.2") == second and files(tmp_path / "run.1") == first
    assert "moved to" in said[-1] and "run.2" in said[-1]


def test_resume_auto_falls_back_over_a_damaged_checkpoint_and_says_so(tmp_path):
    out = tmp_path / "run"
    a_run(out)
    a_checkpoint(out, 2)
    newest = a_checkpoint(out, 4)
    (newest / "learner" / "__0_0.distcp").write_bytes(b"cut")
    said = []
    assert rundir.prepare(out, TrainerConfig(), CONFIG, said.append) == out / "checkpoints" / "step_2"
    assert "step_4 is not whole" in said[0] and "truncated" in said[0]


def test_a_checkpoint_of_another_model_is_refused_before_anything_starts(tmp_path):
    out = tmp_path / "run"
    ckpt = a_checkpoint(out, 2)
    other = CONFIG.replace("layers=1", "layers=2")
    with pytest.raises(RecipeError, match=r"with model.path='tiny://qwen2\?layers=1', the recipe has model.path="):
        rundir.prepare(out, TrainerConfig(), other, lambda _: None)
    with pytest.raises(RecipeError, match="model.lora.rank=0, the recipe has model.lora.rank=8"):
        rundir.prepare(tmp_path / "elsewhere", TrainerConfig(resume=str(ckpt)), CONFIG.replace("rank: 0", "rank: 8"))


@pytest.mark.parametrize("key", ["reward_model.model", "teacher.model", "reward_model.judge.template"])
def test_a_resume_with_another_scorer_is_refused(tmp_path, key):
    """A run that trained on one reward model's (or teacher's, or judge's) signal, resumed with another, would be
    another experiment whose config.yaml names only the new one: refused before anything starts. An empty value
    and an absent key are the same."""
    import yaml

    section, _, rest = key.partition(".")
    nested = {section: {rest: "x"}} if "." not in rest else {section: {"judge": {"template": "x"}}}
    out = tmp_path / "run"
    a_checkpoint(out, 2)
    with pytest.raises(RecipeError, match=rf"with {key}=None, the recipe has {key}='x'"):
        rundir.prepare(out, TrainerConfig(), CONFIG + yaml.safe_dump(nested), lambda _: None)
    blank = {section: {rest: ""}} if "." not in rest else {section: {"judge": {"template": ""}}}
    assert rundir.prepare(out, TrainerConfig(), CONFIG + yaml.safe_dump(blank), lambda _: None).name == "step_2"


def test_checkpoints_none_of_them_whole_are_never_silently_started_over(tmp_path):
    out = tmp_path / "run"
    before = a_run(out)
    a_checkpoint(out, 2)
    (out / "checkpoints" / "step_2" / "learner" / ".metadata").unlink()
    with pytest.raises(RecipeError, match=r"holds checkpoints \[2\] and none is whole"):
        rundir.prepare(out, TrainerConfig(), CONFIG, lambda _: None)
    assert all(files(out)[k] == v for k, v in before.items())


def test_the_same_run_stopped_before_its_first_checkpoint_starts_again(tmp_path):
    """A retried job (RayJob, Slurm requeue) killed before its first save: the same recipe, so its steps are
    redone from 0, as steps after a checkpoint are on resume; another recipe in that directory is refused."""
    out = tmp_path / "run"
    a_run(out)
    (out / "config.yaml").write_text("same: recipe\n")
    said = []
    assert rundir.prepare(out, TrainerConfig(save_freq=5), "same: recipe\n", said.append) is None
    assert "stopped before its first checkpoint" in said[0]
    with pytest.raises(RecipeError):
        rundir.prepare(out, TrainerConfig(save_freq=5), "another: recipe\n")
    with pytest.raises(RecipeError):  # a recipe that never saves: a finished run, not an interrupted one
        rundir.prepare(out, TrainerConfig(save_freq=0), "same: recipe\n")


def test_a_resumed_run_continues_its_tensorboard_without_duplicate_steps(tmp_path):
    """Steps 3-4 redone after a checkpoint of step 2: TensorBoard shows each step once, with the redone values."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from grpo_ray.telemetry.metrics import MetricsLog

    log = MetricsLog(tmp_path, ["tensorboard"], 4)
    for step in range(1, 5):
        log.log(step, {"loss": float(step)})
    log.close()
    log = MetricsLog(tmp_path, ["tensorboard"], 4, done=2)
    for step in (3, 4):
        log.log(step, {"loss": 10.0 * step})
    log.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]


def test_an_evaluation_is_not_overwritten_unless_asked(tmp_path, capsys):
    from grpo_ray.cli import main

    (tmp_path / "eval.json").write_text("{}")
    assert main(["eval", "some/model", "--data", "gsm8k", "--out", str(tmp_path)]) == 2
    assert "already holds an evaluation" in capsys.readouterr().err and (tmp_path / "eval.json").read_text() == "{}"


def test_prepared_data_is_not_overwritten_unless_asked(tmp_path, capsys):
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} is absent")
    from grpo_ray.cli import main

    src = tmp_path / "src"
    src.mkdir()
    for split in ("train", "test"):  # a few real rows are enough
        lines = (SHARED_DATA / "gsm8k" / f"{split}.jsonl").read_text().splitlines()[:20]
        (src / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    assert main(["prepare-data", "gsm8k", "--source", str(src), "--out", str(out)]) == 0
    first = (out / "train.parquet").read_bytes()
    assert main(["prepare-data", "gsm8k", "--source", str(src), "--out", str(out)]) == 2
    assert "already exist; nothing was written" in capsys.readouterr().err
    assert (out / "train.parquet").read_bytes() == first
    assert main(["prepare-data", "gsm8k", "--source", str(src), "--out", str(out), "--overwrite"]) == 0


def test_export_refuses_a_folder_with_files(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "model-00002-of-00002.safetensors").write_bytes(b"an older export")
    ckpt = a_checkpoint(tmp_path / "run", 1)
    with pytest.raises(checkpoint.CheckpointError, match="already holds files; nothing was written"):
        checkpoint.export_hf(ckpt, tmp_path / "out")
    assert (tmp_path / "out" / "model-00002-of-00002.safetensors").read_bytes() == b"an older export"


def test_yaml_tags_never_execute(tmp_path, capsys):
    """A malicious recipe: Python object tags are refused by the YAML loader, nothing is constructed or run."""
    from grpo_ray.cli import main

    marker = tmp_path / "pwned"
    bad = tmp_path / "evil.yaml"
    bad.write_text(
        "model: {path: !!python/object/apply:os.system ['touch " + str(marker) + "']}\n"
        "data: {train_files: ['synthetic://select']}\n"
    )
    assert main(["train", str(bad), f"trainer.output_dir={tmp_path / 'run'}"]) == 2
    assert not marker.exists()
    assert "grpo-ray: error:" in capsys.readouterr().err


def test_a_checkpoint_of_another_command_is_refused_and_touches_nothing(tmp_path):
    """grpo-ray rm pointed at an SFT run's directory replaced its config.yaml and then died loading the SFT
    checkpoint: each checkpoint says which command wrote it, and another command's is refused before start."""
    out = tmp_path / "run"
    ckpt = a_checkpoint(out, 2)
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": 2, "job": "sft"}))
    listed = json.loads((ckpt / "manifest.json").read_text())
    listed["files"]["trainer_state.json"] = (ckpt / "trainer_state.json").stat().st_size
    (ckpt / "manifest.json").write_text(json.dumps(listed))
    before = files(out)
    with pytest.raises(RecipeError, match="is a checkpoint of grpo-ray sft, not of grpo-ray rm; nothing was changed"):
        rundir.prepare(out, TrainerConfig(), CONFIG, lambda _: None, job="rm")
    assert files(out) == before
    assert rundir.prepare(out, TrainerConfig(), CONFIG, lambda _: None, job="sft") == ckpt
