"""What every frozen-model scorer's actor shares (the reference and the teacher, ``Reference``; a reward model's
classifier, ``RewardModel``): the model's path, the recipe's compute dtype, its rank in the pool's FSDP2 group and
the address rank 0 hosts the group's store at. A frozen model is loaded and sharded in ``setup`` (each its own way)
and never trained; ``scorers.Scorers`` calls every actor of the group with its share."""

from __future__ import annotations

import torch

from grpo_ray import sync
from grpo_ray.config import Recipe
from grpo_ray.device import Device
from grpo_ray.roles import RoleActor, log_to_file


class FrozenModel(RoleActor):
    def __init__(self, model_path: str, recipe: Recipe, rank: int = 0, world_size: int = 1, threads: int = 1):
        log_to_file()
        torch.set_num_threads(max(1, threads))
        self.run_on = Device.of(recipe)
        self.device = self.run_on.torch
        self.model_path, self.trust_remote_code = model_path, recipe.model.trust_remote_code
        self.dtype = getattr(torch, recipe.learner.dtype)  # the learner's compute dtype: every pool scores alike
        self.rank, self.world_size = rank, world_size

    def address(self) -> tuple[str, int]:
        """A free address on this actor's node (rank 0 hosts the group's store)."""
        return sync.free_address()
