"""A vision-language twin built offline (``tiny://gemma3?vision=N``: Gemma 3's shape, a SigLIP tower, saved with its
processor) reads the pixels it is given, and vLLM on this CPU serves it an image prompt whose sampled tokens' logprobs
a plain transformers forward of the same ids and pixels gives again, within the text path's bound (1e-3); with the
image blanked that forward is far off (the engine read the pixels). The learner's forward reads each sequence's own
images, padded and packed; and a run on image rows trains, the learner's logprobs the engine's on every image sample
(the rows' checks: tests/test_images.py)."""

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from grpo_ray import models
from grpo_ray.models.tiny import IMAGE_TOKENS, ModelNameError, parse_tiny
from tests.conftest import ROOT, engine_env, run_cli

TWIN = "tiny://gemma3?vision=2&bytes=0&vocab=160"
BOUND = 1e-3  # trainer.max_sync_logprob_diff of the text twins


def picture(seed: int) -> Image.Image:
    """A 40 x 30 picture of random colours (not the processor's size: it resizes)."""
    g = torch.Generator().manual_seed(seed)
    return Image.fromarray(torch.randint(0, 256, (30, 40, 3), generator=g, dtype=torch.uint8).numpy())


def forward(model, processor, ids: list[int], image: Image.Image, banned: list[int] = ()) -> torch.Tensor:
    """Per-position log-softmax of a plain forward of `ids` with `image`'s pixels, attention causal throughout (as
    the engine's transformers backend runs it); the `banned` tokens' logits lowered by the engines' bias first."""
    from grpo_ray.models.vision import BAN

    pixels = processor.image_processor(images=[image], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        logits = (
            model(input_ids=torch.tensor([ids]), pixel_values=pixels, token_type_ids=torch.zeros(1, len(ids)))
            .logits[0]
            .float()
        )
    logits[:, list(banned)] += BAN
    return torch.log_softmax(logits, -1)


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
    env = engine_env()
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


def test_the_learners_forward_reads_each_sequences_own_images_padded_and_packed(twin):
    """Sequences with images, laid out padded and packed (``Sequences.order``), get each the logprobs of a plain
    forward of that sequence alone with its own image (a picture two of them hold run through the tower once);
    swapping the images between them changes those logprobs."""
    from grpo_ray.algo.batching import collate
    from grpo_ray.algo.logprobs import sequence_logprobs
    from grpo_ray.models import vision

    path, model, processor = twin
    pictures, pairs = [], []
    for k, words in enumerate(["Mia has 4 apples.", "Two cats sat.", "Red or blue?"]):
        turn = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": words}]}]
        text = processor.apply_chat_template(turn, add_generation_prompt=True, tokenize=False)
        ids = processor(text=text, images=[picture(k)], add_special_tokens=False)["input_ids"][0]
        pairs.append((ids, [40 + k, 60 + k, 80 + 2 * k][: 1 + k]))  # responses of 1, 2, 3 tokens
        png = io.BytesIO()
        picture(k).save(png, format="PNG")
        pictures.append([png.getvalue()])
    pairs.append((pairs[0][0], [44, 45]))  # a second sample of the first prompt: its picture again
    pictures.append(pictures[0])
    alone = []
    for (p, r), image in zip(pairs, pictures):
        logp = forward(model, processor, p + r, vision.decoded(image)[0])
        alone.append(logp[torch.arange(len(p) - 1, len(p) + len(r) - 1), torch.tensor(r)])
    longest = max(len(p) + len(r) for p, r in pairs)
    for capacity in (0, 2 * longest):  # padded; packed, two to a row
        seqs = collate(pairs, 0, capacity)
        assert (seqs.packed is not None) == bool(capacity)
        pixels = vision.in_order(path, pictures, seqs)
        assert len(pixels.values) == 3 and len(pixels.index) == 4  # the tower runs once a distinct picture
        with torch.no_grad():
            logp, _ = sequence_logprobs(model, seqs, "cpu", pixel_values=pixels)
            swapped, _ = sequence_logprobs(model, seqs, "cpu", pixel_values=vision.in_order(path, pictures[::-1], seqs))
        for b, expected in enumerate(alone):
            got = logp[b][seqs.response_mask[b].bool()]
            assert (got - expected).abs().max() < 1e-4, (capacity, b)
        assert (swapped - logp).abs().max() > 10 * BOUND
    grads = []  # the same gradients, the tower's included, as with each sample's copy run through it
    for once in (pixels, vision.Pixels(pixels.values[pixels.index], torch.arange(len(pixels.index)))):
        model.zero_grad()
        logp, _ = sequence_logprobs(model, seqs, "cpu", pixel_values=once)
        logp.sum().backward()
        grads.append({n: q.grad.clone() for n, q in model.named_parameters() if q.grad is not None})
    assert any("vision_tower" in n for n in grads[0]) and grads[0].keys() == grads[1].keys()
    assert all(torch.allclose(grads[0][n], grads[1][n], atol=1e-5) for n in grads[0])
    model.zero_grad()
    shared = collate(pairs, 0, shared=True)  # each distinct prompt's tokens once: which images would not be said
    with pytest.raises(ValueError, match="images with shared prompts"):
        sequence_logprobs(model, shared, "cpu", pixel_values=vision.in_order(path, pictures, seqs))


VISION = ROOT / "recipes" / "tiny-cpu-vision.yaml"
SHAPES = "synthetic://shapes?size=8&seed=0&max_count=4"


@pytest.mark.parametrize("freeze", [False, True])
def test_what_trains_and_what_a_push_sends_of_a_vision_language_model(freeze):
    """``model.freeze_vision`` keeps the tower as loaded (no gradient, left out of a push: the engines hold it) and
    trains its projection; LoRA's adapters are the language model's alone (the tower and projection frozen, never
    pushed), merged or not; the planner counts the same parameters as trained and as pushed."""
    from grpo_ray.config import LoraConfig, ModelConfig
    from grpo_ray.models import lora
    from grpo_ray.models.dims import model_dims

    path = models.resolve(TWIN)

    def loaded():
        return models.load_causal_lm(path, torch.float32)

    def numel(model, names) -> int:
        return sum(p.numel() for n, p in model.named_parameters() if n in names)

    tower = {n for n, _ in loaded().named_parameters() if ".vision_tower." in n}
    model = lora.wrap(loaded(), LoraConfig(), freeze)
    trains = {n for n, p in model.named_parameters() if p.requires_grad}
    assert (trains & tower == set()) == freeze and any("multi_modal_projector" in n for n in trains)
    sent = set(lora.engine_weights(model, lambda p: p.detach()))
    assert sent == trains and sent | tower == {n for n, _ in model.named_parameters()}
    d, cfg = model_dims(TWIN), ModelConfig(path=TWIN, freeze_vision=freeze)
    assert 0.98 < d.trained(cfg) / numel(model, trains) <= 1 and d.pushed(cfg) == d.trained(cfg)

    adapters = LoraConfig(rank=4, alpha=8)
    model = lora.wrap(loaded(), adapters, freeze)
    trains = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trains and all(lora.is_adapter(n) and ".language_model." in n for n in trains)
    merged = set(lora.engine_weights(model, lambda p: p.detach()))
    assert merged and all(".language_model." in n for n in merged)
    names = {n: lora.base_name(n) for n, _ in model.named_parameters()}
    assert merged == {names[n] for n in names if n.endswith("base_layer.weight")}
    cfg = ModelConfig(path=TWIN, lora=adapters, freeze_vision=freeze)
    assert d.trained(cfg) == numel(model, trains)
    merged_cfg = ModelConfig(path=TWIN, lora=LoraConfig(rank=4, alpha=8, sync="merged"))
    assert d.pushed(merged_cfg) == numel(model, {n for n in names if n.endswith("base_layer.weight")})


def two_steps(rows, out, *over):
    """Two steps of the vision recipe on `rows`, a checkpoint after the second."""
    return run_cli(
        "train",
        str(VISION),
        f"data.train_files=[{rows}]",
        "data.train_batch_size=4",
        "algorithm.group_size=4",
        "learner.mini_batch_size=16",
        "learner.micro_batch_size=8",
        "reward.functions=[{name: 'tests.helpers.varied_rewards:half'}]",  # the random twin: some signal anyway
        "trainer.total_steps=2",
        "trainer.test_freq=0",
        "trainer.val_before_train=false",
        "trainer.dump_freq=1",
        "trainer.save_freq=2",
        "trainer.loggers=[console,jsonl]",
        f"trainer.output_dir={out}",
        *over,
        timeout=900,
    )


@pytest.mark.slow
@pytest.mark.smoke
def test_the_vision_recipe_trains_on_what_the_engine_saw(tmp_path):
    """recipes/tiny-cpu-vision.yaml on image rows in verl's schema (an ``<image>`` placeholder, a path relative to
    the file: its own synthetic pictures, written out) with text rows among them, two learner ranks (one rank's
    share of a step all text, the other's all images: both run the vision tower's collectives) and the reference:
    every image sample's prompt holds the image's tokens as the engine expanded them, no response holds an image
    placeholder (kept out alike by the engine and the learner), the learner's logprobs of every sampled token are
    the engine's within the text path's bound (rollout_corr: its old policy against the sampler) and the reference's
    before any update (the KL term 0), and it trains, vision tower included; its checkpoint exports as a
    vision-language model with its processor."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from grpo_ray.checkpoint import export_hf
    from grpo_ray.config import load_recipe
    from grpo_ray.data.synthetic import make_rows

    rows = make_rows(8, task="shapes")
    for i, row in enumerate(rows):
        if i % 4 >= 2:  # text rows beside image rows, in file order: one rank's share has no image, the other's two
            row["prompt"] = [{"role": "user", "content": "How many squares? Give the final answer after ####."}]
            del row["images"]
            continue
        (tmp_path / f"{i}.png").write_bytes(row["images"][0])
        row["images"] = [f"{i}.png"]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    res = two_steps(tmp_path / "rows.jsonl", out, "data.shuffle=false")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "lost" not in res.stdout  # no engine replaced (a push once left the scheduler's image cache stale)
    steps = [m for m in map(json.loads, (out / "metrics.jsonl").open()) if m["step"]]
    assert len(steps) == 2
    assert steps[0]["actor/kl_loss"] < 1e-6  # the reference read each sample's image as the learner did
    for m in steps:
        assert m["sync/logprob_diff"] < BOUND
        assert abs(m["rollout_corr/rollout_is_max"] - 1) < BOUND and m["rollout_corr/kl"] < BOUND
    assert any(m["actor/grad_norm"] > 0 for m in steps)
    start = AutoModelForImageTextToText.from_pretrained(models.resolve(load_recipe(VISION).model.path))
    image_id = start.config.image_token_id
    for step in (1, 2):
        for line in (out / "rollouts" / f"train_data_step{step}.jsonl").open():
            row = json.loads(line)
            assert row["prompt_ids"].count(image_id) == (IMAGE_TOKENS if "images" in rows[row["uid"]] else 0)
            assert all(image_id not in s["response_ids"] for s in row["samples"])
    exported = export_hf(out / "checkpoints" / "step_2", tmp_path / "exported")  # a vision-language model again
    model, processor = AutoModelForImageTextToText.from_pretrained(exported), AutoProcessor.from_pretrained(exported)
    turn = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]}]
    text = processor.apply_chat_template(turn, add_generation_prompt=True, tokenize=False)
    ids = processor(text=text, images=[picture(0)], add_special_tokens=False)["input_ids"][0]
    assert ids.count(image_id) == IMAGE_TOKENS
    trained, begun = model.state_dict(), start.state_dict()
    assert any((trained[k] - begun[k]).abs().max() > 0 for k in begun if "vision_tower" in k)  # the tower trained


@pytest.mark.slow
@pytest.mark.parametrize(
    "over",
    [
        ["model.freeze_vision=true"],
        ["model.lora.rank=4", "model.lora.alpha=8"],  # the adapters synced alone: vLLM's LoRA on the engine
        ["model.lora.rank=4", "model.lora.alpha=8", "model.lora.sync=merged"],
    ],
    ids=["freeze_vision", "lora", "lora-merged"],
)
def test_a_frozen_tower_or_lora_trains_on_image_rows_and_the_engine_follows(tmp_path, over):
    """The vision recipe with its tower frozen, or with LoRA on its language model: the engine's logprobs are the
    learner's after every push (only what trains was sent: ``sync/bytes`` counts it), the tower leaves the run as it
    came, and what trains changed."""
    from transformers import AutoModelForImageTextToText

    from grpo_ray.checkpoint import export_hf
    from grpo_ray.config import load_recipe

    out = tmp_path / "run"
    res = two_steps(SHAPES, out, *over)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    steps = [m for m in map(json.loads, (out / "metrics.jsonl").open()) if m["step"]]
    assert len(steps) == 2
    for m in steps:
        assert m["sync/logprob_diff"] < BOUND and abs(m["rollout_corr/rollout_is_max"] - 1) < BOUND
    start = AutoModelForImageTextToText.from_pretrained(models.resolve(load_recipe(VISION).model.path))
    begun = start.state_dict()
    trained = AutoModelForImageTextToText.from_pretrained(export_hf(out / "checkpoints" / "step_2", tmp_path / "hf"))
    moved = {k for k, v in trained.state_dict().items() if not torch.equal(v, begun[k])}
    assert moved and not any("vision_tower" in k for k in moved)
    if over[0] == "model.freeze_vision=true":
        assert any("multi_modal_projector" in k for k in moved)  # the projection trains
        sent = sum(v.numel() for k, v in begun.items() if "vision_tower" not in k and k != "lm_head.weight")
        assert steps[0]["sync/bytes"] == 4 * sent  # fp32 on the wire; the tied head is the embedding
    else:
        assert all(".language_model." in k for k in moved)


@pytest.mark.slow
def test_a_vision_language_teacher_scores_the_policys_samples_with_their_images(tmp_path):
    """Distillation on image rows: a teacher of the twin's shape and tokenizer, other weights (another seed), scores
    each sample with its picture; the run's reverse KL is the one a plain forward of the teacher gives on the dumped
    prompt and response ids with each prompt's picture, and far from the one without it (the teacher read it)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from grpo_ray.config import load_recipe
    from grpo_ray.data import load_rows
    from grpo_ray.models import vision
    from grpo_ray.telemetry.dumps import read_samples

    teacher = load_recipe(VISION).model.path.replace("seed=0", "seed=1")
    out = tmp_path / "run"
    res = two_steps(
        SHAPES,
        out,
        f"teacher.model={teacher}",
        "teacher.num_actors=1",
        "teacher.micro_batch_size=64",
        "teacher.num_cpus=0.25",
        "algorithm.kl_coef=0",  # the teacher's signal alone
        "trainer.val_before_train=true",  # the teacher's own validation is asked for: skipped, said
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stdout.count("teacher validation skipped: its generate reads text alone so far") == 1
    steps = [m for m in map(json.loads, (out / "metrics.jsonl").open()) if m["step"]]
    model = AutoModelForImageTextToText.from_pretrained(models.resolve(teacher), dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(models.resolve(teacher))
    rows = load_rows(SHAPES, "prompt", "reward_model.ground_truth")  # the run's rows, a sample's uid its row
    banned = vision.placeholder_ids(model.config)  # kept out of responses by every pool alike
    seen, blank = [], []
    for row in read_samples(out / "rollouts" / "train_data_step2.jsonl"):
        image = Image.open(io.BytesIO(rows[row["uid"]]["images"][0]))
        ids, at = row["prompt_ids"] + row["response_ids"], len(row["prompt_ids"])
        for shown, into in ((image, seen), (Image.new("RGB", image.size), blank)):
            logp = forward(model, processor, ids, shown, banned)[
                torch.arange(at - 1, len(ids) - 1), row["response_ids"]
            ]
            into += (torch.tensor(row["sampler_logprobs"]) - logp).tolist()
    expected, unseen = sum(seen) / len(seen), sum(blank) / len(blank)
    assert steps[-1]["distill/reverse_kl"] == pytest.approx(expected, abs=2e-4)
    assert abs(unseen - expected) > 10 * 2e-4


def test_a_reward_model_that_reads_images_scores_each_conversation_with_its_own(twin):
    """A classifier of the twin's shape (``score=1``: Gemma 3's ``Gemma3ForSequenceClassification``) scores each
    rendered conversation as a bare forward of its processor's output gives, with each text's own pictures (and a
    text without any alone); another picture gives another score, and reward_model.max_length cuts a conversation
    after its image, never inside."""
    from transformers import AutoModelForSequenceClassification

    from grpo_ray.config import load_recipe
    from grpo_ray.roles.reward_model import RewardModel

    scorer = TWIN.replace("vocab=160", "vocab=160&score=1&seed=3")
    r = load_recipe(VISION, ["reward_model.shard=false", f"reward_model.model={scorer}"])
    path = models.resolve(scorer)
    actor = RewardModel(path, r, rank=1, world_size=2)
    actor.setup("", 0)
    processor = twin[2]
    pictures = [picture(k) for k in range(3)]
    files = []
    for p in pictures:
        buf = io.BytesIO()
        p.save(buf, format="PNG")
        files.append(buf.getvalue())
    convo = lambda q, a: processor.apply_chat_template(  # noqa: E731
        [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": q}]},
            {"role": "assistant", "content": a},
        ],
        tokenize=False,
    )
    texts = [convo("How many?", "#### 3"), convo("How many squares?", "#### 12"), convo("How many?", "#### 3")]
    texts.append(processor.apply_chat_template([{"role": "user", "content": "Mia has 4."}], tokenize=False))
    images = [[files[0]], [files[1]], [files[2]], []]
    got = actor.rewards(texts, images)
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
    bare = []
    with torch.no_grad():
        for text, shown in zip(texts, [[pictures[0]], [pictures[1]], [pictures[2]], None]):
            enc = processor(text=text, images=shown, add_special_tokens=False, return_tensors="pt")
            bare.append(model(**enc).logits[0, 0].item())
    assert got == pytest.approx(bare, abs=1e-5)
    assert abs(got[0] - got[2]) > 10 * 1e-5  # the same words, another picture: another score (10x the bound)
    length = len(processor(text=texts[0], images=[pictures[0]], add_special_tokens=False)["input_ids"][0])
    actor.max_length = IMAGE_TOKENS  # shorter than the text up to its image's end
    cut = actor._ids(texts[0], images[0])
    assert cut.count(model.config.image_token_id) == IMAGE_TOKENS and len(cut) < length
    assert actor.rewards(texts[:1], images[:1])[0] != pytest.approx(got[0], abs=1e-5)


SCORED = {
    "reward_model": [f"reward_model.model={TWIN.replace('vocab=160', 'vocab=160&text=shapes&score=1&seed=3')}"],
    "judge": [
        f"reward_model.model={TWIN.replace('vocab=160', 'vocab=160&seed=4&tie=0')}",  # replies with digits at times
        "reward_model.judge.template='How many squares are there? The answer: {response}. Grade:'",
        "reward_model.judge.pattern='([0-9])'",
        "reward_model.judge.max_tokens=8",
        "reward_model.judge.vllm_kwargs={model_impl: transformers, limit_mm_per_prompt: {image: 1}}",
    ],
}
"""A learned reward of the twin's shape that reads images: a classifier (``score=1``), or a judge (untied: its
replies vary) whose grade is the last digit of its reply."""


@pytest.mark.slow
@pytest.mark.parametrize("pool", list(SCORED))
def test_a_reward_model_or_judge_scores_each_sample_with_its_picture(tmp_path, pool):
    """Two steps of the vision recipe with a learned reward that reads images: every dumped sample's
    ``reward_model`` score is what that model gives the sample's conversation with its own picture (a bare forward
    of the classifier; the judge's greedy reply to its rubric, read by the pattern), and with each picture blanked
    the same models give other scores (they read the pixels)."""
    import math

    from transformers import AutoModelForImageTextToText, AutoModelForSequenceClassification, AutoProcessor

    from grpo_ray.data import conversation_text, load_rows
    from grpo_ray.data.images import with_image_parts
    from grpo_ray.roles.judge import shown_with
    from grpo_ray.telemetry.dumps import read_samples
    from grpo_ray.types import Prompt

    over = SCORED[pool] + ["reward_model.num_actors=1", "reward_model.num_cpus=0.2", "reward_model.weight=0.1"]
    over.append("algorithm.kl_coef=0")  # no reference: room for the pool on two cores
    out = tmp_path / "run"
    res = two_steps(SHAPES, out, *over)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    path = models.resolve(over[0].split("=", 1)[1])
    processor = AutoProcessor.from_pretrained(path)
    kind = AutoModelForSequenceClassification if pool == "reward_model" else AutoModelForImageTextToText
    model = kind.from_pretrained(path, dtype=torch.float32).eval()
    rows = load_rows(SHAPES, "prompt", "reward_model.ground_truth")
    prefix = "#### "  # the recipe's data.response_prefix

    def scored(messages, response: str, image: Image.Image) -> float:
        if pool == "reward_model":
            text = conversation_text(processor.tokenizer, messages, prefix + response)
            enc = processor(text=text, images=[image], add_special_tokens=False, return_tensors="pt")
            with torch.no_grad():
                return model(**enc).logits[0, 0].item()
        from grpo_ray.rewards.learned import judge_prompt, read_score

        rubric = judge_prompt(
            SCORED["judge"][1].split("=", 1)[1].strip("'"), Prompt([1], "", "s", messages=messages), prefix + response
        )
        turn = [{"role": "user", "content": shown_with(rubric, 1)}]
        tok = processor.tokenizer
        text = processor.apply_chat_template(turn, add_generation_prompt=True, tokenize=False)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        # the marker as vLLM expands it: the processor's image sequence tokenized apart from the text around it
        sequence = tok(processor.full_image_sequence, add_special_tokens=False)["input_ids"]
        marker = tok.convert_tokens_to_ids(processor.boi_token)
        ids = torch.tensor([[t for x in ids for t in (sequence if x == marker else [x])]])
        pixels = processor.image_processor(images=[image], return_tensors="pt")["pixel_values"]
        with torch.no_grad():  # causal throughout, as the engine runs it
            reply = model.generate(
                input_ids=ids,
                pixel_values=pixels,
                token_type_ids=torch.zeros_like(ids),
                max_new_tokens=8,
                do_sample=False,
            )
        value = read_score(tok.decode(reply[0, ids.shape[1] :], skip_special_tokens=True), "([0-9])")
        return 0.0 if math.isnan(value) else value  # reward_model.judge.default

    got, seen, blank = [], [], []
    for step in (1, 2):
        for row in read_samples(out / "rollouts" / f"train_data_step{step}.jsonl"):
            source = rows[row["uid"]]
            image = Image.open(io.BytesIO(source["images"][0]))
            messages = with_image_parts(source["prompt"], 1)
            got.append(row["rewards"]["reward_model"])
            seen.append(scored(messages, row["response"], image))
            blank.append(scored(messages, row["response"], Image.new("RGB", image.size, "white")))
    assert got == pytest.approx(seen, abs=1e-4)
    assert len(set(got)) > 1 and blank != pytest.approx(seen, abs=1e-4)


def test_a_trajectory_with_images_is_the_engines_expanded_tokens():
    """A trajectory whose prompt and observation each hold an image marker (7), which the engine expands into three
    image tokens (9): its completion is the engine's expanded tokens after the expanded prompt, each model turn's
    tokens, logprobs and versions where the engine's prompt ids of its request put them, 0 (and the version before)
    on the rest; a turn not where the engine put it is refused."""
    from grpo_ray.rollouts.trajectory import Trajectory

    t = Trajectory(0, 0, "0/0", None, given=1)  # the prompt [1, 7, 2] as the engine expanded it: [1, 9, 9, 9, 2]
    t.turns_at.append((5, 0, 2))
    t.context = [1, 9, 9, 9, 2]
    t.ids, t.mask, t.logprobs, t.versions = [10, 11], [1, 1], [-0.1, -0.2], [3, 3]
    t.ids += [20, 7, 21]  # an observation showing an image
    t.mask, t.logprobs, t.versions = t.mask + [0] * 3, t.logprobs + [0.0] * 3, t.versions + [3] * 3
    t.images = [b"png"]
    t.turns_at.append((12, 5, 1))
    t.context = [1, 9, 9, 9, 2, 10, 11, 20, 9, 9, 9, 21]
    t.ids, t.mask, t.logprobs, t.versions = t.ids + [12], t.mask + [1], t.logprobs + [-0.3], t.versions + [4]
    c = t.completion()
    assert c.token_ids == [10, 11, 20, 9, 9, 9, 21, 12]
    assert c.mask == [1, 1, 0, 0, 0, 0, 0, 1]
    assert c.sampler_logprobs == [-0.1, -0.2, 0, 0, 0, 0, 0, -0.3]
    assert c.versions == [3, 3, 3, 3, 3, 3, 3, 4]
    assert c.context == [1, 9, 9, 9, 2] and c.images == [b"png"]
    t.context[5] = 13  # the first turn is not where the engine's ids say
    with pytest.raises(RuntimeError, match="a model turn is not where"):
        t.completion()


def text_rows(tmp_path) -> Path:
    """The shapes task's rows with their pictures left out."""
    from grpo_ray.data.synthetic import make_rows

    rows = tmp_path / "rows.jsonl"
    texts = [
        {**row, "prompt": [{"role": "user", "content": "How many squares?"}]} for row in make_rows(8, task="shapes")
    ]
    rows.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "images"}) + "\n" for r in texts))
    return rows


