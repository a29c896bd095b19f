"""The reward-model role: a learned reward, a sequence classifier (transformers' ``AutoModelForSequenceClassification``
with one output, the Skywork / ArmoRM shape) scoring each (prompt, response) with one number.

The pair is rendered again as text in the reward model's own chat template and tokenizer (they need not be the
policy's): the prompt's messages, then the response as the assistant's turn. The actors form an FSDP2 group of their
own like the reference's (``roles.fsdp``): each holds 1/N of the weights and scores its own share of the samples;
since every forward is a collective, an actor with fewer micro batches than the others runs forwards on a filler
until they are done. With ``reward_model.shard`` false, or one actor, each holds the whole classifier and scores its
share alone: no group, no collective. A classifier that reads images (Gemma 3's, ``Gemma3ForSequenceClassification``)
is shown each sample's images: its processor expands their markers in the rendered text and gives their pixels.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from grpo_ray.algo.batching import Span, samples
from grpo_ray.algo.logprobs import each_image
from grpo_ray.config import REWARD_MODEL, Recipe
from grpo_ray.data import conversation_text
from grpo_ray.faults import lost_at
from grpo_ray.models import vision
from grpo_ray.roles import fsdp
from grpo_ray.roles.frozen import FrozenModel
from grpo_ray.types import Work


class RewardModel(FrozenModel):
    def __init__(self, model_path: str, recipe: Recipe, rank: int = 0, world_size: int = 1, threads: int = 1):
        super().__init__(model_path, recipe, rank, world_size, threads)
        cfg = recipe.reward_model
        self.sharded = cfg.shard and world_size > 1  # a group of one would hold the whole model anyway
        self.micro_batch_size, self.max_length = cfg.micro_batch_size, cfg.max_length
        self.head = max(cfg.head, 0)  # the output that is the score
        self.prefix = recipe.data.response_prefix
        self.calls = 0

    def setup(self, host: str, port: int) -> None:
        """Join the group; load the classifier and its tokenizer, and shard the classifier (replicated, with
        reward_model.shard false: the whole classifier here, no group)."""
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        mesh = fsdp.join(self.run_on, host, port, self.rank, self.world_size) if self.sharded else None
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path, trust_remote_code=self.trust_remote_code)
        model = AutoModelForSequenceClassification.from_pretrained(
            self.model_path, dtype=self.dtype, trust_remote_code=self.trust_remote_code
        )
        model.requires_grad_(False)
        if model.config.pad_token_id is None:  # transformers finds each row's last token by the pad id
            model.config.pad_token_id = self.tokenizer.pad_token_id or self.tokenizer.eos_token_id
        self.pad_id = model.config.pad_token_id
        self.image_id = getattr(model.config, "image_token_id", None) if vision.placeholder_ids(model.config) else None
        typed = (
            self.image_id
            and "token_type_ids" in vision.processor(self.model_path, self.trust_remote_code).model_input_names
        )
        self.typed = bool(typed)  # Gemma 3's: its image tokens attend to each other both ways, as its processor asks
        if self.sharded:
            self.model = fsdp.shard(model, mesh, self.dtype).eval()
        else:
            if self.run_on.gpu:
                torch.cuda.set_device(self.device)
            self.model = model.to(self.device).eval()

    def score(self, rollout_refs: list, spans: list[Span] | None = None) -> tuple[list[float], Work]:
        """The model's score of each completion of the rollouts behind `rollout_refs` (of `spans` of each, or all),
        in order, and the work done. Every actor of the group must be called (an empty share is fine).
        Called with ``num_returns=2``: the scores and the work both go to the controller (small)."""
        import ray

        self.calls += 1
        lost_at(REWARD_MODEL, self.calls, self.rank == self.world_size - 1)  # fault test
        pairs = samples(ray.get(rollout_refs), spans)
        texts = [
            conversation_text(self.tokenizer, p.messages or [{"role": "user", "content": p.text}], self.prefix + c.text)
            for p, c in pairs
        ]
        start, started = time.perf_counter(), time.time()
        out = self.rewards(texts, [p.images for p, _ in pairs])
        return out, Work(time.perf_counter() - start, len(texts), (started, time.time()))

    def rewards(self, texts: list[str], images: list[list[bytes]] | None = None) -> list[float]:
        """The model's score of each rendered conversation, with its `images` where it has any (no Ray: benchmarks
        call it directly). Sharded, a collective: every actor of the group calls it, with its own texts or none."""
        images = images or [[] for _ in texts]
        ids = [self._ids(text, shown) for text, shown in zip(texts, images)]
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))  # longest first: little padding per micro batch
        micros = [order[k : k + self.micro_batch_size] for k in range(0, len(order), self.micro_batch_size)]
        rounds = torch.tensor([len(micros)], device=self.device)  # nccl reduces only device tensors
        if self.sharded:  # every rank runs as many forwards (collectives) as the busiest
            dist.all_reduce(rounds, op=dist.ReduceOp.MAX)
        out = [0.0] * len(ids)
        with torch.no_grad():
            for k in range(int(rounds.item())):
                rows = [ids[i] for i in micros[k]] if k < len(micros) else [[self.pad_id]]
                width = max(map(len, rows))
                batch = torch.tensor([r + [self.pad_id] * (width - len(r)) for r in rows], device=self.device)
                mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], device=self.device)
                shown = [images[i] for i in micros[k]] if k < len(micros) else []
                logits = self._forward(batch, mask, shown)
                for i, value in zip(micros[k] if k < len(micros) else [], logits.tolist()):
                    out[i] = value
        if self.sharded:
            fsdp.reshard(self.model)
        return out

    def _ids(self, text: str, images: list[bytes]) -> list[int]:
        """The token ids of a rendered conversation: its image markers expanded into the images' tokens by the
        model's processor, and cut to reward_model.max_length (never inside an image's tokens: the forward reads
        each image whole)."""
        if images:
            ids = list(vision.expanded_ids(self.model_path, text, vision.sizes(images), self.trust_remote_code))
        else:
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not self.max_length or len(ids) <= self.max_length:
            return ids
        last = max((i for i, t in enumerate(ids) if t == self.image_id), default=-1)
        return ids[: max(self.max_length, last + 2)]  # an image's end marker after its last token

    def _forward(self, batch: torch.Tensor, mask: torch.Tensor, images: list[list[bytes]]) -> torch.Tensor:
        """The score of each row of `batch` (transformers reads it at the row's last token that is not the pad id),
        the model reading the rows' `images`, each distinct one through its tower once."""
        pixels = vision.pixel_values(self.model_path, images, self.trust_remote_code) if self.image_id else None
        with each_image(self.model, None if pixels is None else pixels.to(self.device)) as values:
            extra = {} if values is None else {"pixel_values": values}
            if values is not None and self.typed:
                extra["token_type_ids"] = (batch == self.image_id).long()
            return self.model(input_ids=batch, attention_mask=mask, **extra).logits[:, self.head].float().cpu()

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
