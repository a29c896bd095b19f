"""Weight sync: learner rank 0 broadcasts full weights to every generator worker.

The seam is small: ``SyncGroup`` joins a process group of its own (not the
learner's FSDP group, not vLLM's tensor-parallel group), ``send`` broadcasts named
tensors from rank 0 in buckets, ``receive`` yields them on the other ranks. The
backend follows the device (``backend_for``): nccl on cuda, gloo on cpu; the rest
of the code is the same for both.

Both sides agree on the bytes without talking: the sender's ``WeightMeta`` list
(name, shape, dtype per tensor) is given to the receivers once at setup, and
``plan_buckets`` cuts it into the same buckets on every rank.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Iterable, Iterator

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class WeightMeta:
    name: str
    shape: tuple[int, ...]
    dtype: str  # e.g. "float32"

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


def backend_for(device: str) -> str:
    """The one place that maps a device to a collective backend."""
    return {"cuda": "nccl", "cpu": "gloo"}[device]


def free_address() -> tuple[str, int]:
    """This node's IP and a free TCP port, for a process group's store."""
    import ray

    ip = ray.util.get_node_ip_address()
    with socket.socket() as s:
        s.bind(("", 0))
        return ip, s.getsockname()[1]


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

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Broadcast `tensor` in place from rank 0."""
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.pg.broadcast([tensor], opts).wait()


def plan_buckets(metas: list[WeightMeta], bucket_bytes: int) -> list[list[int]]:
    """Indices of `metas` per bucket: same dtype within a bucket, at most `bucket_bytes` unless one tensor is larger."""
    buckets: list[list[int]] = []
    size, dtype = 0, None
    for i, m in enumerate(metas):
        nbytes = m.numel * torch.empty((), dtype=m.torch_dtype).element_size()
        if not buckets or m.dtype != dtype or size + nbytes > bucket_bytes:
            buckets.append([])
            size, dtype = 0, m.dtype
        buckets[-1].append(i)
        size += nbytes
    return buckets


def send(group: SyncGroup, metas: list[WeightMeta], tensors: Iterable[torch.Tensor], bucket_bytes: int) -> int:
    """Broadcast `tensors` (in `metas` order) from rank 0; returns the bytes sent."""
    tensors = list(tensors)
    sent = 0
    for bucket in plan_buckets(metas, bucket_bytes):
        flat = torch.cat([tensors[i].detach().reshape(-1).to(metas[i].torch_dtype) for i in bucket])
        group.broadcast(flat)
        sent += flat.numel() * flat.element_size()
    return sent


def receive(group: SyncGroup, metas: list[WeightMeta], bucket_bytes: int, device: str | torch.device = "cpu") -> Iterator[tuple[str, torch.Tensor]]:
    """Receive what `send` broadcasts, yielding (name, tensor) in `metas` order."""
    for bucket in plan_buckets(metas, bucket_bytes):
        flat = torch.empty(sum(metas[i].numel for i in bucket), dtype=metas[bucket[0]].torch_dtype, device=device)
        group.broadcast(flat)
        offset = 0
        for i in bucket:
            m = metas[i]
            yield m.name, flat[offset : offset + m.numel].view(m.shape)
            offset += m.numel
