"""A model's shape (``ModelDims``), read from its config without loading weights: what the fit check, the FLOPs
count and the pools' memory sizes are worked out from. ``setup_run`` reads it once for a run's model and carries it
in the run's inputs to the pools and roles."""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit

from grpo_ray import models
from grpo_ray.models import tiny


class Tower(NamedTuple):
    """A vision tower's shape, for the time a picture takes through it (``planner.work.tower_seconds``)."""

    layers: int
    hidden: int
    inner: int
    heads: int
    patches: int
    """The positions a picture is read as (SigLIP's fixed (image_size / patch_size) squared)."""
    projected: int
    """The width of the projection's output (the language model's)."""


@dataclass(frozen=True)
class ModelDims:
    """The numbers a memory estimate needs, read from a config without loading weights."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    max_positions: int = 0
    """Longest sequence the model's positions allow (max_position_embeddings); 0 when unknown."""
    vision: int = 0
    """Parameters of a vision-language model's vision tower and its projection (``vision_params``; 0: a text
    model): held, trained and pushed as the rest are (in ``params``); not in the FLOPs a text token costs."""
    projector: int = 0
    """Of ``vision``, the projection's (``projector_params``): it trains when model.freeze_vision keeps the tower."""
    tower: Tower | None = None
    """The tower's shape where a picture's positions are fixed (SigLIP's: Gemma 3); None for a text model, and for
    Qwen-VL's ViT, whose positions follow each picture's size."""

    @property
    def attn_dim(self) -> int:
        """Width of the attention output: heads x head_dim."""
        return self.heads * self.head_dim

    @property
    def matmul_params(self) -> int:
        """Parameters that take part in a matmul per token: every decoder linear layer and the LM head (not the
        embedding lookup, norms or biases), for the FLOPs count."""
        return self.layers * self.layer_params + self.vocab * self.hidden

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder block: attention projections and a gated MLP (norms and biases ignored)."""
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        return attn + 3 * self.hidden * self.intermediate

    def linears(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of a decoder block, by module name (the LM head aside)."""
        h, a, kv, i = self.hidden, self.attn_dim, self.kv_heads * self.head_dim, self.intermediate
        return {
            "q_proj": (h, a),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (a, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def lora_targets(self, targets: list[str]) -> dict[str, tuple[int, int]]:
        """The linear layers of a block that LoRA's `targets` name ([all-linear]: all of them), as ``linears``."""
        every = self.linears()
        return every if list(targets) == ["all-linear"] else {t: every[t] for t in targets}

    def lora_params(self, rank: int, targets: list[str]) -> int:
        """Adapter parameters of LoRA at `rank` on the `targets` of every block."""
        return self.layers * sum(rank * (i + o) for i, o in self.lora_targets(targets).values())

    @property
    def embedding_params(self) -> int:
        """Input embedding plus, when untied, the LM head."""
        return self.vocab * self.hidden * (1 if self.tied else 2)

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.embedding_params + self.vision

    def trained(self, m) -> int:
        """Parameters that train under model section `m`: LoRA's adapters, or every one but a tower kept frozen."""
        if m.lora.rank:
            return self.lora_params(m.lora.rank, m.lora.target_modules)
        return self.params - (self.vision - self.projector if m.freeze_vision else 0)

    def pushed(self, m) -> int:
        """Parameters a weight sync sends under model section `m`: what trains, or LoRA's adapted weights merged."""
        if m.lora.rank and m.lora.sync == "merged":
            return self.layers * sum(i * o for i, o in self.lora_targets(m.lora.target_modules).values())
        return self.trained(m)


def vision_params(vc: dict, text_hidden: int) -> int:
    """Parameters of a vision tower of config `vc` (a ``vision_config``) and of its projection to the language
    model's width `text_hidden`, norms and biases aside: its blocks' attention and MLP, its patch and position
    embeddings, the projection. SigLIP's shape (Gemma 3); Qwen-VL's ViT (``depth``, ``out_hidden_size``) has a
    gated MLP, no position table, and a merger of ``spatial_merge_size`` squared patches."""
    h = vc["hidden_size"]
    inner = vc.get("intermediate_size") or 4 * h
    patch = vc.get("patch_size", 14)
    channels = vc.get("num_channels") or vc.get("in_channels") or vc.get("in_chans") or 3
    embed = channels * patch * patch * vc.get("temporal_patch_size", 1) * h
    if "out_hidden_size" in vc:  # Qwen2.5-VL / Qwen3-VL
        return vc["depth"] * (4 * h * h + 3 * h * inner) + embed + projector_params(vc, text_hidden)
    positions = (vc.get("image_size", 224) // patch) ** 2 * h
    return vc["num_hidden_layers"] * (4 * h * h + 2 * h * inner) + embed + positions + projector_params(vc, text_hidden)


def projector_params(vc: dict, text_hidden: int) -> int:
    """Of ``vision_params``, the projection's: SigLIP's linear map to the language model's width (Gemma 3), or
    Qwen-VL's merger (two layers over ``spatial_merge_size`` squared patches)."""
    h = vc["hidden_size"]
    if "out_hidden_size" in vc:
        merged = h * vc.get("spatial_merge_size", 2) ** 2
        return merged * merged + merged * vc["out_hidden_size"]
    return h * text_hidden


def vision_dims(vc: dict, text_hidden: int) -> tuple[int, int, Tower | None]:
    """``ModelDims.vision``, ``.projector`` and ``.tower`` of a vision tower of config `vc`."""
    tower = None
    if "out_hidden_size" not in vc:  # SigLIP: every picture resized to image_size
        h = vc["hidden_size"]
        side = vc.get("image_size", 224) // vc.get("patch_size", 14)
        inner, heads = vc.get("intermediate_size") or 4 * h, vc.get("num_attention_heads") or max(1, h // 64)
        tower = Tower(vc["num_hidden_layers"], h, inner, heads, side * side, text_hidden)
    return vision_params(vc, text_hidden), projector_params(vc, text_hidden), tower


SIGLIP_896 = {
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "patch_size": 14,
    "image_size": 896,
}
"""Gemma 3's vision tower (SigLIP so400m at 896 pixels), as its checkpoints' config.json has it."""


# Text-model shapes of the public checkpoints our recipes name (their config.json), so `plan` runs offline.
KNOWN_DIMS = {
    "Qwen/Qwen2.5-32B-Instruct": ModelDims(64, 5120, 40, 8, 128, 27648, 152064, False, 32768),
    "Qwen/Qwen2.5-0.5B-Instruct": ModelDims(24, 896, 14, 2, 64, 4864, 151936, True, 32768),
    "Qwen/Qwen2.5-1.5B-Instruct": ModelDims(28, 1536, 12, 2, 128, 8960, 151936, True, 32768),
    "Qwen/Qwen2.5-7B-Instruct": ModelDims(28, 3584, 28, 4, 128, 18944, 152064, False, 32768),
    "meta-llama/Llama-3.1-8B-Instruct": ModelDims(32, 4096, 32, 8, 128, 14336, 128256, False, 131072),
    # a reward model: Llama-3.1-8B-Instruct's body with a one-output score head
    "Skywork/Skywork-Reward-V2-Llama-3.1-8B": ModelDims(32, 4096, 32, 8, 128, 14336, 128256, False, 131072),
    "google/gemma-3-27b-it": ModelDims(
        62, 5376, 32, 16, 128, 21504, 262208, True, 131072, *vision_dims(SIGLIP_896, 5376)
    ),
    "google/gemma-3-1b-it": ModelDims(26, 1152, 4, 1, 256, 6912, 262144, True, 32768),
    "google/gemma-3-4b-it": ModelDims(34, 2560, 8, 4, 256, 10240, 262208, True, 131072, *vision_dims(SIGLIP_896, 2560)),
}


@functools.cache
def hub_answers(timeout_s: float = 3.0) -> bool:
    """Whether the Hugging Face hub (HF_ENDPOINT) takes a connection within `timeout_s`: when it does not, configs
    are read from the cache only, without the hub client's half minute of retries. Asked once a process."""
    import socket

    host = urlsplit(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((host.hostname, host.port or 443), timeout=timeout_s).close()
        return True
    except OSError:
        return False


def model_dims(name: str, key: str = "model.path") -> ModelDims:
    """Shape of `name` without loading weights or writing anything: a local config.json, the table above, or the
    Hugging Face cache; a tiny model's built config (the vocabulary its tokenizer really got), or before it is
    built, its name's shape (the vocabulary asked for). Raises ModelNameError (naming the recipe's `key`) when none
    of them knows it."""
    if models.is_sft(name):  # fine-tuning keeps the shape
        name = models.sft_base(name)
    if models.is_tiny(name):
        built = models.tiny_dir(name)
        if not (built / "config.json").is_file():
            return tiny_dims(tiny.parse_tiny(name))
        name = str(built)
    if name in KNOWN_DIMS:
        return KNOWN_DIMS[name]
    path = Path(name) / "config.json"
    if Path(name).is_dir() and not path.is_file():
        raise models.ModelNameError(
            f"{key}={name!r}: the directory has no config.json, so it is not a Hugging Face model"
        )
    if name.startswith(("/", "./", "../", "~")) and not Path(name).expanduser().exists():
        raise models.ModelNameError(f"{key}={name!r}: no such directory")
    offline = False
    try:
        if path.is_file():
            cfg = json.loads(path.read_text())
        else:
            from transformers import AutoConfig

            offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on") or not hub_answers()
            cfg = AutoConfig.from_pretrained(name, local_files_only=offline).to_dict()  # the cache, else the hub
    except (OSError, ValueError) as e:
        why = (
            "not in the Hugging Face cache, and offline (HF_HUB_OFFLINE, or the hub does not answer)"
            if offline
            else f"not in the Hugging Face cache and not fetched from the hub ({str(e).splitlines()[0][:200]})"
        )
        raise models.ModelNameError(
            f"{key}={name!r}: no config.json: {why}; download the model, or name a local directory"
        ) from None
    vision = cfg.get("vision_config")
    cfg = cfg.get("text_config", cfg)  # multimodal checkpoints (Gemma 3 >= 4B) keep the LM's shape here
    heads = cfg["num_attention_heads"]
    return ModelDims(
        cfg["num_hidden_layers"],
        cfg["hidden_size"],
        heads,
        cfg.get("num_key_value_heads", heads),
        cfg.get("head_dim") or cfg["hidden_size"] // heads,
        cfg["intermediate_size"],
        cfg["vocab_size"],
        bool(cfg.get("tie_word_embeddings", True)),
        int(cfg.get("max_position_embeddings") or 0),
        *(vision_dims(vision, cfg["hidden_size"]) if vision else (0, 0, None)),
    )


def tiny_dims(spec: tiny.TinySpec) -> ModelDims:
    """The shape a tiny model of `spec` is built with (its vocabulary as asked: the trained one can be smaller)."""
    return ModelDims(
        spec.layers,
        spec.hidden,
        spec.heads,
        spec.kv_heads,
        spec.head_dim,
        spec.mlp_width,
        spec.vocab,
        bool(spec.tie),
        spec.max_len,
        *(vision_dims(tiny.vision_config(spec), spec.hidden) if spec.vision else (0, 0, None)),
    )
