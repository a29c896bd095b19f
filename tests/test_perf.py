"""FLOPs, MFU, throughput and pass@k against counts worked by hand."""

import pytest
import torch

from grpo_ray import models
from grpo_ray.models.dims import ModelDims, model_dims
from grpo_ray.telemetry import perf
from grpo_ray.telemetry.metrics import perf_metrics, validation_metrics
from tests.conftest import TINY


def test_model_dims_count_the_matmul_parameters_of_the_real_model():
    # TINY: hidden 64, 2 heads of 32, 1 kv head, MLP 128, 2 layers, tied embeddings
    path = models.resolve(TINY.format(arch="qwen2"))
    model = models.load_causal_lm(path, torch.float32)
    vocab = model.config.vocab_size
    per_layer = 64 * 64 + 64 * 32 + 64 * 32 + 64 * 64 + 3 * 64 * 128  # q, k, v, o, gate/up/down
    by_hand = 2 * per_layer + 64 * vocab  # + the LM head's matmul (tied to the embedding)
    dims = model_dims(path)
    assert (
        dims.matmul_params
        == by_hand
        == sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    )
    assert (dims.layers, dims.attn_dim, dims.max_positions) == (2, 64, model.config.max_position_embeddings)


# 1 layer, hidden 4, 1 head of 4, 1 kv head, MLP 2, vocab 6: layer 4*4*4 + 3*4*2 = 88, + head 24 = 112 matmul params
DIMS = ModelDims(layers=1, hidden=4, heads=1, kv_heads=1, head_dim=4, intermediate=2, vocab=6, tied=True)


def test_train_flops_by_hand():
    assert DIMS.matmul_params == 112 and DIMS.attn_dim == 4
    # dense: 6 * 112 * (3 + 5) = 5376; attention: 12 * 1 * 4 * (9 + 25) = 1632
    assert perf.train_flops(DIMS, [3, 5]) == 5376 + 1632
    assert perf.train_flops(DIMS, [3, 5], passes=2 + 1 / 3) == pytest.approx((5376 + 1632) * 7 / 3)
    assert perf.forward_flops(DIMS, [(3, 3), (5, 5)]) == (5376 + 1632) / 3


def test_flops_of_the_forwards_as_they_run_by_hand():
    from grpo_ray.algo.batching import forward_work

    pairs = [([5, 6, 7], [8, 9]), ([5, 6, 7], [4]), ([3], [8, 8, 8])]  # two responses to one prompt, one to another
    # packed: each sequence whole; the head where a response token is predicted (2 + 1 + 3 positions)
    assert forward_work(pairs, shared=False) == ([(5, 5), (4, 4), (4, 4)], 6)
    # shared: each prompt once (3 and 1 tokens), then each response after its prompt; the head on each prompt's last
    # position and on the responses' positions but their last (1 + 0 + 2)
    rows, logits = forward_work(pairs, shared=True)
    assert sorted(rows) == sorted([(3, 3), (1, 1), (2, 5), (1, 4), (3, 4)]) and logits == 2 + 3
    # DIMS: body 88 and head 24 matmul parameters; attention 4 * 1 layer * 4 wide = 16 a token x key
    # packed: 2 * 88 * 13 tokens + 2 * 24 * 6 logits + 16 * (25 + 16 + 16)
    assert perf.forward_flops(DIMS, *forward_work(pairs, False)) == 2288 + 288 + 912
    # shared: 2 * 88 * 10 tokens + 2 * 24 * 5 logits + 16 * (9 + 1 + 10 + 4 + 12)
    assert perf.forward_flops(DIMS, *forward_work(pairs, True)) == 1760 + 240 + 576
    # the usual convention (the head on every token): 3 x (2 * 112 * 13 + 16 * 57)
    assert perf.train_flops(DIMS, [5, 4, 4]) == 3 * perf.forward_flops(DIMS, forward_work(pairs, False)[0])


def test_mfu_is_the_learners_counted_flops_over_update_and_step_time():
    from grpo_ray.config import Recipe
    from grpo_ray.types import RolloutStats

    r = Recipe()
    r.learner.world_size = 2
    stats = [RolloutStats(0.1, 0, [1, 2], [2, 3], 0)]  # sequences of 3 and 5 tokens
    trained = {"timing_s/update_actor": 1.0, "timing_s/old_log_prob": 0.5, "actor/flops": 6000.0}
    facts = {"dims": DIMS, "peak_tflops": 1e-9}  # 1000 FLOP/s a device
    m = perf_metrics(stats, trained, 2.0, facts, 1.0, r)
    assert m["perf/mfu/actor"] == pytest.approx(6000 / 1.5 / 2000)
    assert m["perf/mfu/step"] == pytest.approx(6000 / 2.0 / 2000)
    assert m["perf/total_num_tokens"] == 8


