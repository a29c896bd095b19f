"""A short tiny run: every metric users steer by, TensorBoard, rollout dumps, replay, plots."""

import json
import re

import pytest

from grpo_ray.telemetry.dumps import read_samples
from tests.conftest import run_cli

pytestmark = [pytest.mark.slow, pytest.mark.smoke]  # the quick start on-policy, in CI's tier

STEP_KEYS = [
    "critic/score/mean",
    "critic/score/max",
    "critic/score/min",
    "reward/gsm8k/mean",
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/entropy",
    "actor/grad_norm",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "response_length/mean",
    "response_length/max",
    "response_length/clip_ratio",
    "prompt_length/mean",
    "prompt_length/max",
    "global_seqlen/mean",
    "global_seqlen/max",
    "timing_s/gen",
    "timing_s/reward",
    "timing_s/ref",
    "timing_s/old_log_prob",
    "timing_s/update_actor",
    "timing_s/sync_weights",
    "timing_s/step",
    "perf/throughput",
    "perf/mfu/actor",
    "perf/mfu/step",
    "sync/seconds",
    "sync/GBps",
    "sync/logprob_diff",
    "reward/errors",
    "reward/timeouts",
    "rollout_corr/kl",
    "rollout_corr/k3_kl",
    "rollout_corr/rollout_is_mean",
    "rollout_corr/rollout_is_max",
    "rollout_corr/rollout_rs_masked_fraction",
    "rollout/staleness",
    "actor/policy_version",
    "perf/gen_overlap_s",
    *[f"perf/idle/{p}" for p in ("generator", "learner", "reference", "reward")],
    *[f"perf/peak_rss_gb/{p}" for p in ("generator", "learner", "reference", "reward")],
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    res = run_cli(
        "train",
        "recipes/tiny-cpu.yaml",
        f"trainer.output_dir={out}",
        "trainer.total_steps=4",
        "trainer.test_freq=2",
        "trainer.val_before_train=true",
        "trainer.dump_freq=1",
        "trainer.loggers=[console,jsonl,tensorboard]",
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return out, rows, res


def test_every_step_has_the_metrics_and_they_are_sane(run):
    out, rows, res = run
    steps = [r for r in rows if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    for r in steps:
        missing = [k for k in STEP_KEYS if k not in r]
        assert not missing, missing
        assert 0 < r["perf/mfu/actor"] <= 1 and 0 < r["perf/mfu/step"] <= r["perf/mfu/actor"]
        # verl's throughput: prompt+response tokens / step time / devices (2 CPUs reserved by the pools here)
        tokens = r["global_seqlen/mean"] * 16 * 16
        assert r["perf/total_num_tokens"] == tokens
        assert r["perf/throughput"] == pytest.approx(tokens / r["timing_s/step"] / 2.0)
        assert all(0 <= r[f"perf/idle/{p}"] < 1 for p in ("generator", "learner", "reference", "reward"))
        assert r["timing_s/update_actor"] < r["timing_s/step"] and r["timing_s/gen"] < r["timing_s/step"]
        assert r["sync/GBps"] > 0 and r["perf/peak_rss_gb/generator"] > 0.1
        # fp32 on CPU, on-policy: vLLM's sampler and the learner agree on the sampled tokens to ~1e-8
        assert abs(r["rollout_corr/kl"]) < 1e-6 and r["rollout/staleness"] == 0
        dumped = read_samples(out / "rollouts" / f"train_data_step{r['step']}.jsonl")
        assert r["prompt_length/max"] == max(len(d["prompt_ids"]) for d in dumped)
        assert r["global_seqlen/max"] == max(len(d["prompt_ids"]) + len(d["response_ids"]) for d in dumped)
    val = {r["step"]: r["val/synthetic/select/pass@1"] for r in rows if "val/synthetic/select/pass@1" in r}
    assert sorted(val) == [0, 2, 4] and all(0 <= v <= 1 for v in val.values())
    assert "step:4 score:" in res.stdout


def test_console_shows_steps_and_actor_output_goes_to_log_files(run):
    """trainer.log_level=info (default): vLLM's per-load lines ("Failed to load weights", reload timings, prefix
    cache resets) and model-loading bars go to <output_dir>/logs/, not the console."""
    out, rows, res = run
    console = res.stdout + res.stderr
    assert f"actor logs (vLLM, transformers, Ray workers): {out}/logs/" in console
    for noise in ("Failed to load weights", "Reloading", "prefix cache", "Loading weights", "(Generator pid="):
        assert noise not in console, noise
    assert sum("step:" in line for line in console.splitlines()) == len(rows)  # one line a step (+ validation)
    assert all(len(line) <= 120 for line in console.splitlines() if line.startswith("step:"))
    # start-up talks: a line as each phase ends, with the seconds since the command began, in order
    phases = [
        "recipe valid, and it fits",
        "recipe, data and rewards checked",
        "Ray up",
        "actors placed",
        "learner ready",
        "reference ready",
        "engines loaded",
        "weight transport connected (collective)",
        "first probe",
        "training: steps 1 to 4",
    ]
    said = {m.group(2): float(m.group(1)) for m in re.finditer(r"^\[ *(\d+\.\d)s\] (.*)$", res.stdout, re.MULTILINE)}
    at = [next(t for line, t in said.items() if p in line) for p in phases]
    assert at == sorted(at) and at[0] > 0, said
    generator = (out / "logs" / "generator-0.log").read_text()
    assert "Reloading" in generator and "Initializing a V1 LLM engine" in generator
    assert {p.name for p in (out / "logs").iterdir()} == {
        "generator-0.log",
        "learner-0.log",
        "learner-1.log",
        "reference-0.log",
        "reward-0.log",
    }


def test_tensorboard_file_reads_back_with_tensorboards_reader(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, rows, _ = run
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    scores = acc.Scalars("critic/score/mean")
    assert [e.step for e in scores] == [1, 2, 3, 4]
    assert [e.value for e in scores] == pytest.approx([r["critic/score/mean"] for r in rows if r["step"] > 0])
    assert "perf/mfu/actor" in acc.Tags()["scalars"]
    # the same names in both: every metric of metrics.jsonl is a TensorBoard scalar, and nothing else is
    # (TensorBoard's tags allow no "@": pass@k is written pass_k there)
    assert set(acc.Tags()["scalars"]) == {k.replace("@", "_") for r in rows for k in r} - {"step", "time"}


def test_rollout_dumps_hold_every_sample(run):
    out, rows, _ = run
    lines = read_samples(out / "rollouts" / "train_data_step2.jsonl")
    assert len(lines) == 16 * 16
    first = lines[0]
    assert {"prompt", "response", "ground_truth", "rewards", "score", "advantage", "policy_version"} <= set(first)
    assert first["prompt"].endswith("assistant\n####") and first["policy_version"] == 1
    step2 = next(r for r in rows if r["step"] == 2)
    assert sum(l["score"] for l in lines) / len(lines) == pytest.approx(step2["critic/score/mean"])
    assert abs(sum(l["advantage"] for l in lines)) < 1e-3  # group-centred
    val = read_samples(out / "rollouts" / "val_data_step4.jsonl")
    assert len(val) == 256 and val[0]["advantage"] is None
    # compact: a line per prompt, the prompt once, its 16 samples in it
    groups = [json.loads(line) for line in (out / "rollouts" / "train_data_step2.jsonl").read_text().splitlines()]
    assert len(groups) == 16 and all(len(g["samples"]) == 16 and "prompt" not in g["samples"][0] for g in groups)
    assert [s["response"] for g in groups for s in g["samples"]] == [s["response"] for s in lines]


def test_a_dump_replays_into_the_learner_without_generators(run):
    out, rows, _ = run
    res = run_cli(
        "replay", "recipes/tiny-cpu.yaml", str(out / "rollouts" / "train_data_step1.jsonl"), f"trainer.output_dir={out}"
    )
    assert res.returncode == 0, res.stderr[-4000:]
    replayed = json.loads(res.stdout[res.stdout.index("{") :])
    step1 = rows[1] if rows[0]["step"] == 0 else rows[0]
    for key in ("actor/grad_norm", "actor/pg_loss", "actor/entropy", "actor/kl_loss"):
        assert replayed[key] == pytest.approx(step1[key], rel=1e-4, abs=1e-7), key
    placement = json.loads((out / "replay" / "placement.json").read_text())
    assert placement["generator"] == [] and len(placement["learner"]) == 2


def test_plot_draws_a_png_and_overlays_runs(run, tmp_path):
    import matplotlib.image

    out, _, _ = run
    res = run_cli("plot", str(out), str(out), "--out", str(tmp_path / "p.png"))
    assert res.returncode == 0, res.stderr[-2000:]
    image = matplotlib.image.imread(tmp_path / "p.png")
    assert image.shape[:2] == (560, 1280)
    assert run_cli("plot", str(tmp_path / "nope")).returncode == 2
