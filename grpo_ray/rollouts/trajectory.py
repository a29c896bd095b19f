"""One multi-turn trajectory as it is built, turn by turn (``grpo_ray.rollouts.episodes``) or call by call
(``grpo_ray.rollouts.agents``), and the seed of each of its turns."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from grpo_ray.envs.child import EnvChild
from grpo_ray.types import Completion, Episode


@dataclass
class Trajectory:
    prompt: int
    """Index of its prompt in the batch."""
    seed: int
    key: str
    child: EnvChild
    generation: int = 0
    """The child's generation its episode started in."""
    ids: list[int] = field(default_factory=list)
    """Tokens after the prompt."""
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    """The version of the weights that sampled each token (an observation's: its turn's last token's)."""
    texts: list[str] = field(default_factory=list)
    episode: Episode = field(default_factory=lambda: Episode([], 0.0))
    finish_reason: str = "stop"
    closed: bool = True
    """Its last turn ended with the end-of-turn token (not with a stop string)."""

    def completion(self) -> Completion:
        return Completion(
            self.prompt,
            self.ids,
            "".join(self.texts),
            self.logprobs,
            self.finish_reason,
            self.mask,
            self.episode,
            self.versions or None,
        )


def turn_seed(seed: int, sample: int, turn: int) -> int:
    """The sampling seed of one turn of one sample of a prompt (whose seed is `seed`): no history needed."""
    return int.from_bytes(hashlib.blake2b(f"{seed}/{sample}/{turn}".encode(), digest_size=4).digest(), "little")


def turn_params(sampling, stop: list[str], max_tokens: int, seed: int, banned: list[int] = ()):
    """vLLM's sampling parameters of one model turn: the recipe's sampling (a SamplingConfig), at most `max_tokens`,
    the environment's `stop` strings (kept in the output: they are sampled tokens), the sampled tokens' logprobs;
    the `banned` tokens never sampled (a vision-language model's image placeholders: ``vision.placeholder_ids``)."""
    from vllm import SamplingParams

    from grpo_ray.models.vision import BAN

    return SamplingParams(
        n=1,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        max_tokens=max_tokens,
        logprobs=0,
        stop=list(stop) or None,
        include_stop_str_in_output=True,
        seed=seed,
        logit_bias={t: BAN for t in banned} or None,
    )
