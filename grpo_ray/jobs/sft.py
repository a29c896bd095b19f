"""Supervised fine-tuning on the learner pool: ``grpo-ray sft RECIPE``, and the ``sft://RECIPE`` warm start.

An SFT run is the GRPO run's machinery with another step: the same FSDP2 learner actors, data
stream, checkpoints (and resume), metrics, TensorBoard and console. A step takes
data.train_batch_size rows, each a prompt (chat template applied) and its target (the text at
sft.target_key, then end of sequence); the loss is the target tokens' negative log-likelihood,
token mean over each mini batch. With validation rows and trainer.test_freq, the weights are
pushed to a generator and pass@1 is measured with the recipe's rewards, as in GRPO.

After the last step the final checkpoint is exported as a Hugging Face model to
``<output_dir>/model``, which a GRPO recipe names as its model.path. A GRPO recipe may instead
name ``sft://RECIPE.yaml``: the SFT recipe then runs the first time (in the cache, keyed by the hash
of the resolved recipe) and later runs reuse its model.
"""

from __future__ import annotations

import time
from pathlib import Path

import ray

from grpo_ray import checkpoint, models
from grpo_ray.config import GENERATOR, LEARNER, RULES, Recipe, load_recipe
from grpo_ray.jobs.launch import connect, kept_going
from grpo_ray.runner import Runner
from grpo_ray.setup_run import RunInputs, setup_run
from grpo_ray.telemetry import perf


class SFTController(Runner):
    """Runs SFT steps on the learner pool; starts generators and rewards only to validate."""

    save_at_end = True
    job = "sft"

    def pools_needed(self) -> tuple[str, ...]:
        validating = self.inputs.val_rows and (self.r.trainer.test_freq or self.r.trainer.val_before_train)
        return (LEARNER, GENERATOR, RULES) if validating else (LEARNER,)

    def step(self, step: int) -> dict[str, float]:
        start = time.perf_counter()
        rows = [row for _, row in self.stream.next_batch()]
        pairs = ray.put([(row["prompt_ids"], row["target_ids"]) for row in rows])  # one small object for all ranks
        traced = any("target_mask" in row for row in rows)  # multi-turn traces: observations are not trained on
        masks = ray.put([row.get("target_mask") or [1] * len(row["target_ids"]) for row in rows]) if traced else None
        pictures = any("prompt_images" in row for row in rows)  # a vision-language model's: its prompt ids expanded
        images = ray.put([row.get("prompt_images") or [] for row in rows]) if pictures else None

        def calls() -> list:  # (again, by a group started again from the copies, where a rank is lost in them)
            return [l.sft_train.remote(pairs, masks, images) for l in self.pools.learners]

        said = "starting the learner group again from the copy of its state as the step began"
        trained = self.pools.kept_call(LEARNER, calls, "learner sft", said, redone=1)[0]
        self.version += 1
        seconds = time.perf_counter() - start
        lengths = [len(row["prompt_ids"]) + len(row["target_ids"]) for row in rows]
        facts, ranks = self.pools.facts, self.r.learner.world_size
        mfu = (
            {"perf/mfu": perf.mfu(trained["actor/flops"], seconds, facts["peak_tflops"], ranks)}
            if facts["peak_tflops"]
            else {}
        )
        return {
            **trained,
            **mfu,
            "perf/throughput": perf.throughput(sum(lengths), seconds, ranks),
            "response_length/mean": sum(len(row["target_ids"]) for row in rows) / len(rows),
            **self.pools.memory(),
            **self.pools.copy_costs(),
            **{k: v for k, v in self.pools.fault_metrics().items() if k.startswith("fault/learner_")},
            "timing_s/step": seconds,
        }

    def validate(self, step: int) -> dict[str, float]:
        self.engines.sync()  # the generators sample with this step's weights
        return super().validate(step)


def run_sft(recipe: Recipe, inputs: RunInputs) -> Path:
    """Train, then export the last checkpoint to <output_dir>/model (replaced whole); its path."""
    connect(recipe)
    kept_going(lambda given: SFTController(recipe, given), inputs)
    last = checkpoint.find_resume(inputs.output_dir, "auto")
    return checkpoint.run_export(last, inputs.output_dir)


def warm_start(recipe_path: str) -> str:
    """The model of the SFT recipe at `recipe_path`: trained once, cached by the recipe's hash, then reused.
    The SFT run lives in the cache too, so an interrupted warm start resumes from its checkpoint. The job layer
    calls it (setup_run's `warm_start`); grpo_ray.models only finds what it made."""
    recipe = load_recipe(recipe_path, command="sft")
    home = models.sft_home(recipe)
    if (home / "run" / "model" / "config.json").is_file():
        print(f"SFT warm start: {recipe_path} done before, model at {home / 'run' / 'model'}")
        return str(home / "run" / "model")
    recipe.trainer.output_dir = str(home / "run")
    recipe.trainer.resume = "auto"
    recipe.trainer.overwrite = True  # the cache's own run: a warm start stopped before its first checkpoint restarts
    print(f"SFT warm start: training {recipe_path} once (run in {home / 'run'}, reused while the recipe is unchanged)")
    model = run_sft(recipe, setup_run(recipe, "sft", warm_start=warm_start))
    print(f"SFT warm start: model at {model}")
    return str(model)
