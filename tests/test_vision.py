"""A vision-language twin built offline (``tiny://gemma3?vision=N``: Gemma 3's shape, a SigLIP tower, saved with its
processor) reads the pixels it is given, and vLLM on this CPU serves it an image prompt whose sampled tokens' logprobs
a plain transformers forward of the same ids and pixels gives again, within the text path's bound (1e-3); with the
image blanked that forward is far off (the engine read the pixels). The ground under issue 77's generators and
learner: images in the training loop are not built yet (tests/test_images.py: such rows are refused before start)."""

import json
import os
import subprocess
import sys

import pytest
import torch
from PIL import Image

from grpo_ray import models
from grpo_ray.models.tiny import IMAGE_TOKENS, ModelNameError, parse_tiny
from tests.conftest import ROOT

TWIN = "tiny://gemma3?vision=2&bytes=0&vocab=160"
BOUND = 1e-3  # trainer.max_sync_logprob_diff of the text twins


def picture(seed: int) -> Image.Image:
    """A 40 x 30 picture of random colours (not the processor's size: it resizes)."""
    g = torch.Generator().manual_seed(seed)
    return Image.fromarray(torch.randint(0, 256, (30, 40, 3), generator=g, dtype=torch.uint8).numpy())


def forward(model, processor, ids: list[int], image: Image.Image) -> torch.Tensor:
    """Per-position log-softmax of a plain forward of `ids` with `image`'s pixels, attention causal throughout (as
    the engine's transformers backend runs it)."""
    pixels = processor.image_processor(images=[image], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        logits = model(
            input_ids=torch.tensor([ids]), pixel_values=pixels, token_type_ids=torch.zeros(1, len(ids))
        ).logits
    return torch.log_softmax(logits[0].float(), -1)


@pytest.fixture(scope="module")
def twin():
    from transformers import AutoModelForImageTextToText, AutoProcessor

    path = models.resolve(TWIN)
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    return path, model, AutoProcessor.from_pretrained(path)


def test_the_twin_reads_the_pixels_it_is_given(twin):
    path, model, processor = twin
    turn = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Mia has 4 apples."}]}]
    enc = processor(
        text=processor.apply_chat_template(turn, add_generation_prompt=True, tokenize=False),
        images=[picture(0)],
        return_tensors="pt",
    )
    ids = enc["input_ids"][0].tolist()
    assert ids.count(model.config.image_token_id) == IMAGE_TOKENS
    a, b = forward(model, processor, ids, picture(0)), forward(model, processor, ids, picture(1))
    assert (a - b).abs().max() > 10 * BOUND  # another picture, other answers
    text = processor.apply_chat_template([{"role": "user", "content": "Mia has 4 apples."}], tokenize=False)
    assert text == "<bos><start_of_turn>user\nMia has 4 apples.<end_of_turn>\n"  # a text turn: the text twin's


def test_a_vision_twin_is_gemma3s_shape_alone():
    with pytest.raises(ModelNameError, match="vision=2 builds Gemma 3's vision-language shape: arch gemma3"):
        parse_tiny("tiny://qwen2?vision=2")
    assert parse_tiny("tiny://gemma3").canonical() == parse_tiny("tiny://gemma3?vision=0").canonical()
    assert "vision=2" in parse_tiny(TWIN).canonical()


def test_the_engine_serves_an_image_prompt_as_a_plain_forward_reads_it(twin, tmp_path):
    path, model, processor = twin
    picture(3).save(tmp_path / "seen.png")
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "helpers" / "vllm_images.py"), path, str(tmp_path / "seen.png")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, out.stderr[-3000:]
    got = json.loads(line[len("RESULT ") :])
    prompt, image_id = got["prompt_ids"], model.config.image_token_id
    assert got["sent_ids"].count(image_id) == 0 and prompt.count(image_id) == IMAGE_TOKENS  # the engine expanded it
    seen = Image.open(tmp_path / "seen.png")
    for tokens, logprobs in zip(got["tokens"], got["logprobs"]):
        ids = prompt + tokens
        at = torch.arange(len(prompt) - 1, len(ids) - 1)
        mine = forward(model, processor, ids, seen)[at, torch.tensor(tokens)]
        blank = forward(model, processor, ids, Image.new("RGB", seen.size))[at, torch.tensor(tokens)]
        assert (mine - torch.tensor(logprobs)).abs().max() < BOUND
        assert (blank - torch.tensor(logprobs)).abs().max() > 10 * BOUND
