"""FLOPs, MFU, throughput and pass@k: pure functions, each checked against numbers worked by hand.

One forward over rows of q tokens, each token attending to k keys, with the LM head run on H positions, costs

    2 * N_body * sum(q)  +  2 * V * h * H  +  4 * L * d_attn * sum(q * k)

N_body is the number of parameters of the decoder blocks' linear layers, V * h the LM head's (the embedding lookup
and norms do no matmul), L the number of layers and d_attn = heads x head_dim. The first terms are the dense matmuls
(2 FLOPs per multiply-add), the last QK^T and AV. A sequence of s tokens is a row of q = k = s (the usual
convention, which counts the causal mask's upper half too); a backward costs two forwards. With the head on every
token, training over sequences of lengths s_i (T = sum s_i tokens, N = N_body + V * h) is the usual

    6 * N * T  +  12 * L * d_attn * sum(s_i ** 2)

(``train_flops``). The learner and the reference run the head only where a response token is predicted
(``algo.logprobs.head_on``), and with shared prompts (``model.shared_prompt``) each distinct prompt of p tokens
once (a row of q = k = p) and each response of r tokens after it (q = r, k = p + r): the learner counts the FLOPs
of the forwards it really ran, in the layout it ran (``batching.forward_work``, ``Learner._logprobs``), and MFU is
computed from that count. The dims come from ``grpo_ray.models.dims.ModelDims``.
"""

from __future__ import annotations

from math import comb


def forward_flops(dims, rows: list[tuple[int, int]], logits: int | None = None) -> float:
    """FLOPs of one forward over `rows` of (tokens, keys each token attends to), the LM head on `logits` positions
    (None: on every token) (`dims`: a dims.ModelDims)."""
    tokens = sum(q for q, _ in rows)
    head = dims.vocab * dims.hidden
    body = 2 * (dims.matmul_params - head) * tokens + 4 * dims.layers * dims.attn_dim * sum(q * k for q, k in rows)
    return body + 2 * head * (tokens if logits is None else logits)


def train_flops(dims, seq_lens: list[int], passes: float = 1.0) -> float:
    """FLOPs of `passes` forward+backward passes over whole sequences of `seq_lens`, the head on every token."""
    return passes * 3 * forward_flops(dims, [(s, s) for s in seq_lens])


# Dense bf16 peak TFLOPS per device (vendor datasheets, without sparsity), matched against torch's device name in
# this order, the first match winning (so "H100 PCIe" before "H100", "A100" before "A10", "L40S" before "L40").
# Consumer cards are listed at their rate with fp32 accumulation, the one training uses.
PEAK_TFLOPS: list[tuple[str, float]] = [
    (r"GB200", 2500.0),
    (r"B200", 2250.0),
    (r"B100", 1750.0),
    (r"H100 PCIe", 756.0),
    (r"H100 NVL", 835.0),
    (r"GH200|H200|H100|H800", 989.0),
    (r"H20\b", 148.0),
    (r"A100|A800", 312.0),
    (r"A30\b", 165.0),
    (r"A40\b", 149.7),
    (r"A10\b", 125.0),
    (r"L40S", 362.0),
    (r"L40\b", 181.0),
    (r"L4\b", 121.0),
    (r"RTX 6000 Ada", 364.2),
    (r"RTX A6000", 154.8),
    (r"RTX 4090", 165.2),
    (r"RTX 3090", 71.0),
    (r"MI325X|MI300X", 1307.4),
    (r"MI250X", 383.0),
]


def device_peak_tflops(device_name: str, declared: float = 0.0) -> float | None:
    """Peak TFLOPS of one device: the declared number if given, else the table's; None when neither knows it
    (MFU is then not reported: a metric never stops a run)."""
    import re

    if declared > 0:
        return declared
    return next((peak for pattern, peak in PEAK_TFLOPS if re.search(pattern, device_name)), None)


def mfu(flops: float, seconds: float, peak_tflops: float, devices: int) -> float:
    """Model FLOPs utilisation: achieved FLOP/s over the devices' peak."""
    return flops / seconds / (peak_tflops * 1e12 * devices)


def throughput(tokens: int, seconds: float, devices: float) -> float:
    """verl's perf/throughput: prompt+response tokens per second per device of all pools."""
    return tokens / seconds / devices


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al., 2021): 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def measure_cpu_peak_tflops(size: int = 512, repeats: int = 4, trials: int = 5) -> float:
    """Best achieved fp32 matmul TFLOPS of this process's threads over a few trials: the CPU 'peak'.

    The best trial is taken because other processes on the machine can only slow a trial down. 512 reaches what
    1024 does (measured on one thread here: 0.080 and 0.076 TFLOPS) in a ninth of the time (0.08 s, not 0.7 s:
    every run's learner measures it as the actors start, when the cores are busiest)."""
    import time

    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b  # warm up
    best = 0.0
    for _ in range(trials):
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        best = max(best, 2 * size**3 * repeats / (time.perf_counter() - start) / 1e12)
    return best
