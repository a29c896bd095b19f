"""Images as a vision-language model reads them: its processor turns a prompt's images (the image files' bytes a
``Prompt`` carries) into the pixel values its forward takes.

The engines expand each image marker of a prompt's tokens into the image's tokens themselves (vLLM's processing), and
a rollout keeps the expanded tokens; the learner runs the model's own forward on them with these pixel values, one
image after another in the order their tokens come in the batch (``Sequences.order``).
"""

from __future__ import annotations

import functools
import io
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import torch

BAN = -100.0
"""The logit bias that keeps a token from being sampled (vLLM's most negative) and the learner adds alike."""


MARKERS = ("image_token_id", "video_token_id", "boi_token_index", "vision_start_token_id")
"""A vision-language config's tokens that stand for an image: the ones its forward replaces with image (or video)
features, and the marker an engine expands into an image's tokens (Gemma 3's ``<start_of_image>``, Qwen-VL's
``<|vision_start|>``)."""


def placeholder_ids(config) -> list[int]:
    """The tokens that stand for an image in a vision-language model (``MARKERS``), wherever they are: kept out of
    responses (logit bias ``BAN``, in the engine's sampling and the learner's logprobs alike), since one sampled would
    be read as an image the sample does not have (by the learner's forward, or by the engine in a trajectory's next
    turn). None for a text model."""
    if getattr(config, "vision_config", None) is None:
        return []
    return list(dict.fromkeys(t for name in MARKERS if (t := getattr(config, name, None)) is not None))


TOWERS = ("vision_tower", "visual")
"""The vision tower's module name in transformers' vision-language models (Gemma 3's SigLIP; Qwen-VL's ViT)."""
OUTSIDE_THE_LANGUAGE_MODEL = r".*\.(vision_tower|visual|multi_modal_projector)(\..*)?"
"""The modules that are not the language model's, as a pattern of their names (peft's ``exclude_modules``)."""


def freeze_tower(model) -> int:
    """Keep `model`'s vision tower as it is (no gradients; ``model.freeze_vision``); returns its parameter count (0
    for a text model). The projection into the language model still trains (verl's freeze_vision_tower)."""
    frozen = 0
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in TOWERS:
            for p in module.parameters():
                frozen += p.numel() if p.requires_grad else 0
                p.requires_grad_(False)
    return frozen


def decoded(images: list[bytes]) -> list:
    """The PIL images (RGB) of image files' bytes."""
    from PIL import Image

    return [Image.open(io.BytesIO(b)).convert("RGB") for b in images]


@functools.cache
def processor(model_path: str, trust_remote_code: bool = False):
    """The model's processor (its tokenizer and image processor), loaded once a process."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(model_path, trust_remote_code=trust_remote_code)


class Pixels(NamedTuple):
    """A batch's images as a forward reads them: each distinct image's pixel values once (`values`, a row an image)
    and, for each image of the batch in the order its tokens come, which row is its (`index`): the tower runs once
    an image, and its features are handed to every sample that holds it (``algo.logprobs.token_logprobs``)."""

    values: torch.Tensor
    index: torch.Tensor

    def to(self, device) -> Pixels:
        return Pixels(self.values.to(device), self.index.to(device))


def pixel_values(model_path: str, images: list[list[bytes]], trust_remote_code: bool = False) -> Pixels | None:
    """The ``Pixels`` of each sample's images, one sample after another, or None where no sample has any. Each
    distinct image is decoded and processed once (a group's samples share their prompt's)."""
    import torch

    flat = [b for sample in images for b in sample]
    if not flat:
        return None
    at = {b: i for i, b in enumerate(dict.fromkeys(flat))}
    got = processor(model_path, trust_remote_code).image_processor(images=decoded(list(at)), return_tensors="pt")
    return Pixels(got["pixel_values"], torch.tensor([at[b] for b in flat]))


def in_order(model_path: str, images: list[list[bytes]], seqs, trust_remote_code: bool = False) -> Pixels | None:
    """``pixel_values`` of each sequence's `images` in the order of their tokens in `seqs`' forward
    (``algo.batching.Sequences.order``), or None where none has any."""
    return pixel_values(model_path, [images[i] for i in seqs.order], trust_remote_code) if any(images) else None


def sizes(images: list[bytes]) -> tuple[tuple[int, int], ...]:
    """Each image's (width, height), read from its file's header (no pixels decoded)."""
    from PIL import Image

    return tuple(Image.open(io.BytesIO(b)).size for b in images)


@functools.lru_cache(maxsize=4096)
def expanded_ids(
    model_path: str, text: str, sizes: tuple[tuple[int, int], ...], trust_remote_code: bool = False
) -> tuple[int, ...]:
    """The token ids of the prompt `text` with the markers of images of `sizes` expanded by the model's processor:
    what SFT trains on (no engine runs it), and a prompt's length (the engine's own expansion can differ by a token
    or two where the text around a marker tokenizes otherwise; a rollout keeps the engine's). The tokens depend on
    the images' sizes, not their pixels: counted on blank images, once for each text and sizes."""
    from PIL import Image

    blanks = [Image.new("RGB", size) for size in sizes]
    got = processor(model_path, trust_remote_code)(text=text, images=blanks, add_special_tokens=False)
    return tuple(int(t) for t in got["input_ids"][0])


def marker(tokenizer) -> str:
    """The text the model's chat template writes for one image (Gemma 3's ``<start_of_image>``, Qwen-VL's
    ``<|vision_start|><|image_pad|><|vision_end|>``): what an environment's observation with images puts before its
    text, and the engine expands; "" where the template writes none."""
    turn = lambda parts: [{"role": "user", "content": [*parts, {"type": "text", "text": "\x00"}]}]  # noqa: E731
    try:
        shown = tokenizer.apply_chat_template(turn([{"type": "image"}]), tokenize=False).split("\x00")[0]
        plain = tokenizer.apply_chat_template(turn([]), tokenize=False).split("\x00")[0]
    except Exception:  # a template that takes no content parts (jinja's errors: any kind)
        return ""
    return shown[len(plain) :] if shown.startswith(plain) else ""
