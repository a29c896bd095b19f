"""What images cost a step (issue 77): the vision twin's engine generation and learner update on image prompts,
against the same token counts as text alone, in one run, with repeats.

    python benchmarks/vision_overhead.py [--out benchmarks/results/vision-overhead] [--repeats 5]

The model is recipes/tiny-cpu-vision.yaml's (a SigLIP tower of 2 layers before Gemma 3's language model, 16 tokens an
image). Each repeat draws new pictures (``synthetic://shapes``, another seed), so no cache of an earlier repeat's
images or prompts is hit; its text twin is each image prompt with the image's tokens replaced by a text token, the
same lengths, no pixels.

- **Engine**: vLLM (its transformers backend, as the recipe runs it) samples the recipe's group of 16 for each of 16
  prompts, 8 tokens each: the prompts with their pictures as ``multi_modal_data``, against the text twins.
- **Learner**: the same 256 prompt + response pairs through the learner's forward and backward
  (``sequence_logprobs``, packed micro batches of 64 rows): with their pictures as the learner reads them
  (``models.vision.in_order``: each distinct picture of a micro batch processed and run through the tower once, its
  features handed to each sample that holds it), with each sample's copy run through the tower (as before that),
  and the text twins; and the processor's share of the first.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPTS, GROUP, TOKENS, MICRO = 16, 16, 8, 64


def spread(values: list[float]) -> dict:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def prompts_of(path: str, seed: int) -> tuple[list[list[int]], list[list[int]], list[bytes], int]:
    """PROMPTS prompts of new pictures: each one's ids as the engine is sent them (one image marker) and as the
    processor expands them, its picture, and the image's token id."""
    from grpo_ray.data import load_rows
    from grpo_ray.models import vision

    rows = load_rows(
        f"synthetic://shapes?size={PROMPTS}&seed={seed}&max_count=4", "prompt", "reward_model.ground_truth"
    )
    processor = vision.processor(path)
    sent, ids, pictures = [], [], []
    for row in rows:
        text = row["prompt"][0]["content"].replace("<image>", "").strip()
        turn = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
        rendered = processor.apply_chat_template(turn, add_generation_prompt=True, tokenize=False)
        sent.append(processor.tokenizer(rendered, add_special_tokens=False)["input_ids"])
        ids.append(list(vision.expanded_ids(path, rendered, vision.sizes(row["images"]))))
        pictures.append(row["images"][0])
    image_id = processor.tokenizer.convert_tokens_to_ids(processor.tokenizer.image_token)
    return sent, ids, pictures, image_id


def text_tokens(path: str) -> list[int]:
    """The tokenizer's plain tokens (no special or image token): what a text twin holds where an image's were."""
    from grpo_ray.models import vision

    tokenizer = vision.processor(path).tokenizer
    special = set(tokenizer.all_special_ids) | {tokenizer.convert_tokens_to_ids(tokenizer.image_token)}
    return [
        t for t in range(len(tokenizer)) if t not in special and not tokenizer.convert_ids_to_tokens(t).startswith("<")
    ]


