"""Reward-model training on the learner pool: ``grpo-ray rm RECIPE``.

The SFT run's machinery with another step and another model: the same FSDP2 learner actors (``RewardLearner``: a
sequence classifier with one output on model.path), data stream, checkpoints and resume, metrics, TensorBoard and
console. A step takes data.train_batch_size rows, each a preference pair (rm.chosen_key over rm.rejected_key,
Bradley-Terry) or a pointwise row (the response at rm.response_key, its label at rm.label_key, binary
cross-entropy), each conversation rendered in the model's chat template as the reward-model pool renders a rollout.
With validation rows and trainer.test_freq, the held-out rows give val/rm/accuracy (the share the model orders
right), val/rm/loss and val/rm/margin.

After the last step the final checkpoint is exported as a Hugging Face sequence classifier to
``<output_dir>/model``, which a GRPO recipe names as its reward_model.model.
"""

from __future__ import annotations

import time
from pathlib import Path

import ray

from grpo_ray import checkpoint
from grpo_ray.config import LEARNER, Recipe, RMConfig
from grpo_ray.data.targets import RM_IDS
from grpo_ray.jobs.launch import connect
from grpo_ray.roles.reward_learner import RewardLearner
from grpo_ray.runner import Runner
from grpo_ray.setup_run import RunInputs
from grpo_ray.telemetry import perf


def rm_rows(rows: list[dict], rm: RMConfig) -> list[tuple]:
    """The learner's rows: (chosen ids, rejected ids) of each pair, or (response ids, label) of each pointwise row
    (rm.label_key)."""
    if rm.label_key:
        return [(row["response_ids"], row["label"]) for row in rows]
    return [(row["chosen_ids"], row["rejected_ids"]) for row in rows]


class RMController(Runner):
    """Runs reward-model steps on the learner pool; validation scores the held-out rows there too."""

    save_at_end = True
    job = "rm"
    roles = {LEARNER: RewardLearner}

    def pools_needed(self) -> tuple[str, ...]:
        return (LEARNER,)

    def step(self, step: int) -> dict[str, float]:
        start = time.perf_counter()
        rows = [row for _, row in self.stream.next_batch()]
        batch = ray.put(rm_rows(rows, self.r.rm))  # one object for all ranks
        learners = self.pools.learners
        trained = self.call([l.rm_train.remote(batch) for l in learners], "learner rm")[0]
        self.version += 1
        tokens = sum(len(row[k]) for row in rows for k in RM_IDS if k in row)
        seconds = time.perf_counter() - start
        return {
            **trained,
            "perf/throughput": perf.throughput(tokens, seconds, self.r.learner.world_size),
            **self.pools.memory(),
            "timing_s/step": seconds,
        }

    def validate(self, step: int) -> dict[str, float]:
        batch = ray.put(rm_rows(self.inputs.val_rows, self.r.rm))
        learners = self.pools.learners
        return self.call([l.rm_validate.remote(batch) for l in learners], "reward model validation")[0]


def run_rm(recipe: Recipe, inputs: RunInputs) -> Path:
    """Train, then export the last checkpoint to <output_dir>/model (replaced whole); its path."""
    connect(recipe)
    RMController(recipe, inputs).run()
    last = checkpoint.find_resume(inputs.output_dir, "auto")
    return checkpoint.run_export(last, inputs.output_dir)
