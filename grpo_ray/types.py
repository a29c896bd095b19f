"""Records that flow between the pools. Large ones travel as Ray object refs, never through the controller."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Prompt:
    """One prompt of a step, as the generator receives it."""

    ids: list[int]
    """Chat-templated prompt token ids, response prefix included."""
    ground_truth: str
    data_source: str
    extra_info: dict = field(default_factory=dict)
    uid: int = 0
    """Position of the prompt in the training data (for dumps and exact resume)."""
    text: str = ""
    """The prompt as the model sees it (chat template applied, response prefix included)."""
    messages: list[dict] = field(default_factory=list)
    """The row's chat messages, for a reward model that renders them in its own template."""
    style: str = ""
    """The row's ``reward_model.style`` (rule, model, both: with reward_model.by_style, the rewards it gets)."""
    env_choice: str = ""
    """The label of the environment the row chose among environment.choices ("": environment.name's)."""
    images: list[bytes] = field(default_factory=list)
    """The prompt's images, each an image file's bytes, in the order of their markers in `ids` (data.image_key):
    sent to the engine as ``multi_modal_data``, which expands each marker into the image's tokens; a rollout's
    prompt holds the expanded ids (``roles.drivers.expanded``). Empty for a text prompt."""

    @classmethod
    def from_row(cls, uid: int, row: dict) -> Prompt:
        """From a data row (grpo_ray.data schema) whose 'prompt_ids' were added by setup_run."""
        return cls(
            row["prompt_ids"],
            row["reward_model"]["ground_truth"] or "",  # none (data.answer_key ''): an environment's rows
            row["data_source"],
            row.get("extra_info") or {},
            uid,
            row.get("prompt_text", ""),
            row.get("prompt") or [],
            (row.get("reward_model") or {}).get("style", ""),
            row.get("env_choice", ""),
            row.get("prompt_images") or [],
        )

    def env_row(self) -> dict:
        """The row an environment's ``reset`` is given (``grpo_ray.envs.Environment.reset``)."""
        return {
            "ground_truth": self.ground_truth,
            "data_source": self.data_source,
            "extra_info": self.extra_info,
            "prompt": self.text,
            "messages": self.messages,
        }


@dataclass
class Completion:
    """One sampled response."""

    prompt: int
    """Index of its prompt in Rollout.prompts."""
    token_ids: list[int]
    text: str
    """Decoded response, response prefix not included."""
    sampler_logprobs: list[float]
    """vLLM's logprob of each sampled token (0.0 on an observation's)."""
    finish_reason: str
    mask: list[int] | None = None
    """A multi-turn trajectory's loss mask, one per token: 1 on the model's own tokens, 0 on observations' and the
    template's (None: a single turn, every token the model's)."""
    episode: Episode | None = None
    """A multi-turn trajectory's turns and what its environment said (None: a single turn)."""
    versions: list[int] | None = None
    """The version of the weights that sampled each token (a trajectory in flight at a push spans two); None where
    the engine did not label them (multi-turn)."""
    images: list[bytes] = field(default_factory=list)
    """The images its environment showed (image files' bytes), in the order of their tokens, after its prompt's
    (``Prompt.images``): a vision-language model's forward reads both."""
    context: list[int] | None = None
    """A multi-turn trajectory of a prompt with images: the prompt's ids as the engine expanded them (the rollout's
    prompt is given them, ``roles.drivers.expanded``); None otherwise."""


@dataclass
class Episode:
    """What happened in one multi-turn trajectory (``grpo_ray.rollouts.episodes``)."""

    turns: list[str]
    """The model's turns and the observations between them, alternately, as text; the last is the model's."""
    reward: float
    """The sum of the environment's rewards (what the estimators take)."""
    tool_calls: int = 0
    tool_errors: int = 0
    """Tool calls whose tool failed (the episode went on)."""
    failure: str = ""
    """How the environment failed, ending the episode: "error" (raised or answered garbage), "timeout" (past
    environment.timeout_s), "died", "memory"; empty when it did not."""
    ended: str = "done"
    """Why it ended: "done" (the environment said so), "turns" (environment.max_turns), "tokens"
    (environment.max_tokens), "length" (a turn cut at sampling.max_tokens) or the failure."""
    seconds: float = 0.0
    """Time spent in the environment's calls."""
    rewards: list[float] = field(default_factory=list)
    """The environment's reward of each model turn, at its turn (the turn's step's; in dumps, for per-turn credit)."""
    off_record: int = 0
    """An agent program's calls that did not extend its conversation: answered, not trained on (rollouts.endpoint)."""
    opening_mismatch: bool = False
    """Its reset's opening observation was not found in the row's prompt (``environment.opening``: counted)."""


