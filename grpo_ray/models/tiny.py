"""Tiny Hugging Face checkpoints built offline from a ``tiny://ARCH?key=value&...`` name: its shape (``TinySpec``,
``parse_tiny``), a byte-level BPE tokenizer trained here on the synthetic task's text (``train_tokenizer``) with the
family's chat template and special tokens, and random weights from the name's ``seed`` (``build_tiny``).
``models.resolve`` builds one into the cache the first time its name is asked for."""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from grpo_ray.errors import UserError

TINY_SCHEME = "tiny://"
ARCHS = ("qwen2", "llama", "gemma3")


class ModelNameError(UserError):
    """A ``tiny://`` name that cannot be built."""


@dataclass(frozen=True)
class TinySpec:
    """The shape of a tiny model; each field is a query key of a ``tiny://`` name."""

    arch: str
    layers: int = 2
    """Number of transformer blocks."""
    hidden: int = 128
    """Hidden size."""
    heads: int = 4
    """Attention heads; hidden / heads is the head size (vLLM on CPU wants 32, 64, 80, 96, 112, 128, ...)."""
    kv_heads: int = 2
    """Key/value heads (grouped-query attention)."""
    intermediate: int = 0
    """MLP width; 0 means 4 x hidden."""
    vocab: int = 384
    """Tokenizer vocabulary size: the base symbols, the family's special tokens and learned merges."""
    bytes: int = 1
    """1: all 256 byte symbols are in the vocabulary, so any text encodes. 0: only the characters of the
    training text, for a vocabulary small enough that a random-init model hits a one-token answer by chance
    (text with other characters loses them)."""
    max_len: int = 1024
    """Longest sequence (max_position_embeddings)."""
    tie: int = 1
    """1 ties input and output embeddings (as small Qwen2 / Gemma3 / Llama-3.2 do)."""
    seed: int = 0
    """Seed of the random weights."""
    text: str = "select"
    """The synthetic task whose text trains the tokenizer: select or reasoning (grpo_ray.data.synthetic)."""
    score: int = 0
    """N > 0: a sequence classifier with N outputs (a reward model: ``reward_model.model``; of several, as a
    multi-objective one has, ``reward_model.head`` picks the score), not a language model."""
    vision: int = 0
    """N > 0: a vision-language model, Gemma 3's shape (gemma3 only): a SigLIP tower of N layers reads each image at
    64 x 64 pixels as 16 tokens between ``<start_of_image>`` and ``<end_of_image>``; saved with its processor. With
    `score`, a reward model that reads images (``Gemma3ForSequenceClassification``)."""

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def mlp_width(self) -> int:
        """The MLP's width as built: `intermediate`, or 4 x hidden when it is 0."""
        return self.intermediate or 4 * self.hidden

    def canonical(self) -> str:
        optional = {"score": self.score, "vision": self.vision}  # shown when set: older names keep their hash
        shown = [f.name for f in fields(self) if f.name != "arch" and optional.get(f.name, 1)]
        query = "&".join(f"{name}={getattr(self, name)}" for name in shown)
        return f"{TINY_SCHEME}{self.arch}?{query}"


