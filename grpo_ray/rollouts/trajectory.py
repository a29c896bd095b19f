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
    given: int = 0
    """Its prompt's images."""
    images: list[bytes] = field(default_factory=list)
    """The images its observations showed, in order (each an image marker in `ids`, which the engine expands)."""
    extra: int = 0
    """Tokens the engine's expansion of those markers adds to `ids` (counted against environment.max_tokens)."""
    turns_at: list[tuple[int, int, int]] = field(default_factory=list)
    """With images (its prompt's or its observations'): each model turn's start in the engine's expanded tokens, its
    start in `ids`, and its length."""
    context: list[int] | None = None
    """With images: the engine's expanded tokens of its last turn's request (the prompt and every turn before)."""

    def completion(self) -> Completion:
        ids, mask, logprobs, versions, context = self.ids, self.mask, self.logprobs, self.versions, None
        if self.context is not None:
            ids, mask, logprobs, versions, context = self.expanded()
        text = "".join(self.texts)
        episode, finish = self.episode, self.finish_reason
        return Completion(
            self.prompt, ids, text, logprobs, finish, mask, episode, versions or None, self.images, context
        )

    def expanded(self) -> tuple[list[int], list[int], list[float], list[int], list[int]]:
        """Its tokens as the engine read them, every image marker expanded into the image's tokens (what the learner
        reads with the images' pixels), with the mask, logprobs and versions moved to them, and its prompt's
        expanded ids. The model's turns are where the engine's requests put them (vLLM's prompt ids of each)."""
        first, (_, at, _) = self.turns_at[0][0], self.turns_at[-1]
        full = self.context + self.ids[at:]
        ids = full[first:]
        mask, logprobs, versions = [0] * len(ids), [0.0] * len(ids), [None] * len(ids)
        for start, at, n in self.turns_at:
            if full[start : start + n] != self.ids[at : at + n]:  # the engine's expansion is not where it was
                raise RuntimeError(f"trajectory {self.key}: a model turn is not where the engine's prompt ids put it")
            for k in range(n):
                mask[start - first + k], logprobs[start - first + k] = 1, self.logprobs[at + k]
                if self.versions:
                    versions[start - first + k] = self.versions[at + k]
        if self.versions:  # an observation's tokens: the version of the turn before them
            for k in range(1, len(versions)):
                versions[k] = versions[k - 1] if versions[k] is None else versions[k]
        return ids, mask, logprobs, versions if self.versions else [], full[:first]


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
