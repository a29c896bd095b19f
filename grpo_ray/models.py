"""Model names, and tiny Hugging Face checkpoints built offline.

A recipe's ``model.path`` is one of:

- a hub name (``Qwen/Qwen2.5-1.5B-Instruct``) or a local directory: used as it is;
- ``tiny://ARCH?key=value&...``: a small randomly initialised checkpoint in the
  Qwen2, Llama or Gemma3 architecture, built here with no network, e.g.
  ``tiny://qwen2?layers=2&hidden=128&heads=4&kv_heads=2&seed=0``;
- ``sft://RECIPE.yaml``: the model an SFT recipe makes (``grpo-ray sft``), cached by the hash of the
  resolved recipe. This module only finds it in the cache (``resolve``) or names its base model
  (``base_of``); training it is the job layer's (``grpo_ray.sft.warm_start``, called by ``setup_run``).

A tiny checkpoint is an ordinary Hugging Face directory (``config.json``,
``model.safetensors``, tokenizer files with a chat template of the family's own
shape), so transformers and vLLM load it like any other. Its tokenizer is a
byte-level BPE trained with the ``tokenizers`` library on the synthetic task's
text (and, when given, extra text), so every byte stays encodable. The same name
always gives the same files: weights come from the ``seed`` key, and the
directory is keyed by the canonical name under ``cache_dir()``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from grpo_ray.device import Device
from grpo_ray.errors import UserError

CPU = Device("cpu")

TINY_SCHEME = "tiny://"
SFT_SCHEME = "sft://"
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

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def mlp_width(self) -> int:
        """The MLP's width as built: `intermediate`, or 4 x hidden when it is 0."""
        return self.intermediate or 4 * self.hidden

    def canonical(self) -> str:
        shown = [f.name for f in fields(self) if f.name != "arch" and (f.name != "score" or self.score)]
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
    if spec.bytes and spec.vocab <= 300:
        raise ModelNameError(
            f"{name!r}: vocab={spec.vocab} is too small for the 256 byte symbols; use vocab > 300 or bytes=0"
        )
    return spec


def is_tiny(name: str) -> bool:
    return name.startswith(TINY_SCHEME)


def is_sft(name: str) -> bool:
    return name.startswith(SFT_SCHEME)


def sft_base(name: str) -> str:
    """The model an ``sft://`` name is trained from, through SFT recipes that warm-start from others (the warm
    start's shape and tokenizer); ModelNameError when they name each other in a circle."""
    chain = [Path(name.removeprefix(SFT_SCHEME)).resolve()]
    while is_sft(name):
        name = _sft_recipe(name).model.path
        if is_sft(name):
            path = Path(name.removeprefix(SFT_SCHEME)).resolve()
            if path in chain:
                cycle = " -> ".join(str(p) for p in [*chain[chain.index(path) :], path])
                raise ModelNameError(f"model.path={name!r}: the SFT warm starts name each other in a circle ({cycle})")
            chain.append(path)
    return name


def _sft_recipe(name: str):
    from grpo_ray.config import RecipeError, load_recipe

    try:
        return load_recipe(name.removeprefix(SFT_SCHEME), command="sft")
    except RecipeError as e:
        raise ModelNameError(f"model.path={name!r}: {e}") from None


# trainer fields that change where and how an SFT run reports, not the model it makes
NOT_IN_HASH = (
    "output_dir",
    "experiment_name",
    "loggers",
    "log_level",
    "overwrite",
    "resume",
    "call_timeout_s",
    "save_freq",
    "keep_last",
    "dump_freq",
    "preemption_grace_s",
)


def recipe_key(recipe) -> str:
    """Hash of what decides the model an SFT recipe makes (not where or how it reports)."""
    from grpo_ray.config import recipe_dict

    d = recipe_dict(recipe)
    for k in NOT_IN_HASH:
        d["trainer"].pop(k, None)
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def sft_home(recipe) -> Path:
    """Where the warm start of an SFT recipe (a loaded Recipe) keeps its run (``run/``) and model (``run/model``)."""
    return cache_dir() / f"sft-{recipe_key(recipe)}"


