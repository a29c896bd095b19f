"""plan's time model (grpo_ray.planner.speed): phase times worked by hand from known rates, the schedule's composition,
calibration written and read back, and --suggest's layouts loading and fitting."""

import dataclasses
import json
import math
import re

import pytest

from grpo_ray.config import load_recipe
from grpo_ray.models.dims import ModelDims, model_dims
from grpo_ray.planner import fit, rates, speed, suggest, work
from tests.conftest import ROOT, run_cli

# 1 layer, hidden 4, 1 head of 4, 1 kv head, MLP 2, vocabulary 6, tied: the linear layers' fan-in x fan-out sum to
# 4 x (4 x 4) + 2 x (4 x 2) + 2 x 4 = 88, the head 4 x 6 = 24; 112 parameters
DIMS = ModelDims(layers=1, hidden=4, heads=1, kv_heads=1, head_dim=4, intermediate=2, vocab=6, tied=True)
R = 1e6  # FLOP/s of every matmul shape


def known_rates() -> rates.Rates:
    flat = rates.Throughput(
        gemm={"float32": [[1, 1, R], [1, 4096, R], [4096, 1, R], [4096, 4096, R]]},
        bandwidth=float("inf"),  # no memory terms
        forward_call=[0.01, 0.001],
        train_call=[0.02, 0.002],
        optimizer=[0.005, 1e-6],
    )
    engine = {
        "step_s": 0.003,
        "step_layer_s": 0.0005,
        "seq_s": 0.0001,
        "prefill_s": 0.007,
        "request_s": 0.0002,
        "work_scale": 1.0,
        "prefill_scale": 2.0,
        "reload_layer_s": 0.004,
        "reload_bps": 448.0,
    }
    known = rates.Rates("cpu", "by hand", {"1": flat, "2": flat}, [1e-4, 1e9], 448.0, engine, 0.002, 0.05)
    known.reward_call_s, known.pass_s, known.update_s = 0.003, 0.004, 0.006
    return known


def tiny_recipe(*more):
    return load_recipe(
        ROOT / "recipes" / "tiny-cpu.yaml",
        [
            "data.train_batch_size=2",
            "algorithm.group_size=2",
            "learner.world_size=1",
            "learner.mini_batch_size=4",
            "learner.micro_batch_size=2",
            "reference.micro_batch_size=4",
            "model.shared_prompt=false",
            *more,
        ],
    )


