"""LoRA on the learner (peft): wrap the model, switch the adapters off for the reference, merge them for a sync.

With ``model.lora.rank > 0`` the learner's model is a peft ``PeftModel``: each target linear layer gets adapters
A (rank x in) and B (out x rank), B starting at zero, and only they train. The base weights are frozen: no
gradients, no optimizer state, nothing in a checkpoint but the adapters. The reference is the same model with
the adapters off (``adapters_off``), so a LoRA run has no reference pool and no second copy of the weights.

A sync (``engine_weights``) sends one of two things (``model.lora.sync``):

- ``adapters``: A and B only, under peft's saved names. The engine writes them as a peft adapter directory
  (``write_adapter``) and loads it, in place of the last one, through vLLM's LoRA support, over its unchanged
  base weights.
- ``merged``: each target weight merged, W + (alpha / rank) B A, under the base model's own name, for engines
  without LoRA support (the other weights are frozen: the engines hold them as they loaded them). Every learner
  rank merges the rows it holds: FSDP2 cuts W and B along dimension 0 into the same rows, and A (rank x in) is
  small and gathered whole, so no weight is ever unsharded.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path

import torch

from grpo_ray.config import LoraConfig
from grpo_ray.models import vision

PREFIX = "base_model.model."
"""What peft puts before the wrapped model's parameter names."""


def wrap(model: torch.nn.Module, cfg: LoraConfig, freeze_vision: bool = False) -> torch.nn.Module:
    """`model` as the learner trains it: with adapters on its target modules (peft), base weights frozen, or
    unchanged when cfg.rank is 0; a vision-language model's adapters are its language model's alone, and its vision
    tower is frozen with `freeze_vision` (``model.freeze_vision``)."""
    if freeze_vision:
        vision.freeze_tower(model)
    if not cfg.rank:
        return model
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    targets = "all-linear" if list(cfg.target_modules) == ["all-linear"] else list(cfg.target_modules)
    outside = vision.OUTSIDE_THE_LANGUAGE_MODEL  # (matches nothing in a text model)
    return get_peft_model(
        model,
        PeftLoraConfig(
            r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=targets, exclude_modules=outside
        ),
    )


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside (the model itself without LoRA): what FSDP2 shards."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def adapters_off(model: torch.nn.Module):
    """Inside the block, the model is its base: the reference policy."""
    return model.disable_adapter() if hasattr(model, "disable_adapter") else contextlib.nullcontext()


def is_adapter(name: str) -> bool:
    return ".lora_" in name


def base_name(name: str) -> str:
    """The base model's name of a parameter of the wrapped model ('...q_proj.base_layer.weight' ->
    '...q_proj.weight')."""
    return name.removeprefix(PREFIX).replace(".base_layer.", ".")


def engine_weights(
    model: torch.nn.Module, local: Callable, adapters_only: bool = False
) -> dict[str, tuple[torch.Size, Callable[[], torch.Tensor]]]:
    """What a sync sends, in order: the engine's name of each weight -> (its full shape, a function returning this
    rank's rows of it). `local(param)` gives a parameter's rows on this rank. With `adapters_only`, the adapters
    under peft's saved names; otherwise every base weight that trains or is adapted (merged with its adapters): a
    frozen one is the engines' own from the start. Every rank must call the functions in the same order (A's gather
    is collective)."""
    if adapters_only:
        return {
            name.replace(".default.", "."): (p.shape, lambda p=p: local(p))
            for name, p in model.named_parameters()
            if is_adapter(name)
        }
    adapted = {}
    for prefix, module in model.named_modules():
        if hasattr(module, "lora_A") and "default" in getattr(module, "lora_A", {}):
            adapted[f"{prefix}.base_layer.weight"] = module
    out = {}
    for name, p in model.named_parameters():
        if is_adapter(name) or not (p.requires_grad or name in adapted):
            continue  # (a frozen weight never changes, and every engine loaded it as it started)
        if name in adapted:
            out[base_name(name)] = (p.shape, _merged(p, adapted[name], local))
        else:
            out[base_name(name)] = (p.shape, lambda p=p: local(p))
    return out


def _merged(weight, module, local: Callable) -> Callable[[], torch.Tensor]:
    def rows() -> torch.Tensor:
        a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
        full_a = a.full_tensor() if hasattr(a, "full_tensor") else a
        with torch.no_grad():
            return local(weight) + module.scaling["default"] * (local(b) @ full_a)

    return rows


def write_adapter(directory: str, tensors: dict[str, torch.Tensor], alpha: float) -> None:
    """A peft adapter directory (what vLLM's LoRA support loads) from A and B under peft's saved names; the rank
    and target modules are read off the tensors."""
    from safetensors.torch import save_file

    a = {name: t for name, t in tensors.items() if name.endswith("lora_A.weight")}
    config = {
        "peft_type": "LORA",
        "r": next(iter(a.values())).shape[0],
        "lora_alpha": alpha,
        "bias": "none",
        "target_modules": sorted({name.split(".")[-3] for name in a}),
        "lora_dropout": 0.0,
        "fan_in_fan_out": False,
        "use_rslora": False,
    }
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(Path(directory) / "adapter_model.safetensors"))
    (Path(directory) / "adapter_config.json").write_text(json.dumps(config))
