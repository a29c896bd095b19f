"""The streaming schedule (algorithm.schedule=streaming): engines on a loop of their own, pushes into the generation
in flight, each token labelled with the weights that sampled it, every prompt sent trained once, across a resume.

The engine's side runs alone first (tests/helpers/engine_loop_push.py: a push between two tokens of one request,
requests stopped as a hand-back stops them);
then, in the slow tier (CI's time is spent), one 4-step run with 8-token answers, so that answers are in flight at
a push, that run resumed from its step-2 checkpoint, and a policy of one's own that drops stale groups."""

import collections
import json
import math
import subprocess
import sys
import textwrap

import pytest

from grpo_ray import models
from grpo_ray.telemetry.dumps import read_samples
from tests.conftest import ROOT, engine_env, run_cli
from tests.test_checkpoint import COMMON, whole_and_resumed

STREAMING = [
    "algorithm.schedule=streaming",
    "algorithm.max_staleness=2",
    "algorithm.rollout_correction.rollout_is=token",
]
LONGER = [
    "generator.sampling.max_tokens=8",
    "generator.sampling.ignore_eos=true",
    "+generator.vllm_kwargs.max_num_seqs=8",  # 8 answers at a time: the engine is still generating at each push
    "trainer.dump_freq=1",
]


def rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def engine_loop():
    """tests/helpers/engine_loop_push.py's result: a push, then a hand-back, on one engine loop."""
    path = models.resolve(
        "tiny://qwen2?layers=2&hidden=64&heads=2&kv_heads=1&intermediate=128&seed=0&vocab=128&bytes=0"
    )
    res = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "helpers" / "engine_loop_push.py"), path],
        capture_output=True,
        text=True,
        timeout=300,
        env=engine_env(),
    )
    lines = [l for l in res.stdout.splitlines() if l.startswith("RESULT ")]
    assert res.returncode == 0 and lines, res.stderr[-3000:]
    return json.loads(lines[0][len("RESULT ") :])


def test_a_push_between_two_tokens_labels_each_token_with_its_weights(engine_loop):
    """A request in flight when new weights load (the LM head's tied embeddings zeroed: every logprob becomes
    -log(vocab)) goes on under them: the tokens vLLM labels with the new version, and only they, have the new
    weights' logprobs; a request after the push is served no cached block of the old weights, one salted as before
    the push is (the control)."""
    got = engine_loop
    versions, logprobs, uniform = got["versions"], got["logprobs"], -math.log(got["vocab"])
    cut = versions.index(1)
    assert got["in_flight"] == 1 and 0 < cut < len(versions) == 48
    assert versions == [0] * cut + [1] * (len(versions) - cut)
    assert all(abs(lp - uniform) < 1e-4 for lp in logprobs[cut:])
    assert sum(abs(lp - uniform) > 1e-3 for lp in logprobs[:cut]) >= cut - 1  # the old weights' are not uniform
    assert got["later_cached"] == 0 and got["stale_cached"] >= 128


def test_requests_stopped_on_the_engine_loop_leave_it_serving(engine_loop):
    """A hand-back's engine side (``EngineLoop.abort``): a request stopped mid-way in the engine and one stopped as
    it was sent are cancelled and gone from the engine; a finished one is left as it is; the request beside them
    runs to its end and the next one is served."""
    got = engine_loop
    assert got["aborted"] == 2 and got["cancelled"] == [True, True, False]
    assert got["kept_tokens"] == 64 and got["after_tokens"] == 4 and got["unfinished"] == 0


@pytest.fixture(scope="module")
def streamed(tmp_path_factory):
    """One 4-step streaming run (saving at step 2, as tests/test_checkpoint.py's runs do)."""
    out = tmp_path_factory.mktemp("streamed")
    res = run_cli("train", "recipes/tiny-cpu.yaml", *COMMON, *STREAMING, *LONGER, f"trainer.output_dir={out}")
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def trained_uids(out):
    """Each prompt uid trained in steps 1 to 4, with how many samples of it."""
    return collections.Counter(
        s["uid"] for step in range(1, 5) for s in read_samples(out / "rollouts" / f"train_data_step{step}.jsonl")
    )


@pytest.mark.slow
def test_every_prompt_sent_is_trained_once(streamed):
    """Groups are trained as they finish, not in the order sent; still every prompt of the first four batches of
    the stream is trained exactly once by the last step, its whole group."""
    whole = trained_uids(streamed)
    assert len(whole) == 4 * 16 and set(whole.values()) == {16}


@pytest.mark.slow
def test_every_prompt_sent_is_trained_once_across_a_resume(tmp_path_factory):
    """The same run resumed from its step-2 checkpoint: the prompts in flight at the checkpoint are sent again
    first, and the prompts trained are those of the uninterrupted run, each once."""
    whole, resumed = (
        trained_uids(out) for out in whole_and_resumed(tmp_path_factory, [*STREAMING, *LONGER], kill=False)
    )
    assert len(whole) == 4 * 16 and set(whole.values()) == {16}
    assert whole == resumed


