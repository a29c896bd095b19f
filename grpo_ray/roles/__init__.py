"""One Ray actor class per role: Generator, Learner, Reference (and the teacher), RewardModel, Judge, RewardWorker.

They share ``RoleActor``: what an actor is started with (``start_args`` of its ``Seat``), where it runs and how much
memory it has used, and
``log_to_file``: at ``trainer.log_level: info`` each actor's process writes its output (vLLM's,
transformers' and Ray's worker lines included) to ``<output_dir>/logs/<pool>-<i>.log`` instead of the
console; at ``debug`` Ray forwards it to the console as it comes.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass

from grpo_ray.config import Recipe
from grpo_ray.device import Device
from grpo_ray.models.dims import ModelDims

LOG_FILE_ENV = "GRPO_RAY_LOG_FILE"


def log_to_file() -> None:
    """Send this process's stdout and stderr (file descriptors 1 and 2, so C++ and child output too) to the
    file in GRPO_RAY_LOG_FILE, when it is set. Called first thing in each role's __init__."""
    path = os.environ.get(LOG_FILE_ENV)
    if not path:
        return
    import sys

    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


@dataclass(frozen=True)
class Seat:
    """An actor's place in its pool, what ``Pools`` starts it with: each role reads what it needs (``start_args``)."""

    pool: str
    rank: int
    """Its index in the pool (its bundle, its rank in the pool's group)."""
    count: int
    """The pool's actors."""
    threads: int
    """Its compute threads (``placement.threads``)."""
    model_path: str
    """Its model, loadable by transformers and vLLM (the row's ``model``), or empty."""
    recipe: Recipe
    dims: ModelDims
    """The policy's shape."""


class RoleActor:
    run_on: Device = Device()
    """The run's device (``cluster.device``): what this actor's memory is reported as."""
    ENGINE = False
    """A vLLM engine runs in the actor's process (started with the device's engine environment)."""
    CONCURRENCY = 1
    """Calls the actor runs at once."""

    @classmethod
    def concurrency(cls, recipe: Recipe) -> int:
        """Calls the actor runs at once in a run of `recipe`."""
        return cls.CONCURRENCY

    @classmethod
    def eager(cls, recipe: Recipe) -> bool:
        """Whether the actor's engine (``ENGINE``) runs eagerly in a run of `recipe` (its enforce_eager)."""
        return False

    @classmethod
    def start_args(cls, seat: Seat) -> tuple:
        """The constructor's arguments for the actor at `seat`: a frozen scorer's, by default."""
        return (seat.model_path, seat.recipe, seat.rank, seat.count, seat.threads)

    def close(self) -> None:
        """Free what the actor made outside its process (child processes, folders) before it is killed."""

    def where(self) -> dict:
        """Node id, pid and compute threads (torch's, when loaded) of this actor, for placement.json."""
        import ray

        torch = sys.modules.get("torch")
        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "threads": torch.get_num_threads() if torch else None,
        }

    def peak_memory_gb(self) -> tuple[str, float]:
        """("max_memory_allocated_gb", GB) when this actor's torch holds its model on a GPU,
        else ("peak_rss_gb", GB): the peak resident set size of the process."""
        if self.run_on.gpu:
            import torch

            return self.run_on.memory_metric, torch.cuda.max_memory_allocated() / 1e9
        import resource

        return self.run_on.memory_metric, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KiB on Linux


def mark_rss() -> float:
    """Start a memory window in this process (a measurement: run it in an actor with ``actor.__ray_call__``): give
    the heap's free pages back (``trim_heap``), reset the peak RSS (Linux clear_refs) and return the RSS now, GB.
    So the window's peak counts what the work in it allocates above what is live, not what glibc kept of earlier
    frees (which the work may or may not reuse)."""
    trim_heap()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_kb("VmRSS") / 1e6


def peak_rss_since_mark() -> float:
    """The peak RSS of this process since ``mark_rss``, GB."""
    return _status_kb("VmHWM") / 1e6


def trim_heap() -> None:
    """Give the heap's free pages back to the OS (glibc's malloc_trim: 2 ms on the tiny recipe's raw engine, about
    10 ms in a generator's step). Without it, an engine's heap stepped up by tens of MB late in a long run
    (benchmarks/soak.py). Once a generate call: fixing glibc's mmap threshold at 64 KiB instead, the earlier cure,
    made every larger tensor a fresh mapping and generation 1.5x slower (the heap lever in
    benchmarks/results/peer/peer.md)."""
    trim = getattr(_libc(), "malloc_trim", None)  # glibc only
    if trim:
        trim(0)


@functools.cache
def _libc():
    """The C library this process already runs on (looked up once: ctypes' find_library runs ldconfig)."""
    import ctypes

    return ctypes.CDLL(None)


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))
