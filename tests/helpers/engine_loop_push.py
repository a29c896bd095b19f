"""A push into generation in flight, and requests stopped (a hand-back), on vLLM's engine loop
(``grpo_ray.rollouts.engine_loop``): prints one JSON line.

Run as a script (vLLM's engine start needs the __main__ guard): ``engine_loop_push.py MODEL_PATH``, with
VLLM_ENABLE_V1_MULTIPROCESSING=0 (the engine in this process, as in a generator actor). One long request is started;
after some engine steps a call between two steps loads "new weights" (the LM head zeroed: every logprob then is
-log(vocab)) and labels them version 1; the request goes on and finishes. A second request sent after the push, on
the same prompt, must be served no cached token (its salt is the new version's); one salted as before the push is
(the control: the salt is what keeps it fresh).
"""

import json
import sys

if __name__ == "__main__":
    import torch
    from vllm import LLM, SamplingParams

    from grpo_ray.roles.vllm_ext import reload_in_place
    from grpo_ray.rollouts.engine_loop import EngineLoop

    def zero_head(worker):
        """New weights, loaded as a push loads them: the token embeddings (tied to the LM head) all zero."""
        weight = worker.model_runner.model.model.embed_tokens.weight
        reload_in_place(worker, iter([("model.embed_tokens.weight", torch.zeros_like(weight))]))

    llm = LLM(
        model=sys.argv[1],
        dtype="float32",
        enforce_eager=True,
        seed=0,
        max_model_len=256,
        enable_chunked_prefill=False,
        kv_cache_memory_bytes=64 << 20,
    )
    engine = llm.llm_engine
    engine.set_weight_version("0")
    loop = EngineLoop(engine)
    loop.salt = "0"
    prompt = {"prompt_token_ids": list(range(5, 40)) * 4}  # past one cache block (128 on CPU)
    params = SamplingParams(max_tokens=48, ignore_eos=True, temperature=1.0, seed=1, logprobs=0)
    first = loop.submit(prompt, params)
    for _ in range(12):  # each call waits for the next pass of the loop: about one engine step
        loop.call(lambda e: None)

    def push(e):
        e.collective_rpc(zero_head)
        e.set_weight_version("1")
        loop.salt = "1"
        return loop.in_flight()

    in_flight = loop.call(push)
    out = first.result().outputs[0]
    later = loop.submit(prompt, SamplingParams(max_tokens=1, temperature=1.0, seed=2, logprobs=0)).result()
    loop.call(lambda e: setattr(loop, "salt", "0"))  # a request salted as before the push: served the old blocks
    stale = loop.submit(prompt, SamplingParams(max_tokens=1, temperature=1.0, seed=2, logprobs=0)).result()
    # a hand-back (a preemption notice): of two long requests in the engine one is stopped mid-way, and one sent
    # and stopped at once (queued, or just added); the other runs to its end, and the engine serves the next
    long = SamplingParams(max_tokens=64, ignore_eos=True, temperature=1.0, seed=3, logprobs=0)
    kept, dropped = loop.submit(prompt, long), loop.submit(prompt, long)
    for _ in range(4):
        loop.call(lambda e: None)
    aborted = loop.abort([dropped])
    sent = loop.submit(prompt, long)
    kept.result()
    aborted += loop.abort([sent, kept])  # (kept: finished, left as it is)
    after = loop.submit(prompt, SamplingParams(max_tokens=4, ignore_eos=True, temperature=1.0, seed=4)).result()
    unfinished = loop.call(lambda e: e.get_num_unfinished_requests())
    versions = [int(s.version) for s in out.weight_versions for _ in range(s.start, s.end)]
    logprobs = [lp[t].logprob for t, lp in zip(out.token_ids, out.logprobs)]
    print(
        "RESULT "
        + json.dumps(
            {
                "in_flight": in_flight,
                "versions": versions,
                "logprobs": logprobs,
                "vocab": llm.llm_engine.model_config.get_vocab_size(),
                "later_cached": later.num_cached_tokens or 0,
                "stale_cached": stale.num_cached_tokens or 0,
                "idle": loop.idle,
                "aborted": aborted,
                "cancelled": [dropped.cancelled(), sent.cancelled(), kept.cancelled()],
                "kept_tokens": len(kept.result().outputs[0].token_ids),
                "after_tokens": len(after.outputs[0].token_ids),
                "unfinished": unfinished,
            }
        ),
        flush=True,
    )