def two_turns_with_a_picture(tmp_path, pictured: bool, *over) -> None:
    """Two steps of trajectories of up to two turns, on image rows (`pictured`) or text rows, where what `over` names
    shows a picture before the second turn; then: the learner's logprob of every sampled token the engine's within
    the text path's bound, the prompt's image tokens there where the rows had pictures, and each two-turn trajectory
    holding the picture's image tokens, masked."""
    from transformers import AutoConfig

    from grpo_ray.config import load_recipe
    from grpo_ray.telemetry.dumps import read_samples

    out = tmp_path / "run"
    res = two_steps(
        SHAPES if pictured else text_rows(tmp_path),
        out,
        *over,
        "environment.max_turns=2",
        "environment.max_tokens=64",
        "generator.sampling.max_tokens=6",
        "generator.vllm_kwargs.limit_mm_per_prompt={image: 2}",
        "reward.functions=[]",
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]

    steps = [m for m in map(json.loads, (out / "metrics.jsonl").open()) if m["step"]]
    assert len(steps) == 2
    for m in steps:
        assert m["env/errors"] == 0
        assert m["sync/logprob_diff"] < BOUND
        assert abs(m["rollout_corr/rollout_is_max"] - 1) < BOUND and m["rollout_corr/kl"] < BOUND
    image_id = AutoConfig.from_pretrained(models.resolve(load_recipe(VISION).model.path)).image_token_id
    shown = 0
    for step in (1, 2):
        for row in read_samples(out / "rollouts" / f"train_data_step{step}.jsonl"):
            assert row["prompt_ids"].count(image_id) == (IMAGE_TOKENS if pictured else 0)
            at = [k for k, t in enumerate(row["response_ids"]) if t == image_id]
            assert len(at) == (IMAGE_TOKENS if len(row["episode"]["turns"]) == 3 else 0)
            assert all(row["loss_mask"][k] == 0 for k in at)
            shown += bool(at)
    assert shown >= 8  # most trajectories had a second turn


