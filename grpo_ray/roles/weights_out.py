"""What the learner does with its weights outside a step: checkpoints (torch.distributed.checkpoint, every rank its
shard) and pushes to the engines (every rank gathers its shards into rank 0's buckets, which go out through the
weight transport). A part of ``Learner``: it reads the learner's model, optimizer, scheduler, rank and transport."""

from __future__ import annotations

import gc
import time

import torch

from grpo_ray import sync
from grpo_ray.faults import lost_at
from grpo_ray.roles import fsdp


class WeightsOut:
    # --- checkpoints -----------------------------------------------------------------

    def _state_options(self):
        """What a checkpoint holds of the model: every weight, or with LoRA the adapters (the base is frozen)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        # with LoRA, dcp.load fails on a missing adapter; the frozen base is not in the checkpoint, so not strict
        return StateDictOptions(ignore_frozen_params=self.lora, strict=not self.lora)

    def save(self, path: str) -> dict:
        """Model and optimizer into `path` with torch.distributed.checkpoint (every rank writes its shard)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        lost_at("learner_save", self.steps, self.rank == self.world_size - 1)  # fault tests: a rank lost in a save
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=self._state_options())
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
        return {"scheduler": self.scheduler.state_dict()}

    def load(self, path: str, scheduler_state: dict) -> None:
        """Model and optimizer from `path`; DCP reshards when the checkpoint had another world size."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            get_state_dict,
            set_state_dict,
        )

        options = self._state_options()
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=options)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=options,
        )
        self.scheduler.load_state_dict(scheduler_state)

    def state_copy(self) -> tuple[dict, dict]:
        """This rank's whole training state, copied to the host (trainer.fault_tolerance=all: taken as each step
        starts, held by the driver's ``Keeper``): its shards of the weights and of the optimizer's state of each,
        the scheduler, the step count and version, the old policy's snapshots. A new actor in its place, in a group
        of the same size, takes it back (``take_state``) and trains the step as this one would have. With it, what
        the copy cost (seconds, MB), a second return for the driver to read alone."""
        start = time.perf_counter()
        lost_at("learner_copy", self.steps, self.rank == self.world_size - 1)  # fault test: lost with its copy
        fsdp.reshard(self.model)
        state = {
            "params": [fsdp.host_copy(p) for p in self.params],
            "optim": [{k: fsdp.host_copy(v) for k, v in self.optimizer.state[p].items()} for p in self.params],
            "scheduler": self.scheduler.state_dict(),
            "counts": (self.steps, self.version),
            "snapshots": self.snapshots,
        }
        tensors = [*state["params"], *(t for m in state["optim"] for t in m.values())]
        tensors += [t for kept in self.snapshots.values() for t in kept]
        mb = sum(t.numel() * t.element_size() for t in tensors) / 1e6
        return state, {"seconds": time.perf_counter() - start, "mb": mb}

    def take_state(self, state: dict) -> None:
        """Become the rank whose ``state_copy`` `state` is (this actor replaced it, in a group started again)."""
        fsdp.reshard(self.model)
        with torch.no_grad():
            for p, saved, moments in zip(self.params, state["params"], state["optim"]):
                fsdp.local(p).copy_(saved)
                self.optimizer.state[p] = {k: fsdp.shaped_like(p, v) for k, v in moments.items()}
        self.scheduler.load_state_dict(state["scheduler"])
        (self.steps, self.version), self.snapshots = state["counts"], state["snapshots"]

    # --- weight sync -----------------------------------------------------------------

    def weight_metas(self, wire_dtype: str) -> list[sync.WeightMeta]:
        """What a push sends, in the order it sends it, cast to `wire_dtype` (the engine's)."""
        return [sync.WeightMeta(name, tuple(shape), wire_dtype) for name, (shape, _) in self.engine_weights.items()]

    def join_transport(self, transport, where: dict) -> None:
        """Rank 0 takes its side of the weight transport (``grpo_ray.transports``); other ranks only gather."""
        transport.join(where)
        self.transport = transport

    def push_weights(self, metas: list[sync.WeightMeta], bucket_bytes: int, version: int = 0) -> dict[str, float]:
        """Stream the full weights to the engines, bucket by bucket: every rank sends its shards of the bucket to
        rank 0 (cast to the wire dtype), which sends the bucket through the weight transport while the next one is
        assembled. No rank unshards anything. Returns rank 0's seconds per phase (gather, cast, wire), in all, and
        the bytes sent."""
        lost_at("learner_push", version, self.rank == self.world_size - 1)  # fault tests: a rank lost in a push
        start, phases = time.perf_counter(), sync.Phases()
        fsdp.reshard(self.model)
        rows_of, buckets = (
            {n: rows for n, (_, rows) in self.engine_weights.items()},
            sync.plan_buckets(metas, bucket_bytes),
        )
        filled = []

        def fill(bucket: list[int], flat: torch.Tensor) -> None:
            fsdp.gather_bucket(rows_of, metas, bucket, flat, phases)
            filled.append(bucket)

        if self.rank == 0:
            try:
                sent = self.transport.send(metas, fill, bucket_bytes, phases, self.device, version)
            except Exception as e:
                # a receiver is gone (or the transport failed): close our side now (the driver connects again);
                # take the other ranks' remaining shards, so that none waits on us in the gather
                self.transport.close()
                gc.collect()
                failed_at = len(filled)
                for bucket in buckets[failed_at:]:
                    numel = sum(metas[i].numel for i in bucket)
                    fill(bucket, torch.empty(numel, dtype=metas[bucket[0]].torch_dtype, device=self.device))
                raise RuntimeError(  # which side, which bucket: the driver says it with what it does about it
                    f"learner rank 0 sending version {version}: failed at bucket {max(failed_at - 1, 0)} of "
                    f"{len(buckets)} ({type(e).__name__}: {e})"
                ) from e
        else:
            sent = 0
            for bucket in buckets:
                fsdp.gather_bucket(rows_of, metas, bucket, None, phases)
        shown = self.transport.stats if self.rank == 0 else {}
        return {"seconds": time.perf_counter() - start, "bytes": float(sent), **dict(phases.seconds), **shown}
