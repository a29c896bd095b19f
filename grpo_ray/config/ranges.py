"""The values each numeric recipe field may take (``RANGES``), checked before anything starts: one line per field
outside its range, 'key=value: must be ...'."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpo_ray.config.schema import Recipe


@dataclass(frozen=True)
class Range:
    """The values a numeric recipe field may take (NaN and infinities never)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    """`low` itself is not allowed."""
    high_open: bool = False
    """`high` itself is not allowed."""
    why: str = ""
    """Said after the range when a value is outside it."""

    def holds(self, v: float) -> bool:
        if v != v or v in (float("inf"), float("-inf")):
            return False
        if self.low is not None and (v < self.low or (self.low_open and v == self.low)):
            return False
        return self.high is None or (v < self.high or (not self.high_open and v == self.high))

    def text(self) -> str:
        if self.high is None:
            if self.low == 0:
                return "must be positive" if self.low_open else "must be >= 0"
            return (
                f"must be {'>' if self.low_open else '>='} {self.low:g}" if self.low is not None else "must be finite"
            )
        left = "(" if self.low_open else "["
        right = ")" if self.high_open else "]"
        return f"must be in {left}{self.low:g}, {self.high:g}{right}"


POSITIVE, NON_NEGATIVE, FINITE = Range(0, low_open=True), Range(0), Range()
SHARE = Range(0, 1, low_open=True, high_open=True)
RANGES: dict[str, Range] = {
    "model.lora.rank": NON_NEGATIVE,
    "model.lora.alpha": POSITIVE,
    "model.lora.dropout": Range(0, 1, high_open=True),
    "data.train_batch_size": POSITIVE,
    "data.max_prompt_length": POSITIVE,
    "generator.num_engines": POSITIVE,
    "generator.max_engines": NON_NEGATIVE,
    "generator.tensor_parallel_size": POSITIVE,
    "generator.gpu_memory_utilization": SHARE,
    "generator.max_model_len": NON_NEGATIVE,
    "generator.num_cpus": POSITIVE,
    "generator.val_temperature": NON_NEGATIVE,
    "generator.val_n": POSITIVE,
    "generator.timeout_s": POSITIVE,
    "generator.max_restarts": NON_NEGATIVE,
    "generator.sampling.temperature": Range(
        0, low_open=True, why="the learner divides logits by it; 0 (greedy) samples a group of identical responses"
    ),
    "generator.sampling.top_p": Range(0, 1, low_open=True),
    "generator.sampling.top_k": Range(-1, why="-1 turns it off"),
    "generator.sampling.max_tokens": POSITIVE,
    "learner.world_size": POSITIVE,
    "learner.mini_batch_size": POSITIVE,
    "learner.micro_batch_size": POSITIVE,
    "learner.num_cpus": POSITIVE,
    "learner.optim.lr": POSITIVE,
    "learner.optim.betas": Range(0, 1, high_open=True),
    "learner.optim.eps": POSITIVE,
    "learner.optim.weight_decay": NON_NEGATIVE,
    "learner.optim.warmup_steps": NON_NEGATIVE,
    "learner.optim.grad_clip": NON_NEGATIVE,
    "reference.num_actors": POSITIVE,
    "reference.micro_batch_size": POSITIVE,
    "reference.num_cpus": POSITIVE,
    "teacher.kl_coef": POSITIVE,
    "teacher.reward_weight": NON_NEGATIVE,
    "teacher.num_actors": POSITIVE,
    "teacher.micro_batch_size": POSITIVE,
    "teacher.num_cpus": POSITIVE,
    "reward_model.weight": FINITE,
    "reward_model.max_length": NON_NEGATIVE,
    "reward_model.num_actors": POSITIVE,
    "reward_model.micro_batch_size": POSITIVE,
    "reward_model.num_cpus": POSITIVE,
    "reward_model.judge.default": FINITE,
    "reward_model.judge.max_tokens": POSITIVE,
    "reward_model.judge.temperature": NON_NEGATIVE,
    "reward_model.judge.timeout_s": POSITIVE,
    "reward_model.judge.max_model_len": NON_NEGATIVE,
    "reward_model.judge.gpu_memory_utilization": Range(0, 1, low_open=True),
    "reward.functions.weight": FINITE,
    "reward.num_actors": POSITIVE,
    "reward.timeout_s": POSITIVE,
    "reward.memory_mb": Range(64, why="the child process needs room for Python"),
    "reward.max_processes": Range(2, why="the child process and a thread of its own"),
    "reward.scratch_mb": Range(1, why="a scratch folder of some room"),
    "reward.num_cpus": POSITIVE,
    "reward.max_error_share": Range(0, 1),
    "reward.max_error_steps": NON_NEGATIVE,
    "environment.max_turns": POSITIVE,
    "environment.max_tokens": POSITIVE,
    "environment.timeout_s": POSITIVE,
    "environment.memory_mb": Range(64, why="the child process needs room for Python"),
    "environment.max_processes": Range(4, why="the child process and the threads its episodes run on"),
    "environment.scratch_mb": Range(1, why="a scratch folder of some room"),
    "environment.workers": POSITIVE,
    "environment.max_observation_chars": POSITIVE,
    "algorithm.group_size": Range(2, why="GRPO compares samples of one prompt"),
    "algorithm.clip_ratio_low": Range(0, 1, high_open=True),
    "algorithm.clip_ratio_high": NON_NEGATIVE,
    "algorithm.kl_coef": NON_NEGATIVE,
    "algorithm.ppo_epochs": POSITIVE,
    "algorithm.max_staleness": NON_NEGATIVE,
    "algorithm.entropy_coeff": NON_NEGATIVE,
    "algorithm.overlong_buffer.len": NON_NEGATIVE,
    "algorithm.filter_groups.max_num_gen_batches": POSITIVE,
    "algorithm.overlong_buffer.penalty_factor": NON_NEGATIVE,
    "algorithm.rollout_correction.rollout_is_threshold": Range(
        1, low_open=True, why="a cap of the weights at 1 or below would down-weight every token"
    ),
    "algorithm.rollout_correction.rollout_rs_threshold": Range(1, low_open=True),
    "algorithm.rollout_correction.rollout_rs_threshold_lower": Range(
        0, 1, high_open=True, why="0 means 1 / the upper threshold"
    ),
    "cluster.nodes": POSITIVE,
    "cluster.devices_per_node": NON_NEGATIVE,
    "cluster.device_memory_gb": NON_NEGATIVE,
    "cluster.node_memory_gb": NON_NEGATIVE,
    "cluster.peak_tflops": NON_NEGATIVE,
    "trainer.total_steps": NON_NEGATIVE,
    "trainer.total_epochs": NON_NEGATIVE,
    "trainer.save_freq": NON_NEGATIVE,
    "trainer.keep_last": NON_NEGATIVE,
    "trainer.test_freq": NON_NEGATIVE,
    "trainer.dump_freq": NON_NEGATIVE,
    "trainer.seed": NON_NEGATIVE,
    "trainer.max_sync_logprob_diff": POSITIVE,
    "trainer.call_timeout_s": POSITIVE,
    "trainer.bucket_mb": POSITIVE,
    "trainer.sync_timeout_s": POSITIVE,
    "trainer.max_skipped_steps": POSITIVE,
    "reward_model.head": Range(-1, why="-1: the classifier's only output"),
    "trainer.preemption_grace_s": NON_NEGATIVE,
    "sft.max_target_length": POSITIVE,
    "rm.max_length": POSITIVE,
    "trainer.early_stop.patience": POSITIVE,
    "trainer.early_stop.min_delta": NON_NEGATIVE,
}
"""Every numeric field of the recipe and its range, checked before anything starts (a test keeps this complete)."""


ZERO_IS_NEVER = {
    "trainer.save_freq",
    "trainer.test_freq",
    "trainer.dump_freq",
    "trainer.total_steps",
    "trainer.total_epochs",
    "generator.max_model_len",
    "learner.optim.grad_clip",
}
"""Keys where 0 turns the thing off, as -1 does in verl."""


def range_problems(r: Recipe) -> list[str]:
    """A message for every numeric field outside its range: 'key=value: must be ...'."""
    p = []
    for key, rng in RANGES.items():
        head, _, last = key.rpartition(".")
        parent = get_key(r, head)
        items = parent if isinstance(parent, list) else [parent]  # reward.functions: each item's field
        for i, item in enumerate(items):
            values = getattr(item, last)
            name = f"{head}[{i}].{last}" if isinstance(parent, list) else key
            for v in values if isinstance(values, list) else [values]:
                if not rng.holds(v):
                    never = " (0 means never here, where verl writes -1)" if v == -1 and key in ZERO_IS_NEVER else ""
                    p.append(f"{name}={v}: {rng.text()}" + (f" ({rng.why})" if rng.why else "") + never)
    return p


def get_key(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj
