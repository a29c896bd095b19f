"""The collective weight transport (``trainer.weight_transport: collective``, the default): a torch.distributed
process group of its own (not the learner's FSDP group, not vLLM's tensor-parallel group) over learner rank 0 (its
rank 0, hosting the group's store) and every worker of every engine (engine i's workers from 1 + i x tensor
parallel size). The backend follows the device (``Device.backend``): nccl on cuda, gloo on cpu.

Streaming: ``send`` has each bucket filled in place (the learner assembles it from its ranks' shards, cast to the
wire dtype) and broadcasts it asynchronously while the next one fills, so at most two buckets are held.
``receive`` posts the broadcast of the next bucket before it hands the current one over, so the engine loads one
bucket while the next arrives. A collective group cannot take in a new member: after an engine is replaced,
``connect`` builds a new group over all of them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from datetime import timedelta

import torch
import torch.distributed as dist

from grpo_ray.device import Device
from grpo_ray.sync import Buffers, Phases, WeightMeta, plan_buckets, unflatten
from grpo_ray.transports.base import Bucket, Transport


class Collective(Transport):
    name = "collective"

    def __init__(self, recipe):
        self.backend = Device.of(recipe).backend
        self.timeout_s = recipe.trainer.sync_timeout_s
        self.start_s = recipe.generator.timeout_s  # a replaced engine may still be starting vLLM
        self.tp = recipe.generator.tensor_parallel_size
        self.group: SyncGroup | None = None
        self.buffers = Buffers()

    def connect(self, pools) -> None:
        learner, gens = pools.learners[0], pools.generators
        world = 1 + len(gens) * self.tp
        # every engine up first (a replaced one starts vLLM, within the deadline of any start): the group's store
        # waits for all its members, and a member that joins early waits for the others only trainer.sync_timeout_s
        pools.call([g.where.remote() for g in gens], "engines ready")
        host, port = pools.call(learner.address.remote(), "sync address")
        where = {"host": host, "port": port, "world": world}
        pools.call(
            [learner.join_transport.remote(self, {**where, "rank": 0})]
            + [g.join_transport.remote(self, {**where, "rank": 1 + i * self.tp}) for i, g in enumerate(gens)],
            "weight-sync group",
            self.timeout_s + self.start_s,
        )

    def join(self, where: dict) -> None:
        rank = where["rank"] + where.get("worker", 0)  # an engine's workers: its base rank + their own
        self.group = SyncGroup(self.backend, where["host"], where["port"], rank, where["world"], self.timeout_s)

    def send(self, metas, fill, bucket_bytes, phases, device, version) -> int:
        return send(self.group, metas, fill, bucket_bytes, phases, device)

    def receive(self, metas, bucket_bytes, device, phases, version) -> Iterator[Bucket]:
        return receive(self.group, metas, bucket_bytes, device, phases, self.buffers)

    def close(self) -> None:
        # a receiver is gone: close our end now, so the others' pending receives fail at once instead of waiting
        # out their timeout (the driver connects a new group)
        self.group = None

    def __getstate__(self):  # the group is this process's own: never pickled (nor are the buffers' mappings)
        return {**self.__dict__, "group": None}


class SyncGroup:
    """A process group of its own over a TCP store hosted by rank 0 (the store lives as long as the group)."""

    def __init__(self, backend: str, host: str, port: int, rank: int, world_size: int, timeout_s: float = 600.0):
        timeout = timedelta(seconds=timeout_s)
        self.rank, self.world_size = rank, world_size
        self.store = dist.TCPStore(host, port, world_size, is_master=(rank == 0), timeout=timeout)
        prefix = dist.PrefixStore("grpo_ray_weight_sync", self.store)
        if backend == "gloo":
            self.pg = dist.ProcessGroupGloo(prefix, rank, world_size, timeout)
        else:  # the same deadline as gloo's (torch's own group helper sets it so)
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.pg = dist.ProcessGroupNCCL(prefix, rank, world_size, options)

    def broadcast(self, tensor: torch.Tensor):
        """Start a broadcast of `tensor` in place from rank 0; returns the work to wait on."""
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        return self.pg.broadcast([tensor], opts)


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
            with phases("wire"):
                work, buf = pending.popleft()
                work.wait()
        if buf is None or buf.dtype != dtype or buf.numel() < numel:
            buf = torch.empty(numel, dtype=dtype, device=device)
        flat = buf[:numel]
        fill(bucket, flat)
        with phases("wire"):
            pending.append((group.broadcast(flat), buf))
        sent += flat.numel() * flat.element_size()
    with phases("wire"):
        for work, _ in pending:
            work.wait()
    return sent


def receive(
    group: SyncGroup,
    metas: list[WeightMeta],
    bucket_bytes: int,
    device: str | torch.device = "cpu",
    phases: Phases | None = None,
    buffers: Buffers | None = None,
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Receive what `send` broadcasts, one bucket at a time as (name, tensor) pairs in `metas` order; the next
    bucket is already arriving while the caller loads this one. Each bucket into a buffer of `buffers` that nothing
    views: the caller may keep views of it (vLLM holds a layer's tensors until the whole layer has arrived)."""
    phases, buffers = phases or Phases(), buffers or Buffers()
    buckets = plan_buckets(metas, bucket_bytes)

    def post(bucket):
        flat = buffers.take(sum(metas[i].numel for i in bucket), metas[bucket[0]].torch_dtype, device)
        return group.broadcast(flat), flat

    nxt = post(buckets[0]) if buckets else None
    for k, bucket in enumerate(buckets):
        work, flat = nxt
        with phases("wire"):
            work.wait()
        nxt = post(buckets[k + 1]) if k + 1 < len(buckets) else None
        out = unflatten(flat, metas, bucket)
        del flat  # the views alone keep the buffer: free again as soon as the engine drops them
        yield out
    buffers.trim()


TRANSPORT = Collective
