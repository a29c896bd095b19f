"""Rollout dumps: one JSONL line per sample, readable with jq, and enough to replay a step into the learner.

A line holds the prompt and response text, the ground truth, each reward component and the
combined score, the advantage, the policy version that sampled it, and the token ids
(``prompt_ids``, ``response_ids``) and the sampler's logprob of each response token (``sampler_logprobs``)
that ``load_dump`` turns back into rollouts for a replay.
"""

from __future__ import annotations

import json
from pathlib import Path

from grpo_ray.types import Completion, Prompt, Rollout, Scores


def write_dump(path: str, step: int, scores: list[Scores], advantages: list[float] | None, *rollouts: Rollout) -> int:
    """Write the samples of `rollouts` (scored by `scores`, one per reward actor's share, in sample order) to
    `path`; returns the line count.

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
            for c in rollout.completions:
                p = rollout.prompts[c.prompt]
                f.write(json.dumps({
                    "step": step, "uid": p.uid, "data_source": p.data_source,
                    "prompt": p.text, "response": c.text, "ground_truth": p.ground_truth,
                    "score": totals[i], "rewards": {k: v[i] for k, v in components.items()},
                    "advantage": None if advantages is None else advantages[i],
                    "policy_version": rollout.policy_version, "finish_reason": c.finish_reason,
                    "prompt_ids": p.ids, "response_ids": c.token_ids, "sampler_logprobs": c.sampler_logprobs,
                }) + "\n")
                i += 1
    tmp.rename(out)  # a dump is there whole or not at all
    return i


def load_dump(path: str | Path) -> tuple[list[Rollout], list[float]]:
    """A training dump back as one rollout (prompts in order) and its advantages, for a replay."""
    prompts: list[Prompt] = []
    completions: list[Completion] = []
    advantages: list[float] = []
    version = 0
    for line in Path(path).read_text().splitlines():
        d = json.loads(line)
        if d["advantage"] is None:
            raise ValueError(f"{path}: a validation dump has no advantages to replay")
        if not prompts or prompts[-1].uid != d["uid"] or prompts[-1].ids != d["prompt_ids"]:
            prompts.append(Prompt(d["prompt_ids"], d["ground_truth"], d["data_source"], {}, d["uid"], d["prompt"]))
        completions.append(Completion(len(prompts) - 1, d["response_ids"], d["response"], d["sampler_logprobs"],
                                      d["finish_reason"]))
        advantages.append(d["advantage"])
        version = d["policy_version"]
    return [Rollout(prompts, completions, version)], advantages
