"""The learner role: one rank of an FSDP2 model per actor, a torch.distributed group across the actors.

The controller drives it step by step; it runs no loop of its own:

    setup(host, port)          join the group (gloo on CPU, nccl on GPU), load and shard the model
    train(rollouts, refs, adv) PPO epochs over mini batches, micro-batch gradient accumulation, one
                               optimizer step per mini batch; returns the step's metrics
    sft_train(pairs)           one supervised step on (prompt, target) token ids, the same batching
    push_weights(...)          assemble full tensors on rank 0 from the shards, bucket by bucket, and broadcast
                               them to the generators in the engines' dtype
    probe_logprobs(ids)        logprobs of a fixed sequence, to check a sync

Data parallelism: each mini batch of M samples is cut into W contiguous shares; a rank's
loss is scaled so that FSDP2's gradient averaging over ranks gives the mini batch's loss
(see grpo_ray.algo.loss).
"""

from __future__ import annotations

import gc
import math
import time

import torch
import torch.distributed as dist

from grpo_ray import sync
from grpo_ray.algo.batching import chunks, collate, flatten, place_values, rank_slice
from grpo_ray.algo.logprobs import token_logprobs
from grpo_ray.algo.loss import grpo_loss, sft_loss
from grpo_ray.config import Recipe
from grpo_ray.faults import fault_at
from grpo_ray.models import load_causal_lm, model_dims, pad_id
from grpo_ray.perf import device_peak_tflops, measure_cpu_peak_tflops
from grpo_ray.roles import RoleActor, fsdp, log_to_file

METRIC_KEYS = ("pg_loss", "kl_loss", "pg_clipfrac_sum", "ppo_kl_sum", "entropy_sum", "tokens")