def test_phase_times_by_hand():
    """4 samples of 3 prompt + 2 response tokens, on-policy, everything one actor, packed."""
    p = speed.predict(tiny_recipe(), DIMS, known_rates(), speed.Shape(3, 2), node_cpus=2)
    ph = {k: v.seconds for k, v in p.phases.items()}
    # generation: the call (7 ms), 4 requests (0.2 ms each) and a step (3 + 0.5 a layer + 4 x 0.1 ms a sequence) that
    # computes the 4 prompts (12 tokens: linears 2 x 12 x 88, the head on 4 positions 2 x 4 x 24, attention
    # 2 x (2 x 3 x 4 x 3) a prompt; at the prefill's scale, 2) and the first token; then 1 decode step of 4
    # sequences (linears 2 x 4 x 88, head 2 x 4 x 24, attention over 4.5 keys: 2 x 2 x 4 x 4 x 4.5)
    prefill = 0.007 + 4 * 0.0002 + 0.0039 + 2 * (2112 + 192 + 4 * 144) / R
    decode = 0.0039 + (704 + 192 + 2 * 2 * 4 * 4 * 4.5) / R
    assert ph["generation"] == pytest.approx(prefill + decode)
    assert ph["reward"] == pytest.approx(0.003 + 4 * 0.002)
    # reference: a pass (4 ms), one call over 4 packed rows of 5 (20 slots), the head on the 8 response positions
    work = (2 * 20 * 88 + 2 * 8 * 24 + 4 * 2 * (2 * 5 * 4 * 5)) / R
    assert ph["reference"] == pytest.approx(0.004 + 0.011 + work)
    # update: its fixed cost (6 ms), two micro batches of 2 packed rows (20 slots in all): 2 calls' fixed cost + 3 x
    # the forward's work, and one optimizer step over 112 parameters
    assert ph["update"] == pytest.approx(0.006 + 2 * 0.022 + 3 * work + 0.005 + 112e-6)
    # gradient checkpointing: the backward runs the decoder layer's forward again, its fixed cost a layer (1 ms a
    # call) and its work less the head's (2 x 8 x 24) and attention's
    again = speed.predict(tiny_recipe("learner.gradient_checkpointing=true"), DIMS, known_rates(), speed.Shape(3, 2))
    recompute = 2 * 0.001 + (2 * 20 * 88 + 4 * 2 * (2 * 5 * 4 * 5)) / R
    assert again.phases["update"].seconds == pytest.approx(ph["update"] + recompute)
    assert ph["old policy"] == 0.0  # one on-policy update: the old logprobs are the trained weights'
    # sync: 448 bytes (112 fp32 weights) at 448 B/s, a reload of one layer (4 ms) and its bytes at 448 B/s
    assert ph["sync"] == pytest.approx(1.0 + 0.004 + 1.0)
    # the reload's bytes at the generator's threads where calibration measured them (half the rate: twice the time)
    measured = known_rates()
    measured.threads = {k: dataclasses.replace(t, reload_bps=224.0) for k, t in measured.threads.items()}
    again = speed.predict(tiny_recipe(), DIMS, measured, speed.Shape(3, 2), node_cpus=2)
    assert again.phases["sync"].seconds == pytest.approx(1.0 + 0.004 + 2.0)
    # a delta push (fp32 engine: every element changes, so whole bytes): rank 0 finds the changes (448 B at 448 B/s)
    # while the engine applies them (448 B at 1792 B/s) and reloads; one bucket: the shorter counts whole too
    measured.changes_bps, measured.apply_bps = 448.0, 1792.0
    delta = speed.predict(tiny_recipe("trainer.weight_transport=delta"), DIMS, measured, speed.Shape(3, 2))
    assert delta.phases["sync"].seconds == pytest.approx(1.0 + (0.004 + 2.0 + 0.25) + 1.0)
    assert ph["hops"] == 0.05
    assert p.step == pytest.approx(ph["generation"] + ph["reference"] + ph["update"] + ph["sync"] + 0.05)
    # two epochs: the old policy recomputed, a pass and the update's two calls forward only; one step off it also
    # copies the older weights in and the current ones back (112 fp32 weights read and written twice: 1792 bytes at
    # 1792 B/s)
    two = speed.predict(tiny_recipe("algorithm.ppo_epochs=2"), DIMS, known_rates(), speed.Shape(3, 2), node_cpus=2)
    assert two.phases["old policy"].seconds == pytest.approx(0.004 + 2 * 0.011 + work)
    slow = known_rates()
    slow.threads = {k: dataclasses.replace(t, bandwidth=1792.0) for k, t in slow.threads.items()}
    on, off = (
        speed.predict(tiny_recipe(more), DIMS, slow, speed.Shape(3, 2), node_cpus=64)
        for more in ("algorithm.ppo_epochs=2", "algorithm.max_staleness=1")
    )
    assert off.phases["old policy"].seconds == pytest.approx(on.phases["old policy"].seconds + 1.0)
    assert p.idle["generator"] == pytest.approx(1 - (ph["generation"] + ph["sync"]) / p.step)
    # 1.5 CPUs reserved: an engine's 0.5, a learner rank's 0.5, the reference's and the reward actor's 0.25
    assert p.tokens_per_s_per_device == pytest.approx(4 * 5 / p.step / 1.5)


def test_shared_prompts_and_one_step_off_compose_as_the_schedule_runs():
    rates = known_rates()
    packed = speed.predict(tiny_recipe(), DIMS, rates, speed.Shape(30, 1), node_cpus=2)
    shared = speed.predict(tiny_recipe("model.shared_prompt=true"), DIMS, rates, speed.Shape(30, 1), node_cpus=2)
    # long prompts, one-token responses: each prompt once is less work in the reference and the update
    assert shared.phases["reference"].seconds < packed.phases["reference"].seconds
    assert "shared prompts" in shared.phases["update"].detail
    off = speed.predict(tiny_recipe("algorithm.max_staleness=1"), DIMS, rates, speed.Shape(3, 2), node_cpus=2)
    ph = {k: v.seconds for k, v in off.phases.items()}
    assert ph["old policy"] > 0  # one step off, the old policy is recomputed
    assert off.step >= max(ph["generation"], ph["old policy"] + ph["update"]) + ph["sync"] + ph["hops"] - 1e-12
    on = speed.predict(tiny_recipe(), DIMS, rates, speed.Shape(3, 2), node_cpus=2)
    assert off.step < on.step + ph["old policy"]  # generation no longer waits for the update