def cache_dir() -> Path:
    """Where tiny checkpoints are built: ``$GRPO_RAY_CACHE`` or ``~/.cache/grpo_ray``."""
    return Path(os.environ.get("GRPO_RAY_CACHE", Path.home() / ".cache" / "grpo_ray")) / "models"


def resolve(name: str) -> str:
    """A name loadable by transformers and vLLM: builds a tiny model if needed, finds an ``sft://`` model in the
    cache (ModelNameError when it was never trained here: nothing here trains), else returns `name`."""
    if is_sft(name):
        model = sft_home(_sft_recipe(name)) / "run" / "model"
        if not (model / "config.json").is_file():
            raise ModelNameError(
                f"model.path={name!r}: this SFT warm start was not trained on this machine ({model} "
                "is missing); `grpo-ray train` of a recipe that names it trains it once"
            )
        return str(model)
    if not is_tiny(name):
        return name
    out = tiny_dir(name)
    if not (out / "config.json").exists():
        build_tiny(parse_tiny(name), out)
    return str(out)


def tiny_dir(name: str) -> Path:
    """Where the tiny model `name` is (or will be) built in the cache."""
    spec = parse_tiny(name)
    return cache_dir() / f"{spec.arch}-{hashlib.sha256(spec.canonical().encode()).hexdigest()[:16]}"


def base_of(name: str) -> str:
    """`name` resolved, or for an ``sft://`` name its SFT recipe's model resolved (the same tokenizer and shape:
    what the data is checked with before the warm start is trained)."""
    return resolve(sft_base(name) if is_sft(name) else name)


# --- chat templates and special tokens, one per family ------------------------------------

PLAIN_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% if not loop.last %}\n{% endif %}{% endfor %}"
"""``model.chat_template: plain``: the messages' text one after another, for base models."""


GENERIC_TOKENIZERS = ("TokenizersBackend", "PreTrainedTokenizerFast")
"""tokenizer_config.json's class names for a tokenizer that is its tokenizer.json alone (the tiny models' and many
hub models'): loaded by that class itself, without the Auto classes' import of every model's code (5 s here)."""


def tokenizer_class(model_path: str, trust_remote_code: bool = False):
    """The class that loads `model_path`'s tokenizer: transformers' generic fast tokenizer when the checkpoint names
    it and has its tokenizer.json, else AutoTokenizer (a model's own class, remote code, a slow tokenizer)."""
    if _generic(model_path, trust_remote_code):
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast
    from transformers import AutoTokenizer

    return AutoTokenizer


