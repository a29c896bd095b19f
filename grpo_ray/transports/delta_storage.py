"""The delta storage transport (``trainer.weight_transport: delta_storage``): the storage transport's files
(``transports/storage.py``: one per bucket under ``trainer.weight_dir``, loaded by every engine worker as it
appears), each holding what the delta transport sends (``transports/delta.py``): the bucket's header, then the
whole bucket, or the indices and values of the elements that changed since the last push, or nothing. The same
copies, checksum and rules: the first push, and every push after ``connect``, is whole on both sides.

For node pools with only a shared filesystem between them, where a push's bytes are the files written and read by
every engine: a delta push writes and reads a share of them (slime and SkyRL send their deltas through storage).
"""

from __future__ import annotations

from collections.abc import Iterator

from grpo_ray.sync import plan_buckets, unflatten
from grpo_ray.transports.base import Bucket
from grpo_ray.transports.delta import DENSE, SPARSE, Changes
from grpo_ray.transports.storage import Storage

NAMES = {DENSE: ["flat"], SPARSE: ["index", "value"]}
"""A bucket file's payload tensors by how the bucket is sent (none when nothing changed), beside its header."""


class DeltaStorage(Changes, Storage):
    name = "delta_storage"

    def put(self, version, k, header, payload, wire) -> None:
        self.write(version, k, {"header": header, **dict(zip(NAMES.get(int(header[0]), []), payload))})

    def receive(self, metas, bucket_bytes, device, phases, version) -> Iterator[Bucket]:
        buckets = plan_buckets(metas, bucket_bytes)
        whole = self.copies.start(len(buckets))
        for k, bucket in enumerate(buckets):
            with phases("wire"):
                got = self.read(version, k, "cpu")  # the copy is kept on the host
            header = got["header"].tolist()
            with phases("delta"):
                payload = [got[n] for n in NAMES.get(header[0], [])]
                flat = self.copies.decode(k, header, payload, whole, metas, bucket, version)
            yield unflatten(flat.to(device), metas, bucket)


TRANSPORT = DeltaStorage
