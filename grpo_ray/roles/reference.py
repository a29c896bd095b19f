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

from grpo_ray.algo.batching import (
    LayoutWork,
    Span,
    collate,
    flatten,
    layout_work,
    micro_batches,
    response_values,
    samples,
    shared_pays,
)
from grpo_ray.algo.logprobs import sequence_logprobs
from grpo_ray.config import REFERENCE, Recipe
from grpo_ray.faults import lost_at
from grpo_ray.models import load_causal_lm, pad_id, vision
from grpo_ray.roles import Seat, fsdp
from grpo_ray.roles.frozen import FrozenModel
from grpo_ray.types import Completion, Prompt, Rollout, RolloutStats, Work


class Reference(FrozenModel):
    @classmethod
    def start_args(cls, seat: Seat) -> tuple:
        """A frozen scorer's, and its pool: the reference or the teacher, on its own model."""
        return (*super().start_args(seat), seat.pool)

    def __init__(
        self,
        model_path: str,
        recipe: Recipe,
        rank: int = 0,
        world_size: int = 1,
        threads: int = 1,
        pool: str = REFERENCE,
    ):
        super().__init__(model_path, recipe, rank, world_size, threads)
        self.micro_batch_size, self.temperature = (
            getattr(recipe, pool).micro_batch_size,
            recipe.generator.sampling.temperature,
        )
        self.packing, self.shared = recipe.model.sequence_packing, recipe.model.shared_prompt
        self.pool, self.calls = pool, 0

    def setup(self, host: str, port: int) -> None:
        """Join the reference group; load the model in the learner's compute dtype (so both score with the same
        precision) and shard it. A teacher's logprobs are compared with nothing an engine computes, so it takes
        transformers' fastest attention where the reference takes the engines' (eager on CPU)."""
        mesh = fsdp.join(self.run_on, host, port, self.rank, self.world_size)
        match = self.pool == REFERENCE
        model = load_causal_lm(self.model_path, self.dtype, self.trust_remote_code, self.run_on, match_engine=match)
        model.requires_grad_(False)
        self.model = fsdp.shard(model, mesh, self.dtype).eval()
        self.pad_id = pad_id(self.model.config)
        self.banned = vision.placeholder_ids(self.model.config)  # kept out of responses, as the engines and learner do
        if self.banned:  # a vision-language model: which images a prompt holds is not in its tokens
            self.shared = False

    def logprobs(self, rollout_refs: list, spans: list[Span] | None = None) -> tuple[list[list[float]], Work]:
        """Per-completion reference logprobs of the response tokens (of `spans` of each rollout, or all), and
        the work done: seconds and samples. Every actor of the group must be called (an empty share is fine).

        Called with ``num_returns=2``: the logprobs go to the learner by object ref, the work to the controller.
        """
        import ray

        self.calls += 1
        lost_at(self.pool, self.calls, self.rank == self.world_size - 1)  # fault test
        rollouts = ray.get(rollout_refs)
        pairs, images = flatten(rollouts, spans), [p.images + c.images for p, c in samples(rollouts, spans)]
        start, started = time.perf_counter(), time.time()
        out = self.score(pairs, images) if any(images) else self.score(pairs)  # a subclass's score may take pairs
        return out, Work(time.perf_counter() - start, len(pairs), (started, time.time()))

    def score(self, pairs: list, images: list[list[bytes]] = ()) -> list[list[float]]:
        """The logprobs of each (prompt ids, response ids) pair's response tokens, a vision-language model's with each
        pair's `images` (no Ray: benchmarks/gpu.py calls it directly). Collective: every actor of the group calls it,
        with its own pairs or none."""
        shared = self._shared(pairs)
        # longest first, or packed: little padding per micro batch
        micros, capacity = micro_batches(list(range(len(pairs))), pairs, self.micro_batch_size, self.packing, shared)
        rounds = torch.tensor([len(micros)], device=self.device)  # nccl reduces only device tensors
        dist.all_reduce(rounds, op=dist.ReduceOp.MAX)
        filler = [([self.pad_id], [self.pad_id])]  # keeps this rank in the other ranks' all-gathers
        out: list[list[float]] = [[] for _ in pairs]
        with torch.no_grad():
            for k in range(int(rounds.item())):
                mine = k < len(micros)
                seqs = collate(
                    [pairs[i] for i in micros[k]] if mine else filler, self.pad_id, capacity if mine else 0, shared
                )
                some = [images[i] for i in micros[k]] if mine and images else []
                pixels = vision.in_order(self.model_path, some, seqs, self.trust_remote_code)
                logp, _ = sequence_logprobs(
                    self.model, seqs, self.device, self.temperature, False, True, pixels, self.banned
                )
                for i, values in zip(micros[k] if mine else [], response_values(logp.cpu(), seqs.response_mask)):
                    out[i] = values
        fsdp.reshard(self.model)  # FSDP2 keeps the root (embeddings, LM head) gathered after a forward: free it
        return out

    def _shared(self, pairs: list) -> bool:
        """Whether this call's forwards run each prompt once (model.shared_prompt). Under ``auto`` the group weighs
        the forwards of every actor's share together, so all its actors run the same forwards."""
        if self.shared != "auto":
            return bool(self.shared)
        plain, shared = layout_work(pairs, self.micro_batch_size, self.packing)
        work = [plain.slots, plain.forwards, shared.slots, shared.forwards]
        work = torch.tensor(work, dtype=torch.float64, device=self.device)  # nccl reduces only device tensors
        dist.all_reduce(work)
        a, b, c, d = work.tolist()
        return shared_pays(LayoutWork(a, b), LayoutWork(c, d))

    def rollout(self, prompts: list[Prompt], max_tokens: int) -> tuple[Rollout, RolloutStats]:
        """One greedy response to each prompt, by transformers' generate on this group's weights (the teacher's own
        validation: a line for the student to climb to), as a generator answers: a rollout and its stats.
        Collective like `score`: every actor calls it, with its own prompts or none. Called with ``num_returns=2``.
        """
        from transformers import AutoTokenizer, GenerationConfig

        start, started = time.perf_counter(), time.time()
        tokenizer = AutoTokenizer.from_pretrained(self.model_path, trust_remote_code=self.trust_remote_code)
        eos = {tokenizer.eos_token_id, *_ids(self.model.generation_config.eos_token_id)} - {None}
        config = GenerationConfig(  # the engines' greedy validation: no penalty or sampling default of the model's
            do_sample=False, max_new_tokens=max_tokens, eos_token_id=sorted(eos), pad_token_id=self.pad_id
        )
        chunks = [prompts[i : i + self.micro_batch_size] for i in range(0, len(prompts), self.micro_batch_size)]
        rounds = torch.tensor([len(chunks)], device=self.device)
        dist.all_reduce(rounds, op=dist.ReduceOp.MAX)
        completions = []
        with torch.no_grad():
            for k in range(int(rounds.item())):
                ids = [p.ids for p in chunks[k]] if k < len(chunks) else [[self.pad_id]]
                width = max(map(len, ids))
                left = [[0] * (width - len(x)) + [1] * len(x) for x in ids]  # left padding: answers start together
                out = self.model.generate(
                    input_ids=torch.tensor([[self.pad_id] * (width - len(x)) + x for x in ids], device=self.device),
                    attention_mask=torch.tensor(left, device=self.device),
                    generation_config=config,
                    synced_gpus=self.world_size > 1,  # ranks done early keep joining the others' all-gathers
                )
                for row in out[:, width:].tolist() if k < len(chunks) else []:
                    end = next((j + 1 for j, t in enumerate(row) if t in eos), None)
                    tokens = row[:end] if end else row
                    text = tokenizer.decode(tokens, skip_special_tokens=True)
                    reason = "stop" if end else "length"
                    completions.append(Completion(len(completions), tokens, text, [0.0] * len(tokens), reason))
        fsdp.reshard(self.model)
        stats = RolloutStats(
            seconds=time.perf_counter() - start,
            policy_version=-1,
            prompt_lengths=[len(p.ids) for p in prompts],
            response_lengths=[len(c.token_ids) for c in completions],
            truncated=sum(c.finish_reason == "length" for c in completions),
            window=(started, time.time()),
        )
        return Rollout(prompts, completions, -1), stats

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def _ids(value) -> list:
    """A generation config's eos_token_id: None, one id or a list."""
    return [] if value is None else [value] if isinstance(value, int) else list(value)
