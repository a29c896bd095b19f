"""The weight transport interface (``grpo_ray.transports`` says what each side does and which exist)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from grpo_ray.sync import Phases, WeightMeta

Bucket = list[tuple[str, torch.Tensor]]


class Transport:
    """One way for a push's buckets to go from learner rank 0 to every engine worker. Built on the driver from
    the recipe, then pickled to the learner and into each engine worker, where ``join`` gives that process its
    side; the state a side builds there (a process group, a directory) lives in that process only."""

    name = ""
    stats: dict = {}
    """Learner rank 0: counts of its last send beyond its bytes (a delta push's: what changed), added to the push's
    timings as they are (``WeightsOut.push_weights``); set, never mutated, by a transport that has any."""

    finds_changes = False
    """Learner rank 0 compares every bucket with the last push (the planner times it at ``Rates.changes_bps``)."""

    @classmethod
    def bytes_share(cls, recipe) -> float:
        """The planner's expectation of a push's bytes (after the first) against a whole push's."""
        return 1.0

    @classmethod
    def check(cls, recipe) -> None:
        """Before any actor starts: raise RecipeError naming the key when the recipe cannot work with this
        transport."""

    def connect(self, pools) -> None:
        """Driver: join learner rank 0 and every worker of every engine (at start, and again after an engine is
        replaced), through the actors' ``join_transport``."""
        raise NotImplementedError

    def join(self, where: dict) -> None:
        """This process's side (learner rank 0, or one engine worker), as ``connect`` placed it."""
        raise NotImplementedError

    def send(
        self,
        metas: list[WeightMeta],
        fill: Callable[[list[int], torch.Tensor], None],
        bucket_bytes: int,
        phases: Phases,
        device: torch.device,
        version: int,
    ) -> int:
        """Learner rank 0: every bucket of ``sync.plan_buckets(metas, bucket_bytes)`` out, in order, each filled by
        ``fill(bucket, flat)`` (in the wire dtype); the bytes sent. Time on the wire goes to ``phases("wire")``."""
        raise NotImplementedError

    def receive(
        self, metas: list[WeightMeta], bucket_bytes: int, device: torch.device, phases: Phases, version: int
    ) -> Iterator[Bucket]:
        """One engine worker: what ``send`` sent for `version`, a bucket at a time as (name, tensor) pairs in
        `metas` order, each a fresh buffer the caller may keep views of. Time on the wire: ``phases("wire")``."""
        raise NotImplementedError

    def close(self) -> None:
        """This process's side, after a push failed on it (the driver connects again)."""

    def done(self, version: int) -> None:
        """Driver: every engine has loaded `version`; free what the push left."""
