"""Weight transports: how the learner's weights reach the engines.

One module per transport, chosen by ``trainer.weight_transport``:

- ``collective`` (the default): a torch.distributed process group of its own over learner rank 0 and every
  engine worker; each bucket is broadcast (nccl on GPUs, gloo on CPU) while the next one is assembled.
- ``storage``: learner rank 0 writes each bucket as a safetensors file under ``trainer.weight_dir``, and every
  engine worker loads it as soon as it is there. For node pools with no collective path between them (only a
  shared filesystem) and for debugging: a push's files can be read while it runs.

A transport is one object (``base.Transport``), built here on the driver and pickled to the actors. Its sides
run in three kinds of process:

    driver         connect(pools)   join learner rank 0 and every engine worker (again after an engine is replaced)
                   done(version)    a push is loaded everywhere: free what it left
    learner rank 0 send(...)        the buckets out, each filled by the learner's gather from its ranks' shards
    engine worker  receive(...)     the buckets in, one at a time, which vLLM loads in place as they arrive

Every side cuts the learner's ``WeightMeta`` list into the same buckets (``sync.plan_buckets``), so no side
tells another what comes. The probe that checks a push (``Engines.sync``) is the same for every transport.
A new transport is one module here with a ``Transport`` subclass, and one name in ``TRANSPORTS``.
"""

from __future__ import annotations

from grpo_ray.transports.base import Transport

TRANSPORTS = ("collective", "storage")


def build(recipe) -> Transport:
    """The recipe's weight transport (``trainer.weight_transport``)."""
    name = recipe.trainer.weight_transport
    if name == "collective":
        from grpo_ray.transports.collective import Collective

        return Collective(recipe)
    if name == "storage":
        from grpo_ray.transports.storage import Storage

        return Storage(recipe)
    raise ValueError(f"trainer.weight_transport={name!r}: expected one of {', '.join(TRANSPORTS)}")