@pytest.mark.slow
@pytest.mark.parametrize("pictured", [True, False], ids=["image rows", "text rows"])
def test_an_environment_shows_a_picture_and_the_learner_reads_what_the_engine_read(tmp_path, pictured):
    """Rows (with a picture, or text alone) played by an environment that answers the model's first turn with a
    picture of its own (``Step.images``, tests/helpers/envs.py): the engine reads the prompt's picture (if any) and
    then the observation's before the second turn, and the learner's logprob of every sampled token of both turns is
    the engine's within the text path's bound (the observation's image tokens expanded where the engine put them,
    their pixels read in order); each two-turn trajectory holds the observation's image tokens, masked."""
    two_turns_with_a_picture(
        tmp_path,
        pictured,
        "environment.name=tests.helpers.envs:ShowPicture",
        "environment.role=user",
        "environment.stop=[' ', 'e', 'a', 'o']",  # a turn of the random twin ends on one of these, mostly
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "pictured", [pytest.param(True, marks=pytest.mark.smoke), False], ids=["image rows", "text rows"]
)
def test_an_agent_program_shows_a_picture_and_the_learner_reads_what_the_engine_read(tmp_path, pictured):
    """An agent program (tests/helpers/agents.py:pictured) sends the row (an image row's picture as an image_url
    part), then answers the first reply with a picture of its own between two pieces of text, through the
    endpoint's OpenAI content parts: the engine reads the pictures, and the learner reads what it read, as with an
    environment's pictures; a picture at a web address is refused (400) in each program."""
    two_turns_with_a_picture(
        tmp_path,
        pictured,
        "environment.name=agent",
        "environment.options.program=tests.helpers.agents:pictured",
        "environment.options.timeout_s=60",
    )


