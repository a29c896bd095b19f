"""The checks a loaded recipe passes before anything starts: the choices each key takes, numeric ranges, and the
arithmetic between sections. Each problem is one line that names the key and what to fix."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from grpo_ray.config.pools import POOLS
from grpo_ray.config.schema import AlgorithmConfig, Recipe

FUNCTION_KEYS = ("algorithm.adv_estimator", "algorithm.loss_mode", "algorithm.schedule")
"""Keys that take one of their CHOICES or a user's ``module:function`` (grpo_ray.algo.registry)."""
FUNCTION_NAME = r"[A-Za-z_][\w.]*:[A-Za-z_]\w*"

CHOICES = {
    "generator.dtype": ("auto", "float32", "bfloat16", "float16"),
    "learner.dtype": ("bfloat16", "float32"),
    "algorithm.kl_estimator": ("k1", "k3"),
    "algorithm.loss_agg": (
        "auto",
        "token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-mean",
        "seq-mean-token-sum-norm",
    ),
    "algorithm.adv_estimator": ("grpo", "rloo", "reinforce_plus_plus_baseline"),
    "algorithm.loss_mode": ("vanilla", "gspo", "cispo"),
    "algorithm.schedule": ("batched",),
    "algorithm.rollout_correction.rollout_is": (None, "token"),
    "algorithm.rollout_correction.rollout_rs": (None, "sequence", "geometric"),
    "cluster.device": ("cpu", "cuda"),
    "cluster.cpu_threads": ("auto", "reserved", "node"),
    "model.lora.sync": ("adapters", "merged"),
    "model.shared_prompt": ("auto", True, False),
    "trainer.log_level": ("info", "debug"),
    "trainer.wandb_mode": ("", "online", "offline", "disabled"),
    "trainer.early_stop.mode": ("max", "min"),
}
LOGGERS = ("console", "jsonl", "tensorboard", "wandb", "mlflow")
ENGINE_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ranks vLLM's max_lora_rank takes: an engine serves adapters up to the next one."""
GPU_MEMORY_GB = {
    "b200": 180.0,
    "h200": 141.0,
    "h100": 80.0,
    "a100-80gb": 80.0,
    "l40s": 48.0,
    "a100-40gb": 40.0,
    "l4": 24.0,
    "a10g": 24.0,
    "rtx4090": 24.0,
}
"""Memory of one GPU of each known model (as the datasheets give it)."""


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
    "reward.num_cpus": POSITIVE,
    "reward.max_error_share": Range(0, 1),
    "reward.max_error_steps": NON_NEGATIVE,
    "environment.max_turns": POSITIVE,
    "environment.max_tokens": POSITIVE,
    "environment.timeout_s": POSITIVE,
    "environment.memory_mb": Range(64, why="the child process needs room for Python"),
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
FREE_TEXT = {
    "model.path",
    "teacher.model",
    "reward_model.model",
    "reward_model.judge.template",
    "reward_model.judge.pattern",
    "trainer.weight_dir",
    "trainer.weight_transport",
    "model.chat_template",
    "data.response_prefix",
    "data.system_prompt",
    "data.prompt_key",
    "data.answer_key",
    "reward.functions.name",
    "environment.name",
    "environment.role",
    "trainer.resume",
    "trainer.output_dir",
    "trainer.experiment_name",
    "trainer.project_name",
    "trainer.mlflow_tracking_uri",
    "trainer.early_stop.metric",
    "cluster.gpu",
    "sft.target_key",
    "rm.chosen_key",
    "rm.rejected_key",
    "rm.label_key",
    "rm.response_key",
}
"""String fields that are not a choice among CHOICES (paths, names, text; cluster.gpu is checked on its own, the
weight transport by grpo_ray.transports before start)."""


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


def engine_rank(rank: int) -> int:
    """The max_lora_rank an engine needs for adapters of `rank` (vLLM takes a few values only)."""
    return next(r for r in ENGINE_LORA_RANKS if r >= rank)


def range_problems(r: Recipe) -> list[str]:
    """A message for every numeric field outside its range: 'key=value: must be ...'."""
    p = []
    for key, rng in RANGES.items():
        head, _, last = key.rpartition(".")
        parent = _get(r, head)
        items = parent if isinstance(parent, list) else [parent]  # reward.functions: each item's field
        for i, item in enumerate(items):
            values = getattr(item, last)
            name = f"{head}[{i}].{last}" if isinstance(parent, list) else key
            for v in values if isinstance(values, list) else [values]:
                if not rng.holds(v):
                    never = " (0 means never here, where verl writes -1)" if v == -1 and key in ZERO_IS_NEVER else ""
                    p.append(f"{name}={v}: {rng.text()}" + (f" ({rng.why})" if rng.why else "") + never)
    return p


