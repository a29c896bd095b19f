"""The scorers' sections of the recipe: the frozen-model scorers (reference, teacher, reward model or judge) share
``ScorerConfig``'s block (actors, micro batch, CPUs), and the rule rewards' (reward functions in CPU actors)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING


@dataclass
class ScorerConfig:
    """What every frozen-model scorer's section holds (the reference, the teacher, the reward model or judge): its
    actors, how many samples a forward takes, and the CPUs each reserves."""

    num_actors: int = 1
    """The pool's actors (data parallel, each an even share of the samples' tokens; a group of them holds the model
    sharded, FSDP2)."""
    micro_batch_size: int = 16
    """Samples per forward pass; with model.sequence_packing, rows, each as long as the actor's longest sample."""
    num_cpus: float = 0.5
    """CPUs reserved per actor."""


@dataclass
class ReferenceConfig(ScorerConfig):
    """The reference policy's logprobs for the KL term (the policy's starting weights); off when algorithm.kl_coef is
    0 or with LoRA (the learner is its own reference, its adapters off)."""


@dataclass
class TeacherConfig(ScorerConfig):
    """On-policy distillation: a frozen teacher scores every token the policy samples, and the policy-gradient term
    climbs the per-token advantage ``reward_weight * A_i - kl_coef * (logp_student - logp_teacher)`` (the reverse
    KL of student to teacher on the student's own tokens; ``grpo_ray.algo.distill``). The teacher pool is placed
    and sharded like the reference's; it must share the policy's tokenizer."""

    model: str = ""
    """The teacher: a hub name, a local path or a ``tiny://`` / ``sft://`` name; empty turns distillation off."""
    kl_coef: float = 1.0
    """Weight of the per-token reverse KL in the advantage."""
    reward_weight: float = 1.0
    """Weight of the task reward's advantage beside it; 0 distils alone (the reward is still scored and logged)."""
    validate: bool = True
    """With trainer.val_before_train, the teacher's own greedy pass@1 on the validation rows before training
    (``teacher/val/<data_source>/pass@1``, a line on ``grpo-ray plot``), generated once by the teacher pool with
    transformers' generate (no engine: slower than one; single-turn only)."""


@dataclass
class JudgeConfig:
    """A generative judge: reward_model.model is a language model served by a vLLM engine in each actor of the judge
    pool (reward_model.num_actors of them), asked to grade each response with a rubric; the number its reply gives is
    the score."""

    template: str = ""
    """The rubric prompt, sent as the user's turn in the judge's chat template: ``{prompt}`` becomes the prompt's
    text, ``{response}`` the response (required) and ``{ground_truth}`` the row's reference answer. Set, the model is
    a judge; empty, a sequence classifier."""
    pattern: str = r"(-?\d+(?:\.\d+)?)"
    """A regular expression; the first group of its last match in the reply is read as the score."""
    default: float = 0.0
    """The score of a reply the pattern does not match, of a conversation too long for the judge, and of a step whose
    judging missed timeout_s; counted (reward_model/judge_unread, reward_model/judge_timeouts)."""
    max_tokens: int = 64
    """Tokens of the judge's reply at most."""
    temperature: float = 0.0
    """The judge's sampling temperature (0: greedy, the same reply to the same conversation)."""
    timeout_s: float = 300.0
    """A step's judging must finish within this; past it every sample of the step scores the default and the pool is
    started again."""
    max_model_len: int = 0
    """The judge's context length; 0: the policy's prompt and response lengths, max_tokens and 512 tokens for the
    template."""
    gpu_memory_utilization: float = 0.85
    """On GPU: the share of the judge's device its engine takes (weights and KV cache)."""
    vllm_kwargs: dict[str, Any] = field(default_factory=dict)
    """More arguments of the judge's ``vllm.LLM`` (as generator.vllm_kwargs are the generators'): a judge that reads
    images takes ``limit_mm_per_prompt``, and ``model_impl: transformers`` on this CPU."""


