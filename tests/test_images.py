"""Rows with images (issue 77, its first piece): each form of image a row may carry opens, and every way an image row
can be wrong is one line naming the file, row and key before any actor starts (grpo_ray/data/images.py,
preflight.image_rows); where a run would read them somewhere that takes text alone so far, it is refused in words
that say so, never trained as text with the images dropped. (A run on them: tests/test_vision.py.)"""

import io
import json

import pytest
from PIL import Image

from grpo_ray import models
from grpo_ray.data import DataError, images
from tests.conftest import TINY

ROW = {"prompt": [{"role": "user", "content": "<image> What colour is it?"}], "data_source": "x"}


def png(colour: str = "red") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 8), colour).save(out, format="PNG")
    return out.getvalue()


def test_each_form_of_image_opens(tmp_path):
    (tmp_path / "red.png").write_bytes(png())
    forms = [
        str(tmp_path / "red.png"),  # an absolute path
        "red.png",  # relative to the data file's folder
        png(),  # bytes
        {"bytes": png(), "path": None},  # a datasets Image feature, as a parquet holds it
        {"bytes": None, "path": str(tmp_path / "red.png")},
        Image.new("RGB", (4, 4)),
    ]
    for form in forms:
        assert images.opened(form, tmp_path).size in ((8, 8), (4, 4))
        assert images.problem({**ROW, "images": [form]}, "images", 999, tmp_path) is None
    assert images.images_of({**ROW, "images": png()}, "images") == [png()]  # one image, not a list
    assert images.images_of({**ROW, "extra": {"pics": ["a", "b"]}}, "extra.pics") == ["a", "b"]
    assert images.images_of(ROW, "images") == []


def test_every_wrong_image_row_says_what_is_wrong(tmp_path):
    (tmp_path / "red.png").write_bytes(png())
    (tmp_path / "fake.png").write_text("not an image")
    cases = {
        "missing.png": "image 0: no file",
        "fake.png": "image 0: ",
        12: "image 0: a int, not a path",
    }
    for image, said in cases.items():
        why = images.problem({**ROW, "images": [image]}, "images", 999, tmp_path)
        assert why.startswith("'images' (data.image_key) ") and said in why, why
    assert "is not an image PIL reads" in images.problem({**ROW, "images": ["fake.png"]}, "images", 999, tmp_path)
    two = {**ROW, "images": ["red.png", "red.png"]}
    assert "the prompt has 1 <image> placeholder(s) and 'images' (data.image_key) 2 image(s)" in images.problem(
        two, "images", 999, tmp_path
    )
    unmarked = {**two, "prompt": [{"role": "user", "content": "Which is red?"}]}  # none: the images go first
    assert images.problem(unmarked, "images", 999, tmp_path) is None
    assert "holds 2 images, over the 1 a prompt may carry" in images.problem(unmarked, "images", 1, tmp_path)
    assert images.limit({"limit_mm_per_prompt": {"image": {"count": 3}}}) == 3
    assert images.limit({"limit_mm_per_prompt": {"image": 2}}) == 2 and images.limit({}) == 999