def validate(r: Recipe, command: str = "train") -> list[str]:
    """Every problem of a type-correct recipe for `command`, as messages naming the numbers that clash."""
    p: list[str] = []
    for key, choices in CHOICES.items():
        value = _get(r, key)
        if value not in choices and not (key in FUNCTION_KEYS and re.fullmatch(FUNCTION_NAME, str(value))):
            shown = ("null" if c is None else str(c).lower() if isinstance(c, bool) else c for c in choices)
            p.append(f"{key}={value!r}: expected one of {', '.join(shown)}")
    out_of_range = range_problems(r)
    if out_of_range:
        return p + out_of_range  # the arithmetic below assumes sizes in range

    g = r.algorithm.group_size if command == "train" else 1
    samples = r.data.train_batch_size * g
    if samples % r.learner.mini_batch_size:
        times = f" x algorithm.group_size ({g})" if command == "train" else ""
        p.append(
            f"data.train_batch_size ({r.data.train_batch_size}){times} = {samples} samples "
            f"per step is not divisible by learner.mini_batch_size ({r.learner.mini_batch_size})"
        )
    per_pass = r.learner.micro_batch_size * r.learner.world_size
    if r.learner.mini_batch_size % per_pass:
        p.append(
            f"learner.mini_batch_size ({r.learner.mini_batch_size}) is not divisible by learner.micro_batch_size "
            f"({r.learner.micro_batch_size}) x learner.world_size ({r.learner.world_size}) = {per_pass}"
        )
    for bad in set(r.trainer.loggers) - set(LOGGERS):
        p.append(f"trainer.loggers: unknown logger {bad!r}; expected any of {', '.join(LOGGERS)}")
    p += _tracker_problems(r)
    if r.trainer.total_steps == 0 and r.trainer.total_epochs == 0:
        p.append("trainer.total_steps or trainer.total_epochs must be positive")
    if not r.data.train_files:
        p.append("data.train_files is empty: name parquet/JSONL files or synthetic://select?size=N")
    if command != "rm" and not r.reward.functions and not r.environment.name:
        p.append("reward.functions is empty: name at least one reward function (or an environment.name)")
    if r.model.shared_prompt is True and r.learner.gradient_checkpointing:
        p.append(
            "model.shared_prompt=true with learner.gradient_checkpointing=true: a checkpointed forward keeps no "
            "keys and values of the prompt for its responses; set one of them false (or shared_prompt auto, which "
            "packs under checkpointing)"
        )
    lo = r.model.lora
    joined = next((t for t in lo.target_modules if re.search(r"[,\s]", t)), None)
    if lo.rank and joined:
        names = ", ".join(n for n in re.split(r"[,\s]+", joined) if n)
        p.append(f"model.lora.target_modules: {joined!r} is one name; a list of modules is written [{names}]")
    if lo.rank and not lo.target_modules:
        p.append("model.lora.target_modules is empty: name modules (q_proj, v_proj, ...) or [all-linear]")
    if lo.rank > ENGINE_LORA_RANKS[-1] and lo.sync == "adapters":
        p.append(
            f"model.lora.rank={lo.rank}: vLLM serves adapters up to rank {ENGINE_LORA_RANKS[-1]}; lower it, "
            "or set model.lora.sync=merged"
        )
    m = r.rm
    if command == "rm" and not m.label_key and m.chosen_key == m.rejected_key:
        p.append(
            f"rm.chosen_key and rm.rejected_key are both {m.chosen_key!r}: every pair would compare a response with "
            "itself; name the rejected response's key"
        )
    if command == "rm" and m.label_key and m.label_key == m.response_key:
        p.append(f"rm.label_key and rm.response_key are both {m.label_key!r}: the label and the response are two keys")
    if command == "rm" and lo.rank:
        p.append(f"model.lora.rank={lo.rank}: grpo-ray rm trains every weight of the classifier; set it to 0")
    p += _cluster_problems(r)
    p += _schedule_problems(r)
    p += _generator_problems(r)
    if r.environment.name and r.generator.sampling.ignore_eos:
        p.append(
            "generator.sampling.ignore_eos=true with environment.name: a turn ends at its end-of-sequence token; "
            "ignore_eos is for single-turn rollouts"
        )
    if r.environment.name and r.environment.max_tokens < r.generator.sampling.max_tokens:
        p.append(
            f"environment.max_tokens ({r.environment.max_tokens}) is below generator.sampling.max_tokens "
            f"({r.generator.sampling.max_tokens}): a trajectory's budget holds at least one whole turn"
        )
    p += _judge_problems(r.reward_model.judge)
    learned = r.reward_model.model and r.reward_model.weight  # a reward model alone tells responses apart
    if command == "train" and r.reward.functions and not learned and not any(f.weight > 0 for f in r.reward.functions):
        p.append(
            "reward.functions: no function has a positive weight, so no response can be told from another; "
            "give at least one a weight above 0 (or name a reward_model.model)"
        )
    return p


