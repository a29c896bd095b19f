"""The reward-model pool against the raw component, and its scaling with actors, in one run.

    python benchmarks/reward_model.py --out benchmarks/results/reward-model

1. **Pool against a bare forward**: one reward-model actor (``roles.reward_model.RewardModel``: one actor holds the
   whole classifier, no group; longest-first micro batches) scores batches of rollouts passed as Ray object refs, against a bare
   ``AutoModelForSequenceClassification`` forward of the same classifier in a Ray actor with the same threads, on the
   same rollouts; both render each (prompt, response) in the classifier's chat template and tokenize it (every
   conversation the same length, so the bare side pads nothing) and are timed from the driver, the Ray hop included.
   Tokens/s, the median over --reps calls after one warm-up, for each model in MODELS.
2. **Scaling with actors**: the same batch scored by a pool of one actor and by a pool of two (each actor one
   thread, so two actors use the two cores one actor leaves half idle), each actor given an even share as the
   controller gives it, two actors sharded (one FSDP2 group) and unsharded (``reward_model.shard=false``); and, as what this machine's two cores give to two processes at all, the bare forward in one
   process against two, each on half the batch. The median seconds of each.

Writes reward-model.json and reward-model.md to --out.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench import heading, machine, write_report  # noqa: E402
from benchmarks.gpu import pool_against_bare  # noqa: E402

TWIN = "recipes/tiny-qwen2.5-1.5b-gsm8k-rm.yaml"
MODELS = {  # name: (samples a call, micro batch)
    "tiny://llama?layers=2&hidden=64&heads=2&kv_heads=1&intermediate=128&vocab=400&seed=3&score=1": (128, 16),
    "tiny://llama?layers=4&hidden=512&heads=8&kv_heads=2&intermediate=1536&vocab=400&seed=3&score=1": (64, 8),
}
SCALING = list(MODELS)[1]


def rollouts(samples: int, words: int, seed: int):
    """One rollout of `samples` single-turn completions of random words from the tiny tokenizer's own text, each
    conversation `words` words long (so every rendered conversation is about as long)."""
    from grpo_ray.data import synthetic
    from grpo_ray.types import Completion, Prompt, Rollout

    rng = random.Random(seed)
    vocab = " ".join(synthetic.corpus("select", size=200)).split()
    text = lambda n: " ".join(rng.choice(vocab) for _ in range(n))  # noqa: E731
    prompts = [
        Prompt([1], "1", "bench", messages=[{"role": "user", "content": text(words // 2)}]) for _ in range(samples)
    ]
    completions = [Completion(i, [1], text(words // 2), [0.0], "stop") for i in range(samples)]
    return Rollout(prompts, completions, 0)


class BareClassifier:
    """A transformers forward of the classifier at `path` on each (prompt, response) rendered in its chat template,
    micro batch by micro batch (every conversation cut to the shortest's length: no padding)."""

    def __init__(self, path: str, threads: int, micro: int):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        torch.set_num_threads(threads)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
        self.micro = micro

    def scores(self, rollout_refs: list, length: int) -> list[float]:
        import ray
        import torch

        from grpo_ray.data import conversation_text as render

        pairs = [(r.prompts[c.prompt], c) for r in ray.get(rollout_refs) for c in r.completions]
        texts = [render(self.tokenizer, p.messages, c.text) for p, c in pairs]
        ids = [x[:length] for x in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]
        out = []
        with torch.no_grad():
            for i in range(0, len(ids), self.micro):
                out += self.model(torch.tensor(ids[i : i + self.micro])).logits[:, 0].tolist()
        return out


def pool(path: str, recipe, actors: int, threads: int) -> list:
    """A reward-model pool of `actors`, joined into its FSDP2 group."""
    import ray

    from grpo_ray.roles.reward_model import RewardModel

    options = dict(num_cpus=threads, runtime_env={"env_vars": {"OMP_NUM_THREADS": str(threads)}})
    handles = [
        ray.remote(RewardModel).options(**options).remote(path, recipe, i, actors, threads) for i in range(actors)
    ]
    host, port = ray.get(handles[0].address.remote())
    ray.get([h.setup.remote(host, port) for h in handles])
    return handles


def timed(calls, reps: int) -> tuple[list[float], object]:
    """Seconds of each call after the first (a warm-up), and the first call's answer."""
    seconds, first = [], None
    for k in range(reps + 1):
        start = time.perf_counter()
        got = calls()
        if k:
            seconds.append(time.perf_counter() - start)
        else:
            first = got
    return seconds, first


def shortest(path: str, rollout) -> int:
    """Tokens of the shortest conversation of `rollout` as the classifier reads it: both sides cut every one there,
    so every sequence is as long (no padding) and both score the same tokens."""
    from transformers import AutoTokenizer

    from grpo_ray.data import conversation_text as render

    tokenizer = AutoTokenizer.from_pretrained(path)
    texts = [render(tokenizer, rollout.prompts[c.prompt].messages, c.text) for c in rollout.completions]
    return min(len(x) for x in tokenizer(texts, add_special_tokens=False)["input_ids"])


def pool_vs_bare(name: str, samples: int, micro: int, words: int, reps: int, threads: int) -> dict:
    import ray

    from grpo_ray import models
    from grpo_ray.config import load_recipe
    from grpo_ray.models.dims import model_dims

    path = models.resolve(name)
    batch = rollouts(samples, words, seed=0)
    length = shortest(path, batch)
    overrides = [
        f"reward_model.model={name}",
        f"reward_model.micro_batch_size={micro}",
        f"reward_model.max_length={length}",
        "~data.response_prefix",  # the bare side renders the response as it is
    ]
    (actor,) = pool(path, load_recipe(ROOT / TWIN, overrides), 1, threads)
    bare = ray.remote(BareClassifier).options(num_cpus=threads).remote(path, threads, micro)
    ray.get(bare.__ray_ready__.remote())  # loaded before anything is timed: its start would take the pool's CPUs
    ref = ray.put(batch)
    pool_s, (pool_scores, _) = timed(lambda: ray.get(actor.score.options(num_returns=2).remote([ref])), reps)
    bare_s, bare_scores = timed(lambda: ray.get(bare.scores.remote([ref], length)), reps)
    for a in (actor, bare):
        ray.kill(a)
    return {
        "model": name,
        "parameters": model_dims(path).params,
        "samples": samples,
        "seq": length,
        "micro_batch": micro,
        "threads": threads,
        **pool_against_bare(samples * length, pool_s, bare_s, [pool_scores], [bare_scores]),
    }


def scaling(name: str, samples: int, micro: int, words: int, reps: int) -> dict:
    """One actor against two (one thread each) on the same batch, each with an even share: the pool (one FSDP2 group
    of two), the pool unsharded (reward_model.shard=false: the whole classifier on each actor) and, as what this
    machine's cores allow, the bare forward in one process against two."""
    import ray

    from grpo_ray import models
    from grpo_ray.config import load_recipe
    from grpo_ray.types import Rollout

    path = models.resolve(name)
    batch = rollouts(samples, words, seed=1)
    length = shortest(path, batch)
    overrides = [f"reward_model.model={name}", f"reward_model.micro_batch_size={micro}", "~data.response_prefix"]
    recipe = load_recipe(ROOT / TWIN, [*overrides, f"reward_model.max_length={length}"])
    whole = load_recipe(ROOT / TWIN, [*overrides, f"reward_model.max_length={length}", "reward_model.shard=false"])
    ref, out = ray.put(batch), {"model": name, "samples": samples}
    for actors in (1, 2):
        share = -(-samples // actors)
        spans = [[(k * share, min(samples, (k + 1) * share))] for k in range(actors)]
        halves = [ray.put(Rollout(batch.prompts, batch.completions[a:b], 0)) for [(a, b)] in spans]
        options = dict(num_cpus=1, runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
        for kind in ("pool", "unsharded", "bare"):  # one kind's actors at a time: each actor its own core
            if kind == "bare":
                handles = [ray.remote(BareClassifier).options(**options).remote(path, 1, micro) for _ in range(actors)]
                ray.get([b.__ray_ready__.remote() for b in handles])
                call = lambda handles=handles, halves=halves: ray.get(  # noqa: E731
                    [b.scores.remote([h], length) for b, h in zip(handles, halves)]
                )
            else:
                handles = pool(path, recipe if kind == "pool" else whole, actors, 1)
                call = lambda handles=handles, spans=spans: ray.get(  # noqa: E731
                    [h.score.options(num_returns=2).remote([ref], s)[0] for h, s in zip(handles, spans)]
                )
            seconds, _ = timed(call, reps)
            out[f"{kind}_{actors}_seconds"] = seconds
            out[f"{kind}_{actors}_median_s"] = statistics.median(seconds)
            for h in handles:
                ray.kill(h)
    for kind in ("pool", "unsharded", "bare"):
        out[f"{kind}_speedup"] = round(out[f"{kind}_1_median_s"] / out[f"{kind}_2_median_s"], 3)
    return out


def markdown(report: dict) -> str:
    lines = [
        *heading("Reward-model pool", report),
        "One reward-model actor (the role: one actor holds the whole classifier, no group) against a bare "
        "`AutoModelForSequenceClassification` forward in a Ray actor with the same threads, on the same rollouts passed "
        "as object refs, both rendering each conversation in the classifier's chat template, timed from the driver "
        f"(median of {report['reps']} calls after one warm-up; fp32):",
        "",
        "| classifier | parameters | batch | threads | pool tokens/s | bare tokens/s | pool / bare | largest score gap |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report["pool_vs_bare"]:
        lines.append(
            f"| `{r['model'].split('?')[1][:40]}...` | {r['parameters']:,} | {r['samples']} x {r['seq']} tokens, "
            f"micro {r['micro_batch']} | {r['threads']} | {r['pool_tokens_per_s']:.0f} | {r['bare_tokens_per_s']:.0f} "
            f"| **{r['pool_over_bare']:.2f}** | {r['max_abs_logprob_gap']:.2g} |"
        )
    s = report["scaling"]
    lines += [
        "",
        f"Scaling: {s['samples']} samples of the {s['model'].split('hidden=')[1].split('&')[0]}-wide classifier, one "
        "actor against two (one thread each, even shares):",
        "",
        "| | one actor s | two actors s | speedup |",
        "| --- | --- | --- | --- |",
        f"| the pool, sharded (two actors: one FSDP2 group) | {s['pool_1_median_s']:.3f} | {s['pool_2_median_s']:.3f} | "
        f"**{s['pool_speedup']:.2f}x** |",
        f"| the pool unsharded (`reward_model.shard=false`) | {s['unsharded_1_median_s']:.3f} | "
        f"{s['unsharded_2_median_s']:.3f} | **{s['unsharded_speedup']:.2f}x** |",
        f"| bare forwards, one process each | {s['bare_1_median_s']:.3f} | {s['bare_2_median_s']:.3f} | "
        f"{s['bare_speedup']:.2f}x |",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--words", type=int, default=120, help="words of each conversation")
    ap.add_argument("--out", default="benchmarks/results/reward-model")
    args = ap.parse_args()
    import ray

    ray.init(address="local", num_cpus=2 * args.threads, include_dashboard=False, log_to_driver=False)
    try:
        rows = [pool_vs_bare(name, *shape, args.words, args.reps, args.threads) for name, shape in MODELS.items()]
        scaled = scaling(SCALING, *MODELS[SCALING], args.words, args.reps)
    finally:
        ray.shutdown()
    report = {
        "machine": machine(),
        "reps": args.reps,
        "pool_vs_bare": rows,
        "scaling": scaled,
        "command": "python benchmarks/reward_model.py " + " ".join(sys.argv[1:]),
    }
    write_report(args.out, "reward-model", report, markdown(report))


if __name__ == "__main__":
    main()