@pytest.fixture(scope="module")
def vl_model(tmp_path_factory):
    """A vision-language model's config (Qwen2.5-VL's class, tiny): all the check reads of a model."""
    from transformers import Qwen2_5_VLConfig

    path = tmp_path_factory.mktemp("vl")
    config = Qwen2_5_VLConfig(
        text_config={"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 128},
        vision_config={"depth": 1, "hidden_size": 32, "out_hidden_size": 64, "num_heads": 2},
    )
    config.architectures = ["Qwen2_5_VLForConditionalGeneration"]
    config.save_pretrained(path)
    return str(path)


def test_a_vision_language_models_image_rows_are_checked_and_carry_their_images(tmp_path, vl_model):
    """Checked, each image row carries its images' bytes and its placeholders as the template's image parts; a run
    that would read its prompts without their images (a text-only reward model or teacher, `grpo-ray rm`) is
    refused, naming it; an environment and an agent program (given the pictures as image_url parts) take them."""
    from grpo_ray.config import Recipe, RecipeError
    from grpo_ray.preflight import image_rows

    assert images.model_reads_images(vl_model) == (True, "Qwen2_5_VLForConditionalGeneration")
    spec = tmp_path / "rows.jsonl"
    (tmp_path / "red.png").write_bytes(png())
    rows = [{**ROW, "images": []}, {**ROW, "images": ["red.png"]}, {**ROW, "images": ["gone.png"]}]
    spec.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=rf"{spec} row 2: 'images' \(data.image_key\) image 0: no file"):
        image_rows(str(spec), rows, Recipe(), vl_model)
    got = image_rows(str(spec), rows[:2], Recipe(), vl_model)  # the reference pool on: it reads the images
    assert got[0] == rows[0]  # a row without images as it was
    assert got[1]["prompt_images"] == [png()]
    assert got[1]["prompt"] == [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " What colour is it?"}]}
    ]
    scored = Recipe()
    scored.reward_model.model = models.resolve(TINY.format(arch="llama") + "&score=1")
    with pytest.raises(RecipeError) as e:
        image_rows(str(spec), rows[:2], scored, vl_model)
    assert str(e.value) == (
        f"{spec} row 1: 'images' (data.image_key) holds 1 image(s), and reward_model.model="
        f"{scored.reward_model.model!r} is a text-only model (LlamaForSequenceClassification): the reward_model pool "
        "would score each sample without its images; give a model that reads them, or reward_model.model='' to run "
        "without it"
    )
    taught = Recipe()
    taught.teacher.model = TINY.format(arch="qwen2")
    with pytest.raises(RecipeError) as e:
        image_rows(str(spec), rows[:2], taught, vl_model)
    assert str(e.value) == (
        f"{spec} row 1: 'images' (data.image_key) holds 1 image(s), and teacher.model={taught.teacher.model!r} is a "
        "text-only model (Qwen2ForCausalLM): the teacher pool would score each sample without its images; give a "
        "model that reads them, or teacher.model='' to run without it"
    )
    with pytest.raises(RecipeError, match="and `grpo-ray rm` reads text alone so far"):
        image_rows(str(spec), rows[:2], Recipe(), vl_model, "rm")
    played, agent = Recipe(), Recipe()
    played.environment.name, agent.environment.name = "calculator", "agent"
    assert image_rows(str(spec), rows[:2], played, vl_model) == got  # an environment reads the images
    assert image_rows(str(spec), rows[:2], agent, vl_model) == got  # and an agent program


def test_prepare_data_writes_image_rows_in_verls_schema(tmp_path):
    """`prepare-data custom --image-key K`: each row's images as verl's Geometry3K parquet holds them (an images
    column of {bytes, path} image features, the files' own bytes: the parquet stands alone); a row whose image is
    missing is a bad row, counted, its reason naming the key."""
    from grpo_ray.data import load_rows
    from grpo_ray.data.prepare import prepare

    (tmp_path / "red.png").write_bytes(png())
    rows = [
        {"question": "<image> What colour is it?", "answer": "red", "pics": ["red.png"]},
        {"question": "What colour is the sky?", "answer": "blue"},  # no image: a text row beside the image rows
        {"question": "<image> And this one?", "answer": "green", "pics": ["gone.png"]},
    ]
    source = tmp_path / "colours.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = prepare(
        "custom", str(source), tmp_path / "out", prompt_key="question", image_key="pics", max_bad_fraction=0.5
    )[0]
    assert (report.read, report.kept) == (3, 2)
    assert "'pics' (--image-key) image 0: no file" in report.examples[0]
    got = load_rows(str(tmp_path / "out" / "test.parquet"))
    assert got[0]["images"] == [{"bytes": png(), "path": None}] and "pics" not in got[0]["extra_info"]
    assert images.problem(got[0], "images", 999) is None and images.opened(got[0]["images"][0]).size == (8, 8)
    assert not got[1].get("images")
