"""The delta weight transport (``trainer.weight_transport: delta``): the collective's process group, sending per bucket
only the elements whose value in the wire dtype (the engine's) changed since the last push. ``delta_storage`` sends
the same through shared storage (``transports/delta_storage.py``); both keep their copies with ``Copies``.

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
and both sides forget). The copies cost one model in the wire dtype in host memory on each side: learner rank 0's
(each bucket is copied from its device to the host to be compared) and each engine worker's.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from grpo_ray.faults import fault_at
from grpo_ray.lengths import dtype_bytes, wire_dtype
from grpo_ray.sync import WeightMeta, plan_buckets, unflatten
from grpo_ray.transports.base import Bucket
from grpo_ray.transports.collective import Collective

DENSE, SPARSE, SAME = 0, 1, 2
"""How a bucket is sent: whole, as (index, value) pairs, or not at all (nothing changed)."""
BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}
CHANGED_PER_LR = 2.66e4
"""The share of bf16 elements a step changes per unit of learning rate, for the planner: 2.66% at AdamW lr 1e-6 on
float32 master weights (benchmarks/results/delta-probe, 122M parameters, a mean over 5 steps). A 16-bit element
changes when its update crosses half its last bit, about in proportion to the learning rate while few do; a 32-bit
engine's elements change wherever Adam moves them: all."""


def bytes_share(recipe) -> float:
    """The planner's expected bytes of a delta push against a whole one: the changed share of the elements at
    4 + b bytes each (index and value) over b, no more than whole."""
    b = dtype_bytes(wire_dtype(recipe))
    changed = min(1.0, CHANGED_PER_LR * recipe.learner.optim.lr) if b == 2 else 1.0
    return min(1.0, changed * (4 + b) / b)


def bits(flat: torch.Tensor) -> torch.Tensor:
    """`flat`'s elements as integers of their width (bit for bit: -0.0 and 0.0 differ, a NaN equals itself)."""
    return flat.view(BITS[flat.element_size()])


def checksum(flat: torch.Tensor) -> int:
    """The sum, modulo 2^64, of the bucket's bytes read as 64-bit words (the last few bytes each a word of its own):
    any one changed element changes it, whatever the order of the sum (1 ms for 32 MiB on one core here)."""
    raw = flat.view(torch.uint8)
    whole = raw.numel() // 8 * 8
    return int(raw[:whole].view(torch.int64).sum()) + int(raw[whole:].to(torch.int64).sum())


class Copies:
    """One side's copy of the last push, bucket by bucket, in the wire dtype, and how a bucket is told against it:
    learner rank 0 ``encode``s what it sends, an engine worker ``decode``s what it receives."""

    def __init__(self):
        self.last: list[torch.Tensor] | None = None
        """The last push, per bucket (learner rank 0: what it sent; an engine worker: what it holds); None before
        the first push and after ``forget``."""
        self.stats: dict = {}

    def forget(self) -> None:
        """A new group or set of engines: the next push is whole on both sides."""
        self.last = None

    def start(self, buckets: int) -> bool:
        """A push of `buckets` buckets begins; whether it must be whole (this side has no last push)."""
        whole = self.last is None
        self.last = self.last or [None] * buckets
        self.stats = {"changed": 0, "elements": 0, "tensors_touched": 0, "dense_bytes": 0}
        return whole

    def encode(self, k: int, flat: torch.Tensor, metas, bucket, version: int) -> tuple[torch.Tensor, list]:
        """Learner rank 0: bucket `k` (`flat`, on the host) against the last push: its header [how it is sent, how
        many elements, checksum] and payload (the whole bucket, the changes' int32 indices and values, or nothing).
        Keeps `flat` as the last push and counts what changed. (numpy finds the changes 3x faster than torch's
        ``nonzero`` on one core: 11 against 32 ms for 32 MiB of bf16 here.)"""
        last = self.last[k]
        changed = None if last is None else torch.from_numpy(np.flatnonzero(bits(flat).numpy() != bits(last).numpy()))
        kind = sent_as(flat, changed)
        count = flat.numel() if changed is None else changed.numel()
        header = torch.tensor([kind, count, checksum(flat)])
        payload = [flat] if kind == DENSE else [changed.to(torch.int32), flat[changed]] if kind == SPARSE else []
        if kind == SPARSE and fault_at("corrupt_delta", version):  # fault test: a change lost on the way
            payload[1] = payload[1].clone()
            payload[1][0] = -payload[1][0] if payload[1][0] != 0 else 1.0
        self.last[k] = flat
        s = self.stats
        s["changed"], s["elements"] = s["changed"] + count, s["elements"] + flat.numel()
        s["dense_bytes"] += flat.nbytes
        s["tensors_touched"] += touched(metas, bucket, changed)
        return header, payload

    def decode(self, k: int, header: list[int], payload: list, whole: bool, metas, bucket, version: int):
        """An engine worker: bucket `k` from its header and payload, written into this side's copy and checked
        against the learner's checksum; a loud error when it was sent as changes to a push this side never had or
        when the sums differ (naming the bucket)."""
        kind, _, expected = header
        if whole and kind != DENSE:
            raise RuntimeError(
                f"delta push of version {version}: bucket {k} came as changes to a push this engine never had"
            )
        if kind == DENSE:
            self.last[k] = payload[0] if payload[0].device.type == "cpu" else payload[0].cpu()
        elif kind == SPARSE:
            self.last[k][payload[0].long().cpu()] = payload[1].cpu()
        got = checksum(self.last[k])
        if got != expected:
            raise RuntimeError(
                f"delta push of version {version}: bucket {k} ({metas[bucket[0]].name} ... "
                f"{metas[bucket[-1]].name}) holds other weights than the learner's after its changes (checksum "
                f"{got} against {expected}): a change was lost or applied to another base"
            )
        return self.last[k]


