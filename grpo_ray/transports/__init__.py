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
A new transport is one module here whose ``TRANSPORT`` is its ``Transport`` subclass: the module's name is its
``trainer.weight_transport`` value. A user's own is named ``module:Class``.
"""

from __future__ import annotations

import importlib
import pkgutil

from grpo_ray.algo.registry import FunctionError, imported
from grpo_ray.config import RecipeError
from grpo_ray.transports.base import Transport


def available() -> list[str]:
    """The transports of this package: each module but ``base``."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name != "base")


def transport_class(name: str) -> type[Transport]:
    """The Transport class `name` names: a module of this package (its ``TRANSPORT``), or a user's ``module:Class``.
    RecipeError naming ``trainer.weight_transport`` when there is none."""
    where = f"trainer.weight_transport={name!r}"
    if ":" in name:
        try:
            cls = imported(name)
        except FunctionError as e:
            raise RecipeError(f"{where}: {e}") from None
    elif name in available():
        cls = importlib.import_module(f"{__name__}.{name}").TRANSPORT
    else:
        raise RecipeError(f"{where}: expected one of {', '.join(available())} (grpo_ray/transports/), or module:Class")
    if not (isinstance(cls, type) and issubclass(cls, Transport)):
        raise RecipeError(f"{where}: {cls!r} is not a grpo_ray.transports.base.Transport subclass")
    return cls


def check(recipe) -> None:
    """Before start: the recipe's transport exists and has what it needs (``Transport.check``)."""
    transport_class(recipe.trainer.weight_transport).check(recipe)


def build(recipe) -> Transport:
    """The recipe's weight transport (``trainer.weight_transport``)."""
    return transport_class(recipe.trainer.weight_transport)(recipe)
