"""The reference role: the frozen initial policy, computing logprobs of sampled responses (data parallel)."""

from __future__ import annotations

import time

import torch

from grpo_ray.algo.batching import Span, chunks, collate, flatten, response_values
from grpo_ray.algo.logprobs import token_logprobs
from grpo_ray.models import load_causal_lm, pad_id
from grpo_ray.roles import RoleActor, log_to_file
from grpo_ray.types import Work


class Reference(RoleActor):
    def __init__(self, model_path: str, device: str, micro_batch_size: int, temperature: float, num_cpus: float,
                 trust_remote_code: bool = False, dtype: str = "float32"):
        log_to_file()
        torch.set_num_threads(max(1, round(num_cpus)))
        self.device = torch.device("cuda" if device == "cuda" else "cpu")
        # the learner's compute dtype, so both score with the same precision
        self.model = load_causal_lm(model_path, getattr(torch, dtype), trust_remote_code).to(self.device).eval()
        self.micro_batch_size, self.temperature = micro_batch_size, temperature
        self.pad_id = pad_id(self.model.config)

    def logprobs(self, rollout_refs: list, spans: list[Span] | None = None) -> tuple[list[list[float]], Work]:
        """Per-completion reference logprobs of the response tokens (of `spans` of each rollout, or all), and
        the work done: seconds and samples.

        Called with ``num_returns=2``: the logprobs go to the learner by object ref, the work to the controller.
        """
        import ray

        pairs = flatten(ray.get(rollout_refs), spans)
        start = time.perf_counter()
        out: list[list[float]] = []
        with torch.no_grad():
            for micro in chunks(pairs, self.micro_batch_size):
                seqs = collate(micro, self.pad_id)
                logp, _ = token_logprobs(self.model, seqs.input_ids.to(self.device),
                                         seqs.attention_mask.to(self.device), self.temperature)
                out += response_values(logp.cpu(), seqs.response_mask)
        return out, Work(time.perf_counter() - start, len(pairs))