def _judge_problems(j) -> list[str]:
    """A judge's rubric without the response to grade, or a score pattern that is no regular expression with a
    group."""
    import re

    if not j.template:
        return []
    p = []
    if "{response}" not in j.template:
        p.append(
            "reward_model.judge.template has no {response}: the judge would grade without seeing the response "
            "(placeholders: {prompt}, {response}, {ground_truth})"
        )
    unknown = sorted(set(re.findall(r"\{([A-Za-z_]\w*)\}", j.template)) - {"prompt", "response", "ground_truth"})
    if unknown:
        p.append(
            f"reward_model.judge.template has {', '.join('{' + u + '}' for u in unknown)}, which nothing fills: the "
            "placeholders are {prompt}, {response} and {ground_truth} (other braces must hold more than a name)"
        )
    try:
        if re.compile(j.pattern).groups < 1:
            p.append(f"reward_model.judge.pattern={j.pattern!r} has no group: put the score in ( )")
    except re.error as e:
        p.append(f"reward_model.judge.pattern={j.pattern!r} is not a regular expression ({e})")
    return p


ENGINE_KEYS = {
    "model": "model.path",
    "tensor_parallel_size": "generator.tensor_parallel_size",
    "gpu_memory_utilization": "generator.gpu_memory_utilization",
    "dtype": "generator.dtype",
    "enforce_eager": "generator.enforce_eager",
    "max_model_len": "generator.max_model_len",
    "seed": "trainer.seed",
    "trust_remote_code": "model.trust_remote_code",
    "worker_extension_cls": None,
    "logprobs_mode": None,
    "enable_lora": "model.lora",
    "max_lora_rank": "model.lora",
    "max_loras": "model.lora",
}
"""vllm.LLM arguments grpo-ray sets itself: the recipe key that sets each (None: needed as it is, for the weight
sync or for logprobs the learner's match)."""


def _generator_problems(r: Recipe) -> list[str]:
    g, p = r.generator, []
    for key in g.vllm_kwargs:
        if key in ENGINE_KEYS:
            owner = ENGINE_KEYS[key]
            p.append(
                f"generator.vllm_kwargs.{key}: set by grpo-ray "
                + (
                    f"from {owner}; set that instead"
                    if owner
                    else "(the weight sync and the sampler's logprobs depend on it); remove it"
                )
            )
    if g.val_n > 1 and g.val_temperature == 0:
        p.append(
            f"generator.val_n={g.val_n} with generator.val_temperature=0: every sample is the same greedy answer, "
            "so pass@n says nothing pass@1 does not; set val_temperature above 0 (e.g. 0.6) or val_n=1"
        )
    return p


def _tracker_problems(r: Recipe) -> list[str]:
    import importlib.util

    t, p = r.trainer, []
    for name in ("wandb", "mlflow"):
        if name in t.loggers and importlib.util.find_spec(name) is None:
            p.append(f"trainer.loggers: {name} needs the {name} package: pip install 'grpo-ray[tracking]'")
    uri = t.mlflow_tracking_uri
    if "mlflow" in t.loggers and uri and not _mlflow_uri(uri):
        p.append(
            f"trainer.mlflow_tracking_uri={uri!r}: not a URI MLflow takes; expected a server (http://host:5000), "
            "a database (sqlite:///path/mlflow.db, postgresql://...) or databricks"
        )
    e = t.early_stop
    if e.metric and not e.metric.startswith("val/"):
        p.append(f"trainer.early_stop.metric={e.metric!r}: a validation metric is expected, e.g. val/gsm8k/pass@1")
    if (e.metric or t.keep_best) and not (r.data.val_files and t.test_freq):
        what = "trainer.early_stop.metric" if e.metric else "trainer.keep_best"
        p.append(f"{what} needs validation: set data.val_files and trainer.test_freq")
    return p


MLFLOW_SCHEMES = ("http", "https", "sqlite", "postgresql", "mysql", "mssql", "file", "databricks")
"""The tracking URI schemes MLflow's client takes (a database's with a driver suffix too: postgresql+psycopg2)."""


def _mlflow_uri(uri: str) -> bool:
    from urllib.parse import urlparse

    u = urlparse(uri)
    scheme = u.scheme.split("+")[0]
    if scheme not in MLFLOW_SCHEMES:
        return False
    return bool(u.netloc) if scheme in ("http", "https") else scheme == "databricks" or bool(u.path or u.netloc)


MAX_STALENESS = 16
"""The most versions a sample may lag the learner (algorithm.max_staleness): twice the field's largest."""