def parse_tiny(name: str) -> TinySpec:
    """Parse ``tiny://ARCH?k=v&...`` into a spec; errors name the bad part."""
    parts = urlsplit(name)
    arch = parts.netloc or parts.path.strip("/")
    if arch not in ARCHS:
        raise ModelNameError(f"{name!r}: unknown tiny architecture {arch!r}; expected one of {', '.join(ARCHS)}")
    known = {f.name for f in fields(TinySpec)} - {"arch"}
    values: dict[str, int | str] = {}
    for key, raw in parse_qsl(parts.query, keep_blank_values=True):
        if key not in known:
            raise ModelNameError(f"{name!r}: unknown key {key!r}; expected one of {', '.join(sorted(known))}")
        if key == "text":
            values[key] = raw
            continue
        try:
            values[key] = int(raw)
        except ValueError:
            raise ModelNameError(f"{name!r}: {key}={raw!r} is not an integer") from None
    spec = TinySpec(arch=arch, **values)
    from grpo_ray.data.synthetic import TASKS

    if spec.text not in TASKS:
        raise ModelNameError(f"{name!r}: text={spec.text!r}; expected one of {', '.join(TASKS)}")
    if spec.hidden % spec.heads or spec.heads % spec.kv_heads:
        raise ModelNameError(
            f"{name!r}: hidden={spec.hidden} must be divisible by heads={spec.heads}, "
            f"and heads by kv_heads={spec.kv_heads}"
        )
    if min(spec.layers, spec.hidden, spec.heads, spec.kv_heads, spec.max_len, spec.vocab) <= 0:
        raise ModelNameError(f"{name!r}: sizes must be positive")
    if spec.vision and spec.arch != "gemma3":
        raise ModelNameError(
            f"{name!r}: vision={spec.vision} builds Gemma 3's vision-language shape: arch gemma3 (Qwen2.5-VL "
            "and Qwen3-VL twins need torchvision, which has no build for this CPU torch: docs/training.md#images)"
        )
    if spec.bytes and spec.vocab <= 300:
        raise ModelNameError(
            f"{name!r}: vocab={spec.vocab} is too small for the 256 byte symbols; use vocab > 300 or bytes=0"
        )
    return spec


_FAMILY = {
    "qwen2": {
        "specials": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "bos": None,
        "eos": "<|im_end|>",
        "pad": "<|endoftext|>",
        "template": (
            "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
        ),
    },
    "llama": {
        "specials": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        "bos": "<|begin_of_text|>",
        "eos": "<|eot_id|>",
        "pad": "<|end_of_text|>",
        "template": (
            "<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
            "{{ m['content'] }}<|eot_id|>{% endfor %}"
            "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
        ),
    },
    "gemma3": {
        "specials": ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"],
        "bos": "<bos>",
        "eos": "<end_of_turn>",
        "pad": "<pad>",
        "template": (
            "<bos>{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
            "{{ m['content'] }}<end_of_turn>\n{% endfor %}"
            "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
        ),
    },
}


VISION = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
"""Gemma 3's image tokens: the processor writes each image as ``<start_of_image>``, its soft tokens and
``<end_of_image>``, with a blank line either side."""
IMAGE_SIDE, IMAGE_TOKENS, PATCH = 64, 16, 8
"""A vision twin's image side in pixels, tokens an image and patch side (SigLIP's 64 patches pooled to 16)."""


def _vision_template(template: str) -> str:
    """The family's chat template, with a message's content also a list of parts: an image part is its marker."""
    parts = (
        "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
        "{% if c['type'] == 'image' %}" + VISION["boi_token"] + "{% else %}{{ c['text'] }}{% endif %}"
        "{% endfor %}{% endif %}"
    )
    return template.replace("{{ m['content'] }}", parts)


