"""The batched schedule's batches (``schedules/batched.py``'s rules): a batch a step, launched on the engines and
collected whole. When the schedule launches ahead, the next step's batch is launched before this one is waited on,
so the engines generate it while the learner trains; once generated (while the learner still trains) it is
collected and sent to the scorers, and read when its step starts.

An engine runs its calls in the order they were sent, so a batch is generated with the weights of the last push sent
before it (``Launched.version``), and a push waits for the generation ahead of it.
"""

from __future__ import annotations

from grpo_ray.engines import Launched
from grpo_ray.pools import PoolFault
from grpo_ray.sources import BatchSource, Collected


class Batched(BatchSource):
    def next(self, step: int, version: int, last_update: tuple[float, float]) -> tuple[Collected, dict[str, float]]:
        """The batch launched during the last step (maybe collected already) or now; the next one launched ahead
        when the schedule says, before this one is waited on."""
        batch = self.inflight.pop(step, None) or self.launch(step)
        if self.launches_ahead(step):
            self.inflight[step + 1] = self.launch(step + 1)  # generated while this step trains
        return self.collect(batch), {}

    def ahead(self, step: int, version: int) -> None:
        """The next batch collected and sent to the scorers while the learner trains: the engines have it soon after
        the update ends anyway (the push waits for it). If an engine failed, the batch as it was: it is replaced
        when the next step starts, after the update, so that its new weights are those of a finished update."""
        batch = self.inflight.get(step + 1)
        if batch is not None:
            try:
                self.inflight[step + 1] = self.collect(batch, recover=False)
            except PoolFault:
                pass

    def more(self, step: int, version: int) -> tuple[list, list]:
        """A batch launched and collected."""
        return self.h.engines.collect(self.launch(step))

    def launch(self, step: int) -> Launched:
        """The stream's next prompts sent to the engines."""
        return self.h.engines.launch(step, self.h.prompts())

    def collect(self, batch: Launched | Collected, recover: bool = True) -> Collected:
        """The batch's rollouts from the engines (replacing an engine that failed, if `recover`), sent to the
        scorers; a batch collected ahead as it is."""
        if isinstance(batch, Collected):
            return batch
        rollouts, stats = self.h.engines.collect(batch, recover)
        return self.h.send(rollouts, stats, batch.version)