def _generic(model_path: str, trust_remote_code: bool) -> bool:
    """Whether `model_path`'s tokenizer is transformers' generic fast one (``tokenizer_class``)."""
    folder = Path(model_path)
    try:
        named = json.loads((folder / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        named = None
    return not trust_remote_code and named in GENERIC_TOKENIZERS and (folder / "tokenizer.json").is_file()


def load_tokenizer(model_path: str, model, lazy: bool = False):
    """The tokenizer of `model_path` with `model` (the recipe's ModelConfig) chat template in place of its own
    when set; ModelNameError when it cannot be loaded or has no chat template at all. `lazy`: a LazyTokenizer where
    the checkpoint's files say its template, so a caller that finds what it needs elsewhere (rows checked by an
    earlier run) never imports transformers."""
    if lazy:
        template = chat_template_text(model.chat_template) if model.chat_template else _own_template(model_path, model)
        if template:
            return LazyTokenizer(model_path, model, template)
    try:
        cls = tokenizer_class(model_path, model.trust_remote_code)
        tokenizer = cls.from_pretrained(model_path, trust_remote_code=model.trust_remote_code)
    except (OSError, ValueError) as e:
        raise ModelNameError(f"model.path={model.path!r}: cannot load a tokenizer ({str(e).splitlines()[0]})") from None
    if model.chat_template:
        tokenizer.chat_template = chat_template_text(model.chat_template)
    if not tokenizer.chat_template:
        raise ModelNameError(
            f"model.path={model.path!r}: the tokenizer has no chat template; set model.chat_template "
            "(Jinja text, a .jinja file, or plain: the prompt as it is, for a base model)"
        )
    return tokenizer


def _own_template(model_path: str, model) -> str:
    """The chat template a checkpoint loaded by transformers' generic fast class has, where its files say it without
    doubt (one plain template in tokenizer_config.json or chat_template.jinja, not both); else ''."""
    folder = Path(model_path)
    if not _generic(model_path, model.trust_remote_code):
        return ""
    if (folder / "chat_template.json").exists():
        return ""
    try:
        inline = json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template")
    except (OSError, ValueError, AttributeError):
        return ""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return "" if inline is not None else jinja.read_text()
    return inline if isinstance(inline, str) else ""


class LazyTokenizer:
    """A checkpoint's tokenizer that loads (transformers with it) at its first use; its folder (`name_or_path`) and
    chat template are known without it."""

    def __init__(self, model_path: str, model, chat_template: str):
        self.name_or_path, self.chat_template, self._model, self._loaded = model_path, chat_template, model, None

    def loaded(self):
        if self._loaded is None:
            self._loaded = load_tokenizer(self.name_or_path, self._model)
            self._loaded.chat_template = self.chat_template
        return self._loaded

    def __getattr__(self, name: str):  # anything else is the tokenizer's own
        return getattr(self.loaded(), name)

    def __call__(self, *args, **kwargs):
        return self.loaded()(*args, **kwargs)


def chat_template_text(value: str) -> str:
    """model.chat_template as Jinja text: ``plain``, a file's text (a ``.json`` file: its ``chat_template``, as
    Hugging Face's chat_template.json and tokenizer_config.json hold it), or the text itself; ModelNameError when
    the file cannot be read or the text is not a Jinja template that compiles."""
    if value == "plain":
        return PLAIN_TEMPLATE
    text, where = value, f"model.chat_template={value!r}"
    if value.endswith((".jinja", ".j2", ".json")) or "{" not in value:
        try:
            text = Path(value).expanduser().read_text()
        except OSError as e:
            raise ModelNameError(
                f"{where}: cannot read the file ({e.strerror or e}); give Jinja text, a .jinja file, or plain"
            ) from None
        if value.endswith(".json"):
            try:
                text = json.loads(text)["chat_template"]
            except (ValueError, KeyError, TypeError):
                raise ModelNameError(f'{where}: a .json file must hold a "chat_template" string') from None
    import jinja2

    if "{{" not in text and "{%" not in text:
        raise ModelNameError(
            f"{where}: no Jinja in it ({{{{ ... }}}} or {{% ... %}}); give Jinja text, a file, or plain"
        )
    try:
        jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as e:
        raise ModelNameError(f"{where}: not a valid Jinja template (line {e.lineno}: {e.message})") from None
    return text


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


def train_tokenizer(arch: str, texts: list[str], vocab_size: int, all_bytes: bool = True):
    """A byte-level BPE tokenizer for `arch`, trained offline on `texts`; digits stay single tokens."""
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
        special_tokens=family["specials"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet() if all_bytes else [],
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=family["bos"],
        eos_token=family["eos"],
        pad_token=family["pad"],
    )
    fast.chat_template = family["template"]
    return fast


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

    texts = synthetic.corpus(spec.text) + list(extra_texts or [])
    tokenizer = train_tokenizer(spec.arch, texts, spec.vocab, all_bytes=bool(spec.bytes))
    vocab_size = len(tokenizer)
    config = _config(spec, vocab_size, tokenizer)
    torch.manual_seed(spec.seed)
    if spec.score:
        from transformers import AutoModelForSequenceClassification

        model = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
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


def load_causal_lm(path: str, dtype, trust_remote_code: bool = False, device: Device = CPU, match_engine: bool = True):
    """A transformers causal LM from `path` (hub name or directory), in `dtype`, with `device`'s attention (the one
    whose logprobs the engines match); without `match_engine`, transformers' default (sdpa), the fastest."""
    from transformers import AutoModelForCausalLM

    attn = {"attn_implementation": device.attn_implementation} if device.attn_implementation and match_engine else {}
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=trust_remote_code, **attn)


def pad_id(config) -> int:
    """The token id that pads a batch: the config's pad token, else 0 (padding is masked out either way)."""
    return config.pad_token_id if config.pad_token_id is not None else 0