def payload_shapes(kind: int, count: int, numel: int, dtype: torch.dtype) -> list[tuple[int, torch.dtype]]:
    """What follows a header: (elements, dtype) of each tensor."""
    return {DENSE: [(numel, dtype)], SPARSE: [(count, torch.int32), (count, dtype)], SAME: []}[kind]


class Changes:
    """What the delta transports share, mixed in before their medium's class (``Collective``, ``Storage``): the
    copies (forgotten at every ``join``: the next push is whole), the planner's view of a push, and the send loop,
    whose medium is ``put``."""

    finds_changes = True

    @classmethod
    def bytes_share(cls, recipe) -> float:
        return bytes_share(recipe)

    def __init__(self, recipe):
        super().__init__(recipe)
        self.copies = Copies()

    def join(self, where: dict) -> None:
        super().join(where)
        self.copies.forget()  # connected again (an engine replaced, a push failed): the next push is whole

    def send(self, metas, fill, bucket_bytes, phases, device, version) -> int:
        sent, buckets = 0, plan_buckets(metas, bucket_bytes)
        self.copies.start(len(buckets))
        for k, bucket in enumerate(buckets):
            wire = torch.empty(sum(metas[i].numel for i in bucket), dtype=metas[bucket[0]].torch_dtype, device=device)
            fill(bucket, wire)
            with phases("delta"):  # the copy is kept on the host (a view of `wire` on CPU)
                header, payload = self.copies.encode(k, wire.cpu(), metas, bucket, version)
            with phases("wire"):
                self.put(version, k, header, payload, wire)
            sent += header.nbytes + sum(t.nbytes for t in payload)
        self.stats = self.copies.stats
        return sent

    def put(self, version: int, k: int, header: torch.Tensor, payload: list, wire: torch.Tensor) -> None:
        """Send bucket `k`'s header and payload (`wire`: the bucket as filled, on the learner's device)."""
        raise NotImplementedError

    def __getstate__(self):  # the copies are this process's own: never pickled
        return {**super().__getstate__(), "copies": Copies()}


class Delta(Changes, Collective):
    name = "delta"

    def put(self, version, k, header, payload, wire) -> None:
        for t in [header, *([wire] if header[0] == DENSE else payload)]:  # a whole bucket from where it was filled
            self.group.broadcast(t.to(wire.device)).wait()

    def receive(self, metas, bucket_bytes, device, phases, version) -> Iterator[Bucket]:
        buckets = plan_buckets(metas, bucket_bytes)
        whole = self.copies.start(len(buckets))
        for k, bucket in enumerate(buckets):
            numel, dtype = sum(metas[i].numel for i in bucket), metas[bucket[0]].torch_dtype
            header = torch.empty(3, dtype=torch.int64, device=device)
            with phases("wire"):
                self.group.broadcast(header).wait()
                header = header.tolist()
                shapes = payload_shapes(header[0], header[1], numel, dtype)
                payload = [self.buffers.take(n, d, device) for n, d in shapes]
                for t in payload:
                    self.group.broadcast(t).wait()
            with phases("delta"):  # the copy is kept on the host
                flat = self.copies.decode(k, header, payload, whole, metas, bucket, version)
            yield unflatten(flat, metas, bucket)
        self.buffers.trim()


def sent_as(flat: torch.Tensor, changed: torch.Tensor | None) -> int:
    """DENSE with no last push or when the changes' (index, value) pairs would be no smaller; SAME when nothing
    changed; else SPARSE."""
    if changed is None or changed.numel() * (4 + flat.element_size()) >= flat.nbytes:
        return DENSE
    return SAME if changed.numel() == 0 else SPARSE


def touched(metas: list[WeightMeta], bucket: list[int], changed: torch.Tensor | None) -> int:
    """How many of the bucket's tensors have an element in `changed` (ascending flat indices; all of them when sent
    whole): those whose end has more changes before it than the tensor before them."""
    if changed is None:
        return len(bucket)
    ends = torch.tensor([metas[i].numel for i in bucket]).cumsum(0)
    before = torch.searchsorted(changed.long(), ends)
    return int((before.diff(prepend=before.new_zeros(1)) > 0).sum())


TRANSPORT = Delta