def engine_times(path: str, repeats: int) -> dict:
    from vllm import LLM, SamplingParams

    from grpo_ray.models import vision

    llm = LLM(
        model=path,
        model_impl="transformers",
        dtype="float32",
        enforce_eager=True,
        seed=0,
        max_model_len=256,
        kv_cache_memory_bytes=256 * 2**20,
        limit_mm_per_prompt={"image": 1},
    )
    params = SamplingParams(n=GROUP, max_tokens=TOKENS, temperature=1.0, ignore_eos=True)
    plain = text_tokens(path)
    out = {"images": [], "text": []}
    for r in range(repeats + 1):
        sent, _, pictures, image_id = prompts_of(path, 100 + r)
        # the engine takes a prompt's image marker and expands it into the image's tokens itself
        with_images = [
            {"prompt_token_ids": s, "multi_modal_data": {"image": vision.decoded([b])}} for s, b in zip(sent, pictures)
        ]
        start = time.perf_counter()
        got = llm.generate(with_images, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        # each text twin: the prompt as the engine expanded it, plain tokens where the image's were (drawn for each
        # prompt: no two share a prefix the pictures would not)
        g = random.Random(r)
        text = [
            {"prompt_token_ids": [g.choice(plain) if t == image_id else t for t in o.prompt_token_ids]} for o in got
        ]
        assert all(o.prompt_token_ids.count(image_id) == 16 for o in got)
        start = time.perf_counter()
        llm.generate(text, params, use_tqdm=False)
        if r:  # the first: warm-up, not counted
            out["images"].append(seconds)
            out["text"].append(time.perf_counter() - start)
    return out


def learner_times(path: str, repeats: int) -> dict:
    import torch

    from grpo_ray.algo.batching import collate, micro_batches
    from grpo_ray.algo.logprobs import sequence_logprobs
    from grpo_ray.models import load_causal_lm, vision

    torch.set_num_threads(2)
    model = load_causal_lm(path, torch.float32)
    plain = [t for t in text_tokens(path) if t < model.get_input_embeddings().num_embeddings]
    g = torch.Generator().manual_seed(0)
    out = {"processor": []}
    for r in range(repeats + 1):
        _, ids, pictures, image_id = prompts_of(path, 200 + r)
        pairs, images = [], []
        for p, b in zip(ids, pictures):
            for _ in range(GROUP):
                pairs.append((p, [plain[k] for k in torch.randint(0, len(plain), (TOKENS,), generator=g).tolist()]))
                images.append([b])
        text_pairs = [([plain[k % len(plain)] if t == image_id else t for k, t in enumerate(p)], x) for p, x in pairs]
        micros, capacity = micro_batches(list(range(len(pairs))), pairs, MICRO, True, False)
        for name, these in (("images", pairs), ("images_tower_per_sample", pairs), ("text", text_pairs)):
            start, processing = time.perf_counter(), 0.0
            for micro in micros:
                seqs = collate([these[i] for i in micro], 0, capacity)
                t = time.perf_counter()
                pixels = vision.in_order(path, [images[i] for i in micro], seqs) if name != "text" else None
                if name == "images_tower_per_sample":  # each sample's copy of its picture run through the tower
                    pixels = vision.Pixels(pixels.values[pixels.index], torch.arange(len(pixels.index)))
                processing += time.perf_counter() - t
                logp, _ = sequence_logprobs(model, seqs, "cpu", pixel_values=pixels)
                (-(logp * seqs.response_mask).sum()).backward()
            model.zero_grad(set_to_none=True)
            if r:
                out.setdefault(name, []).append(time.perf_counter() - start)
                if name == "images":
                    out["processor"].append(processing)
    return out


def part(name: str, repeats: int) -> dict:
    """One part's times, in a process of its own (vLLM's transformers backend patches the model classes it loads,
    so the learner's forward does not share the engine's process)."""
    import subprocess

    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    cmd = [sys.executable, __file__, "--part", name, "--repeats", str(repeats)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if done.returncode or not line:
        raise SystemExit(f"the {name} part failed:\n{done.stderr[-3000:]}")
    return json.loads(line[len("RESULT ") :])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/vision-overhead")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--part", choices=["engine", "learner"], help="(run by the benchmark itself)")
    args = ap.parse_args()
    from grpo_ray import models
    from grpo_ray.config import load_recipe

    name = load_recipe(ROOT / "recipes" / "tiny-cpu-vision.yaml").model.path
    path = models.resolve(name)
    if args.part:
        times = (engine_times if args.part == "engine" else learner_times)(path, args.repeats)
        print("RESULT " + json.dumps(times), flush=True)
        return
    from benchmarks.bench import machine

    engine, learner = part("engine", args.repeats), part("learner", args.repeats)
    result = {
        "machine": machine(),
        "command": f"python benchmarks/vision_overhead.py --repeats {args.repeats}",
        "model": name,
        "repeats": args.repeats,
        "shape": {"prompts": PROMPTS, "group": GROUP, "response_tokens": TOKENS, "micro_batch_rows": MICRO},
        "engine_s": {k: spread(v) for k, v in engine.items()},
        "learner_s": {k: spread(v) for k, v in learner.items()},
        "raw": {"engine": engine, "learner": learner},
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vision_overhead.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("engine_s", "learner_s")}, indent=1))


if __name__ == "__main__":
    main()
