"""Rollout dumps: one JSON line per prompt, its samples in a list, readable with jq (``jq '.samples[].response'``),
and enough to replay a step into the learner.

A line holds the prompt (text and ``prompt_ids``), the ground truth, the policy version that sampled it, and per
sample the response text, each reward component and the combined score, the advantage, the finish reason, the
token ids (``response_ids``) and the sampler's logprob of each response token (``sampler_logprobs``). The prompt
is written once, not once per sample: with 8-16 samples a prompt, that is most of a dump's size. A multi-turn
trajectory's sample also has its ``loss_mask`` (1 on the model's tokens) and ``episode``: its ``turns`` as text
(the model's and the observations', alternately), the environment's reward, tool calls and how it ended.
``read_samples`` gives one flat dict per sample; ``load_dump`` turns a training dump back into rollouts for a
replay.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from pathlib import Path

from grpo_ray.errors import UserError
from grpo_ray.types import Completion, Episode, Prompt, Rollout, Scores


def write_dump(path: str, step: int, scores: list[Scores], advantages: list[float] | None, *rollouts: Rollout) -> int:
    """Write the samples of `rollouts` (scored by `scores`, one per reward actor's share, in sample order) to
    `path`, a line per prompt (its samples in order); returns the sample count.

    Runs as a Ray task on the driver's node: the rollouts arrive as resolved object refs.
    """
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".jsonl.tmp")
    totals = [t for s in scores for t in s.totals]
    components = {k: [v for s in scores for v in s.components[k]] for k in scores[0].components}
    i = 0
    with open(tmp, "w") as f:
        for rollout in rollouts:
            for prompt, group in itertools.groupby(rollout.completions, key=lambda c: c.prompt):
                samples = []
                for c in group:
                    samples.append(
                        {
                            "response": c.text,
                            "score": totals[i],
                            "rewards": {k: v[i] for k, v in components.items() if not math.isnan(v[i])},
                            "advantage": None if advantages is None else advantages[i],
                            "finish_reason": c.finish_reason,
                            "response_ids": c.token_ids,
                            "sampler_logprobs": c.sampler_logprobs,
                            **({"versions": c.versions} if c.versions else {}),
                            **(episode_record(c) if c.episode else {}),
                        }
                    )
                    i += 1
                p = rollout.prompts[prompt]
                f.write(
                    json.dumps(
                        {
                            "step": step,
                            "uid": p.uid,
                            "data_source": p.data_source,
                            "prompt": p.text,
                            "ground_truth": p.ground_truth,
                            "policy_version": rollout.policy_version,
                            "prompt_ids": p.ids,
                            "samples": samples,
                        }
                    )
                    + "\n"
                )
    tmp.rename(out)  # a dump is there whole or not at all
    return i


def read_samples(path: str | Path) -> list[dict]:
    """A dump as one dict per sample, in order: the sample's fields with its prompt's (step, uid, prompt, ...)."""
    out = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        try:
            group = json.loads(line)
            samples = group.pop("samples")
            out += [{**group, **sample} for sample in samples]
        except (json.JSONDecodeError, AttributeError, KeyError, TypeError):
            raise UserError(
                f"{path} line {i}: not a rollout dump's line (a JSON object of a prompt and its samples, as "
                "trainer.dump_freq writes to rollouts/train_data_stepN.jsonl)"
            ) from None
    return out


def episode_record(c: Completion) -> dict:
    """A trajectory's loss mask and episode (its turns as text, alternately the model's and the observations')."""
    return {"loss_mask": c.mask, "episode": dataclasses.asdict(c.episode)}


def load_dump(path: str | Path) -> tuple[list[Rollout], list[float]]:
    """A training dump back as one rollout (prompts in order) and its advantages, for a replay."""
    prompts: list[Prompt] = []
    completions: list[Completion] = []
    advantages: list[float] = []
    version = 0
    if not Path(path).is_file():
        raise UserError(f"{path}: no such file (a dump is rollouts/train_data_stepN.jsonl of a run)")
    samples = read_samples(path)
    need = ("uid", "prompt_ids", "ground_truth", "data_source", "prompt", "response_ids", "response")
    need += ("sampler_logprobs", "finish_reason", "advantage", "policy_version")
    for i, d in enumerate(samples):
        missing = [k for k in need if k not in d]
        if missing:
            raise UserError(f"{path} sample {i}: no {', '.join(missing)}: not a training dump of this grpo-ray")
    if not samples:
        raise UserError(f"{path}: no samples to replay")
    for d in samples:
        if d["advantage"] is None:
            raise UserError(f"{path}: a validation dump has no advantages to replay")
        if not prompts or prompts[-1].uid != d["uid"] or prompts[-1].ids != d["prompt_ids"]:
            prompts.append(Prompt(d["prompt_ids"], d["ground_truth"], d["data_source"], {}, d["uid"], d["prompt"]))
        episode = d.get("episode")
        completions.append(
            Completion(
                len(prompts) - 1,
                d["response_ids"],
                d["response"],
                d["sampler_logprobs"],
                d["finish_reason"],
                d.get("loss_mask"),
                Episode(**episode) if episode else None,
            )
        )
        advantages.append(d["advantage"])
        version = d["policy_version"]
    return [Rollout(prompts, completions, version)], advantages
