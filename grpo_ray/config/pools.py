"""The pool kinds, one row each (a pool's recipe section is its name): how many actors it runs (0: off) and what each
asks for, the model it loads, how its actors work together, what losing one costs, what it gives the learner, and
the names of the planner's memory and time models for it (no time: not modelled, and ``plan`` says so). Placement,
start-up (``Pools``), fault handling, the scorers' calls and metrics, the fit check and ``plan`` loop over these rows;
the actor class of each is the role map's (``pools.ROLES``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from grpo_ray.config.schema import Recipe


@dataclass(frozen=True)
class Use:
    """How a scorer's signal meets training."""

    per: Literal["token", "sequence"]
    """What the signal is: a logprob per sampled token (the learner reads it), or a score per sample (a component
    of the reward)."""
    doc: str


KL, DISTILL, REWARD_COMPONENT = "kl", "distill", "reward_component"
USES = {
    KL: Use("token", "a KL term in the loss against these logprobs (algorithm.kl_coef, algorithm.kl_estimator)"),
    DISTILL: Use(
        "token",
        "each token's advantage takes the student's log ratio to these logprobs (algo/distill.py; the pool's "
        "section's kl_coef and reward_weight)",
    ),
    REWARD_COMPONENT: Use(
        "sequence", "a component of each sample's weighted reward (the pool's section's weight, or each function's)"
    ),
}
"""The uses a pool's row may name (``PoolKind.use``): where its signal goes. A token use is read by the learner,
keyed by its name (``Learner.update``), and applied by the loss (``algo.loss.token_uses``); a sequence use is summed
into the reward by the scorers (``Scorers.rewards``)."""


@dataclass(frozen=True)
class Unscored:
    """A scorer's policy for what it leaves unscored: a sample it gives no score (NaN), and every sample of a call
    past its deadline (the pool is then started again), score `default`, counted as the scorer's failures."""

    default: float
    deadline_s: float
    why: str
    """What a sample left unscored means, for the console (a judge's reply without a score its pattern reads)."""
    keys: str
    """The recipe keys that set them, for the console (``reward_model.judge``)."""


@dataclass(frozen=True)
class PoolKind:
    name: str
    count: Callable[[Recipe], int]
    """Its actors under the recipe; 0 when the recipe does not turn it on."""
    cpus: Callable[[Recipe], float]
    """Ray CPUs per actor."""
    gpus: Callable[[Recipe], int]
    """GPUs per actor on cuda (0 on CPU, where every pool runs on the node's cores)."""
    memory: str
    """The fit check's function for one actor's memory (``grpo_ray.planner.memory``; every pool's is modelled)."""
    time: str | None
    """The time model of its work (``grpo_ray.planner.speed.TIME_MODELS``), or None: not modelled."""
    model: str | None = None
    """The recipe key of the model its actors load (resolved before start), or None."""
    group: Literal["fsdp", "engine"] | None = None
    """How its actors work together: one FSDP2 group (formed at start, every actor in every call), each a vLLM
    engine of its own, or none (independent workers)."""
    lost: Literal["replace", "restart", "copy", "stop"] = "stop"
    """What losing an actor does: a new one in its place (an engine), the whole pool started again (a group that
    cannot take in a new member), started again taking the copy of its state each actor made as the step began (the
    learner: its state is trained, so only under trainer.fault_tolerance=all, which keeps the copies), or the run
    stops. trainer.fault_tolerance=off stops the run on any loss (``Pools.lost_policy``)."""
    use: str | None = None
    """How a scorer's signal meets training (a name of ``USES``), or None: not a scorer."""
    section: str = ""
    """The recipe section its keys are in; empty: its name (a judge's are reward_model's)."""
    unscored: Callable[[Recipe], Unscored] | None = None
    """A sequence scorer's policy for samples it leaves unscored and calls past a deadline; None: it scores every
    sample, and a call that fails is its ``lost`` policy's."""
    checked: str = ""
    """How its own model is checked before start, with the policy's tokenizer (a function of ``setup_run``'s
    ``MODEL_CHECKS``: the teacher's tokenizer must be the policy's, a reward model's head); empty: found or built,
    not checked further."""
    timing: str = ""
    """The metric of its work's seconds a step; empty: ``timing_s/<name>`` (the reference's is verl's name)."""
    cpu_runtime_gb: float = 0.55
    """Resident memory of one actor's process on CPU before any model: Python, torch, transformers, Ray (measured
    on this project's CPU machine; the fit check's runtime part)."""

    @property
    def signal(self) -> Literal["token", "sequence"] | None:
        """What a scorer gives each sample: a logprob per token (to the learner), a score per sequence (to the
        rewards), or nothing (not a scorer); its use's."""
        return USES[self.use].per if self.use else None

    @property
    def timing_key(self) -> str:
        """The metric of its work's seconds a step."""
        return self.timing or f"timing_s/{self.name}"

    def section_of(self, r: Recipe):
        """Its recipe section."""
        return getattr(r, self.section or self.name)

    def model_name(self, r: Recipe) -> str:
        """Its model as the recipe names it (the value at its ``model`` key), or empty."""
        section, _, key = (self.model or "").partition(".")
        return getattr(getattr(r, section), key) if self.model else ""


