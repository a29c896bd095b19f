"""The checks a loaded recipe passes before anything starts: the choices each key takes, numeric ranges, and the
arithmetic between sections. Each problem is one line that names the key and what to fix."""

from __future__ import annotations

import re

from grpo_ray.config.pools import GENERATOR, LEARNER, POOLS
from grpo_ray.config.ranges import get_key, range_problems
from grpo_ray.config.schema import GPU_MEMORY_GB, AlgorithmConfig, Recipe

FUNCTION_KEYS = ("algorithm.adv_estimator", "algorithm.loss_mode", "algorithm.schedule", "algorithm.staleness")
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
    "algorithm.adv_estimator": ("grpo", "rloo", "reinforce_plus_plus_baseline", "grpo_turn"),
    "algorithm.loss_mode": ("vanilla", "gspo", "cispo"),
    "algorithm.schedule": ("batched", "streaming"),
    "algorithm.staleness": ("keep", "drop"),
    "algorithm.rollout_correction.rollout_is": (None, "token"),
    "algorithm.rollout_correction.rollout_rs": (None, "sequence", "geometric"),
    "cluster.device": ("cpu", "cuda"),
    "cluster.cpu_threads": ("auto", "reserved", "node"),
    "model.lora.sync": ("adapters", "merged"),
    "model.shared_prompt": ("auto", True, False),
    "trainer.log_level": ("info", "debug"),
    "trainer.fault_tolerance": ("off", "pools", "all"),
    "trainer.wandb_mode": ("", "online", "offline", "disabled"),
    "trainer.early_stop.mode": ("max", "min"),
    "environment.opening": ("prompt", "check", "ignore"),
}
LOGGERS = ("console", "jsonl", "tensorboard", "wandb", "mlflow")
ENGINE_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ranks vLLM's max_lora_rank takes: an engine serves adapters up to the next one."""
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
    "data.image_key",
    "reward.functions.name",
    "environment.name",
    "environment.role",
    "environment.row_key",
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


def engine_rank(rank: int) -> int:
    """The max_lora_rank an engine needs for adapters of `rank` (vLLM takes a few values only)."""
    return next(r for r in ENGINE_LORA_RANKS if r >= rank)


def validate(r: Recipe, command: str = "train") -> list[str]:
    """Every problem of a type-correct recipe for `command` (train, sft, rm: each job's own checks are
    ``JOB_CHECKS``), as messages naming the numbers that clash."""
    p = _choice_problems(r)
    out_of_range = range_problems(r)
    if out_of_range:
        return p + out_of_range  # the arithmetic below assumes sizes in range
    p += _batch_problems(r, command)
    for check in (
        _run_problems,
        _tracker_problems,
        _lora_problems,
        _cluster_problems,
        _schedule_problems,
        _generator_problems,
        _environment_problems,
    ):
        p += check(r)
    for check in JOB_CHECKS.get(command, ()):
        p += check(r)
    return p + _judge_problems(r.reward_model.judge)


def _choice_problems(r: Recipe) -> list[str]:
    p = []
    for key, choices in CHOICES.items():
        value = get_key(r, key)
        if value not in choices and not (key in FUNCTION_KEYS and re.fullmatch(FUNCTION_NAME, str(value))):
            shown = ("null" if c is None else str(c).lower() if isinstance(c, bool) else c for c in choices)
            p.append(f"{key}={value!r}: expected one of {', '.join(shown)}")
    return p


def _batch_problems(r: Recipe, command: str) -> list[str]:
    """A step's samples cut into mini batches, and those into micro batches over the ranks."""
    p = []
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
    return p


def _run_problems(r: Recipe) -> list[str]:
    p = []
    if r.trainer.total_steps == 0 and r.trainer.total_epochs == 0:
        p.append("trainer.total_steps or trainer.total_epochs must be positive")
    if not r.data.train_files:
        p.append("data.train_files is empty: name parquet/JSONL files or synthetic://select?size=N")
    if r.model.shared_prompt is True and r.learner.gradient_checkpointing:
        p.append(
            "model.shared_prompt=true with learner.gradient_checkpointing=true: a checkpointed forward keeps no "
            "keys and values of the prompt for its responses; set one of them false (or shared_prompt auto, which "
            "packs under checkpointing)"
        )
    return p


def _lora_problems(r: Recipe) -> list[str]:
    p, lo = [], r.model.lora
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
    return p


def _environment_problems(r: Recipe) -> list[str]:
    p = []
    if r.environment.choices and not r.environment.name:
        p.append(
            "environment.choices without environment.name: name the environment of the rows that choose none "
            "(one of the choices' names will do)"
        )
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
    return p


def _reward_problems(r: Recipe) -> list[str]:
    """A job that scores samples (train, and sft's validation) needs a reward."""
    if not r.reward.functions and not r.environment.name:
        return ["reward.functions is empty: name at least one reward function (or an environment.name)"]
    return []


