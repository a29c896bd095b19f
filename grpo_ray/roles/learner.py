"""The learner role: one rank of an FSDP2 model per actor, a torch.distributed group across the actors.

The controller drives it step by step; it runs no loop of its own:

    setup(host, port)              join the group (gloo on CPU, nccl on GPU), load and shard the model
    train(refs, adv, v, signals)   fetch the rollouts and the frozen scorers' logprobs (by use), then PPO
                                   epochs over mini batches, micro-batch gradient accumulation, one optimizer step
                                   per mini batch, the old policy as the schedule says (``recomputes_old_policy``);
                                   returns the step's metrics and the probe's logprobs under the new weights
    sft_train(pairs, masks)        one supervised step on (prompt, target) token ids, the same batching
    push_weights(metas, ...)       every rank sends its shards of each bucket to rank 0, which sends the bucket to
                                   the generators through the weight transport (``WeightsOut``, ``transports/``)
    probe_logprobs(ids)            logprobs of a fixed sequence, to check a sync

With LoRA (``model.lora.rank``) the model is wrapped by peft before sharding and only the adapters train; the
reference logprobs are computed here, with the adapters off (``grpo_ray.models.lora``); a push sends the adapters
alone or (``model.lora.sync: merged``) the adapted weights merged. A vision-language model reads its images.

Data parallelism: each mini batch of M samples is cut into W contiguous shares (``rank_slice``); a rank's loss is
scaled so that FSDP2's gradient averaging over ranks gives the mini batch's loss (``grpo_ray.algo.loss``), and a
rank with fewer micro batches pairs the others' collectives on a filler (``_rounds``).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from grpo_ray import schedules, sync
from grpo_ray.algo.advantage import per_token
from grpo_ray.algo.batching import (
    collate,
    flatten,
    forward_work,
    micro_batches,
    placed,
    rank_slice,
    samples,
    use_shared,
)
from grpo_ray.algo.logprobs import sequence_logprobs, token_logprobs
from grpo_ray.algo.loss import LOSS_SUMS, LossInputs, StepSums, micro_batch_loss, sft_loss, step_metrics, token_uses
from grpo_ray.config import DISTILL, KINDS, KL, LEARNER, Recipe
from grpo_ray.device import Device
from grpo_ray.faults import fault_at, lost_at
from grpo_ray.lengths import response_budget
from grpo_ray.models import load_causal_lm, lora, pad_id, vision
from grpo_ray.models.dims import ModelDims, model_dims
from grpo_ray.roles import RoleActor, Seat, fsdp, log_to_file
from grpo_ray.roles.weights_out import WeightsOut
from grpo_ray.telemetry.perf import device_peak_tflops, forward_flops, measure_cpu_peak_tflops
from grpo_ray.types import Update


def token_signals() -> dict[str, str]:
    """The frozen scorers' per-token signals the learner reads, by their use (``config.USES``; the loss applies each,
    ``algo.loss.token_uses``), and the pool whose row names it (its section holds the use's coefficients)."""
    return {k.use: k.name for k in KINDS.values() if k.signal == "token"}


@dataclass
class RankShare:
    """One step's samples as this rank trains on them (``Learner._batch``); each list is indexed by sample."""

    pairs: list
    """(prompt ids, response ids) of every sample of the step."""
    minis: list[list[int]]
    """This rank's share of each mini batch."""
    sampler: list
    """The sampler's logprobs of each response."""
    adv: torch.Tensor | list
    """[N] the advantages; or under a per-turn estimator, each sample's per token (``per_token``)."""
    masks: list | None
    """Multi-turn trajectories' loss masks (1 on the model's tokens); None when every sample is one turn."""
    old: dict | None
    """The old policy's logprobs of this rank's samples; None where they are the trained weights' (or bypass)."""
    signals: dict[str, list | dict]
    """The frozen scorers' logprobs by use (``token_signals``): the reference's (``kl``) when the loss has a KL term,
    the distillation teacher's (``distill``) when there is a teacher."""
    old_seconds: float
    ref_seconds: float


class Learner(WeightsOut, RoleActor):
    @classmethod
    def start_args(cls, seat: Seat) -> tuple:
        return (seat.model_path, seat.recipe, seat.rank, seat.count, seat.threads, seat.dims)

    def __init__(
        self,
        model_path: str,
        recipe: Recipe,
        rank: int,
        world_size: int,
        threads: int = 1,
        dims: ModelDims | None = None,
    ):
        log_to_file()
        self.model_path, self.recipe, self.rank, self.world_size = model_path, recipe, rank, world_size
        self.sections = {use: KINDS[pool].section_of(recipe) for use, pool in token_signals().items()}
        """Each token signal's pool section, by use: its coefficients (the teacher's for distillation)."""
        self.lora = recipe.model.lora.rank > 0
        self.run_on = Device.of(recipe)
        self.device = self.run_on.torch
        self.dims = dims or model_dims(model_path)  # the run's inputs carry it; read here when made without
        torch.set_num_threads(threads)
        torch.manual_seed(recipe.trainer.seed)
        self.transport = None  # rank 0's side of the weight transport, once joined
        self.steps = 0
        self.version = 0
        """The version of the weights held now (the controller's count of updates that changed them)."""
        self.snapshots: dict[int, list[torch.Tensor]] = {}
        """This rank's shards of earlier versions, on the host: the old policy of samples generated by them."""
        self.shared, self.images = False, []
        """Whether this step's forwards run each prompt once (``_layout``); its samples' images, as its pairs."""
        self.flops = 0.0
        """FLOPs of this rank's forwards (x3 with their backward) since the step began, in the layout they ran."""

    def address(self) -> tuple[str, int]:
        """A free address on this actor's node (rank 0 hosts the group's store)."""
        return sync.free_address()

    def setup(self, host: str, port: int) -> dict:
        """Join the group, load and shard the model; returns the model's dims, this device's name and its peak TFLOPS
        (None when unknown: no MFU then)."""
        cfg = self.recipe.learner
        mesh = fsdp.join(self.run_on, host, port, self.rank, self.world_size)
        model = self.load_model()
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable()
            if self.lora:
                model.enable_input_require_grads()  # the frozen embeddings would cut the checkpointed graph
        model = lora.wrap(model, self.recipe.model.lora, self.recipe.model.freeze_vision)
        fsdp.shard(lora.base_model(model), mesh, getattr(torch, cfg.dtype))
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        """What trains: every parameter, or with LoRA the adapters."""
        self.engine_weights = lora.engine_weights(
            model, fsdp.local_rows, self.lora and self.recipe.model.lora.sync == "adapters"
        )
        o = cfg.optim
        self.optimizer = torch.optim.AdamW(
            self.params, lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay
        )
        warmup = o.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0
        )
        self.pad_id = pad_id(model.config)
        declared = self.recipe.cluster.peak_tflops
        if self.run_on.gpu:
            name = torch.cuda.get_device_name()
            peak = device_peak_tflops(name, declared)
        else:
            name, peak = "cpu", declared or (measure_cpu_peak_tflops() if self.rank == 0 else None)  # rank 0's is used
        return {"dims": self.dims, "peak_tflops": peak, "device_name": name}

    def load_model(self) -> torch.nn.Module:
        """The model this role trains, in fp32 on the host (fully_shard then moves one layer at a time to the device
        and keeps only this rank's shard): the policy, a causal LM."""
        return load_causal_lm(self.model_path, torch.float32, self.recipe.model.trust_remote_code, self.run_on)

    # --- training --------------------------------------------------------------------

    def _layout(self, pairs: list) -> None:
        """Decide the step's forward layout from all its `pairs` (model.shared_prompt; every rank holds the whole
        batch, so every rank decides alike and runs the same forwards)."""
        m, cfg = self.recipe.model, self.recipe.learner
        # a checkpointed forward keeps no cache for the responses to read the prompt from (true is refused then)
        # images: a prompt's tokens alone do not say which it holds (true is refused with image rows)
        setting = False if cfg.gradient_checkpointing or any(self.images) else m.shared_prompt
        self.shared = use_shared(setting, pairs, cfg.micro_batch_size, m.sequence_packing)

    def _micro_batches(self, indices: list[int], pairs: list) -> tuple[list[list[int]], int]:
        """This rank's micro batches of `indices`, and their row capacity when packed (model.sequence_packing; with
        shared prompts, runs of whole groups where they fit)."""
        m = self.recipe.model
        return micro_batches(indices, pairs, self.recipe.learner.micro_batch_size, m.sequence_packing, self.shared)

    def _logprobs(self, pairs, capacity: int, with_entropy=False, temperature: float | None = None, images=()):
        """Padded sequences of `pairs` (packed into rows of `capacity`, unless 0, or each prompt run once with shared
        prompts) and each next token's logprob (at the sampling temperature), reading each pair's `images`; the
        entropies carry a gradient only when the loss has an entropy term."""
        seqs = collate(pairs, self.pad_id, capacity, self.shared)
        pixels = vision.in_order(self.model_path, images, seqs, self.recipe.model.trust_remote_code)
        passes = 3 if torch.is_grad_enabled() else 1  # a backward costs two forwards
        self.flops += passes * forward_flops(self.dims, *forward_work(pairs, self.shared))
        t = self.recipe.generator.sampling.temperature if temperature is None else temperature
        grad, banned = self.recipe.algorithm.entropy_coeff > 0, vision.placeholder_ids(self.model.config)
        logp, entropy = sequence_logprobs(self.model, seqs, self.device, t, with_entropy, grad, pixels, banned)
        return seqs, logp, entropy

    def _score(self, pairs: list, indices: list[int]) -> dict[int, torch.Tensor]:
        """Logprobs of the response tokens of `indices` under the weights held now, without gradients (a 1-D
        tensor each, so any micro batch can take it). Collective: every rank runs as many forwards as the rank
        with the most (filler ones)."""
        out = {}
        micros, capacity = self._micro_batches(indices, pairs)
        with torch.no_grad():
            for k in range(self._rounds(len(micros))):
                micro = micros[k] if k < len(micros) else []
                some, images = [pairs[i] for i in micro] or self.filler(), [self.images[i] for i in micro]
                seqs, logp, _ = self._logprobs(some, capacity if micro else 0, images=images)
                for j, i in enumerate(micro):
                    out[i] = logp[j][seqs.response_mask[j].to(logp.device).bool()].cpu()
        return out

    def _rounds(self, micro_batches: int) -> int:
        """The most micro batches any rank has of a pass: every rank runs as many forwards (FSDP2's all-gathers and
        reduce-scatters are collectives), those with fewer on a filler (``_filler_backward``). Counts differ: each
        rank cuts its own share (packed to its own longest sample, or shared prompts within its own budget)."""
        rounds = torch.tensor([micro_batches], device=self.device)  # on the device: nccl reduces device tensors only
        dist.all_reduce(rounds, op=dist.ReduceOp.MAX)
        return int(rounds.item())

    def filler(self) -> list[tuple[list[int], list[int]]]:
        """A one-token sequence that keeps a rank in the other ranks' collectives."""
        return [([self.pad_id], [self.pad_id])]

    def _filler_backward(self) -> None:
        """A forward and backward on the filler with a loss of 0: the collectives paired, no gradient added."""
        _, logp, entropy = self._logprobs(self.filler(), 0, with_entropy=True)
        loss = logp.sum() * 0.0
        if entropy is not None and entropy.requires_grad:
            loss = loss + entropy.sum() * 0.0
        loss.backward()

    def _old_logprobs(self, pairs: list, indices: list[int], versions: list[int]) -> dict[int, torch.Tensor]:
        """Logprobs of the response tokens under the weights that generated each sample (its version), for the
        samples this rank trains on; samples of older versions are scored with that version's snapshot swapped
        in. Collective: every rank swaps in each version of the batch."""
        out = {}
        for v in sorted(set(versions)):  # every rank holds the whole batch: the same versions in the same order
            with self._weights_of(v):
                out.update(self._score(pairs, [i for i in indices if versions[i] == v]))
        return out

    def _snapshot(self, keep_from: int) -> None:
        """Keep this rank's shards of the current version (once), and drop those older than `keep_from`."""
        fsdp.reshard(self.model)
        if self.version not in self.snapshots:
            self.snapshots[self.version] = [fsdp.host_copy(p) for p in self.params]
        for v in [v for v in self.snapshots if v < keep_from]:
            del self.snapshots[v]

    @contextlib.contextmanager
    def _weights_of(self, version: int):
        """The model holds the weights of `version` inside the block (a snapshot copied into the shards)."""
        if version == self.version:
            yield
            return
        if version not in self.snapshots:
            raise RuntimeError(
                f"samples of policy version {version} and no weights of it here (the learner holds "
                f"version {self.version} and snapshots of {sorted(self.snapshots)}): the old policy "
                "cannot be computed; algorithm.rollout_correction.bypass_mode=true takes the sampler's"
            )
        fsdp.reshard(self.model)
        with torch.no_grad():
            for p, saved in zip(self.params, self.snapshots[version]):
                p.to_local().copy_(saved)
        try:
            yield
        finally:
            fsdp.reshard(self.model)
            with torch.no_grad():
                for p, saved in zip(self.params, self.snapshots[self.version]):
                    p.to_local().copy_(saved)

    def train(
        self,
        rollout_refs: list,
        advantages: list[float],
        version: int,
        signals: dict[str, list] | None = None,
        keep_from: int | None = None,
        probe_ids: list[int] | None = None,
    ) -> Update:
        """One GRPO step over all samples of `rollout_refs` (Ray object refs, fetched here, not by the controller)
        with the weights of `version`: ``update`` on what they hold. `signals`: each frozen scorer's refs to its
        chunks of per-token logprobs, by its use (``token_signals``)."""
        import ray

        rollouts = ray.get(rollout_refs)
        fetched = {name: [lp for chunk in ray.get(refs) for lp in chunk] for name, refs in (signals or {}).items()}
        return self.update(rollouts, advantages, version, fetched, keep_from, probe_ids)

    def update(
        self,
        rollouts: list,
        advantages: list[float],
        version: int,
        signals: dict[str, list] | None = None,
        keep_from: int | None = None,
        probe_ids: list[int] | None = None,
    ) -> Update:
        """One GRPO step over all samples of `rollouts` with the weights of `version` (no Ray: benchmarks/gpu.py
        calls it directly): PPO epochs over mini batches, an optimizer step each. The old policy of each sample
        is the learner at the version that generated it (snapshots of versions >= `keep_from` are kept for later
        batches), or the sampler's in bypass mode. With `probe_ids`, the updated weights' ``probe_logprobs`` too
        (``Update.probe``), for the sync that pushes them: no call of its own then. `signals`: the frozen
        scorers' per-token logprobs of every sample, by use (``token_signals``): the reference's for the KL term
        (``kl``), the distillation teacher's for each token's advantage (``distill``)."""
        a = self.recipe.algorithm
        self.version, self.flops = version, 0.0
        unknown = sorted(set(signals or {}) - set(token_uses()))
        if unknown:
            raise ValueError(f"the learner reads no signal of use {unknown}: it reads {', '.join(token_uses())}")
        batch = self._batch(rollouts, advantages, keep_from, dict(signals or {}))
        sums = StepSums.zeros(self.device)
        norms, empty = [], 0
        self.model.train()
        started, start = time.time(), time.perf_counter()
        for epoch in range(a.ppo_epochs):
            for mine in batch.minis:
                kept = self._backward(batch, mine, sums, first_epoch=epoch == 0)
                if not kept:  # every sample masked (rollout rejection): no gradient, no step (Adam's momentum
                    self.optimizer.zero_grad(set_to_none=True)  # would still move the weights)
                    empty += 1
                    norms.append(0.0)
                    continue
                # FSDP2 averages the gradients over ranks: each rank's sum over what was kept times the world size
                norms.append(self._optimizer_step(self.world_size / kept))
        sums.all_reduce()
        self.steps += 1
        metrics = {
            "actor/flops": self._total(self.flops),
            **step_metrics(sums, self.world_size * a.ppo_epochs * len(batch.minis), DISTILL in batch.signals),
            **self._update_metrics(norms, empty),
            "actor/empty_updates": empty,
            "actor/old_log_prob_recomputed": float(batch.old is not None),
            "actor/shared_prompt": float(self.shared),
            "actor/policy_version": float(version),
            "timing_s/old_log_prob": batch.old_seconds,
            "timing_s/ref": batch.ref_seconds,
            "timing_s/update_actor": time.perf_counter() - start,
        }
        return Update(metrics, (started, time.time()), self.probe_logprobs(probe_ids) if probe_ids else None)

    def _batch(self, rollouts: list, advantages: list[float], keep_from: int | None, signals: dict) -> RankShare:
        """The step's samples cut into this rank's share of each mini batch, with what the loss needs beside the
        learner's own logprobs: the old policy's logprobs where they are not the trained weights' (one on-policy
        update, or bypass mode: none), and with LoRA the reference's (this model, adapters off)."""
        a, m = self.recipe.algorithm, self.recipe.learner.mini_batch_size
        pairs, self.images = flatten(rollouts), [p.images + c.images for p, c in samples(rollouts)]
        self._layout(pairs)
        schedule, versions = schedules.of(a), [r.policy_version for r in rollouts for _ in r.completions]
        n = len(pairs)
        minis = [rank_slice(list(range(b, min(b + m, n))), self.rank, self.world_size) for b in range(0, n, m)]
        mine = [i for mini in minis for i in mini]
        if schedule.keeps_older_weights():
            self._snapshot(min(versions + ([] if keep_from is None else [keep_from])))
        start = time.perf_counter()
        recompute = schedule.recomputes_old_policy(len(minis), stale=set(versions) != {self.version})
        olds = [schedule.old_policy_version(v, self.version) for v in versions]  # streaming: the proximal policy
        old = self._old_logprobs(pairs, mine, olds) if recompute else None
        old_seconds = time.perf_counter() - start if recompute else 0.0
        ref_seconds = 0.0
        if self.lora and a.kl_coef > 0 and KL not in signals:  # the reference: this model with the adapters off
            flops = self.flops
            with lora.adapters_off(self.model):
                signals[KL] = self._score(pairs, mine)
            self.flops = flops  # the reference's forward is timed as timing_s/ref, not as the update's work
            ref_seconds = time.perf_counter() - start - old_seconds
        sampler = [c.sampler_logprobs for r in rollouts for c in r.completions]
        masks = [c.mask or [1] * len(c.token_ids) for r in rollouts for c in r.completions]
        per_turn = isinstance(advantages[0], list)  # a per-turn estimator's: laid on each turn's tokens
        adv = per_token(advantages, masks) if per_turn else torch.tensor(advantages, dtype=torch.float32)
        multi_turn = any(c.mask is not None for r in rollouts for c in r.completions)
        masks = masks if multi_turn else None
        return RankShare(pairs, minis, sampler, adv, masks, old, signals, old_seconds, ref_seconds)

    def _backward(self, batch: RankShare, mine: list[int], sums: StepSums, first_epoch: bool) -> float:
        """Forward and backward of this rank's micro batches of one mini batch (gradients accumulated, each micro
        batch's loss unnormalised); the count the loss kept over every rank (the mini batch's normaliser), its sums
        added to `sums` (the correction's in the first epoch only)."""
        count = torch.zeros((), dtype=torch.float64, device=self.device)
        mini = torch.zeros(len(LOSS_SUMS), dtype=torch.float64, device=self.device)
        micros, capacity = self._micro_batches(mine, batch.pairs)
        for _ in range(self._rounds(len(micros)) - len(micros)):  # this rank has fewer than another: pair theirs
            self._filler_backward()
        for micro in micros:
            images = [self.images[i] for i in micro]
            seqs, logp, entropy = self._logprobs([batch.pairs[i] for i in micro], capacity, True, images=images)
            response = seqs.response_mask.to(logp.device)  # where each sample's per-token values lie
            x = LossInputs(
                logp,
                placed(batch.sampler, micro, response),
                batch.adv[micro] if isinstance(batch.adv, torch.Tensor) else placed(batch.adv, micro, response),
                response if batch.masks is None else placed(batch.masks, micro, response),  # multi-turn: the
                placed(batch.old, micro, response),  # model's own tokens only, not the observations'
                entropy,
                {use: placed(values, micro, response) for use, values in batch.signals.items()},
            )
            loss, counted, losses, corr, top = micro_batch_loss(
                x, self.recipe.algorithm, response_budget(self.recipe), self.sections
            )
            if fault_at("nan_loss", self.steps + 1):
                loss = loss * float("nan")
            loss.backward()
            count += counted
            mini += losses
            if first_epoch:
                sums.add_correction(corr, top)
        dist.all_reduce(count)
        kept = count.item()
        sums.add_losses(mini, self.world_size / kept if kept else 0.0)
        return kept

    def _optimizer_step(self, scale: float = 1.0) -> float:
        """Scale the gradients by `scale` (the mini batch's normaliser, once known), clip them and step (skipped when
        their norm is not finite); the norm before clipping."""
        if scale != 1.0:
            for p in self.params:
                if p.grad is not None:
                    p.grad.mul_(scale)
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.recipe.learner.optim.grad_clip or float("inf"))
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        if torch.isfinite(norm):
            self.optimizer.step()
            self.scheduler.step()
        lost_at(LEARNER, self.steps + 1, self.rank == self.world_size - 1)  # fault tests: a rank lost here
        self.optimizer.zero_grad(set_to_none=True)
        return norm.item()

    def _update_metrics(self, norms: list[float], empty: int = 0) -> dict[str, float]:
        """A step's optimizer metrics from each update's gradient norm (``_optimizer_step``): their mean, the learning
        rate, the updates skipped (a norm that is not finite, or `empty`: nothing kept to train on) and counted."""
        return {
            "actor/grad_norm": sum(norms) / len(norms),
            "actor/lr": self.scheduler.get_last_lr()[0],
            "actor/skipped_updates": sum(not math.isfinite(n) for n in norms) + empty,
            "actor/updates": len(norms),
        }

    def _total(self, local: float) -> float:
        """`local` summed over the ranks."""
        total = torch.tensor([float(local)], dtype=torch.float64, device=self.device)  # nccl reduces device tensors
        dist.all_reduce(total)
        return total.item()

    def _normaliser(self, local: int) -> float:
        """Tokens (or sequences) of the whole mini batch, summed over ranks, / world size: with FSDP2's gradient
        mean over ranks, each rank's loss summed over its share and divided by this is the mini batch's mean."""
        return self._total(local) / self.world_size

    def sft_train(self, pairs: list, masks: list | None = None, images: list | None = None) -> dict[str, float]:
        """One SFT step: (prompt ids, target ids) pairs (a vision-language model's with each one's `images`) cut into
        mini batches (an optimizer step each), each cut over the ranks; loss on target tokens only (those a multi-turn
        trace's `masks` keep: not its observations), token mean over the mini batch."""
        lc = self.recipe.learner
        n, m = len(pairs), lc.mini_batch_size
        minis = [rank_slice(list(range(b, min(b + m, n))), self.rank, self.world_size) for b in range(0, n, m)]
        start = time.perf_counter()
        totals = torch.zeros(2, dtype=torch.float64, device=self.device)  # nll, tokens
        grad_norms, self.images = [], images or [[] for _ in pairs]  # each pair's images, its prompt's expanded
        self.model.train()
        trained = [sum(m) for m in masks] if masks else [len(target) for _, target in pairs]
        self._layout(pairs)
        self.flops = 0.0
        for mine in minis:
            normaliser = self._normaliser(sum(trained[i] for i in mine))
            micros, capacity = self._micro_batches(mine, pairs)
            for _ in range(self._rounds(len(micros)) - len(micros)):  # pair the collectives of a rank with more
                self._filler_backward()
            for micro in micros:
                seqs, logp, _ = self._logprobs(
                    [pairs[i] for i in micro], capacity, False, 1.0, [self.images[i] for i in micro]
                )
                response = seqs.response_mask.to(logp.device)
                loss, mm = sft_loss(logp, placed(masks, micro, response) if masks else response, normaliser)
                loss.backward()
                totals += torch.stack([mm["nll_sum"], mm["tokens"]]).double()
            grad_norms.append(self._optimizer_step())
        dist.all_reduce(totals)
        self.steps += 1
        return {
            "sft/loss": (totals[0] / totals[1]).item(),
            "sft/tokens": totals[1].item(),
            "actor/flops": self._total(self.flops),
            **self._update_metrics(grad_norms),
            "timing_s/update_actor": time.perf_counter() - start,
        }

    def probe_logprobs(self, token_ids: list[int]) -> list[float]:
        """Logprobs of a fixed sequence at temperature 1 (every rank must call: FSDP2's forward is collective)."""
        self.model.eval()
        with torch.no_grad():
            ids = torch.tensor([token_ids], device=self.device)
            logp, _ = token_logprobs(self.model, ids, torch.ones_like(ids), temperature=1.0)
        return logp[0].tolist()

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