GENERATOR, LEARNER, REFERENCE, TEACHER, REWARD_MODEL, JUDGE, RULES = (
    "generator",
    "learner",
    "reference",
    "teacher",
    "reward_model",
    "judge",
    "reward",
)
"""The pool kinds' names (each its recipe section), for code that means one pool: a job that starts some, the
learner's reading of a signal by its meaning. Code that does the same for every pool loops over KINDS."""


def _on_gpu(n: int) -> Callable[[Recipe], int]:
    return lambda r: n if r.cluster.device == "cuda" else 0


def _frozen_scorer(name: str, model: str, count: Callable[[Recipe], int], use: str, **more) -> PoolKind:
    """A frozen model scoring every sampled token (one FSDP2 group) for `use`: the reference's memory model on its
    own shape, a phase of its own in the time model; a lost actor starts the pool again and the batch is scored
    again (``Scorers.settled``)."""
    cpus = lambda r: getattr(r, name).num_cpus  # noqa: E731
    return PoolKind(name, count, cpus, _on_gpu(1), "frozen_pool", "frozen", model, "fsdp", "restart", use, **more)


KINDS: dict[str, PoolKind] = {
    k.name: k
    for k in (
        PoolKind(
            GENERATOR,
            count=lambda r: r.generator.num_engines,
            cpus=lambda r: r.generator.num_cpus,
            gpus=lambda r: r.generator.tensor_parallel_size if r.cluster.device == "cuda" else 0,
            memory="generator_pool",
            time="generation",
            model="model.path",
            group="engine",
            lost="replace",
            cpu_runtime_gb=1.9,
        ),
        PoolKind(
            LEARNER,
            count=lambda r: r.learner.world_size,
            cpus=lambda r: r.learner.num_cpus,
            gpus=_on_gpu(1),
            memory="learner_pool",
            time="update",
            model="model.path",
            group="fsdp",
            lost="copy",
            cpu_runtime_gb=0.60,
        ),
        # no KL term: no reference; LoRA: the learner is its own reference (the adapters switched off)
        _frozen_scorer(
            REFERENCE,
            "model.path",
            lambda r: r.reference.num_actors if r.algorithm.kl_coef > 0 and not r.model.lora.rank else 0,
            KL,
            timing="timing_s/ref",
        ),
        _frozen_scorer(
            TEACHER,
            "teacher.model",
            lambda r: r.teacher.num_actors if r.teacher.model else 0,
            DISTILL,
            checked="teacher_base",
        ),
        PoolKind(  # a one-output classifier: one FSDP2 group, so a lost actor restarts the pool
            REWARD_MODEL,
            count=lambda r: (
                r.reward_model.num_actors if r.reward_model.model and not r.reward_model.judge.template else 0
            ),
            cpus=lambda r: r.reward_model.num_cpus,
            gpus=_on_gpu(1),
            memory="reward_model_pool",
            time="learned_reward",
            model="reward_model.model",
            group="fsdp",
            lost="restart",
            use=REWARD_COMPONENT,
            checked="reward_model_path",
        ),
        PoolKind(  # a generative judge: vLLM engines, each grading its share; a lost or late one restarts the pool
            JUDGE,
            count=lambda r: r.reward_model.num_actors if r.reward_model.model and r.reward_model.judge.template else 0,
            cpus=lambda r: r.reward_model.num_cpus,
            gpus=_on_gpu(1),
            memory="judge_pool",
            time="judging",
            model="reward_model.model",
            group="engine",
            lost="restart",
            use=REWARD_COMPONENT,
            section="reward_model",
            checked="reward_model_path",
            unscored=lambda r: Unscored(
                r.reward_model.judge.default,
                r.reward_model.judge.timeout_s,
                f"replies had no score matching reward_model.judge.pattern={r.reward_model.judge.pattern!r} (or "
                "left no room to reply)",
                "reward_model.judge",
            ),
        ),
        PoolKind(
            RULES,
            count=lambda r: r.reward.num_actors,
            cpus=lambda r: r.reward.num_cpus,
            gpus=lambda r: 0,  # rule rewards run on CPUs everywhere
            memory="reward_pool",
            time="rule_reward",
            lost="replace",  # independent workers: a new one scores the lost one's share (Scorers.rule_scores)
            use=REWARD_COMPONENT,
            cpu_runtime_gb=0.35,
        ),
    )
}
"""Every pool kind, in the order pools start and are listed."""

POOLS = KINDS.keys()
"""The pool names, in KINDS' order (a view: a plugin's row is among them, ``grpo_ray.extend``)."""
