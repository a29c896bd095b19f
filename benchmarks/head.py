"""The LM head on response positions only, against the head on every position: one learner micro step.

    python benchmarks/head.py [--layers 24] [--samples 4] [--prompt 192] [--response 256] [--reps 3] \
        [--out benchmarks/results/head]

A Qwen2.5-0.5B-shaped model (vocabulary 151,936, tied embeddings; random weights, built from its config, so
nothing is downloaded), in bf16 on this host's cores. One micro batch of `samples` sequences of `prompt` +
`response` tokens; a forward, the logprobs of the response tokens, a backward of their sum: the learner's
work per micro batch. Variants, each in its own child process (same thread count) so that its peak memory is
its own:
  - every position: the head on every hidden state, log-softmax over every position, response tokens picked
    afterwards (grpo-ray before; verl's padded path);
  - responses only: ``grpo_ray.algo.logprobs.sequence_logprobs``, which runs the head on the hidden states
    that predict a response token (what the learner and the reference do now; TRL's ``logits_to_keep``).
Reported: median seconds of `reps` steps after one warm-up, and the step's peak memory above the model's
(the child's peak RSS after the steps less its RSS before the first).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

QWEN25_05B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    tie_word_embeddings=True,
    max_position_embeddings=4096,
)


def _rss_gb() -> float:
    return int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmRSS"))) / 1e6


def _variant(name: str, spec: dict, out) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_ray.algo.batching import collate
    from grpo_ray.algo.logprobs import sequence_logprobs, token_logprobs

    torch.manual_seed(0)
    config = Qwen2Config(**QWEN25_05B, num_hidden_layers=spec["layers"], attn_implementation="eager")
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    rand = lambda n: torch.randint(3, config.vocab_size, (n,), generator=g).tolist()  # noqa: E731
    seqs = collate([(rand(spec["prompt"]), rand(spec["response"])) for _ in range(spec["samples"])], 0)
    mask = seqs.response_mask

    def step():
        model.zero_grad(set_to_none=True)
        if name == "every position":
            logp, _ = token_logprobs(model, seqs.input_ids, seqs.attention_mask)
        else:
            logp, _ = sequence_logprobs(model, seqs, "cpu")
        (logp * mask).sum().backward()

    before = _rss_gb()
    step()  # warm-up
    times = []
    for _ in range(spec["reps"]):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    out.put(
        {
            "seconds": statistics.median(times),
            "peak_above_model_gb": peak - before,
            "params": sum(p.numel() for p in model.parameters()),
        }
    )


def run(name: str, spec: dict) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_variant, args=(name, spec, q))
    p.start()
    result = q.get()
    p.join()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=192)
    ap.add_argument("--response", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/head")
    spec = vars(ap.parse_args())
    from benchmarks.bench import machine, write_report

    results = {name: run(name, spec) for name in ("every position", "responses only")}
    report = {"machine": machine(), "spec": spec, "results": results}
    m, every, only = report["machine"], results["every position"], results["responses only"]
    tokens = spec["samples"] * (spec["prompt"] + spec["response"])
    lines = [
        "# The LM head on response positions only",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB; torch {m['torch']}; {m['date']}. "
        f"`python benchmarks/head.py --layers {spec['layers']} --samples {spec['samples']} --prompt {spec['prompt']} "
        f"--response {spec['response']} --reps {spec['reps']}`: a Qwen2.5-0.5B-shaped model "
        f"({every['params'] / 1e6:.0f}M parameters, vocabulary 151,936), bf16, one micro batch of "
        f"{spec['samples']} x ({spec['prompt']} prompt + {spec['response']} response) = {tokens} tokens, "
        "forward + response logprobs + backward.",
        "",
        "| head on | step (s) | tokens/s | peak memory above the model (GB) |",
        "| --- | --- | --- | --- |",
        *(
            f"| {name} | {r['seconds']:.2f} | {tokens / r['seconds']:.0f} | {r['peak_above_model_gb']:.2f} |"
            for name, r in results.items()
        ),
        "",
        f"Responses only: {every['seconds'] / only['seconds']:.2f}x the step speed, "
        f"{every['peak_above_model_gb'] - only['peak_above_model_gb']:.2f} GB less peak memory.",
        "",
    ]
    write_report(spec["out"], "head", report, "\n".join(lines))


if __name__ == "__main__":
    main()
