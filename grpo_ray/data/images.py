"""Rows with images, as vision-language tasks have them (verl's Geometry3K parquet, a ``datasets`` Image feature).

A row's images are at ``data.image_key`` (default ``images``, dotted for nested keys): one image or a list, each a
path (absolute, or relative to the data file's folder), bytes of an image file, a PIL image, or a ``datasets``
Image feature's ``{"bytes", "path"}``. The prompt marks where each goes with an ``<image>`` placeholder (verl's), or
has none: then the images come before its first user turn's text. Before any actor starts, each image row is
checked (``problem``): every image opens, there are as many placeholders as images (or none), and no more images
than a prompt may carry (vLLM's ``limit_mm_per_prompt``, from ``generator.vllm_kwargs``); and the model must read
images (``model_reads_images``).
"""

from __future__ import annotations

import io
from pathlib import Path

PLACEHOLDER = "<image>"
"""Where an image goes in a prompt's text (verl's placeholder)."""


def images_of(row: dict, key: str) -> list:
    """The images `row` carries at dotted `key`, as given: [] where it has none."""
    value = row
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def opened(value, folder: Path | None = None):
    """The PIL image `value` is (see the module's forms), decoded; ValueError saying why it cannot be."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(value, Image.Image):
        return value
    if isinstance(value, dict) and ("bytes" in value or "path" in value):  # a datasets Image feature
        value = value.get("bytes") or value.get("path")
    try:
        if isinstance(value, (bytes, bytearray)):
            source, what = io.BytesIO(value), f"{len(value)} bytes"
        elif isinstance(value, str) and value:
            path = Path(value)
            if not path.is_absolute() and folder is not None and (folder / path).exists():
                path = folder / path
            source, what = path, str(path)
            if not path.is_file():
                raise ValueError(f"no file {path}")
        else:
            raise ValueError(f"a {type(value).__name__}, not a path, image bytes, a PIL image or {{bytes, path}}")
        image = Image.open(source)
        image.load()
    except (UnidentifiedImageError, OSError) as e:
        raise ValueError(f"{what} is not an image PIL reads ({e})") from None
    return image


def as_feature(value, folder: Path | None = None) -> dict:
    """`value` as a ``datasets`` Image feature holds it in a parquet, ``{"bytes", "path"}``: the image file's own
    bytes (a PIL image's as PNG), no path, so the file stands alone; ValueError where it does not open."""
    image = opened(value, folder)
    if isinstance(value, dict) and value.get("bytes"):
        value = value["bytes"]
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": bytes(value), "path": None}
    if isinstance(value, str):
        return {"bytes": Path(image.filename).read_bytes(), "path": None}
    out = io.BytesIO()
    image.save(out, format="PNG")
    return {"bytes": out.getvalue(), "path": None}


def file_bytes(value, folder: Path | None = None) -> bytes:
    """`value`'s image as the bytes of an image file (``as_feature``'s): what a prompt carries to the engines."""
    return as_feature(value, folder)["bytes"]


def with_image_parts(prompt: list[dict], n: int) -> list[dict]:
    """The prompt's messages with `n` images as content parts (``{"type": "image"}``, which a vision-language
    chat template renders as its image marker): each ``<image>`` placeholder becomes one, or, with none, the `n`
    come before the first user turn's text."""
    out, marks = [dict(m) for m in prompt], placeholders(prompt)
    image, text = {"type": "image"}, lambda t: [{"type": "text", "text": t}] if t else []  # noqa: E731
    if not marks:
        first = next(i for i, m in enumerate(out) if m.get("role") == "user")
        out[first]["content"] = [image] * n + text(out[first]["content"])
        return out
    for m in out:
        if isinstance(m.get("content"), str) and PLACEHOLDER in m["content"]:
            pieces = m["content"].split(PLACEHOLDER)
            m["content"] = text(pieces[0]) + [part for piece in pieces[1:] for part in [image, *text(piece)]]
    return out


def placeholders(prompt: list[dict]) -> int:
    """How many ``<image>`` placeholders the prompt's messages hold."""
    return sum(m["content"].count(PLACEHOLDER) for m in prompt if isinstance(m.get("content"), str))


def limit(vllm_kwargs: dict, unset: int = 999) -> int:
    """The most images a prompt may carry: vLLM's ``limit_mm_per_prompt`` for images (a count, or ``{count}``), else
    `unset` (vLLM's default, 999)."""
    given = (vllm_kwargs.get("limit_mm_per_prompt") or {}).get("image", unset)
    return int(given["count"] if isinstance(given, dict) else given)


def problem(row: dict, key: str, most: int, folder: Path | None = None, named: str = "data.image_key") -> str | None:
    """What is wrong with `row`'s images (at `key`, at most `most`), or None; `named`: what sets the key."""
    images = images_of(row, key)
    if len(images) > most:
        return (
            f"'{key}' ({named}) holds {len(images)} images, over the {most} a prompt may carry "
            "(generator.vllm_kwargs.limit_mm_per_prompt)"
        )
    marks = placeholders(row["prompt"])
    if marks and marks != len(images):
        return f"the prompt has {marks} {PLACEHOLDER} placeholder(s) and '{key}' ({named}) {len(images)} image(s)"
    for i, image in enumerate(images):
        try:
            opened(image, folder)
        except ValueError as e:
            return f"'{key}' ({named}) image {i}: {e}"
    return None


def model_reads_images(model_path: str, trust_remote_code: bool = False) -> tuple[bool, str]:
    """Whether the model at `model_path` reads images (its config has a vision tower), and its architecture's name."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    arch = (getattr(config, "architectures", None) or [type(config).__name__])[0]
    return getattr(config, "vision_config", None) is not None, arch
