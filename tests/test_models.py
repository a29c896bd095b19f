import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_ray import models
from grpo_ray.models import tiny
from tests.conftest import ROOT, TINY, engine_env

ARCHS = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM", "gemma3": "Gemma3ForCausalLM"}


@pytest.fixture(scope="module")
def built():
    return {arch: models.resolve(TINY.format(arch=arch)) for arch in ARCHS}


def test_parse_tiny_names_and_errors():
    spec = tiny.parse_tiny("tiny://llama?layers=4&hidden=256&heads=8&kv_heads=2")
    assert (spec.arch, spec.layers, spec.hidden, spec.head_dim, spec.kv_heads) == ("llama", 4, 256, 32, 2)
    assert tiny.parse_tiny(spec.canonical()) == spec
    with pytest.raises(models.ModelNameError, match="unknown tiny architecture 'mistral'"):
        tiny.parse_tiny("tiny://mistral?layers=2")
    with pytest.raises(models.ModelNameError, match="unknown key 'layer'"):
        tiny.parse_tiny("tiny://qwen2?layer=2")
    with pytest.raises(models.ModelNameError, match="hidden=100 must be divisible by heads=3"):
        tiny.parse_tiny("tiny://qwen2?hidden=100&heads=3")
    assert models.resolve("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"


@pytest.mark.parametrize("arch", list(ARCHS))
def test_tiny_checkpoint_reloads_in_transformers(built, arch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(built[arch])
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == [ARCHS[arch]]
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    n = sum(p.numel() for p in model.parameters())
    assert 50_000 < n < 2_000_000  # "about 1M parameters" scale for tests
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Mia has 7 pears. #### 7"}], add_generation_prompt=True, tokenize=False
    )
    ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    assert tok.decode(ids[0]) == text  # byte-level: every character round-trips
    assert tok.eos_token_id is not None and tok.eos_token is not None
    out = model.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape[1] > ids.shape[1]


@pytest.mark.parametrize("arch", list(ARCHS))
def test_the_driver_tokenizes_as_the_pools_do(built, arch, tmp_path):
    """The driver loads a tokenizer.json-only checkpoint with transformers' generic fast class (no Auto import of
    every model's code); the engines, learner and reference load it with AutoTokenizer: the same templated text
    and the same ids on every training row, special tokens included. A checkpoint naming its own class gets that."""
    import shutil

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from grpo_ray.config import ModelConfig
    from grpo_ray.data import load_rows, prompt_text

    cls = models.tokenizer_class(built[arch])
    assert cls is PreTrainedTokenizerFast
    ours, theirs = (
        models.load_tokenizer(built[arch], ModelConfig(path=built[arch])),
        AutoTokenizer.from_pretrained(built[arch]),
    )
    rows = load_rows("synthetic://reasoning?size=300&seed=3", "prompt", "answer")
    rows += [{"prompt": [{"role": "user", "content": "ünïcödé 汉字 🙂  \t\n x <|im_end|>"}]}]
    texts = [prompt_text(ours, row) for row in rows]
    assert texts == [prompt_text(theirs, row) for row in rows]
    assert ours(texts, add_special_tokens=False)["input_ids"] == theirs(texts, add_special_tokens=False)["input_ids"]
    assert ours(texts)["input_ids"] == theirs(texts)["input_ids"]
    assert (ours.eos_token_id, ours.pad_token_id, ours.bos_token_id, ours.all_special_ids) == (
        theirs.eos_token_id,
        theirs.pad_token_id,
        theirs.bos_token_id,
        theirs.all_special_ids,
    )
    lazy = models.load_tokenizer(built[arch], ModelConfig(path=built[arch]), lazy=True)  # what setup_run holds
    assert isinstance(lazy, models.LazyTokenizer) and lazy.chat_template == theirs.chat_template
    assert lazy._loaded is None and [prompt_text(lazy, row) for row in rows[:5]] == texts[:5]
    own = tmp_path / "own"
    shutil.copytree(built[arch], own)
    config = json.loads((own / "tokenizer_config.json").read_text())
    (own / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "Qwen2Tokenizer"}))
    assert models.tokenizer_class(str(own)) is AutoTokenizer
    assert models.tokenizer_class(built[arch], trust_remote_code=True) is AutoTokenizer