def _schedule_problems(r: Recipe) -> list[str]:
    a, p = r.algorithm, []
    if a.overlong_buffer.len > r.generator.sampling.max_tokens:
        p.append(
            f"algorithm.overlong_buffer.len ({a.overlong_buffer.len}) is longer than the responses can be "
            f"(generator.sampling.max_tokens={r.generator.sampling.max_tokens})"
        )
    rc = a.rollout_correction
    if rc.bypass_mode and (rc.rollout_is or rc.rollout_rs):
        p.append(
            "algorithm.rollout_correction.bypass_mode=true takes the sampler's logprobs as the old policy, so "
            "there is no mismatch to correct: set rollout_is and rollout_rs to null, or bypass_mode=false"
        )
    k = a.max_staleness
    if k > MAX_STALENESS:
        p.append(
            f"algorithm.max_staleness={k}: samples up to {k} versions older than the learner, weights pushed every "
            f"{k} steps and {k + 1} versions kept by each learner rank; the field uses 1 to 8 (verl, NeMo RL's "
            f"max_trajectory_age_steps, AReaL's max_head_offpolicyness), past {MAX_STALENESS} the importance ratio no "
            "longer corrects the gap: lower it"
        )
    elif k and r.trainer.total_steps and k >= r.trainer.total_steps:
        p.append(
            f"algorithm.max_staleness={k} with trainer.total_steps={r.trainer.total_steps}: weights are pushed every "
            f"{k} steps, so the generators would never get the trained weights; lower it"
        )
    shared = next((g for g in r.cluster.colocate if "generator" in g and "learner" in g), None)
    if a.max_staleness and shared:
        p.append(
            f"algorithm.max_staleness={a.max_staleness}: the generator shares devices with the learner "
            f"(cluster.colocate {shared}), so generation cannot overlap training; set it to 0"
        )
    return p


def _cluster_problems(r: Recipe) -> list[str]:
    p = []
    c = r.cluster
    seen: set[str] = set()
    for group in c.colocate:
        for pool in group:
            if pool not in POOLS:
                p.append(f"cluster.colocate: unknown pool {pool!r}; expected any of {', '.join(POOLS)}")
            elif pool in seen:
                p.append(f"cluster.colocate: pool {pool!r} is in more than one group")
            seen.add(pool)
    for pool in c.node_resources:
        if pool not in POOLS:
            p.append(f"cluster.node_resources: unknown pool {pool!r}; expected any of {', '.join(POOLS)}")
    for marker, n in c.node_markers.items():
        if n <= 0:
            p.append(f"cluster.node_markers.{marker}={n}: must be positive")
    if c.gpu and c.gpu not in GPU_MEMORY_GB:
        p.append(
            f"cluster.gpu={c.gpu!r}: expected one of {', '.join(GPU_MEMORY_GB)}, or leave it empty and "
            "set cluster.device_memory_gb"
        )
    if c.device != "cuda":
        return p
    if c.devices_per_node <= 0:
        p.append(f"cluster.devices_per_node={c.devices_per_node}: a cuda cluster needs GPUs on its nodes")
        return p
    tp = r.generator.tensor_parallel_size
    if tp > c.devices_per_node:
        p.append(
            f"generator.tensor_parallel_size ({tp}) is larger than cluster.devices_per_node "
            f"({c.devices_per_node}): one engine must fit on one node"
        )
    return p


def loss_aggregation(a: AlgorithmConfig) -> str:
    """The aggregation algorithm.loss_agg names; auto: seq-mean-token-mean under GSPO (its objective weighs every
    sequence the same), token-mean otherwise."""
    if a.loss_agg != "auto":
        return a.loss_agg
    return "seq-mean-token-mean" if a.loss_mode == "gspo" else "token-mean"


def notices(r: Recipe) -> list[str]:
    """What a run says at start about choices the recipe left to defaults that change the math, and settings that
    will do nothing."""
    a, out = r.algorithm, []
    if r.trainer.test_freq and not r.data.val_files:
        out.append(f"trainer.test_freq={r.trainer.test_freq} but data.val_files is empty: no validation will run")
    return out + _gspo_notices(a)


def _gspo_notices(a: AlgorithmConfig) -> list[str]:
    if a.loss_mode != "gspo":
        return []
    if a.loss_agg == "auto":
        return [
            "algorithm.loss_mode=gspo: the loss aggregates seq-mean-token-mean (GSPO's sequence-level objective; "
            "set algorithm.loss_agg to choose another)"
        ]
    if loss_aggregation(a) != "seq-mean-token-mean":
        return [
            f"algorithm.loss_mode=gspo with algorithm.loss_agg={a.loss_agg}: not GSPO's objective, which weighs "
            "every sequence the same (seq-mean-token-mean)"
        ]
    return []


def _get(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj
