"""The reference role: the frozen initial policy, computing logprobs of sampled responses (data parallel)."""

from __future__ import annotations

import time

import torch

from grpo_ray.algo.batching import chunks, collate, flatten, response_values
from grpo_ray.algo.logprobs import token_logprobs
from grpo_ray.models import load_causal_lm
from grpo_ray.roles import RoleActor


class Reference(RoleActor):
    def __init__(self, model_path: str, device: str, micro_batch_size: int, temperature: float, num_cpus: float,
                 trust_remote_code: bool = False, dtype: str = "float32"):
        torch.set_num_threads(max(1, round(num_cpus)))
        self.device = torch.device("cuda" if device == "cuda" else "cpu")
        # the learner's compute dtype, so both score with the same precision
        self.model = load_causal_lm(model_path, getattr(torch, dtype), trust_remote_code).to(self.device).eval()
        self.micro_batch_size, self.temperature = micro_batch_size, temperature
        self.pad_id = self.model.config.pad_token_id or 0

    def logprobs(self, rollout_refs: list) -> tuple[list[list[float]], float]:
        """Per-completion reference logprobs of the response tokens, and the seconds it took.

        Called with ``num_returns=2``: the logprobs go to the learner by object ref, the seconds to the controller.
        """
        import ray

        pairs = flatten(ray.get(rollout_refs))
        start = time.perf_counter()
        out: list[list[float]] = []
        with torch.no_grad():
            for micro in chunks(pairs, self.micro_batch_size):
                seqs = collate(micro, self.pad_id)
                logp, _ = token_logprobs(self.model, seqs.input_ids.to(self.device),
                                         seqs.attention_mask.to(self.device), self.temperature)
                out += response_values(logp.cpu(), seqs.response_mask)
        return out, time.perf_counter() - start