def test_rows_kept_by_an_earlier_run_are_checked_without_transformers(tmp_path):
    """The driver's data check of a train run imports transformers only when it has rows to tokenize: a second run
    over the same files reads the first one's checked rows and scores its reward check without it."""
    code = (
        "import sys; from grpo_ray.config import load_recipe; from grpo_ray.setup_run import setup_run; "
        "inputs = setup_run(load_recipe('recipes/tiny-cpu.yaml', ['trainer.output_dir=' + sys.argv[1]])); "
        "print(len(inputs.train_rows), 'transformers' in sys.modules)"
    )
    said = []
    for run in ("first", "second"):
        res = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / run)], capture_output=True, text=True, cwd=ROOT
        )
        assert res.returncode == 0, res.stderr[-3000:]
        said.append(res.stdout.split()[-2:])
    assert said[1] == [said[0][0], "False"] and int(said[0][0]) > 1000


def test_same_name_same_weights_other_seed_other_weights(tmp_path):
    from safetensors.torch import load_file

    name = "tiny://qwen2?layers=1&hidden=64&heads=2&kv_heads=1&seed=3"
    a = tiny.build_tiny(tiny.parse_tiny(name), tmp_path / "a")
    b = tiny.build_tiny(tiny.parse_tiny(name), tmp_path / "b")
    c = tiny.build_tiny(tiny.parse_tiny(name.replace("seed=3", "seed=4")), tmp_path / "c")
    wa, wb, wc = (load_file(p / "model.safetensors") for p in (a, b, c))
    key = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(wa[key], wb[key]) and not torch.equal(wa[key], wc[key])
    assert (a / "tokenizer.json").read_text() == (b / "tokenizer.json").read_text()


def test_small_vocabulary_option():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(
        models.resolve("tiny://qwen2?layers=1&hidden=64&heads=2&kv_heads=1&vocab=64&bytes=0")
    )
    assert len(tok) == 64
    assert tok.decode(tok("Mia has 7 pears.\n#### 7")["input_ids"]) == "Mia has 7 pears.\n#### 7"


@pytest.mark.slow
def test_tiny_checkpoints_generate_in_vllm(built):
    """Each family's tiny checkpoint loads in vLLM and samples (one process, engine after engine)."""
    res = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "helpers" / "vllm_generate.py"), *(built[a] for a in ARCHS)],
        capture_output=True,
        text=True,
        timeout=600,
        env=engine_env(),
    )
    outs = [json.loads(l[len("RESULT ") :]) for l in res.stdout.splitlines() if l.startswith("RESULT ")]
    assert res.returncode == 0 and [o["path"] for o in outs] == [built[a] for a in ARCHS], res.stderr[-3000:]
    for out in outs:
        assert len(out["token_ids"]) == 2 and all(len(t) >= 1 for t in out["token_ids"]), out["path"]
        assert all(lp <= 0 for lps in out["logprobs"] for lp in lps)


