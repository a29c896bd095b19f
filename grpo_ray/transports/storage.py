"""The storage weight transport (``trainer.weight_transport: storage``): learner rank 0 writes each bucket of a
push as a safetensors file, ``<trainer.weight_dir>/grpo-ray-v<version>/bucket_<k>.safetensors`` (written aside,
then renamed: a reader never sees half a file), and every engine worker loads the buckets in order as they appear,
waiting at most ``trainer.sync_timeout_s`` for each. A directory every node sees (a shared filesystem) is all it
needs: no collective path between the learner's nodes and the engines'. The driver removes a version's files
once every engine has loaded it (``done``), and any older ones left by a push that failed.

The sender writes while the engines read: the engines load bucket k while the learner assembles and writes bucket
k + 1. Each file is loaded straight onto the worker's device as a tensor of its own, so the engine may keep views
of it as of the collective's buckets.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from grpo_ray.rundir import writable_dir
from grpo_ray.sync import plan_buckets, unflatten
from grpo_ray.transports.base import Bucket, Transport

POLL_S = 0.005
PREFIX = "grpo-ray-v"
"""A push's folder in trainer.weight_dir, ``grpo-ray-v<version>``: the only folders the transport removes (and
only the bucket files it wrote in them), so a weight_dir holding folders of the user's loses nothing."""


class Storage(Transport):
    @classmethod
    def check(cls, recipe) -> None:
        """trainer.weight_dir (or <output_dir>/weights) can be written."""
        t = recipe.trainer
        writable_dir(t.weight_dir or str(Path(t.output_dir) / "weights"), "trainer.weight_dir")

    name = "storage"

    def __init__(self, recipe):
        self.dir = Path(recipe.trainer.weight_dir or Path(recipe.trainer.output_dir) / "weights").resolve()
        self.timeout_s = recipe.trainer.sync_timeout_s

    def connect(self, pools) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        gens = pools.generators
        pools.call([g.where.remote() for g in gens], "engines ready")
        pools.call(
            [a.join_transport.remote(self, {}) for a in [pools.learners[0], *gens]],
            "weight transport",
            self.timeout_s,
        )

    def join(self, where: dict) -> None:
        if not self.dir.is_dir():
            raise RuntimeError(
                f"trainer.weight_dir={str(self.dir)!r} is not a directory on this node: the storage "
                "transport needs one that every node sees"
            )

    def path(self, version: int, k: int) -> Path:
        return self.dir / f"{PREFIX}{version}" / f"bucket_{k:05d}.safetensors"

    def write(self, version: int, k: int, tensors: dict[str, torch.Tensor]) -> None:
        """Learner rank 0: bucket `k`'s file of push `version` (written aside, then renamed)."""
        final = self.path(version, k)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_suffix(".tmp")
        save_file({n: t.cpu() for n, t in tensors.items()}, str(tmp))
        os.replace(tmp, final)

    def read(self, version: int, k: int, device) -> dict[str, torch.Tensor]:
        """An engine worker: bucket `k`'s file of push `version` once it is there (at most trainer.sync_timeout_s
        from now), loaded onto `device` as fresh tensors (views of them may be kept)."""
        path = self.path(version, k)
        deadline = time.monotonic() + self.timeout_s
        while not path.is_file():
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"weight push {version}: {path} did not appear within trainer.sync_timeout_s={self.timeout_s:g}"
                )
            time.sleep(POLL_S)
        return load_file(str(path), device=str(device))

    def send(self, metas, fill, bucket_bytes, phases, device, version) -> int:
        sent = 0
        for k, bucket in enumerate(plan_buckets(metas, bucket_bytes)):
            flat = torch.empty(sum(metas[i].numel for i in bucket), dtype=metas[bucket[0]].torch_dtype, device=device)
            fill(bucket, flat)
            with phases("wire"):
                self.write(version, k, {"flat": flat})
            sent += flat.numel() * flat.element_size()
        return sent

    def receive(self, metas, bucket_bytes, device, phases, version) -> Iterator[Bucket]:
        for k, bucket in enumerate(plan_buckets(metas, bucket_bytes)):
            with phases("wire"):
                flat = self.read(version, k, device)["flat"]
            out = unflatten(flat, metas, bucket)
            del flat  # the views alone keep the buffer: it goes as soon as the engine drops them
            yield out

    def done(self, version: int) -> None:
        for old in self.dir.glob(f"{PREFIX}*"):
            n = old.name.removeprefix(PREFIX)
            if not (n.isdigit() and int(n) <= version):
                continue
            for f in old.glob("bucket_*"):
                if f.suffix in (".safetensors", ".tmp"):  # only the files a push writes
                    f.unlink(missing_ok=True)
            try:
                old.rmdir()  # empty now, unless someone else's files are in it: those stay, with the folder
            except OSError:
                pass


TRANSPORT = Storage
