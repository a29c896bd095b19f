"""One Ray actor class per role: Generator, Learner, Reference, RewardWorker.

They share only ``RoleActor``: where the actor runs and how much memory it has used.
"""

from __future__ import annotations

import os


class RoleActor:
    device: str = "cpu"

    def where(self) -> dict:
        """Node id and pid of this actor, for placement.json."""
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    def peak_memory_gb(self) -> tuple[str, float]:
        """("max_memory_allocated_gb", GB) when this actor's torch holds its model on a GPU,
        else ("peak_rss_gb", GB): the peak resident set size of the process."""
        if str(self.device).startswith("cuda"):
            import torch

            return "max_memory_allocated_gb", torch.cuda.max_memory_allocated() / 1e9
        import resource

        return "peak_rss_gb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KiB on Linux