def assert_same_as_full_padded_forward(model, padded, *layouts):
    """Each layout's ``sequence_logprobs`` gives the logprobs and entropies (temperature 0.7) of a padded forward
    with the LM head on every position, 0 off the responses, and the gradient of their sum."""
    from grpo_ray.algo.logprobs import sequence_logprobs, token_logprobs

    mask = padded.response_mask.bool()
    forwards = [lambda: token_logprobs(model, padded.input_ids, padded.attention_mask, 0.7, True)]
    forwards += [lambda seqs=seqs: sequence_logprobs(model, seqs, "cpu", 0.7, True) for seqs in layouts]
    grads, outs = [], []
    for forward in forwards:
        model.zero_grad()
        logp, entropy = forward()
        (logp * padded.response_mask).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        outs.append((logp, entropy))
    (want_logp, want_entropy), *got = outs
    for (logp, entropy), grad in zip(got, grads[1:]):
        assert torch.allclose(logp[mask], want_logp[mask], atol=1e-5)
        assert torch.allclose(entropy[mask], want_entropy[mask], atol=1e-5)
        assert not logp[~mask].any() and not entropy[~mask].any()  # no logits off the responses
        assert torch.allclose(grad, grads[0], atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_packed_forward_gives_the_padded_logprobs_and_gradients(built, arch):
    """Several samples to a row (model.sequence_packing), the LM head on response positions only: each sample's
    logprobs, entropies and the gradient of their sum are those of a padded forward with the head on every
    position, so no sample attends to another, each one's positions restart and the head skips nothing needed."""
    import random

    from grpo_ray.algo.batching import collate, micro_batches

    model = models.load_causal_lm(built[arch], torch.float32)
    rng, vocab = random.Random(0), model.config.vocab_size
    pairs = [
        (
            [rng.randrange(3, vocab) for _ in range(rng.randint(2, 12))],
            [rng.randrange(3, vocab) for _ in range(rng.randint(1, 30))],
        )
        for _ in range(12)
    ]
    (micro, *_), capacity = micro_batches(list(range(12)), pairs, 12, packing=True)
    padded = collate([pairs[i] for i in micro], 0)
    packed = collate([pairs[i] for i in micro], 0, capacity)
    assert packed.packed.input_ids.shape[0] < len(micro)  # rows really are shared
    assert_same_as_full_padded_forward(model, padded, padded, packed)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_shared_prompt_forward_gives_the_padded_logprobs_and_gradients(built, arch):
    """Each distinct prompt run once (model.shared_prompt), its keys and values serving its responses packed
    several to a row: each sample's logprobs, entropies and the gradient of their sum are those of a padded
    forward of every whole sequence, for groups of samples sharing a prompt, a prompt alone, and an empty
    response."""
    import random

    from grpo_ray.algo.batching import collate

    model = models.load_causal_lm(built[arch], torch.float32)
    rng, vocab = random.Random(1), model.config.vocab_size
    word = lambda n: [rng.randrange(3, vocab) for _ in range(n)]  # noqa: E731
    prompts = [word(rng.randint(2, 12)) for _ in range(4)]
    pairs = [(prompts[k], word(rng.randint(1, 20))) for k in (0, 0, 0, 1, 1, 2, 3, 3, 0)] + [(prompts[3], [])]
    padded, shared = collate(pairs, 0), collate(pairs, 0, shared=True)
    assert shared.shared.prompt_ids.shape[0] == 4 and shared.shared.input_ids.shape[0] < len(pairs)
    assert_same_as_full_padded_forward(model, padded, shared)


def test_shared_prompt_forward_keeps_sliding_windows(built):
    """Gemma 3's sliding-window layers, with a window shorter than the sequences: each kind of layer gets its own
    mask with shared prompts, and the result is still the padded forward's (which transformers masks itself)."""
    import random

    from grpo_ray.algo.batching import collate

    model = models.load_causal_lm(built["gemma3"], torch.float32)
    assert "sliding_attention" in model.config.layer_types
    model.config.sliding_window = 6
    rng, vocab = random.Random(2), model.config.vocab_size
    word = lambda n: [rng.randrange(3, vocab) for _ in range(n)]  # noqa: E731
    prompts = [word(9), word(4)]
    pairs = [(prompts[k], word(rng.randint(3, 15))) for k in (0, 0, 0, 1, 1)]
    assert_same_as_full_padded_forward(model, collate(pairs, 0), collate(pairs, 0, shared=True))


def test_entropy_carries_a_gradient_only_when_asked(built):
    """Without an entropy term in the loss the entropies are a metric: no graph (whose [tokens, vocab] tensor would
    hold memory until the micro batch ends), the same values, and the same logprob gradients."""
    from grpo_ray.algo.batching import collate
    from grpo_ray.algo.logprobs import sequence_logprobs

    model = models.load_causal_lm(built["qwen2"], torch.float32)
    seqs = collate([([5, 6, 7], [8, 9]), ([5, 6], [10, 11, 12])], 0, capacity=6)
    outs = []
    for grad in (True, False):
        model.zero_grad()
        logp, entropy = sequence_logprobs(model, seqs, "cpu", 0.7, True, entropy_grad=grad)
        (logp * seqs.response_mask).sum().backward()
        outs.append((entropy, torch.cat([p.grad.flatten() for p in model.parameters()])))
    (with_grad, g1), (without, g2) = outs
    assert with_grad.requires_grad and not without.requires_grad
    assert torch.equal(with_grad.detach(), without) and torch.equal(g1, g2)
