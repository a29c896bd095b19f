"""The FSDP2 seam shared by the learner and the reference: join a group, shard a model, gather its weights.

A model is sharded in units, one per transformer block and the root (embeddings, final norm, LM head);
each parameter is cut along dimension 0 over the ranks. For the weight sync, ``gather_bucket`` assembles one
bucket of full tensors on rank 0 from the shards by point-to-point sends, with no unit unsharded anywhere:
on gloo this moves the bytes 12x faster than FSDP2's all-gathers (measured, 122M parameters, 2 ranks:
0.09 s against 1.1 s), and only rank 0 needs them.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from grpo_ray import sync
from grpo_ray.device import Device


def join(device: Device, host: str, port: int, rank: int, world_size: int):
    """Join the role's process group (gloo on CPU, nccl on GPU); returns its one-dimensional device mesh."""
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group(
        device.backend,
        init_method=f"tcp://{host}:{port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(minutes=10),
    )
    if device.gpu:
        torch.cuda.set_device(device.torch)  # Ray gives each actor one GPU
    return init_device_mesh(device.kind, (world_size,))


def shard(model: torch.nn.Module, mesh, param_dtype: torch.dtype, reduce_dtype: torch.dtype = torch.float32):
    """FSDP2 over `mesh`: one unit per transformer block (``blocks``), then the root (a transformers model; with
    LoRA, the one inside the peft wrapper)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    for layer in blocks(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's transformer blocks: each member of a module list named ``layers`` (a causal LM's decoder blocks;
    a vision-language model's language and vision towers' too)."""
    return [
        block
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.ModuleList) and name.rsplit(".", 1)[-1] == "layers"
        for block in m
    ]


def shard_rows(rows: int, world_size: int) -> list[int]:
    """Rows of dimension 0 each rank holds: FSDP2 cuts it into chunks of ceil(rows / W), the last ones short or
    empty (torch.chunk's sizes, padded with empty chunks)."""
    chunk = -(-rows // world_size)
    return [max(0, min(chunk, rows - r * chunk)) for r in range(world_size)]


def largest_unit_bytes(metas: list[sync.WeightMeta]) -> int:
    """Bytes of the largest FSDP unit among `metas` (a block ``...layers.N``, or the root: the rest)."""
    units: dict[str, int] = {}
    for m in metas:
        parts = m.name.split(".")
        at = next((k for k in range(len(parts) - 1) if parts[k] == "layers" and parts[k + 1].isdigit()), None)
        key = ".".join(parts[: at + 2]) if at is not None else ""
        units[key] = units.get(key, 0) + m.nbytes
    return max(units.values(), default=0)


def reshard(model: torch.nn.Module) -> None:
    """Free every unsharded parameter (FSDP2 keeps the root's after a forward), so each is a DTensor shard."""
    from torch.distributed.fsdp import FSDPModule

    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def local_rows(p) -> torch.Tensor:
    """This rank's rows of a sharded parameter (FSDP2 cuts every parameter along dimension 0)."""
    from torch.distributed.tensor import Shard

    if tuple(p.placements) != (Shard(0),):  # the sync's row layout depends on it: never send misplaced rows
        raise RuntimeError(f"expected FSDP2's Shard(0) placement, got {p.placements}")
    return p.to_local()


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of `t`: a DTensor's local shard, any other tensor itself."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def host_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of this rank's part of `t` on the host."""
    return local(t).detach().to("cpu", copy=True)


def shaped_like(p: torch.Tensor, saved: torch.Tensor) -> torch.Tensor:
    """`saved` (a ``host_copy``) as a tensor of optimizer state for parameter `p`: sharded as `p` where it has p's
    shape (Adam's moments), else as it was (its step count)."""
    if saved.shape != local(p).shape:
        return saved
    out = torch.zeros_like(p)
    local(out).copy_(saved)
    return out


def gather_bucket(
    rows_of: dict, metas: list[sync.WeightMeta], bucket: list[int], flat: torch.Tensor | None, phases: sync.Phases
) -> None:
    """One bucket of full weights assembled on rank 0 from every rank's rows, straight into `flat` (the bucket
    buffer, wire dtype; None on the other ranks); `rows_of[name]()` gives this rank's rows of a weight (its shard,
    or with LoRA its shard merged with the adapters). No parameter is unsharded: rank 0 copies its own rows into
    place (with the cast), and receives each other rank's rows, cast by their owner, into place; every rank
    must call it for every bucket, in the same order."""
    rank, world = dist.get_rank(), dist.get_world_size()
    ops, keep, offset = [], [], 0
    for i in bucket:
        m = metas[i]
        per_row = m.numel // m.shape[0] if m.shape and m.shape[0] else m.numel
        rows = shard_rows(m.shape[0], world)
        local = rows_of[m.name]()  # on every rank, even one without rows: a LoRA merge gathers its A collectively
        if rank == 0:
            start = offset
            for r, n in enumerate(rows):
                piece = flat[start : start + n * per_row]
                if r == 0:
                    with phases("cast"):
                        piece.copy_(local.reshape(-1))
                elif n:
                    ops.append(dist.P2POp(dist.irecv, piece, r))
                start += n * per_row
        elif rows[rank]:
            with phases("cast"):
                wire = local.detach().reshape(-1).to(m.torch_dtype)
            keep.append(wire)
            ops.append(dist.P2POp(dist.isend, wire, 0))
        offset += m.numel
    with phases("gather"):
        for work in dist.batch_isend_irecv(ops) if ops else []:
            work.wait()