def test_mfu_and_throughput_by_hand():
    assert perf.mfu(flops=2e12, seconds=2.0, peak_tflops=1.0, devices=2) == pytest.approx(0.5)
    assert perf.throughput(tokens=1000, seconds=2.0, devices=4) == 125.0


def test_device_peaks():
    assert perf.device_peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert perf.device_peak_tflops("NVIDIA B200") == 2250.0
    assert perf.device_peak_tflops("Some CPU", declared=1.5) == 1.5
    # the table's order matters: a longer name must not be taken for a shorter one it contains
    assert perf.device_peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert perf.device_peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert perf.device_peak_tflops("NVIDIA A10") == 125.0
    assert perf.device_peak_tflops("NVIDIA L40S") == 362.0 and perf.device_peak_tflops("NVIDIA L40") == 181.0
    assert perf.device_peak_tflops("NVIDIA L4") == 121.0
    assert perf.device_peak_tflops("NVIDIA GeForce RTX 4090") == 165.2
    assert perf.device_peak_tflops("NVIDIA RTX 6000 Ada Generation") == 364.2
    # unknown: no peak, never an error (a metric must not stop a run after its start)
    assert perf.device_peak_tflops("Tesla T4") is None and perf.device_peak_tflops("NVIDIA A10G") is None
    assert 0 < perf.measure_cpu_peak_tflops(size=256, repeats=2, trials=2) < 100


def test_pass_at_k_by_hand():
    assert perf.pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert perf.pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert perf.pass_at_k(4, 0, 4) == 0.0 and perf.pass_at_k(4, 1, 4) == 1.0


def test_validation_metrics_per_source():
    sources = ["gsm8k", "gsm8k", "math500"]
    totals = [1, 0, 0, 0, 1, 1]  # n = 2 per prompt
    m = validation_metrics(sources, totals, n=2, perfect=1.0)
    assert m == {
        "val/gsm8k/pass@1": pytest.approx(0.25),
        "val/gsm8k/pass@2": pytest.approx(0.5),
        "val/math500/pass@1": 1.0,
        "val/math500/pass@2": 1.0,
    }
    assert validation_metrics(["a"], [0.9], n=1, perfect=1.0) == {"val/a/pass@1": 0.0}  # partial credit fails
    # no reward function scores the source (an environment is the reward: a game): a positive reward passes
    assert validation_metrics(["game"] * 3, [1.0, 0.0, -1.0], n=1, perfect=0.0) == {"val/game/pass@1": 1 / 3}


def test_pool_metrics_count_every_actor_of_a_pool():
    from grpo_ray.telemetry.metrics import pool_metrics
    from grpo_ray.types import Work

    work = {"reference": [Work(1.0, 10), Work(0.5, 6)], "reward": [Work(0.2, 16)]}
    m = pool_metrics(work, {"reference": 2, "reward": 2, "generator": 0}, step_seconds=2.0)
    assert m["perf/idle/reference"] == pytest.approx(1 - 1.5 / 4)  # busy 1.5 of 2 actors x 2 s
    assert m["perf/work_balance/reference"] == pytest.approx(0.6)
    assert m["perf/idle/reward"] == pytest.approx(1 - 0.2 / 4)  # the second actor was given nothing
    assert m["perf/work_balance/reward"] == 0.0
    assert not any("generator" in k for k in m)


def test_an_unknown_gpu_reports_no_mfu_and_fails_nothing():
    """An A10G or a T4 raised UnknownDeviceError in the learner after the cluster had started; now the step's
    metrics simply leave MFU out (the run says so once at start)."""
    from grpo_ray.config import Recipe
    from grpo_ray.types import RolloutStats

    stats = [RolloutStats(0.1, 0, [1, 2], [2, 3], 0)]
    trained = {"timing_s/update_actor": 1.0, "timing_s/old_log_prob": 0.0, "actor/flops": 7008.0}
    m = perf_metrics(stats, trained, 2.0, {"dims": DIMS, "peak_tflops": None}, 1.0, Recipe())
    assert m["perf/throughput"] == pytest.approx(8 / 2.0) and not any(k.startswith("perf/mfu") for k in m)