def train_tokenizer(arch: str, texts: list[str], vocab_size: int, all_bytes: bool = True, vision: bool = False):
    """A byte-level BPE tokenizer for `arch`, trained offline on `texts`; digits stay single tokens. With `vision`,
    Gemma 3's image tokens too (``VISION``), and a template that renders image parts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    family = _FAMILY[arch]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=family["specials"] + (list(VISION.values()) if vision else []),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet() if all_bytes else [],
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=family["bos"],
        eos_token=family["eos"],
        pad_token=family["pad"],
        **({"extra_special_tokens": VISION} if vision else {}),
    )
    fast.chat_template = _vision_template(family["template"]) if vision else family["template"]
    return fast


def vision_config(spec: TinySpec) -> dict:
    """A vision twin's SigLIP tower: spec.vision layers, half the text's width (at least 32)."""
    width = max(32, spec.hidden // 2)
    return dict(
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=spec.vision,
        num_attention_heads=max(1, width // 32),
        image_size=IMAGE_SIDE,
        patch_size=PATCH,
        vision_use_head=False,
    )


def _vision_config(spec: TinySpec, text, tokenizer):
    """Gemma 3's vision-language config around `text`: a SigLIP tower of spec.vision layers, half the text's width."""
    from transformers import Gemma3Config

    ids = {k: tokenizer.convert_tokens_to_ids(v) for k, v in VISION.items()}
    cfg = Gemma3Config(
        text_config=text.to_dict(),
        vision_config=vision_config(spec),
        mm_tokens_per_image=IMAGE_TOKENS,
        boi_token_index=ids["boi_token"],
        eoi_token_index=ids["eoi_token"],
        image_token_index=ids["image_token"],
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=bool(spec.tie),
    )
    cfg.architectures = ["Gemma3ForSequenceClassification" if spec.score else "Gemma3ForConditionalGeneration"]
    if spec.score:  # a reward model that reads images: its score from the last token, as a text one's
        cfg.num_labels = spec.score
    return cfg


def _config(spec: TinySpec, vocab_size: int, tokenizer):
    from transformers import Gemma3TextConfig, LlamaConfig, Qwen2Config

    common = dict(
        vocab_size=vocab_size,
        hidden_size=spec.hidden,
        intermediate_size=spec.mlp_width,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_len,
        tie_word_embeddings=bool(spec.tie),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        dtype="float32",
    )
    if spec.arch == "qwen2":
        cfg = Qwen2Config(**common)
    elif spec.arch == "llama":
        cfg = LlamaConfig(**common)
    else:
        cfg = Gemma3TextConfig(**common, sliding_window=min(512, spec.max_len), query_pre_attn_scalar=spec.head_dim)
    cfg.architectures = [
        {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM", "gemma3": "Gemma3ForCausalLM"}[spec.arch]
    ]
    if spec.vision:
        return _vision_config(spec, cfg, tokenizer)
    if spec.score:  # scores from the last token (transformers finds it by the pad id)
        cfg.num_labels = spec.score
        cfg.architectures = [cfg.architectures[0].replace("ForCausalLM", "ForSequenceClassification")]
    return cfg


def build_tiny(spec: TinySpec, out: Path, extra_texts: list[str] | None = None) -> Path:
    """Write a randomly initialised checkpoint of `spec` to `out` (atomically: built aside, then renamed)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a tiny build is instant; keep the CLI's output to its own lines

    from grpo_ray.data import synthetic

    texts = synthetic.corpus(spec.text) + list(extra_texts or []) + (["\n\n"] if spec.vision else [])
    tokenizer = train_tokenizer(spec.arch, texts, spec.vocab, all_bytes=bool(spec.bytes), vision=bool(spec.vision))
    vocab_size = len(tokenizer)
    config = _config(spec, vocab_size, tokenizer)
    torch.manual_seed(spec.seed)
    processor = None
    if spec.vision:
        from transformers import Gemma3ForConditionalGeneration, Gemma3ForSequenceClassification, Gemma3Processor
        from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

        kind = Gemma3ForSequenceClassification if spec.score else Gemma3ForConditionalGeneration
        model = kind._from_config(config, dtype=torch.float32)
        with torch.no_grad():  # transformers starts the projection at 0: no image would reach the language model
            model.model.multi_modal_projector.mm_input_projection_weight.normal_(
                0, config.vision_config.hidden_size**-0.5
            )
        pixels = Gemma3ImageProcessorPil(size={"height": IMAGE_SIDE, "width": IMAGE_SIDE})
        processor = Gemma3Processor(pixels, tokenizer, tokenizer.chat_template, image_seq_length=IMAGE_TOKENS)
    elif spec.score:
        from transformers import AutoModelForSequenceClassification

        model = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        (processor or tokenizer).save_pretrained(tmp)
        GenerationConfig(
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
        ).save_pretrained(tmp)
        (tmp / "tiny_spec.json").write_text(json.dumps({"name": spec.canonical()}, indent=1))
        try:
            tmp.rename(out)
        except OSError:  # another process built it first: theirs is as good as ours
            if not (out / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
