"""The keeper of the learner's state copies (trainer.fault_tolerance=all, ``Pools.copy_state``): one actor on the
driver's node, for the run, holding each rank's newest copy in its memory, so a lost node takes nothing a recovery
needs (the driver's own node ends the job anyway). A module of its own: the actor's process imports only this and
torch. A copy is safe once it is here: until then (its transfer, while the step trains) a lost node takes it along,
and the recovery says so rather than start from an older one (the job then starts the run again from its newest
whole checkpoint: ``grpo_ray.jobs.launch.kept_going``)."""

from __future__ import annotations

import ray


class Keeper:
    def __init__(self):
        import torch  # noqa: F401  (a copy's tensors need it: imported as the pools start, not as the first copy waits)

        self.kept: dict[tuple[str, int], tuple[int, dict]] = {}

    def hold(self, key: tuple[str, int], tag: int, boxed: list) -> None:
        """Keep the copy behind ``boxed[0]`` (a ref in a list: the call takes its turn as sent, and waits for the copy
        here) as `key`'s copy number `tag`."""
        self.kept[key] = (tag, ray.get(boxed[0]))

    def give(self, key: tuple[str, int], tag: int) -> dict:
        """`key`'s copy number `tag`; never an older one (a step trained again from another step's state)."""
        held, state = self.kept.get(key, (None, None))
        if held != tag:
            raise RuntimeError(f"{key[0]} {key[1]}'s copy {tag} never reached the keeper (it holds copy {held})")
        return state
