"""The delta weight transport (``trainer.weight_transport: delta``): the collective's process group, sending per bucket
only the elements whose value in the wire dtype (the engine's) changed since the last push.

At a typical RL learning rate few bf16 values change a step (benchmarks/results/delta-probe: 2.7% at lr 1e-6 on a
122M model, all but the norms' tensors touched), so a bucket goes as its changed elements' flat indices (int32) and
values, or whole when that would be larger. Each side keeps the last push, bucket by bucket, in the wire dtype:

    learner rank 0   fill the bucket (the learner's gather and cast) -> compare bit for bit with the last push ->
                     broadcast a header (how it is sent, how many elements, a checksum), then what changed
    engine worker    receive -> write the changes into its copy of the last push -> check the checksum -> hand the
                     whole bucket to vLLM's in-place reload (the engine's load is the full push's: its weights are
                     bit-identical to a full push's when the copies are)

The checksum is the sum of the bucket's bytes as 64-bit words, computed by the learner on what it holds and by the
engine on its copy after the changes: a delta lost, applied twice or to another base is a loud
error naming the bucket, never a silent drift. A push is whole (every bucket dense) when either side has no last
push: the first, and every push after ``connect`` (an engine replaced, or a push failed: the group is built again
and both sides forget). The copies cost one model in the wire dtype on learner rank 0's device and on each engine
worker's host.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from grpo_ray.faults import fault_at
from grpo_ray.sync import WeightMeta, buffer, plan_buckets, unflatten
from grpo_ray.transports.base import Bucket
from grpo_ray.transports.collective import Collective

DENSE, SPARSE, SAME = 0, 1, 2
"""How a bucket is sent: whole, as (index, value) pairs, or not at all (nothing changed)."""
BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(flat: torch.Tensor) -> torch.Tensor:
    """`flat`'s elements as integers of their width (bit for bit: -0.0 and 0.0 differ, a NaN equals itself)."""
    return flat.view(BITS[flat.element_size()])


def checksum(flat: torch.Tensor) -> int:
    """The sum, modulo 2^64, of the bucket's bytes read as 64-bit words (the last few bytes each a word of its own):
    any one changed element changes it, whatever the order of the sum (1 ms for 32 MiB on one core here)."""
    raw = flat.view(torch.uint8)
    whole = raw.numel() // 8 * 8
    return int(raw[:whole].view(torch.int64).sum()) + int(raw[whole:].to(torch.int64).sum())


class Delta(Collective):
    name = "delta"

    def __init__(self, recipe):
        super().__init__(recipe)
        self.last: list[torch.Tensor] | None = None
        """This side's copy of the last push, per bucket (learner rank 0: what it sent; an engine worker: what it
        holds); None before the first push and after a new group."""

    def join(self, where: dict) -> None:
        super().join(where)
        self.last = None  # a new group (an engine replaced, a push failed): the next push is whole

    def send(self, metas, fill, bucket_bytes, phases, device, version) -> int:
        sent, pushed, stats = 0, [], {"changed": 0, "elements": 0, "tensors_touched": 0, "dense_bytes": 0}
        for k, bucket in enumerate(plan_buckets(metas, bucket_bytes)):
            wire = torch.empty(sum(metas[i].numel for i in bucket), dtype=metas[bucket[0]].torch_dtype, device=device)
            fill(bucket, wire)
            with phases("delta"):
                flat = wire.cpu()  # the copy is kept on the host (a view of `wire` on CPU)
                last = self.last[k] if self.last else None
                changed = None if last is None else (bits(flat) != bits(last)).nonzero().flatten()
                kind = sent_as(flat, changed)
                header = torch.tensor([kind, flat.numel() if changed is None else changed.numel(), checksum(flat)])
                payload = (
                    [wire] if kind == DENSE else [changed.to(torch.int32), flat[changed]] if kind == SPARSE else []
                )
                if kind == SPARSE and fault_at("corrupt_delta", version):  # fault test: a change lost on the way
                    payload[1] = payload[1].clone()
                    payload[1][0] = -payload[1][0] if payload[1][0] != 0 else 1.0
            with phases("wire"):
                for t in [header, *payload]:
                    self.group.broadcast(t.to(device)).wait()
            sent += header.nbytes + sum(t.nbytes for t in payload)
            stats["changed"] += flat.numel() if changed is None else changed.numel()
            stats["elements"] += flat.numel()
            stats["dense_bytes"] += flat.nbytes
            stats["tensors_touched"] += touched(metas, bucket, changed)
            pushed.append(flat)
        self.last, self.stats = pushed, stats
        return sent

    def receive(self, metas, bucket_bytes, device, phases, version) -> Iterator[Bucket]:
        buckets = plan_buckets(metas, bucket_bytes)
        whole = self.last is None
        self.last = self.last or [None] * len(buckets)
        for k, bucket in enumerate(buckets):
            numel, dtype = sum(metas[i].numel for i in bucket), metas[bucket[0]].torch_dtype
            header = torch.empty(3, dtype=torch.int64, device=device)
            with phases("wire"):
                self.group.broadcast(header).wait()
            kind, n, expected = (int(x) for x in header.tolist())
            if whole and kind != DENSE:
                raise RuntimeError(
                    f"delta push of version {version}: bucket {k} came as changes to a push this engine never had"
                )
            with phases("wire"):
                got = [
                    buffer(x, d, device)
                    for x, d in {DENSE: [(numel, dtype)], SPARSE: [(n, torch.int32), (n, dtype)], SAME: []}[kind]
                ]
                for t in got:
                    self.group.broadcast(t).wait()
            with phases("delta"):  # the copy is kept on the host
                if kind == DENSE:
                    self.last[k] = got[0] if got[0].device.type == "cpu" else got[0].cpu()
                elif kind == SPARSE:
                    self.last[k][got[0].long().cpu()] = got[1].cpu()
                got = checksum(self.last[k])
            if got != expected:
                raise RuntimeError(
                    f"delta push of version {version}: bucket {k} ({metas[bucket[0]].name} ... "
                    f"{metas[bucket[-1]].name}) holds other weights than the learner's after its changes (checksum "
                    f"{got} against {expected}): a change was lost or applied to another base"
                )
            yield unflatten(self.last[k], metas, bucket)

    def __getstate__(self):  # the copies are this process's own: never pickled
        return {**super().__getstate__(), "last": None}


def sent_as(flat: torch.Tensor, changed: torch.Tensor | None) -> int:
    """DENSE with no last push or when the changes' (index, value) pairs would be no smaller; SAME when nothing
    changed; else SPARSE."""
    if changed is None or changed.numel() * (4 + flat.element_size()) >= flat.nbytes:
        return DENSE
    return SAME if changed.numel() == 0 else SPARSE


def touched(metas: list[WeightMeta], bucket: list[int], changed: torch.Tensor | None) -> int:
    """How many of the bucket's tensors have an element in `changed` (all of them when sent whole)."""
    if changed is None:
        return len(bucket)
    ends = torch.tensor([metas[i].numel for i in bucket]).cumsum(0)
    return int(torch.unique(torch.searchsorted(ends, changed.long(), right=True)).numel())


TRANSPORT = Delta
