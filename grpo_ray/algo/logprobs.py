"""Per-token log-probabilities and entropy of response tokens under a causal LM."""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from grpo_ray.algo.batching import Sequences


def token_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask,
    temperature: float = 1.0,
    with_entropy: bool = False,
    position_ids: torch.Tensor | None = None,
    keep: torch.Tensor | None = None,
    past_key_values=None,
    entropy_grad: bool = True,
    pixel_values=None,
    banned: list[int] = (),
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(x_t | x_<t) for t = 1..T-1 ([B, T-1]), and the entropy of each of those distributions (without a
    gradient unless `entropy_grad`: a metric alone needs none, and its graph would keep a [tokens, vocab] tensor).
    A vision-language model reads its images (`pixel_values`: ``models.vision.Pixels``, in the order their tokens
    come, row after row; ``each_image``); the `banned` tokens' logits get the engine's bias against sampling them
    (``models.vision.placeholder_ids``).

    Logits are divided by the sampling temperature, as the sampler did before drawing. With `keep` ([B, T-1]
    bool), only those positions get logits (the LM head runs on their hidden states alone); the others hold 0.
    With `past_key_values`, `input_ids` go on from those keys and values (``attention_mask`` then covers both).
    """
    keep_head = None if keep is None else torch.nn.functional.pad(keep, (0, 1))
    with head_on(model, keep_head), each_image(model, pixel_values) as pixels:
        logits = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=past_key_values is not None,
            **({} if pixels is None else {"pixel_values": pixels}),
        ).logits
    if keep is None:
        logits, targets = logits[:, :-1], input_ids[:, 1:]
    else:
        targets = input_ids[:, 1:][keep]
    logp, entropy = _logprobs_of(logits, targets, temperature, with_entropy, entropy_grad, banned)
    if keep is not None:
        place = lambda v: torch.zeros(keep.shape, dtype=v.dtype, device=v.device).masked_scatter(keep, v)  # noqa: E731
        logp, entropy = place(logp), None if entropy is None else place(entropy)
    return logp, entropy


def _logprobs_of(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    entropy_grad: bool = True,
    banned: list[int] = (),
):
    """log p(target) under (logits + the bias against `banned` tokens) / temperature, as vLLM's sampler applies
    them, and the distribution's entropy (or None; with a gradient only if `entropy_grad`)."""
    logits = logits.float()
    if banned:
        logits = logits.index_add(-1, torch.tensor(banned, device=logits.device), _ban(logits, len(banned)))
    logp_all = torch.log_softmax(logits / temperature, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return logp, None
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        return logp, -(logp_all.exp() * logp_all).sum(-1)


def _ban(logits: torch.Tensor, n: int) -> torch.Tensor:
    """The bias added to `n` columns of `logits` (``models.vision.BAN``)."""
    from grpo_ray.models.vision import BAN

    return torch.full((*logits.shape[:-1], n), BAN, dtype=logits.dtype, device=logits.device)


@contextlib.contextmanager
def head_on(model, keep: torch.Tensor | None):
    """While open, `model`'s LM head sees the hidden states of the `keep` positions only ([B, T] bool), flattened
    to [N, hidden]. With a vocabulary of 150K the head is the largest layer, and its logits ([tokens, vocab], in
    fp32 for the softmax) the largest activation; prompt positions need neither."""
    if keep is None:
        yield
        return
    handle = model.get_output_embeddings().register_forward_pre_hook(lambda _, args: (args[0][keep],))
    try:
        yield
    finally:
        handle.remove()


PROJECTORS = ("multi_modal_projector",)
"""The module that maps a vision tower's output into the language model (Gemma 3's, LLaVA's): one output an image."""


@contextlib.contextmanager
def each_image(model, pixels):
    """While open, `model`'s forward runs its vision tower once for each distinct image of `pixels`
    (``models.vision.Pixels``), and each image of the batch gets its features (its projector's output, indexed):
    yields the pixel values to pass. A model without such a projector gets every image's pixels, run each time.
    A forward without images of a model sharded over ranks runs its tower on one blank image all the same, its
    features used by no token: the tower's gathers (and, in a backward, its reductions) pair with those of the
    ranks whose forwards have images (a filler, or a micro batch of text rows)."""
    projector = next((m for name, m in model.named_modules() if name.rsplit(".", 1)[-1] in PROJECTORS), None)
    if pixels is None and projector is not None and _sharded(model):
        side = model.config.vision_config.image_size
        values = torch.zeros(1, 3, side, side, device=next(model.parameters()).device)
        index = torch.zeros(0, dtype=torch.long, device=values.device)  # no token's features
    elif pixels is None:
        yield None
        return
    else:
        values, index = pixels
    if projector is None:
        yield values[index]
        return
    handle = projector.register_forward_hook(lambda _module, _args, out: out[index])
    try:
        yield values
    finally:
        handle.remove()


def _sharded(model) -> bool:
    """Whether `model`'s forwards are collectives: FSDP2 units over more than one rank."""
    from torch.distributed.fsdp import FSDPModule

    return (
        dist.is_initialized() and dist.get_world_size() > 1 and any(isinstance(m, FSDPModule) for m in model.modules())
    )


def sequence_logprobs(
    model,
    seqs: Sequences,
    device,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = True,
    pixel_values=None,
    banned: list[int] = (),
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``token_logprobs`` of the response tokens of `seqs` in their [B, L-1] layout (0 off ``response_mask``),
    whether the forward runs on them padded, packed (``seqs.packed``) or with each prompt run once
    (``seqs.shared``); a vision-language model's `pixel_values` are its images' in ``seqs.order``, and its
    `banned` tokens are kept out of responses (``token_logprobs``)."""
    pixels = None if pixel_values is None else pixel_values.to(device)
    if seqs.shared is not None:
        if pixels is not None:
            raise ValueError("images with shared prompts: a prompt's tokens alone do not say which images it holds")
        return shared_prompt_logprobs(model, seqs, device, temperature, with_entropy, entropy_grad, banned)
    keep = seqs.response_mask.to(device).bool()
    if seqs.packed is None:
        return token_logprobs(
            model,
            seqs.input_ids.to(device),
            seqs.attention_mask.to(device),
            temperature,
            with_entropy,
            keep=keep,
            entropy_grad=entropy_grad,
            pixel_values=pixels,
            banned=banned,
        )
    p = seqs.packed
    index = p.index.to(device)
    rows, width = p.input_ids.shape
    packed_keep = torch.zeros(rows * (width - 1), dtype=torch.bool, device=device)
    packed_keep[index[keep]] = True
    logp, entropy = token_logprobs(
        model,
        p.input_ids.to(device),
        None,
        temperature,
        with_entropy,
        p.position_ids.to(device),
        packed_keep.view(rows, width - 1),
        entropy_grad=entropy_grad,
        pixel_values=pixels,
        banned=banned,
    )
    inside, at = index >= 0, index.clamp(min=0)
    unpack = lambda v: torch.where(inside, v.reshape(-1)[at], 0.0)  # noqa: E731
    return unpack(logp), None if entropy is None else unpack(entropy)


def shared_prompt_logprobs(
    model,
    seqs: Sequences,
    device,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = True,
    banned: list[int] = (),
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``sequence_logprobs`` with each distinct prompt run once (``seqs.shared``, model.shared_prompt): a forward
    of the prompts keeps their keys and values (gradients flow back through them) and predicts each one's first
    response token; a forward of the response rows attends to its prompt's keys and values and to its own
    response, causally. The same math as one forward per sequence, with the prompt's work done once for all its
    responses."""
    from transformers import DynamicCache

    s = seqs.shared
    prompts, plen = s.prompt_ids.to(device), s.prompt_lengths.to(device)
    width = prompts.shape[1]
    cache = DynamicCache()  # full layers: a config's sliding-window layers would drop keys the rows still need
    last = torch.arange(width, device=device) == (plen - 1)[:, None]
    with head_on(model, last):
        first_logits = model(
            input_ids=prompts,
            attention_mask=(torch.arange(width, device=device) < plen[:, None]).long(),
            past_key_values=cache,
            use_cache=True,
        ).logits
    row_prompt = s.row_prompt.to(device)
    rows = DynamicCache(ddp_cache_data=[(layer.keys[row_prompt], layer.values[row_prompt]) for layer in cache.layers])
    segment, positions = s.segment.to(device), s.position_ids.to(device)
    keep = (segment[:, :-1] >= 0) & (segment[:, :-1] == segment[:, 1:])  # predicts its own response's next token
    mask = _row_masks(model, plen[row_prompt], width, segment, positions)
    row_logp, row_entropy = token_logprobs(
        model,
        s.input_ids.to(device),
        mask,
        temperature,
        with_entropy,
        positions,
        keep,
        rows,
        entropy_grad,
        banned=banned,
    )
    first = s.first.to(device)
    first_logp, first_entropy = _logprobs_of(
        first_logits[first[:, 0]], first[:, 1], temperature, with_entropy, entropy_grad, banned
    )
    index = s.index.to(device)
    inside, at = index >= 0, index.clamp(min=0)
    unpack = lambda a, b: torch.where(inside, torch.cat([a, b.reshape(-1)])[at], 0.0)  # noqa: E731
    return unpack(first_logp, row_logp), None if row_entropy is None else unpack(first_entropy, row_entropy)


def _row_masks(model, plen: torch.Tensor, width: int, segment: torch.Tensor, positions: torch.Tensor):
    """Attention masks ([R, 1, C, P + C]) of response rows over their prompt's keys (the first P, of which each
    row sees its prompt's length) then their own: a response sees its prompt and itself, causally; padding sees
    its prompt. A model whose layers have sliding windows (``config.layer_types``) gets one mask per kind of
    layer, the sliding ones within the window. Boolean for sdpa, additive for eager attention."""
    config = model.config
    n = segment.shape[1]
    col = torch.arange(n, device=segment.device)
    own = (
        (segment[:, :, None] == segment[:, None, :])
        & (col[None, :, None] >= col[None, None, :])
        & (segment[:, None, :] >= 0)
    )
    prompt = (torch.arange(width, device=segment.device)[None, None, :] < plen[:, None, None]).expand(-1, n, -1)
    key_pos = torch.cat([torch.arange(width, device=segment.device).expand(len(segment), -1), positions], dim=1)
    seen = torch.cat([prompt, own], dim=2)
    masks = {}
    for kind in set(getattr(config, "layer_types", None) or ["full_attention"]):
        m = seen
        if kind == "sliding_attention":
            m = m & (positions[:, :, None] - key_pos[:, None, :] < config.sliding_window)
        m = m[:, None]
        if config._attn_implementation != "sdpa":
            m = torch.zeros(m.shape, device=m.device).masked_fill(~m, torch.finfo(torch.float32).min)
        masks[kind] = m
    return masks if getattr(config, "layer_types", None) else masks["full_attention"]
