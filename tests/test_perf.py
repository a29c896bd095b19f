"""FLOPs, MFU, throughput and pass@k against counts worked by hand."""

import pytest
import torch

from grpo_ray import models, perf
from grpo_ray.metrics import validation_metrics
from grpo_ray.roles.learner import model_shape
from tests.conftest import TINY


def test_model_shape_matches_a_count_from_the_config():
    # TINY: hidden 64, 2 heads of 32, 1 kv head, MLP 128, 2 layers, tied embeddings
    path = models.resolve(TINY.format(arch="qwen2"))
    model = models.load_causal_lm(path, torch.float32)
    vocab = model.config.vocab_size
    per_layer = 64 * 64 + 64 * 32 + 64 * 32 + 64 * 64 + 3 * 64 * 128  # q, k, v, o, gate/up/down
    by_hand = 2 * per_layer + 64 * vocab  # + the LM head's matmul (tied to the embedding)
    assert model_shape(model) == perf.ModelShape(by_hand, 2, 64)


def test_train_flops_by_hand():
    shape = perf.ModelShape(matmul_params=1000, layers=2, attn_dim=8)
    # dense: 6 * 1000 * (3 + 5) = 48000; attention: 12 * 2 * 8 * (9 + 25) = 6528
    assert perf.train_flops(shape, [3, 5]) == 48000 + 6528
    assert perf.train_flops(shape, [3, 5], passes=2 + 1 / 3) == pytest.approx((48000 + 6528) * 7 / 3)


def test_mfu_and_throughput_by_hand():
    assert perf.mfu(flops=2e12, seconds=2.0, peak_tflops=1.0, devices=2) == pytest.approx(0.5)
    assert perf.throughput(tokens=1000, seconds=2.0, devices=4) == 125.0


def test_device_peaks():
    assert perf.device_peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert perf.device_peak_tflops("NVIDIA B200") == 2250.0
    assert perf.device_peak_tflops("Some CPU", declared=1.5) == 1.5
    with pytest.raises(perf.UnknownDeviceError, match="set cluster.peak_tflops"):
        perf.device_peak_tflops("NVIDIA A10G")
    assert 0 < perf.measure_cpu_peak_tflops(size=256, repeats=2, trials=2) < 100


def test_pass_at_k_by_hand():
    assert perf.pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert perf.pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert perf.pass_at_k(4, 0, 4) == 0.0 and perf.pass_at_k(4, 1, 4) == 1.0


def test_validation_metrics_per_source():
    sources = ["gsm8k", "gsm8k", "math500"]
    totals = [1, 0, 0, 0, 1, 1]  # n = 2 per prompt
    m = validation_metrics(sources, totals, n=2, perfect=1.0)
    assert m == {"val/gsm8k/pass@1": pytest.approx(0.25), "val/gsm8k/pass@2": pytest.approx(0.5),
                 "val/math500/pass@1": 1.0, "val/math500/pass@2": 1.0}
    assert validation_metrics(["a"], [0.9], n=1, perfect=1.0) == {"val/a/pass@1": 0.0}  # partial credit fails
