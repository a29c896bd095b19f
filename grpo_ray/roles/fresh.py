"""The fresh-rollout check after a push: no key or value an engine computed under older weights is served to a
request after the push (``Generator.receive_weights`` runs it when the run has a probe). The prefix cache is reset
after every load (salted by version when streaming), so a request sharing a prefix with one served before the push
must be served no token of it from the cache."""

from __future__ import annotations

import time
from collections.abc import Callable


class FreshCheck:
    def __init__(self, llm, generate: Callable[[list[dict], object], list]):
        """`generate`: the generator's (its driver's, with the last push's adapters)."""
        self.llm, self.generate = llm, generate

    def probe(self, probe_ids: list[int]) -> list[int] | None:
        """The probe's tokens repeated past one block of the prefix cache (a block is cached only when full, and a
        request reuses blocks before its last token): the prefix the check serves before a push and asks for after
        it. None when the engine's context cannot hold one (no request can then reuse a block)."""
        block = self.llm.llm_engine.vllm_config.cache_config.block_size
        length = block + 2
        if not probe_ids or length + 1 > self.llm.llm_engine.vllm_config.model_config.max_model_len:
            return None
        return (probe_ids * (length // len(probe_ids) + 1))[:length]

    def serve(self, probe_ids: list[int], skip_cache: bool) -> tuple[int, dict[int, float], float] | None:
        """One request on the probe's tokens (``probe``), read through the prefix cache as a rollout is, or skipping
        it: how many of its prompt tokens the cache served, its next token's top logprobs, and its seconds."""
        from vllm import SamplingParams

        ids = self.probe(probe_ids)
        if ids is None:
            return None
        start = time.perf_counter()
        params = SamplingParams(max_tokens=1, temperature=1.0, seed=0, logprobs=5, skip_reading_prefix_cache=skip_cache)
        out = self.generate([{"prompt_token_ids": ids}], params)[0]
        logprobs = {t: lp.logprob for t, lp in out.outputs[0].logprobs[0].items()}
        return out.num_cached_tokens or 0, logprobs, time.perf_counter() - start

    def after_push(self, probe_ids: list[int], before) -> dict[str, float]:
        """The check after a push: a request sharing its prefix with one served before the push (`before`, what
        ``serve`` answered then) must be given no key or value of that prefix computed under the older weights: the
        cache must serve it no token (it holds nothing from before the reset that follows every load).
        "stale_tokens": the prompt tokens it served; "diff", when it served some, how far they moved the next
        token's logprobs from the new weights' (the same request skipping the cache); "seconds": the check's, both
        requests."""
        if before is None:
            return {"stale_tokens": 0.0, "diff": 0.0, "seconds": 0.0}
        start = time.perf_counter()
        stale, through, _ = self.serve(probe_ids, False)
        diff = 0.0  # nothing served from the cache: the request computed its prefix under the new weights
        if stale:  # how far the old keys and values moved its logprobs, for the message
            fresh = self.serve(probe_ids, True)[1]
            diff = max(abs(through[t] - fresh[t]) for t in through.keys() & fresh.keys())
        return {"stale_tokens": float(stale), "diff": diff, "seconds": time.perf_counter() - start + before[2]}