@dataclass
class Group:
    """Streaming: one prompt's group sent to an engine and not yet taken (``Generator.submit``)."""

    prompt: Prompt
    seed: int
    n: int
    sent: object
    """The future of its vLLM request."""


@dataclass
class Rollout:
    """What one generator returns: group_size completions per prompt, group after group."""

    prompts: list[Prompt]
    completions: list[Completion]
    policy_version: int
    """Version of the weights that sampled these completions."""


@dataclass
class RolloutStats:
    """The small part of a generator's answer, for the controller."""

    seconds: float
    """Generation time inside the actor, after the engine returned."""
    policy_version: int
    prompt_lengths: list[int]
    response_lengths: list[int]
    truncated: int
    """Completions cut at sampling.max_tokens (finish reason "length"): response_length/clip_ratio."""
    window: tuple[float, float] = (0.0, 0.0)
    """Wall-clock start and end of the generation (time.time() in the actor): what overlapped what."""
    env: dict[str, list[float]] = field(default_factory=dict)
    """Multi-turn rollouts: the env/* metrics' values per trajectory (``grpo_ray.rollouts.episodes.episode_values``)."""
    failures: dict[str, str] = field(default_factory=dict)
    """Multi-turn rollouts: the environment's first failure of each kind on this engine (error, timeout, ...), its
    traceback or what happened, when it is new since the engine's last answer."""
    versions: list[tuple[int, int]] = field(default_factory=list)
    """Per completion with labelled tokens: (its oldest token's version, how many versions its tokens span)."""
    uids: list[int] = field(default_factory=list)
    """Its prompts' ``Prompt.uid``, in order."""
    discarded: int = 0
    """Streaming: tokens generated and not handed on (groups the staleness policy dropped, generated again)."""
    engine_idle: float = 0.0
    """Streaming: seconds the engine had nothing to run since its last take."""
    ready: int = 0
    """Streaming: groups finished and waiting in the engine after this take (its share of the buffer)."""
    turn_rewards: list[list[float]] = field(default_factory=list)
    """Multi-turn rollouts: each trajectory's environment rewards, one per model turn (its mask's runs), at its
    turn (``algo.advantage.turn_rewards``); empty for single-turn ones. For the per-turn estimators."""


@dataclass
class Scores:
    """Rewards of one rollout, in completion order."""

    totals: list[float]
    components: dict[str, list[float]]
    errors: int
    """Samples whose reward function raised (scored 0)."""
    timeouts: int
    """Samples whose reward function ran past the time limit (scored 0)."""
    seconds: float
    failures: dict[str, str] = field(default_factory=dict)
    """What went wrong the first time each function failed on this actor (a traceback), by function name."""
    extras: dict[str, list[float]] = field(default_factory=dict)
    """The other numbers of functions that return verl's dict, as ``name/key`` -> one per completion (NaN where
    a completion's answer did not have it)."""
    styles: list[str] = field(default_factory=list)
    """Each completion's row style (``Prompt.style``), when the rows choose their reward (reward_model.by_style)."""


@dataclass
class Work:
    """What one actor of a pool did in a step, for perf/idle/<pool> and perf/work_balance/<pool>."""

    seconds: float
    """Busy time inside the actor, after its input arrived."""
    samples: int
    """Samples it processed."""
    window: tuple[float, float] = (0.0, 0.0)
    """Wall-clock start and end of that work (the frozen pools': what of it overlapped the learner's update)."""


@dataclass
class Update:
    """What one learner step gives back (``Learner.train``)."""

    metrics: dict[str, float]
    """The step's metrics (actor/*, rollout_corr/*, timing_s/*), reduced over the ranks."""
    window: tuple[float, float]
    """Wall-clock start and end of the update itself (what overlapped it, one step off, is measured against it)."""
    probe: list[float] | None = None
    """The sync probe's logprobs under the updated weights, when asked for: the sync that pushes these weights
    compares the engines' with them, with no learner call of its own."""
