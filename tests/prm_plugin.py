"""A process reward model as a plugin (a recipe's ``plugins: [tests.prm_plugin]``): its row, its section, its role
and its use, and nothing else. Its model scores every sampled token (the probability it gives the token: a step
that reads as it would have written it scores high), and its use adds ``prm.coef`` times that score, centred, to
each token's advantage (as PRIME's implicit process reward is a per-token term beside the outcome's)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from grpo_ray.config import PoolKind, ScorerConfig, Use
from grpo_ray.extend import add_pool, add_use
from grpo_ray.roles.reference import Reference

PRM, PROCESS_REWARD = "prm", "process_reward"


@dataclass
class PRMConfig(ScorerConfig):
    """A process reward model scoring every sampled token."""

    model: str = ""
    """The PRM: a causal LM (a hub name, a local path or a ``tiny://`` name); empty turns it off."""
    coef: float = 0.1
    """Weight of its per-token score, centred on 0.5, in each token's advantage."""


class ProcessRewardModel(Reference):
    """The reference's forward on the PRM's model; each token's score is the probability it gives the token."""

    def score(self, pairs: list) -> list[list[float]]:
        return [[math.exp(v) for v in values] for values in super().score(pairs)]


def process_reward(advantages: torch.Tensor, old: torch.Tensor, signal: torch.Tensor, keep: torch.Tensor, section):
    """Each kept token's advantage plus coef x (its score - 0.5)."""
    m = keep.to(old.dtype)
    base = advantages.to(old.dtype)
    per_token = (base.unsqueeze(1) if base.dim() == 1 else base) * m
    return per_token + section.coef * (signal.to(old.dtype) - 0.5) * m, {}


add_use(PROCESS_REWARD, Use("token", "each token's advantage plus prm.coef x (its score - 0.5)"), process_reward)
add_pool(
    PoolKind(
        PRM,
        count=lambda r: r.prm.num_actors if r.prm.model else 0,
        cpus=lambda r: r.prm.num_cpus,
        gpus=lambda r: 1 if r.cluster.device == "cuda" else 0,
        memory="frozen_pool",
        time="frozen",
        model="prm.model",
        group="fsdp",
        use=PROCESS_REWARD,
    ),
    PRMConfig,
    ProcessRewardModel,
)
