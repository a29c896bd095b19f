"""Model names, and tiny Hugging Face checkpoints built offline.

A recipe's ``model.path`` is one of:

- a hub name (``Qwen/Qwen2.5-1.5B-Instruct``) or a local directory: used as it is;
- ``tiny://ARCH?key=value&...``: a small randomly initialised checkpoint in the
  Qwen2, Llama or Gemma3 architecture, built here with no network, e.g.
  ``tiny://qwen2?layers=2&hidden=128&heads=4&kv_heads=2&seed=0``;
- ``sft://RECIPE.yaml``: the model an SFT recipe makes (``grpo-ray sft``), cached by the hash of the
  resolved recipe. This module only finds it in the cache (``resolve``) or names its base model
  (``base_of``); training it is the job layer's (``grpo_ray.jobs.sft.warm_start``, called by ``setup_run``).

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
from pathlib import Path

from grpo_ray.device import Device
from grpo_ray.models.tiny import TINY_SCHEME, ModelNameError, build_tiny, parse_tiny

CPU = Device("cpu")

SFT_SCHEME = "sft://"


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
    from grpo_ray.data.checked import cache_root

    return cache_root() / "models"


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


def load_causal_lm(path: str, dtype, trust_remote_code: bool = False, device: Device = CPU, match_engine: bool = True):
    """A transformers causal LM from `path` (hub name or directory), in `dtype`, with `device`'s attention (the one
    whose logprobs the engines match); without `match_engine`, transformers' default (sdpa), the fastest."""
    from transformers import AutoModelForCausalLM

    attn = {"attn_implementation": device.attn_implementation} if device.attn_implementation and match_engine else {}
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=trust_remote_code, **attn)


def pad_id(config) -> int:
    """The token id that pads a batch: the config's pad token, else 0 (padding is masked out either way)."""
    return config.pad_token_id if config.pad_token_id is not None else 0