class Learner(RoleActor):
    def __init__(self, model_path: str, recipe: Recipe, rank: int, world_size: int):
        log_to_file()
        self.model_path, self.recipe, self.rank, self.world_size = model_path, recipe, rank, world_size
        self.device = torch.device("cuda" if recipe.cluster.device == "cuda" else "cpu")
        torch.set_num_threads(max(1, round(recipe.learner.num_cpus)))
        torch.manual_seed(recipe.trainer.seed)
        self.sync_group: sync.SyncGroup | None = None
        self.steps = 0

    def address(self) -> tuple[str, int]:
        """A free address on this actor's node (rank 0 hosts the group's store)."""
        return sync.free_address()

    def setup(self, host: str, port: int) -> dict:
        """Join the group, load and shard the model; returns the model's dims and this device's peak TFLOPS."""
        cfg = self.recipe.learner
        mesh = fsdp.join(self.recipe.cluster.device, host, port, self.rank, self.world_size)
        # loaded on the host; fully_shard moves one layer at a time to the device and keeps only this rank's shard
        model = load_causal_lm(self.model_path, torch.float32, self.recipe.model.trust_remote_code)
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        fsdp.shard(model, mesh, getattr(torch, cfg.dtype))
        self.model = model
        o = cfg.optim
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=tuple(o.betas), eps=o.eps,
                                           weight_decay=o.weight_decay)
        warmup = o.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)
        self.pad_id = pad_id(model.config)
        declared = self.recipe.cluster.peak_tflops
        if self.device.type == "cuda":
            peak = device_peak_tflops(torch.cuda.get_device_name(), declared)
        else:
            peak = declared or measure_cpu_peak_tflops()
        return {"dims": model_dims(self.model_path), "peak_tflops": peak}

    # --- training --------------------------------------------------------------------

    def _logprobs(self, pairs, with_entropy=False, temperature: float | None = None):
        """Padded sequences of `pairs` and the logprobs of each next token (at the sampling temperature)."""
        seqs = collate(pairs, self.pad_id)
        t = self.recipe.generator.sampling.temperature if temperature is None else temperature
        logp, entropy = token_logprobs(self.model, seqs.input_ids.to(self.device), seqs.attention_mask.to(self.device),
                                       t, with_entropy)
        return seqs, logp, entropy

    def _old_logprobs(self, pairs: list, indices: list[int]) -> dict[int, torch.Tensor]:
        """Logprobs under the weights before this step's updates, for the samples this rank trains on."""
        out = {}
        with torch.no_grad():
            for micro in chunks(indices, self.recipe.learner.micro_batch_size):
                seqs, logp, _ = self._logprobs([pairs[i] for i in micro])
                for j, i in enumerate(micro):
                    out[i] = (logp[j] * seqs.response_mask[j].to(logp.device)).cpu()
        return out

    def train(self, rollout_refs: list, ref_logprob_refs: list | None, advantages: list[float]) -> dict[str, float]:
        """One GRPO step over all samples of `rollout_refs` (Ray object refs, fetched here, not by the controller)."""
        import ray

        lc, a = self.recipe.learner, self.recipe.algorithm
        pairs = flatten(ray.get(rollout_refs))
        ref_lps = [lp for chunk in ray.get(ref_logprob_refs) for lp in chunk] if ref_logprob_refs else None
        adv = torch.tensor(advantages, dtype=torch.float32)
        n, m = len(pairs), lc.mini_batch_size
        minis = [rank_slice(list(range(b, b + m)), self.rank, self.world_size) for b in range(0, n, m)]

        start = time.perf_counter()
        # one update per step: the policy that sampled is the one being trained, so old = logp.detach()
        on_policy = a.ppo_epochs == 1 and len(minis) == 1
        old = None if on_policy else self._old_logprobs(pairs, [i for mini in minis for i in mini])
        old_seconds = 0.0 if on_policy else time.perf_counter() - start

        totals = torch.zeros(len(METRIC_KEYS), dtype=torch.float64)
        grad_norms, skipped = [], 0
        self.model.train()
        for _ in range(a.ppo_epochs):
            for mine in minis:
                tokens = a.loss_agg == "token-mean"
                normaliser = self._normaliser(sum(len(pairs[i][1]) for i in mine) if tokens else len(mine))
                for micro in chunks(mine, lc.micro_batch_size):
                    seqs, logp, entropy = self._logprobs([pairs[i] for i in micro], with_entropy=True)
                    mask = seqs.response_mask.to(logp.device)
                    old_logp = logp.detach() if old is None else torch.stack([old[i] for i in micro]).to(logp.device)
                    ref_logp = None
                    if ref_lps is not None:
                        ref_logp = place_values([ref_lps[i] for i in micro], seqs.response_mask).to(logp.device)
                    loss, mm = grpo_loss(logp, old_logp, ref_logp, adv[micro].to(logp.device), mask,
                                         clip_low=a.clip_ratio_low, clip_high=a.clip_ratio_high, kl_coef=a.kl_coef,
                                         kl_estimator=a.kl_estimator, loss_agg=a.loss_agg, normaliser=normaliser)
                    if fault_at("nan_loss", self.steps + 1):
                        loss = loss * float("nan")
                    loss.backward()
                    mm["entropy_sum"] = (entropy.detach() * mask).sum().item()
                    totals += torch.tensor([mm[k] for k in METRIC_KEYS], dtype=torch.float64)
                norm = self._optimizer_step()
                skipped += not math.isfinite(norm)
                grad_norms.append(norm)
        dist.all_reduce(totals)
        self.steps += 1
        # losses: each update's loss summed over ranks is world_size x its value; token metrics: per token
        per_update = totals / (self.world_size * a.ppo_epochs * len(minis))
        per_token = totals / totals[METRIC_KEYS.index("tokens")]
        return {
            "actor/pg_loss": per_update[0].item(),
            "actor/kl_loss": per_update[1].item(),
            "actor/pg_clipfrac": per_token[2].item(),
            "actor/ppo_kl": per_token[3].item(),
            "actor/entropy": per_token[4].item(),
            "actor/grad_norm": sum(grad_norms) / len(grad_norms),
            "actor/lr": self.scheduler.get_last_lr()[0],
            "actor/skipped_updates": skipped,
            "actor/updates": len(grad_norms),
            "actor/old_log_prob_recomputed": float(not on_policy),
            "timing_s/old_log_prob": old_seconds,
            "timing_s/update_actor": time.perf_counter() - start - old_seconds,
        }

    def _optimizer_step(self) -> float:
        """Clip the gradients and step (skipped when their norm is not finite); the norm before clipping."""
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.recipe.learner.optim.grad_clip or float("inf"))
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        if torch.isfinite(norm):
            self.optimizer.step()
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm.item()

    def _normaliser(self, local: int) -> float:
        """Tokens (or sequences) of the whole mini batch, summed over ranks, / world size: with FSDP2's gradient
        mean over ranks, each rank's loss summed over its share and divided by this is the mini batch's mean."""
        total = torch.tensor([float(local)])
        dist.all_reduce(total)
        return total.item() / self.world_size

    def sft_train(self, pairs: list[tuple[list[int], list[int]]]) -> dict[str, float]:
        """One SFT step: (prompt ids, target ids) pairs cut into mini batches (an optimizer step each), each
        cut over the ranks; loss on target tokens only, token mean over the mini batch."""
        lc = self.recipe.learner
        n, m = len(pairs), lc.mini_batch_size
        minis = [rank_slice(list(range(b, min(b + m, n))), self.rank, self.world_size) for b in range(0, n, m)]
        start = time.perf_counter()
        totals = torch.zeros(2, dtype=torch.float64)  # nll, tokens
        grad_norms = []
        self.model.train()
        for mine in minis:
            normaliser = self._normaliser(sum(len(pairs[i][1]) for i in mine))
            for micro in chunks(mine, lc.micro_batch_size):
                seqs, logp, _ = self._logprobs([pairs[i] for i in micro], temperature=1.0)
                loss, mm = sft_loss(logp, seqs.response_mask.to(logp.device), normaliser)
                loss.backward()
                totals += torch.tensor([mm["nll_sum"], mm["tokens"]], dtype=torch.float64)
            grad_norms.append(self._optimizer_step())
        dist.all_reduce(totals)
        self.steps += 1
        return {"sft/loss": (totals[0] / totals[1]).item(), "sft/tokens": totals[1].item(),
                "actor/grad_norm": sum(grad_norms) / len(grad_norms), "actor/lr": self.scheduler.get_last_lr()[0],
                "actor/skipped_updates": sum(not math.isfinite(g) for g in grad_norms), "actor/updates": len(grad_norms),
                "timing_s/update_actor": time.perf_counter() - start}

    def probe_logprobs(self, token_ids: list[int]) -> list[float]:
        """Logprobs of a fixed sequence at temperature 1 (every rank must call: FSDP2's forward is collective)."""
        self.model.eval()
        with torch.no_grad():
            ids = torch.tensor([token_ids], device=self.device)
            logp, _ = token_logprobs(self.model, ids, torch.ones_like(ids), temperature=1.0)
        return logp[0].tolist()

    # --- checkpoints -----------------------------------------------------------------

    def save(self, path: str) -> dict:
        """Model and optimizer into `path` with torch.distributed.checkpoint (every rank writes its shard)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
        return {"scheduler": self.scheduler.state_dict()}

    def load(self, path: str, scheduler_state: dict) -> None:
        """Model and optimizer from `path`; DCP reshards when the checkpoint had another world size."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            get_state_dict,
            set_state_dict,
        )

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        self.scheduler.load_state_dict(scheduler_state)

    # --- weight sync -----------------------------------------------------------------

    def weight_metas(self, wire_dtype: str) -> list[sync.WeightMeta]:
        """What a push sends, in the order it sends it, cast to `wire_dtype` (the engine's)."""
        return [sync.WeightMeta(name, tuple(p.shape), wire_dtype) for name, p in self.model.named_parameters()]

    def init_sync(self, host: str, port: int, world_size: int, timeout_s: float) -> None:
        """Rank 0 joins the weight-sync group as its rank 0 (and hosts its store); other ranks have no part in it."""
        if self.rank == 0:
            self.sync_group = sync.SyncGroup(sync.backend_for(self.recipe.cluster.device), host, port, 0, world_size,
                                             timeout_s)

    def push_weights(self, metas: list[sync.WeightMeta], bucket_bytes: int) -> dict[str, float]:
        """Stream the full weights to the engines, bucket by bucket: every rank sends its shards of the bucket to
        rank 0 (cast to the wire dtype), which broadcasts the bucket while the next one is assembled. No rank
        unshards anything. Returns rank 0's seconds per phase (gather, broadcast), in all, and the bytes sent."""
        start, phases = time.perf_counter(), sync.Phases()
        fsdp.reshard(self.model)
        params, buckets = dict(self.model.named_parameters()), sync.plan_buckets(metas, bucket_bytes)
        filled = []

        def fill(bucket: list[int], flat: torch.Tensor) -> None:
            fsdp.gather_bucket(params, metas, bucket, flat, phases)
            filled.append(bucket)

        if self.rank == 0:
            try:
                sent = sync.send(self.sync_group, metas, fill, bucket_bytes, phases, self.device)
            except RuntimeError:
                # a receiver is gone: close our end now, so the others' pending receives fail at once instead
                # of waiting out their timeout (the controller builds a new group); take the other ranks'
                # remaining shards, so that none waits on us
                self.sync_group = None
                gc.collect()
                for bucket in buckets[len(filled):]:
                    numel = sum(metas[i].numel for i in bucket)
                    fill(bucket, torch.empty(numel, dtype=metas[bucket[0]].torch_dtype, device=self.device))
                raise
        else:
            sent = 0
            for bucket in buckets:
                fsdp.gather_bucket(params, metas, bucket, None, phases)
        return {"seconds": time.perf_counter() - start, "bytes": float(sent), **dict(phases.seconds)}

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