@pytest.mark.slow
def test_answers_span_pushes_and_the_learner_corrects_them(streamed):
    """Pushes land in generation in flight: some answers carry two versions, each token's no newer than the
    weights that trained it; nothing is thrown away under the default policy (keep); the old policy is the
    learner's before its update (recomputed every step) and the sampler's logprobs of older tokens are corrected."""
    metrics = rows(streamed)
    assert any(m["rollout/versions_per_trajectory/max"] == 2 for m in metrics)
    assert all(m["rollout/discarded_tokens/stale"] == 0 for m in metrics)
    generated = over = 0  # goodput: tokens trained within max_staleness over tokens generated, recounted
    for m in metrics:
        for s in read_samples(streamed / "rollouts" / f"train_data_step{m['step']}.jsonl"):
            generated += len(s["response_ids"])
            over += len(s["response_ids"]) * (m["step"] - 1 - s["versions"][0] > 2)
        assert m["rollout/over_bound_share"] == pytest.approx(over / generated)
        assert m["rollout/goodput"] == pytest.approx(1 - over / generated)
    assert all(m["actor/old_log_prob_recomputed"] == 1 and m["sync/pause_s"] > 0 for m in metrics)
    assert max(m["rollout/staleness/max"] for m in metrics) >= 1
    for m in metrics:  # the histogram: each sample's age counted once (none past the bound here)
        shares = [m[f"rollout/staleness/share_{a}"] for a in range(3)]
        assert m["rollout/over_max_staleness"] > 0 or abs(sum(shares) - 1) < 1e-9
        assert shares[0] < 1 or m["rollout/staleness/max"] == 0
    for step in range(1, len(metrics) + 1):
        for s in read_samples(streamed / "rollouts" / f"train_data_step{step}.jsonl"):
            v = s["versions"]
            assert len(v) == len(s["response_ids"]) and v == sorted(v) and v[-1] <= step - 1
            assert s["policy_version"] <= v[0]


POLICY = """
from grpo_ray.schedules import Staleness


class Fresh(Staleness):
    def oldest_kept(self, learner_version):
        return learner_version
"""


@pytest.mark.slow
def test_a_policy_of_ones_own_drops_stale_groups_and_regenerates_them(tmp_path):
    """A user's policy (module:Class) that keeps only groups wholly of the learner's weights: the others are
    dropped as they finish, their tokens counted, their prompts generated again; goodput falls below 1, and every
    sample trained was sampled by the weights it is trained on."""
    (tmp_path / "fresh_only.py").write_text(textwrap.dedent(POLICY))
    out = tmp_path / "run"
    res = run_cli(
        "train",
        "recipes/tiny-cpu.yaml",
        *COMMON,
        *STREAMING,
        *LONGER,
        "algorithm.staleness=fresh_only:Fresh",
        "algorithm.max_staleness=1",  # groups taken after the push: the learner's weights are the engines'
        "trainer.save_freq=0",
        f"trainer.output_dir={out}",
        env={"PYTHONPATH": f"{tmp_path}:{ROOT}"},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = rows(out)
    assert sum(m["rollout/discarded_tokens/stale"] for m in metrics) > 0 and metrics[-1]["rollout/goodput"] < 1
    assert all(m["rollout/staleness/max"] == 0 for m in metrics)


@pytest.mark.slow
def test_multi_turn_episodes_stream_and_span_pushes(tmp_path):
    """Multi-turn episodes on the engine's loop: a trajectory's turns go to the engine one by one as its environment
    answers (tests.helpers.envs:Echo, turns ended by stop strings), pushes land between them and inside them, and
    the trajectory goes on under the new weights; each token keeps the version that sampled it (an observation's, its
    turn's), the loss mask covers the model's tokens only, and every prompt is trained once."""
    out = tmp_path / "run"
    res = run_cli(
        "train",
        "recipes/tiny-cpu.yaml",
        *COMMON,
        *STREAMING,
        "generator.sampling.max_tokens=8",
        "+generator.vllm_kwargs.max_num_seqs=8",
        "trainer.dump_freq=1",
        "trainer.save_freq=0",
        "environment.name=tests.helpers.envs:Echo",
        "environment.stop=[e,a]",
        "environment.max_turns=3",
        "environment.max_tokens=64",
        f"trainer.output_dir={out}",
    )
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = rows(out)
    assert all(m["rollout/goodput"] + m["rollout/over_bound_share"] == pytest.approx(1.0) for m in metrics)
    assert metrics[-1]["env/turns/mean"] > 1
    spanning, samples = 0, []
    for step in range(1, 5):
        for s in read_samples(out / "rollouts" / f"train_data_step{step}.jsonl"):
            v, mask = s["versions"], s["loss_mask"]
            assert len(v) == len(mask) == len(s["response_ids"]) and v == sorted(v) and v[-1] <= step - 1
            spanning += len(set(v)) > 1 and len(s["episode"]["turns"]) > 1
            samples.append(s["uid"])
    assert spanning > 0  # some episode went on across a push
    counts = collections.Counter(samples)
    assert len(counts) == 4 * 16 and set(counts.values()) == {16}