@dataclass
class RewardModelConfig(ScorerConfig):
    """A learned reward: a sequence classifier (transformers' ``AutoModelForSequenceClassification``, one output: the
    Skywork / ArmoRM shape) scoring each (prompt, response), rendered in its own chat template and tokenizer, in a pool
    of its own (FSDP2-sharded over num_actors, even shares of the samples). Its score joins the reward functions'
    weighted sum as the component ``reward_model``."""

    model: str = ""
    """The classifier: a hub name, a local path, or a ``tiny://`` name with ``score=1``; empty turns it off."""
    weight: float = 1.0
    """Weight of its score in the combined reward (the reward functions keep theirs; weight 0 there logs a rule
    reward without training on it: the true score beside the learned one)."""
    sigmoid: bool = False
    """Take sigmoid(score), the Bradley-Terry probability that the response is a good one, in (0, 1) as a rule
    reward's pass or fail; with mean-only group advantages (algorithm.norm_adv_by_std: false) a group whose answers
    the model all finds bad then gets almost no push, as under a rule reward (the learned-reward showcase)."""
    normalize: bool = False
    """Standardise its scores (after sigmoid, if on) over each step's samples (mean 0, std 1) before weighting (a
    classifier's logits have no fixed scale)."""
    max_length: int = 0
    """Tokens of a rendered conversation the classifier reads at most (cut at the end); 0: all."""
    head: int = -1
    """Which output of a classifier with several is the score (counted from 0: one objective of a multi-objective
    reward model); -1: the classifier has one output, and one of several is refused before start."""
    shard: bool = True
    """The actors form one FSDP2 group, each holding 1/num_actors of the classifier's weights (for one too large for
    a device); false (and always with one actor): each holds the whole classifier and scores its share alone, with no
    collective per forward (faster where it fits: benchmarks/results/reward-model)."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """Set judge.template to use a language model as a generative judge instead of a classifier."""
    by_style: bool = False
    """Let each data row's ``reward_model.style`` (verl's field) choose its reward: ``rule`` the reward functions
    alone, ``model`` the reward model alone, ``both``; off, every row gets both (prepared data says ``rule``)."""


@dataclass
class RewardFnConfig:
    name: str = MISSING
    """A built-in (gsm8k, math, format, auto), ``module:function`` (a module in the working directory or the
    recipe's folder is found) or ``path/to/file.py:function`` (verl's custom_reward_function.path and .name).
    Ours is ``fn(response, ground_truth, **extra)``; verl's ``compute_score(data_source, solution_str,
    ground_truth, extra_info=None)`` is told by its solution_str and called as verl calls it."""
    weight: float = 1.0
    """Weight in the combined reward."""
    sources: list[str] = field(default_factory=list)
    """The data_source values whose rows it scores (verl's routing of rows by data_source); empty: every row. A row
    it does not name takes neither its score nor its weight: the row's reward is the weighted sum of the functions
    that name it, and a validation answer passes with their positive weights."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments it is called with beside the row's (verl's custom_reward_function.reward_kwargs)."""

    def scores(self, data_source: str) -> bool:
        """Whether it scores a row of `data_source`."""
        return not self.sources or data_source in self.sources


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
    """Run reward functions sandboxed (docs/operations.md#the-sandbox): no network, no Unix socket, no other
    process, no token; a root of read-only folders (the system's, Python's, sys.path's, `paths`) and a scratch tmpfs.
    Where the kernel refuses a layer, the run says which once, before start."""
    network: bool = False
    """Let sandboxed reward code reach the network (a judge API, a code runner); the rest of the sandbox holds."""
    max_processes: int = 64
    """Processes and threads a reward child may run at once (a fork bomb stops there)."""
    scratch_mb: int = 256
    """Size of a reward child's scratch tmpfs (its /tmp and HOME; /dev/shm as much again)."""
    paths: list[str] = field(default_factory=list)
    """The node's files or folders reward code may read beside the system's, Python's and sys.path's (a word list,
    a model's folder)."""
    pass_env: list[str] = field(default_factory=list)
    """Environment variables handed to reward code by name (an API key a judge reward calls with); no other
    variable but PATH, LANG, thread counts and the like reaches it."""
    max_error_share: float = 0.5
    """Stop the run when reward functions fail (raise, hang, return no number) on more than this share of a step's
    samples for max_error_steps steps in a row; the same for an environment's trajectories (a step that raises,
    hangs or answers no Step) and a judge's replies (no score matching its pattern), each counted on its own."""
    max_error_steps: int = 3
    """Steps in a row over max_error_share that stop the run (0: never stop; failures are still shown and counted)."""
    num_cpus: float = 0.25
    """CPUs reserved per reward actor."""
