"""The reference role: the frozen initial policy, computing logprobs of sampled responses. The teacher pool of
on-policy distillation is the same role on the teacher's model (``pool="teacher"``: its own section's sizes).

The reference actors form an FSDP2 group of their own, sharded like the learner (``roles.fsdp``): each holds
1/N of the weights in the learner's compute dtype and gathers one block at a time as its forward runs, so a
32B reference over 8 GPUs costs 8 GB of weights per GPU, not 65. Each actor scores its own share of the
samples (data parallel); since every forward is a collective, an actor with fewer micro batches than the
others runs forwards on a one-token filler until they are done.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from grpo_ray import sync
from grpo_ray.algo.batching import Span, collate, flatten, micro_batches, response_values
from grpo_ray.algo.logprobs import sequence_logprobs
from grpo_ray.config import Recipe
from grpo_ray.device import Device
from grpo_ray.models import load_causal_lm, pad_id
from grpo_ray.roles import RoleActor, fsdp, log_to_file
from grpo_ray.types import Work


class Reference(RoleActor):
    def __init__(
        self,
        model_path: str,
        recipe: Recipe,
        rank: int = 0,
        world_size: int = 1,
        threads: int = 1,
        pool: str = "reference",
    ):
        log_to_file()
        torch.set_num_threads(max(1, threads))
        self.run_on = Device.of(recipe)
        self.device = self.run_on.torch
        self.model_path, self.trust_remote_code = model_path, recipe.model.trust_remote_code
        self.dtype = getattr(torch, recipe.learner.dtype)  # the learner's compute dtype: both score alike
        self.rank, self.world_size = rank, world_size
        self.micro_batch_size, self.temperature = (
            getattr(recipe, pool).micro_batch_size,
            recipe.generator.sampling.temperature,
        )
        self.packing, self.shared = recipe.model.sequence_packing, recipe.model.shared_prompt
        self.pool = pool

    def address(self) -> tuple[str, int]:
        """A free address on this actor's node (rank 0 hosts the group's store)."""
        return sync.free_address()

    def setup(self, host: str, port: int) -> None:
        """Join the reference group; load the model in the learner's compute dtype (so both score with the same
        precision) and shard it. A teacher's logprobs are compared with nothing an engine computes, so it takes
        transformers' fastest attention where the reference takes the engines' (eager on CPU)."""
        mesh = fsdp.join(self.run_on, host, port, self.rank, self.world_size)
        match = self.pool == "reference"
        model = load_causal_lm(self.model_path, self.dtype, self.trust_remote_code, self.run_on, match_engine=match)
        model.requires_grad_(False)
        self.model = fsdp.shard(model, mesh, self.dtype).eval()
        self.pad_id = pad_id(self.model.config)

    def logprobs(self, rollout_refs: list, spans: list[Span] | None = None) -> tuple[list[list[float]], Work]:
        """Per-completion reference logprobs of the response tokens (of `spans` of each rollout, or all), and
        the work done: seconds and samples. Every actor of the group must be called (an empty share is fine).

        Called with ``num_returns=2``: the logprobs go to the learner by object ref, the work to the controller.
        """
        import ray

        pairs = flatten(ray.get(rollout_refs), spans)
        start = time.perf_counter()
        out = self.score(pairs)
        return out, Work(time.perf_counter() - start, len(pairs))

    def score(self, pairs: list) -> list[list[float]]:
        """The logprobs of each (prompt ids, response ids) pair's response tokens (no Ray: benchmarks/gpu.py calls
        it directly). Collective: every actor of the group calls it, with its own pairs or none."""
        # longest first, or packed: little padding per micro batch
        micros, capacity = micro_batches(
            list(range(len(pairs))), pairs, self.micro_batch_size, self.packing, self.shared
        )
        rounds = torch.tensor([len(micros)], device=self.device)  # nccl reduces only device tensors
        dist.all_reduce(rounds, op=dist.ReduceOp.MAX)
        filler = [([self.pad_id], [self.pad_id])]  # keeps this rank in the other ranks' all-gathers
        out: list[list[float]] = [[] for _ in pairs]
        with torch.no_grad():
            for k in range(int(rounds.item())):
                mine = k < len(micros)
                seqs = collate(
                    [pairs[i] for i in micros[k]] if mine else filler, self.pad_id, capacity if mine else 0, self.shared
                )
                logp, _ = sequence_logprobs(self.model, seqs, self.device, self.temperature)
                for i, values in zip(micros[k] if mine else [], response_values(logp.cpu(), seqs.response_mask)):
                    out[i] = values
        fsdp.reshard(self.model)  # FSDP2 keeps the root (embeddings, LM head) gathered after a forward: free it
        return out

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