@pytest.mark.parametrize(
    "gen, scoring, learn, step",
    [
        # the generation the longer: scoring's 0.5 s runs through the sync and hops (0.15 s), the 0.35 s left
        # opens the next step beside the generation: max(1.0, 0.35 + 0.5) + 0.15
        (1.0, 0.5, 0.5, 1.15),
        # the learner the longer: 0.2 s of scoring is left after one step (max(0.5, 0.8) + 0.1 = 0.9, scoring ends
        # at 1.1), none after the next (max(0.5, 0.2 + 0.8) + 0.1 = 1.1, scoring ends at 1.1): 0.9 and 1.1 by turns
        (0.5, 0.6, 0.8, 1.0),
    ],
)
def test_one_step_off_hides_scoring_as_the_controller_runs_it(gen, scoring, learn, step):
    """One step off (on a GPU: no cores shared), the next batch's scoring starts as its generation ends and what
    runs past the step's end opens the next, before the learner's old policy and update."""
    recipe = ROOT / "recipes" / "qwen2.5-1.5b-gsm8k-1node.yaml"  # one step off
    r = load_recipe(recipe)
    plans = {p: dataclasses.replace(plan, actors=1) for p, plan in speed.placement.plan(r).items()}
    shape = speed.Shape(3, 2)
    s = speed.StepInputs(r, DIMS, known_rates(), shape, speed.shape_pairs(r, shape), plans, dict.fromkeys(plans, 1), 1)
    after = 0.15 if gen == 1.0 else 0.1
    seconds = {"generation": gen, "reward": 0.01, "reference": scoring, "old policy": 0.0, "update": learn}
    phases = {k: speed.Phase(v, "") for k, v in {**seconds, "sync": after / 2, "hops": after / 2}.items()}
    got, how = speed.schedule_step(s, phases)
    assert got == pytest.approx(step) and how.startswith("one step off")
    on = speed.schedule_step(dataclasses.replace(s, r=load_recipe(recipe, ["algorithm.max_staleness=0"])), phases)
    assert on[0] == pytest.approx(gen + scoring + learn + after)  # on-policy: one after the other


def test_attention_past_the_grids_head_dim_grows_with_it():
    grid = [[k, hd, 1e-9 * hd / 32] for k in (64, 1024) for hd in (32, 128)]
    t = rates.Throughput({"float32": [[1, 1, R]]}, 1e9, [0, 0], [0, 0], [0, 0], attention={"forward": grid})
    at = {hd: t.attention_seconds("float32", [(10, 100)], 2, hd, False) for hd in (64, 128, 256)}
    assert at[128] == pytest.approx(10 * 100 * 2 * 4e-9)
    assert at[64] == pytest.approx(at[128] / 2)  # on the grid, interpolated in log space
    assert at[256] == pytest.approx(2 * at[128])  # Gemma 3's 256: twice the widest measured


def test_gemm_rates_are_interpolated_on_the_grid_in_log_space():
    t = rates.Throughput(
        {"float32": [[1, 16, 1e9], [1, 256, 4e9], [64, 16, 4e9], [64, 256, 16e9]]}, 1e9, [0, 0], [0, 0], [0, 0]
    )
    assert 2 * 8 * 64 * 64 / t.gemm_seconds("float32", 8, 64, 64) == pytest.approx(4e9)  # the middle of both axes
    assert 2 * 1 * 16 * 16 / t.gemm_seconds("float32", 1, 16, 16) == pytest.approx(1e9)
    assert 2 * 1e4 * 1e3 * 1e3 / t.gemm_seconds("bfloat16", 1e4, 1e3, 1e3) == pytest.approx(16e9)  # clamped; fp32's


