"""The learner on a reward model: ``grpo-ray rm`` trains a one-output sequence classifier with the learner's
machinery (FSDP2 group, optimizer and schedule, checkpoints, resume).

    rm_train(rows)              one step: rows cut into mini batches (an optimizer step each), each cut over the
                                ranks; a pair's chosen and rejected conversations go through one forward
    rm_validate(rows)           loss, accuracy and margin over held-out rows, no gradients

A row is the token ids of a preference pair's two rendered conversations (chosen, rejected), or of a pointwise
row's one and its label (rm.label_key: ``grpo_ray.data.targets.rm_tokens``); the loss is
``algo.loss.reward_model_loss``.
The model is model.path with a sequence-classification head of one output (a causal LM's new head starts at
random, as in TRL's and OpenRLHF's reward trainers); its config, with the pad id it reads scores at, is what a
checkpoint exports, so the reward-model pool loads the export as it is.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from grpo_ray.algo.batching import rank_slice
from grpo_ray.algo.loss import reward_model_loss
from grpo_ray.roles.learner import Learner

RM_SUMS = ("loss", "accuracy", "margin")
"""The per-row means a reward model's step and validation report (sums over rows, then / rows)."""


class RewardLearner(Learner):
    def load_model(self) -> torch.nn.Module:
        """model.path as a one-output sequence classifier, in fp32; its pad id set (transformers reads each row's
        score at its last token that is not the pad id) from the tokenizer when the config has none."""
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        trust = self.recipe.model.trust_remote_code
        model = AutoModelForSequenceClassification.from_pretrained(
            self.model_path, num_labels=1, dtype=torch.float32, trust_remote_code=trust
        )
        if model.config.pad_token_id is None:
            tokenizer = AutoTokenizer.from_pretrained(self.model_path, trust_remote_code=trust)
            model.config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        model.config.architectures = [type(model).__name__]  # a causal LM's config names its own class
        return model

    def setup(self, host: str, port: int) -> dict:
        """The learner's setup on the classifier; also its config (JSON), which checkpoints keep."""
        facts = super().setup(host, port)
        return {**facts, "config": self.model.config.to_json_string()}

    def _scores(self, rows: list) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One forward over `rows`, right-padded: each row's score (a pair's chosen ones, then its rejected ones),
        and the pointwise labels."""
        pointwise = bool(self.recipe.rm.label_key)
        seqs = [r[0] for r in rows] if pointwise else [r[0] for r in rows] + [r[1] for r in rows]
        width = max(map(len, seqs))
        pad = self.model.config.pad_token_id
        ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs], device=self.device)
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs], device=self.device)
        scores = self.model(input_ids=ids, attention_mask=mask).logits[:, 0]
        labels = torch.tensor([r[1] for r in rows], device=self.device) if pointwise else None
        return scores, labels

    def rm_train(self, rows: list) -> dict[str, float]:
        """One step over `rows`: an optimizer step per learner.mini_batch_size rows, each rank its share in micro
        batches of learner.micro_batch_size rows (a rank with fewer than another pairs its collectives on a filler);
        the loss is each mini batch's mean over its rows."""
        lc = self.recipe.learner
        n, m, mb = len(rows), lc.mini_batch_size, lc.micro_batch_size
        start = time.perf_counter()
        totals = torch.zeros(4, dtype=torch.float64, device=self.device)
        grad_norms = []
        self.model.train()
        for b in range(0, n, m):
            mine = rank_slice(list(range(b, min(b + m, n))), self.rank, self.world_size)
            normaliser = self._normaliser(len(mine))
            micros = [mine[k : k + mb] for k in range(0, len(mine), mb)]
            for k in range(self._rounds(len(micros))):  # a rank with fewer: a filler, its loss times 0
                scores, labels = self._scores([rows[i] for i in micros[k]] if k < len(micros) else rows[:1])
                loss, sums = reward_model_loss(scores, labels, normaliser)
                if k < len(micros):
                    totals += sums
                (loss if k < len(micros) else loss * 0.0).backward()
            grad_norms.append(self._optimizer_step())
        dist.all_reduce(totals)
        self.steps += 1
        return {
            **{f"rm/{name}": (totals[i] / totals[3]).item() for i, name in enumerate(RM_SUMS)},
            **self._update_metrics(grad_norms),
            "timing_s/update_actor": time.perf_counter() - start,
        }

    def rm_validate(self, rows: list) -> dict[str, float]:
        """Loss, accuracy and margin over `rows`, each rank scoring every world_size-th one. Collective: a rank with
        fewer micro batches than another runs forwards on a filler row until they are done."""
        mine = list(range(self.rank, len(rows), self.world_size))
        mb = self.recipe.learner.micro_batch_size
        micros = [mine[k : k + mb] for k in range(0, len(mine), mb)]
        rounds = torch.tensor([len(micros)], device=self.device)
        dist.all_reduce(rounds, op=dist.ReduceOp.MAX)
        totals = torch.zeros(4, dtype=torch.float64, device=self.device)
        self.model.eval()
        with torch.no_grad():
            for k in range(int(rounds.item())):
                scores, labels = self._scores([rows[i] for i in micros[k]] if k < len(micros) else rows[:1])
                if k < len(micros):
                    totals += reward_model_loss(scores, labels, 1.0)[1]
        dist.all_reduce(totals)
        return {f"val/rm/{name}": (totals[i] / totals[3]).item() for i, name in enumerate(RM_SUMS)}