def _weight_problems(r: Recipe) -> list[str]:
    """GRPO's advantages need rewards that can tell responses apart."""
    learned = r.reward_model.model and r.reward_model.weight  # a reward model alone tells responses apart
    if r.reward.functions and not learned and not any(f.weight > 0 for f in r.reward.functions):
        return [
            "reward.functions: no function has a positive weight, so no response can be told from another; "
            "give at least one a weight above 0 (or name a reward_model.model)"
        ]
    return []


def _rm_problems(r: Recipe) -> list[str]:
    """Reward-model training's rows and model."""
    p, m, lo = [], r.rm, r.model.lora
    if not m.label_key and m.chosen_key == m.rejected_key:
        p.append(
            f"rm.chosen_key and rm.rejected_key are both {m.chosen_key!r}: every pair would compare a response with "
            "itself; name the rejected response's key"
        )
    if m.label_key and m.label_key == m.response_key:
        p.append(f"rm.label_key and rm.response_key are both {m.label_key!r}: the label and the response are two keys")
    if lo.rank:
        p.append(f"model.lora.rank={lo.rank}: grpo-ray rm trains every weight of the classifier; set it to 0")
    return p


JOB_CHECKS = {"train": (_reward_problems, _weight_problems), "sft": (_reward_problems,), "rm": (_rm_problems,)}
"""Each job's own checks (``validate``'s command)."""


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
    for key in sorted(set(j.vllm_kwargs) & set(JUDGE_ENGINE_KEYS)):
        owner = JUDGE_ENGINE_KEYS[key]
        how = f"from {owner}; set that instead" if owner else "(on CPU, from the judge's share of a step); remove it"
        p.append(f"reward_model.judge.vllm_kwargs.{key}: set by grpo-ray {how}")
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
JUDGE_ENGINE_KEYS = {
    "model": "reward_model.model",
    "gpu_memory_utilization": "reward_model.judge.gpu_memory_utilization",
    "dtype": "generator.dtype",
    "max_model_len": "reward_model.judge.max_model_len",
    "seed": "trainer.seed",
    "trust_remote_code": "model.trust_remote_code",
    "kv_cache_memory_bytes": None,
    "enable_chunked_prefill": None,
}
"""vllm.LLM arguments of the judge's engine grpo-ray sets itself: the recipe key that sets each (None: on CPU, from
the judge's share of a step)."""


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
    p += _elastic_problems(r) if g.max_engines else []
    if g.val_n > 1 and g.val_temperature == 0:
        p.append(
            f"generator.val_n={g.val_n} with generator.val_temperature=0: every sample is the same greedy answer, "
            "so pass@n says nothing pass@1 does not; set val_temperature above 0 (e.g. 0.6) or val_n=1"
        )
    half = [f"{k}.dtype={d}" for k, d in ((GENERATOR, g.dtype), (LEARNER, r.learner.dtype)) if d in HALF]
    bound = r.trainer.max_sync_logprob_diff
    if half and bound < HALF_PROBE_BOUND:
        p.append(
            f"trainer.max_sync_logprob_diff={bound:g} with {' and '.join(half)}: the engine's and the learner's "
            f"logprobs differ on the probe by more than that from 16-bit rounding alone; with a 16-bit dtype on "
            f"either side set it to {HALF_PROBE_BOUND:g} or more (the default), or run both in float32"
        )
    return p


def _elastic_problems(r: Recipe) -> list[str]:
    """Why the engines cannot grow past num_engines to max_engines in this run (``Pools.grow``)."""
    g = r.generator
    if g.max_engines < g.num_engines:
        return [f"generator.max_engines={g.max_engines} is under generator.num_engines={g.num_engines}"]
    if any(GENERATOR in group for group in r.cluster.colocate):
        return [
            f"generator.max_engines={g.max_engines} with the generator colocated (cluster.colocate): an engine added "
            "has no bundle of its group to share; set num_engines alone"
        ]
    return []


HALF = ("bfloat16", "float16")
HALF_PROBE_BOUND = 1e-2
"""The least trainer.max_sync_logprob_diff with a 16-bit engine or learner: the probe's logprobs differ by 16-bit
rounding alone (docs/design.md#weight-sync has the measured gaps)."""


def _tracker_problems(r: Recipe) -> list[str]:
    import importlib.util

    t = r.trainer
    p = [
        f"trainer.loggers: unknown logger {bad!r}; expected any of {', '.join(LOGGERS)}"
        for bad in set(t.loggers) - set(LOGGERS)
    ]
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
    elif (
        k and r.trainer.total_steps and k >= r.trainer.total_steps and a.schedule != "streaming"
    ):  # it pushes every step
        p.append(
            f"algorithm.max_staleness={k} with trainer.total_steps={r.trainer.total_steps}: weights are pushed every "
            f"{k} steps, so the generators would never get the trained weights; lower it"
        )
    if a.schedule == "streaming" and not k:
        p.append(
            "algorithm.schedule=streaming with algorithm.max_staleness=0: the engines could only generate a batch "
            "after the last push, as the batched schedule does; set max_staleness to 1 or more (how many steps ahead "
            "prompts are sent)"
        )
    shared = next((g for g in r.cluster.colocate if GENERATOR in g and LEARNER in g), None)
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
