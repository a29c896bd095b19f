"""A vLLM engine run step by step on a thread of its own: the streaming schedule's engines
(``grpo_ray.schedules.streaming``), and multi-turn rollouts' turns (``grpo_ray.rollouts.episodes``).

vLLM's ``LLM.generate`` runs the engine until every request it holds has finished, so a batch waits for its slowest
sample and nothing can join it. Here one thread owns the engine (``LLMEngine``, in this process) and loops:

    run the calls queued (a weight load, a probe)   <- between two engine steps: a token boundary
    add the requests queued                          <- a new group starts as soon as it is sent
    one engine step (continuous batching)            -> each finished request's future is answered

A call queued while requests are in flight runs between two steps: they pause there, keep their keys, values and
tokens, and go on with whatever the call changed (new weights). vLLM labels each output token with the weight
version set when it was sampled (``set_weight_version``; its ``CompletionOutput.weight_versions`` spans), which is
how a trajectory that spans a push tells which tokens came from which weights.

Every other thread talks to the engine only through ``submit`` and ``call``. An engine step that raises fails every
request in flight with its error, and every later one: the actor is then lost and replaced by its pool.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from concurrent.futures import Future


class EngineLoop:
    """The thread that owns `engine` (a vLLM ``LLMEngine``)."""

    def __init__(self, engine):
        self.engine = engine
        self.cond = threading.Condition()
        self.calls: deque = deque()
        """(function, future): run on the loop's thread between two steps."""
        self.adds: deque = deque()
        """(prompt, params, lora request, future): added before the next step."""
        self.waiting: dict[str, Future] = {}
        """Request id -> its future, for the requests in the engine."""
        self.ids = itertools.count()
        self.error: BaseException | None = None
        self.salt: str | None = None
        """The prefix-cache salt given to every request added from now on (the weights' version: a request never
        reads keys and values cached under other weights); set by a call."""
        self.idle = 0.0
        """Seconds the loop has waited with nothing to run (the engine idle)."""
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self.thread.start()

    def submit(self, prompt: dict, params, lora=None, request_id: str | None = None) -> Future:
        """Queue one request (its id `request_id`, unique among those in flight, or a number); its future gives its
        RequestOutput once it has finished."""
        done: Future = Future()
        with self.cond:
            self._check()
            self.adds.append((prompt, params, lora, request_id, done))
            self.cond.notify()
        return done

    def stop(self) -> None:
        """End the thread once nothing is queued or in flight, and wait for it: the engine is the caller's again."""
        with self.cond:
            self.stopping = True
            self.cond.notify()
        self.thread.join()

    def call(self, fn):
        """Run `fn(engine)` on the loop's thread between two steps and return what it returns (its error raised
        here)."""
        done: Future = Future()
        with self.cond:
            self._check()
            self.calls.append((fn, done))
            self.cond.notify()
        return done.result()

    def abort(self, futures: list[Future]) -> int:
        """Stop the requests of `futures` that have not finished: those queued are never added, those in the engine
        are aborted between two steps; their futures are cancelled. How many were (a future of another kind, or
        finished, is left as it is)."""
        wanted = set(futures)
        with self.cond:
            queued = sum(done.cancel() for *_, done in self.adds if done in wanted)

        def drop(engine) -> int:
            with self.cond:
                ids = [rid for rid, done in self.waiting.items() if done in wanted]
                for rid in ids:
                    self.waiting.pop(rid).cancel()
            if ids:
                engine.abort_request(ids)
            return len(ids)

        return queued + self.call(drop)

    def in_flight(self) -> int:
        """Requests queued or in the engine."""
        with self.cond:
            return len(self.adds) + len(self.waiting)

    def _check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"the engine's loop stopped: {self.error!r}") from self.error

    def _run(self) -> None:
        from vllm.sampling_params import RequestOutputKind

        try:
            while True:
                with self.cond:
                    if not (self.calls or self.adds or self.waiting):
                        start = time.perf_counter()
                        while not (self.calls or self.adds or self.waiting or self.stopping):
                            self.cond.wait()
                        self.idle += time.perf_counter() - start
                        if self.stopping and not (self.calls or self.adds or self.waiting):
                            return
                    calls, adds = list(self.calls), list(self.adds)
                    self.calls.clear()
                    self.adds.clear()
                for fn, done in calls:
                    try:
                        done.set_result(fn(self.engine))
                    except BaseException as e:  # the caller's error, raised in its thread
                        done.set_exception(e)
                for prompt, params, lora, rid, done in adds:
                    if done.cancelled():  # (aborted before it was added)
                        continue
                    rid = rid or str(next(self.ids))
                    params.output_kind = RequestOutputKind.FINAL_ONLY  # one output a request, when it ends
                    if self.salt is not None:
                        prompt = {**prompt, "cache_salt": self.salt}
                    try:
                        self.engine.add_request(rid, prompt, params, lora_request=lora)
                    except Exception as e:  # this request's own fault (a prompt too long): its caller's error
                        done.set_exception(e)
                        continue
                    with self.cond:
                        self.waiting[rid] = done
                if self.waiting:
                    for out in self.engine.step():
                        if out.finished:
                            with self.cond:
                                done = self.waiting.pop(out.request_id, None)  # (None: aborted)
                            if done is not None:
                                done.set_result(out)
        except BaseException as e:  # the engine failed: every request in flight, and every later call, says so
            with self.cond:
                self.error = e
                pending = list(self.waiting.values()) + [d for *_, d in self.adds] + [d for _, d in self.calls]
                self.waiting.clear()
            for done in pending:
                done.set_exception(RuntimeError(f"the engine's loop stopped: {e!r}"))