@pytest.mark.slow
def test_an_agent_groups_programs_that_open_apart_get_a_turn_from_the_image_rows_prompt(tmp_path):
    """A group whose programs open with different prompts (tests/helpers/agents.py:opens_apart) ends its trajectories
    as errors, each given one turn generated from the row's prompt, its picture with it: the learner reads that turn
    as the engine sampled it (what the programs' sessions recorded is dropped with their ids)."""
    out = tmp_path / "run"
    res = two_steps(
        SHAPES,
        out,
        "environment.name=agent",
        "environment.options.program=tests.helpers.agents:opens_apart",
        "environment.options.timeout_s=60",
        "generator.sampling.max_tokens=6",
        "reward.functions=[]",
        "reward.max_error_steps=0",  # every trajectory an error, by design
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    steps = [m for m in map(json.loads, (out / "metrics.jsonl").open()) if m["step"]]
    assert [m["env/errors"] for m in steps] == [16, 16]
    for m in steps:
        assert m["sync/logprob_diff"] < BOUND and abs(m["rollout_corr/rollout_is_max"] - 1) < BOUND


def test_the_planner_counts_the_vision_tower_from_the_config(twin):
    """``ModelDims.vision`` (in ``params``: the planner's weights, gradients, optimizer state and pushes) is the
    tower's and its projection's parameters as the config gives them, within 2% (norms and biases aside): the
    twin's, built or not yet, and a Qwen2.5-VL ViT's (gated MLP, merger)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from grpo_ray.models.dims import model_dims, tiny_dims, vision_params

    def count(model, *names) -> int:
        return sum(p.numel() for n, p in model.named_parameters() if any(x in n for x in names))

    real = count(twin[1], "vision_tower", "multi_modal_projector")
    assert 0.98 < model_dims(TWIN).vision / real <= 1 and tiny_dims(parse_tiny(TWIN)).vision == model_dims(TWIN).vision
    text = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 128}
    vit = {"depth": 2, "hidden_size": 64, "out_hidden_size": 64, "num_heads": 2, "intermediate_size": 128}
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vit)
    real = count(Qwen2_5_VLForConditionalGeneration(config), "visual")
    assert 0.98 < vision_params(config.vision_config.to_dict(), 64) / real <= 1


def test_the_plan_times_the_pictures_through_the_tower():
    """`plan` adds the tower's forward for the pictures each phase reads (limit_mm_per_prompt's a prompt): an
    engine's prefill once a prompt (Gemma-3-4B on Geometry3K: 80 sequences an engine, groups of 5, 16 pictures),
    the reference's and the learner's once a prompt a call, the learner's backward through the tower where it trains
    (3 x the forward it adds when model.freeze_vision keeps it); the same recipe without images, none."""
    from grpo_ray.config import load_recipe
    from grpo_ray.lengths import wire_dtype
    from grpo_ray.models.dims import model_dims
    from grpo_ray.planner import rates, speed
    from grpo_ray.planner.work import tower_seconds

    def phases(*over):
        r = load_recipe(ROOT / "recipes" / "gemma3-4b-geometry3k-1node.yaml", list(over))
        got = speed.predict(r, d, rates.rates_for(r), speed.default_shape(r)).phases
        return {k: v.seconds for k, v in got.items()}

    d = model_dims("google/gemma-3-4b-it")
    r = load_recipe(ROOT / "recipes" / "gemma3-4b-geometry3k-1node.yaml")
    assert d.tower.patches == 4096 and r.generator.vllm_kwargs["limit_mm_per_prompt"] == {"image": 1}
    text, pictured = phases("generator.vllm_kwargs.limit_mm_per_prompt={image: 0}"), phases()
    tower = tower_seconds(d, rates.rates_for(r).at(1), wire_dtype(r), 16)
    assert tower > 0 and pictured["generation"] - text["generation"] == pytest.approx(tower, rel=1e-9)
    assert pictured["reference"] > text["reference"] and pictured["old policy"] > text["old policy"]
    frozen = phases("model.freeze_vision=true")
    trained = pictured["update"] - text["update"]
    assert trained > 0 and trained == pytest.approx(
        3
        * (
            frozen["update"]
            - phases("model.freeze_vision=true", "generator.vllm_kwargs.limit_mm_per_prompt={image: 0}")["update"]
        ),
        rel=1e-9,
    )


@pytest.mark.slow
def test_sft_trains_on_image_rows_with_the_prompts_expanded(tmp_path):
    """``grpo-ray sft`` on the vision recipe's pictures: its prompts expanded by the model's processor (no engine runs
    them), each sample's pixels in the learner's forward, the loss falling; the model it makes reads images."""
    from transformers import AutoModelForImageTextToText

    out = tmp_path / "sft"
    res = run_cli(
        "sft",
        str(VISION),
        "trainer.total_steps=6",
        "data.train_batch_size=32",
        "learner.mini_batch_size=32",
        "learner.micro_batch_size=16",
        "trainer.test_freq=0",
        "trainer.val_before_train=false",
        "trainer.loggers=[jsonl]",
        f"trainer.output_dir={out}",
        timeout=900,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    losses = [m["sft/loss"] for m in map(json.loads, (out / "metrics.jsonl").open()) if m["step"]]
    assert len(losses) == 6 and losses[-1] < 0.7 * losses[0], losses  # 4.45 -> 2.40 here
    # (a prompt's 16 image tokens without its pixels would fail the forward: images and tokens must match)
    model = AutoModelForImageTextToText.from_pretrained(out / "model")
    assert model.config.vision_config.num_hidden_layers == 2