@pytest.mark.slow
def test_calibration_writes_the_rates_that_plan_then_reads(tmp_path):
    """plan --calibrate measures this machine (matmuls, memory, the learner's calls, gloo, vLLM engines), writes the
    rates under the cache, and plan predicts with them from then on. An earlier calibration is kept aside, and the
    console holds the command's own lines (the parts' loading bars and engine lines go to calibrate.log)."""
    env = {"GRPO_RAY_CACHE": str(tmp_path)}
    path = tmp_path / "calibration" / "cpu.json"
    path.parent.mkdir()
    path.write_text('{"an": "earlier calibration"}')
    first = run_cli("plan", "recipes/tiny-cpu.yaml", "--calibrate", env=env, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    kept = [p for p in path.parent.glob("cpu-*.json")]
    assert len(kept) == 1 and kept[0].read_text() == '{"an": "earlier calibration"}'
    console = first.stdout + first.stderr
    assert "%|" not in console and "Loading" not in console and "leaked" not in console, console[-3000:]
    assert (path.parent / "calibrate.log").stat().st_size > 0
    got = rates.Rates.load(path)
    assert "calibrated on" in got.source and set(got.threads) >= {"1"}
    t = got.at(1)
    assert t.gemm_seconds("float32", 1024, 512, 512) / (1024 * 512 * 512) < t.gemm_seconds("float32", 1, 32, 32) / 1024
    assert t.train_call[0] + t.train_call[1] > t.forward_call[0] + t.forward_call[1] > 0
    assert got.collective[1] > 1e6 and got.transport > 1e6  # gloo moves megabytes a second at least
    assert got.engine["step_s"] + got.engine["step_layer_s"] > 0 and got.engine["reload_bps"] > 0
    assert all(math.isfinite(t.reload_bps) and t.reload_bps > 0 for t in got.threads.values())  # a bf16 engine's
    assert got.engine["prefill_scale"] > 0 and got.reward_sample_s > 0  # measured, not FITTED's defaults
    again = run_cli("plan", "recipes/tiny-cpu.yaml", env=env, timeout=300)
    assert again.returncode == 0 and f"({got.source}):" in again.stdout, again.stdout
    assert re.search(r"step\s+[0-9.]+ s", again.stdout)


def test_suggest_gives_overrides_that_load_and_fit(capsys):
    """--suggest on a tiny twin, with the published table's rates: three layouts, fastest first, each a list of
    overrides that loads and passes the fit check."""
    from grpo_ray.cli import main
    from grpo_ray.models.dims import model_dims

    twin = "recipes/tiny-qwen2.5-1.5b-gsm8k-1node.yaml"
    assert main(["plan", twin, "--suggest"]) == 0
    out = capsys.readouterr().out
    found = re.findall(r"^  \d\. ([0-9.]+) s a step .*?: (.+)$", out, re.M)
    assert len(found) == 3, out
    times = [float(t) for t, _ in found]
    assert times == sorted(times)
    for _, overrides in found:
        r = load_recipe(ROOT / twin, overrides.split())
        assert fit.check(r, model_dims(r.model.path)).fits
    predicted = float(re.search(r"^  step\s+([0-9.]+) s", out, re.M).group(1))
    assert times[0] <= predicted  # the recipe as it is was among the layouts considered, or something faster


def test_suggest_on_cpu_leaves_out_layouts_the_nodes_cannot_place():
    """On a node of 2 cores, the tiny recipe's two engines and two learner ranks ask for 2.5 CPUs, which Ray's
    placement refuses at start (found by benchmarks/suggest.py): --suggest considers only layouts it can place."""
    from grpo_ray import placement
    from grpo_ray.models.dims import model_dims

    path = ROOT / "recipes/tiny-cpu.yaml"
    r = load_recipe(path)
    d, known, shape = model_dims(r.model.path), rates.rates_for(r), speed.default_shape(r)
    node = [{"CPU": 2.0}]
    refused = [o for o in suggest.layouts(r, 0) if placement.problems(load_recipe(path, o), node)]
    assert refused  # the case exists: some layout the recipe allows does not fit 2 cores
    ranked = suggest.suggest(lambda more: load_recipe(path, more), r, d, known, shape, 0, top=None, node_cpus=2)
    assert ranked
    assert all(not placement.problems(load_recipe(path, s.overrides), node) for s in ranked)
    assert not {tuple(o) for o in refused} & {tuple(s.overrides) for s in ranked}


def test_published_table_scales_a_measured_gpu_by_datasheets():
    table = rates.published()
    assert "cpu" in table
    gpus = [g for g in rates.DATASHEET if g in json.loads(rates.TABLE.read_text())]
    if not gpus:
        pytest.skip("no GPU measured in the committed table yet")
    base = table[gpus[0]]
    for gpu, (peak, _) in rates.DATASHEET.items():
        if gpu in gpus:
            continue
        ratio = peak / rates.DATASHEET[gpus[0]][0]
        a, b = table[gpu].at(1), base.at(1)
        assert a.gemm_seconds("bfloat16", 512, 1024, 1024) == pytest.approx(
            b.gemm_seconds("bfloat16", 512, 1024, 1024) / ratio
        )
        assert f"scaled by {gpu}'s datasheet" in table[gpu].source


IGNORE_EOS = """
import dataclasses, json
from grpo_ray import models
from grpo_ray.config import load_recipe
from grpo_ray.roles.generator import Generator
from grpo_ray.types import Prompt
path = models.resolve("tiny://qwen2?layers=1&hidden=64&heads=2&kv_heads=1&intermediate=128&vocab=128&bytes=0&seed=0")
recipe = load_recipe("recipes/tiny-cpu.yaml", [f"model.path={path}", "generator.sampling.max_tokens=24"])
engine = Generator(path, recipe, 64 << 20, 0)
out = {}
for flag in (False, True):
    sampling = dataclasses.replace(recipe.generator.sampling, ignore_eos=flag)
    out[str(flag)] = engine.generate([Prompt([5, 6, 7], "1", "t")], 64, [0], sampling)[1].response_lengths
print(json.dumps(out))
"""


@pytest.mark.slow
def test_ignore_eos_makes_every_response_max_tokens_long():
    """generator.sampling.ignore_eos (verl's rollout.ignore_eos), what the speed benchmark's fixed shapes rest on: a
    random tiny model ends some of 64 responses within 24 tokens by itself (its end-of-sequence token is one of 128);
    with it, none ends early."""
    import os
    import subprocess
    import sys

    from grpo_ray.device import Device

    env = {**os.environ, **Device("cpu").engine_env(1, eager=True)}  # tiny-cpu.yaml's engine
    out = subprocess.run(
        [sys.executable, "-c", IGNORE_EOS], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lengths = json.loads(out.stdout.strip().splitlines()[-1])
    assert lengths["True"] == [24] * 64
    assert min(lengths["False"]) < 24  # some responses end at their end-of-sequence token without it


def test_the_reward_model_and_the_judge_score_beside_the_frozen_pools():
    """A classifier: a forward over each actor's share on its own shape, one output a row (no vocabulary head); a
    judge: its engines generate a verdict of up to judge.max_tokens for each sample of their share, the rubric's
    characters / 4 added to the prompt. Either scores beside the reward actors and the reference, so the on-policy
    step counts the longest of them."""
    known, policy = known_rates(), load_recipe(ROOT / "recipes" / "tiny-cpu.yaml").model.path
    scorer = [f"reward_model.model={policy}&score=1", "reward_model.shard=false"]
    classifier = tiny_recipe(*scorer, "reward_model.num_actors=2")
    p = speed.predict(classifier, DIMS, known, speed.Shape(3, 2), node_cpus=2)
    ph = {k: v.seconds for k, v in p.phases.items()}
    assert ph["reward_model"] > 0 and "2 actor(s)" in p.phases["reward_model"].detail
    scoring = max(ph["reward"], ph["reference"], ph["reward_model"])
    assert p.step == pytest.approx(ph["generation"] + scoring + ph["old policy"] + ph["update"] + ph["sync"] + 0.05)
    alone = speed.predict(
        tiny_recipe(*scorer, "reward_model.num_actors=1"), DIMS, known, speed.Shape(3, 2), node_cpus=2
    )
    assert alone.phases["reward_model"].seconds > ph["reward_model"]  # one actor scores all 4 samples, not 2
    template = "Grade {prompt} -> {response}. " * 4
    judge = tiny_recipe(
        f"reward_model.model={policy}",
        f"reward_model.judge.template={template!r}",
        "reward_model.judge.max_tokens=6",
        "reward_model.num_actors=2",
    )
    got = speed.predict(judge, DIMS, known, speed.Shape(3, 2), node_cpus=2).phases["judge"]  # the judge's own row
    prompt = 3 + 2 + len(template) // 4
    prefill, decode = work.generation_seconds(model_dims(policy), known.at(1), "float32", known.engine, 2, prompt, 6)
    assert got.seconds == pytest.approx(prefill + decode) and "up to 6 tokens" in got.detail


def test_plan_without_rates_for_the_gpu_says_so_and_names_the_table(capsys):
    """A GPU with a memory size but neither a calibration nor a datasheet line (the A10G): the fit check runs, and
    the time prediction is one line naming the GPUs plan has rates for."""
    from grpo_ray.cli import main

    assert main(["plan", "recipes/qwen2.5-0.5b-gsm8k-1gpu.yaml", "--gpu", "a10g"]) == 0
    out = capsys.readouterr().out
    assert "FITS" in out and "no time prediction: no rates for a10g" in out and "h100" in out.splitlines()[-1]
