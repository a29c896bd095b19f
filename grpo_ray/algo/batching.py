"""Turning rollouts into padded tensors, cutting a step's samples over a pool's actors, and sample indices
into mini / micro batches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from grpo_ray.types import Completion, Prompt, Rollout

if TYPE_CHECKING:  # torch is imported where tensors are made: a reward actor and the driver cut batches without it
    import torch

Span = tuple[int, int]
"""[start, end) of a rollout's completions."""


@dataclass
class Packed:
    """The same sequences packed: several to a row, each row of the longest one's length at most, so a forward
    spends little on padding. Positions restart at 0 with each sequence, and the model keeps each sequence's
    attention to itself (transformers: a block-diagonal causal mask from position_ids, with no attention_mask)."""

    input_ids: torch.Tensor
    """[R, C] sequences one after another in each row, then padding."""
    position_ids: torch.Tensor
    """[R, C] 0, 1, ... from each sequence's first token (a row's padding goes on counting from its last)."""
    index: torch.Tensor
    """[B, L-1] where next-token position t of sequence b lies in the packed rows' [R, C-1] positions, flattened;
    -1 past the sequence's end."""
    order: list[int]
    """The sequences in the order their tokens come in the rows, row after row (what a vision-language model's
    images follow: ``Sequences.order``)."""


@dataclass
class Shared:
    """The same sequences with each distinct prompt run once (model.shared_prompt): the prompts form a batch of
    their own, whose keys and values then serve every response to them; the responses are packed several to a
    row, a row holding responses to one prompt only and no longer than the longest response."""

    prompt_ids: torch.Tensor
    """[G, P] the distinct prompts, right-padded."""
    prompt_lengths: torch.Tensor
    """[G] their lengths."""
    input_ids: torch.Tensor
    """[R, C] responses one after another in each row, then padding."""
    row_prompt: torch.Tensor
    """[R] the prompt whose keys and values each row attends to."""
    segment: torch.Tensor
    """[R, C] which response of its row a position holds (0, 1, ...), -1 on padding."""
    position_ids: torch.Tensor
    """[R, C] each response's positions after its prompt (prompt length, +1, ...; padding goes on counting)."""
    first: torch.Tensor
    """[B, 2] each sequence's prompt and first response token: that token is predicted at the prompt's last
    position, in the prompts' batch."""
    index: torch.Tensor
    """[B, L-1] where next-token position t of sequence b lies: < B, the first response token of that sequence;
    else B + a position of the rows' [R, C-1] flattened; -1 off the response."""


@dataclass
class Sequences:
    """Prompt + response token sequences, right-padded; masks line up with next-token logprobs."""

    input_ids: torch.Tensor
    """[B, L] prompt then response, then padding."""
    attention_mask: torch.Tensor
    """[B, L] 1 on real tokens."""
    response_mask: torch.Tensor
    """[B, L-1] 1 where logprob position t predicts a response token (token t+1)."""
    packed: Packed | None = None
    """The forward's layout when packed (collate's `capacity`); values come back in the [B, L-1] layout above."""
    shared: Shared | None = None
    """The forward's layout with each prompt run once (collate's `shared`); values come back as above."""

    @property
    def order(self) -> list[int]:
        """The sequences in the order their tokens come in the forward's rows: a vision-language model takes their
        images' pixels in this order (its forward places them at the image tokens as it meets them). Not defined
        with shared prompts, where the prompts' batch holds each distinct prompt's tokens once."""
        if self.shared is not None:
            raise ValueError("shared prompts keep no per-sequence order of their prompts' tokens")
        return self.packed.order if self.packed is not None else list(range(len(self.input_ids)))


def samples(rollouts: list[Rollout], spans: list[Span] | None = None) -> list[tuple[Prompt, Completion]]:
    """(prompt, completion) of every completion, rollout after rollout; with `spans`, only those of each."""
    spans = spans or [(0, len(r.completions)) for r in rollouts]
    return [(r.prompts[c.prompt], c) for r, (a, b) in zip(rollouts, spans) for c in r.completions[a:b]]


def flatten(rollouts: list[Rollout], spans: list[Span] | None = None) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) of every completion (or of `spans`), rollout after rollout."""
    return [(p.ids, c.token_ids) for p, c in samples(rollouts, spans)]


@dataclass
class Samples:
    """A step's samples as the controller knows them (from the generators' small stats): enough to share
    the work out without fetching a rollout."""

    counts: list[int]
    """Completions of each rollout, in order."""
    costs: list[int]
    """Tokens (prompt + response) of each sample, in flat order."""

    @classmethod
    def of(cls, stats: list) -> Samples:
        """From the generators' RolloutStats."""
        return cls(
            [len(s.response_lengths) for s in stats],
            [p + r for s in stats for p, r in zip(s.prompt_lengths, s.response_lengths)],
        )

    @classmethod
    def of_rollouts(cls, rollouts: list[Rollout]) -> Samples:
        """From rollouts at hand (a replay)."""
        return cls([len(r.completions) for r in rollouts], [len(p) + len(q) for p, q in flatten(rollouts)])


def balanced_ranges(costs: list[float], parts: int) -> list[Span]:
    """[start, end) ranges cutting 0..len(costs) into `parts` contiguous shares of near-equal total cost, in
    order (so the shares' results, concatenated, are in sample order). Every share is non-empty when there are
    at least `parts` items; past the items, shares are empty."""
    total, out, start, acc = sum(costs), [], 0, 0.0
    for k in range(1, parts + 1):
        end = start
        target = total * k / parts
        left = max(0, min(parts - k, len(costs) - start - 1))  # leave an item to each later share, while any
        while end < len(costs) - left and (end == start or acc + costs[end] / 2 <= target):
            acc += costs[end]
            end += 1
        if k == parts:
            end = len(costs)
        out.append((start, end))
        start = end
    return out


def spans_of(counts: list[int], share: Span) -> list[tuple[int, int, int]]:
    """The (rollout index, start, end) pieces of a share of the flat sample order, for rollouts of `counts`
    completions each; rollouts the share does not touch are left out."""
    out, offset = [], 0
    for i, n in enumerate(counts):
        a, b = max(share[0], offset), min(share[1], offset + n)
        if a < b:
            out.append((i, a - offset, b - offset))
        offset += n
    return out


def collate(
    pairs: list[tuple[list[int], list[int]]], pad_id: int, capacity: int = 0, shared: bool = False
) -> Sequences:
    """The pairs right-padded to the longest; with `capacity` (tokens a row holds, at least the longest pair),
    packed too (``pack_rows``); with `shared`, laid out to run each distinct prompt once (``share_prompts``)."""
    import torch

    length = max(len(p) + len(r) for p, r in pairs)
    ids = torch.full((len(pairs), length), pad_id, dtype=torch.long)
    attn = torch.zeros((len(pairs), length), dtype=torch.long)
    resp = torch.zeros((len(pairs), length - 1), dtype=torch.float32)
    for i, (p, r) in enumerate(pairs):
        ids[i, : len(p) + len(r)] = torch.tensor(p + r, dtype=torch.long)
        attn[i, : len(p) + len(r)] = 1
        resp[i, len(p) - 1 : len(p) + len(r) - 1] = 1
    if shared:
        return Sequences(ids, attn, resp, shared=share_prompts(pairs, pad_id, length))
    if not capacity:
        return Sequences(ids, attn, resp)
    lengths = [len(p) + len(r) for p, r in pairs]
    rows = pack_rows(lengths, capacity)
    width = max(sum(lengths[i] for i in row) for row in rows)  # the fullest row: no column of padding only
    packed_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    positions = torch.zeros((len(rows), width), dtype=torch.long)
    index = torch.full((len(pairs), length - 1), -1, dtype=torch.long)
    for r, row in enumerate(rows):
        at = 0
        for i in row:
            n = lengths[i]
            packed_ids[r, at : at + n] = ids[i, :n]
            positions[r, at : at + n] = torch.arange(n)
            index[i, : n - 1] = r * (width - 1) + at + torch.arange(n - 1)
            at += n
        positions[r, at:] = torch.arange(n, n + width - at)
    return Sequences(ids, attn, resp, Packed(packed_ids, positions, index, [i for row in rows for i in row]))


def share_prompts(pairs: list[tuple[list[int], list[int]]], pad_id: int, length: int) -> Shared:
    """The ``Shared`` layout of `pairs` (padded to `length` tokens): distinct prompts in order of appearance; each
    one's responses packed first fit, longest first, into rows as long as the longest response."""
    import torch

    prompts: dict[tuple[int, ...], int] = {}
    of = [prompts.setdefault(tuple(p), len(prompts)) for p, _ in pairs]
    width = max([len(r) for _, r in pairs] + [1])
    rows: list[tuple[int, list[int]]] = []
    for g in range(len(prompts)):
        members = [i for i, (_, r) in enumerate(pairs) if of[i] == g and r]
        rows += [(g, [members[j] for j in row]) for row in pack_rows([len(pairs[i][1]) for i in members], width)]
    rows = rows or [(0, [])]  # no response at all: one row of padding keeps the forward's shapes
    prompt_ids = torch.full((len(prompts), max(map(len, prompts))), pad_id, dtype=torch.long)
    for g, p in enumerate(prompts):
        prompt_ids[g, : len(p)] = torch.tensor(p, dtype=torch.long)
    plen = [len(p) for p in prompts]
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    segment = torch.full((len(rows), width), -1, dtype=torch.long)
    positions = torch.zeros((len(rows), width), dtype=torch.long)
    index = torch.full((len(pairs), length - 1), -1, dtype=torch.long)
    first = torch.zeros((len(pairs), 2), dtype=torch.long)
    for k, (g, row) in enumerate(rows):
        at = 0
        for s, i in enumerate(row):
            p, r = pairs[i]
            n = len(r)
            ids[k, at : at + n] = torch.tensor(r, dtype=torch.long)
            segment[k, at : at + n] = s
            positions[k, at : at + n] = torch.arange(plen[g], plen[g] + n)
            first[i] = torch.tensor([g, r[0]])
            index[i, len(p) - 1] = i
            index[i, len(p) : len(p) + n - 1] = len(pairs) + k * (width - 1) + at + torch.arange(n - 1)
            at += n
        positions[k, at:] = torch.arange(width - at) + (positions[k, at - 1] + 1 if at else plen[g])
    return Shared(
        prompt_ids, torch.tensor(plen), ids, torch.tensor([g for g, _ in rows]), segment, positions, first, index
    )


def pack_rows(lengths: list[int], capacity: int) -> list[list[int]]:
    """Which sequences share a row: first fit, longest first (ties in order), no row over `capacity` tokens.
    Packing the sequences of any run of consecutive rows again gives those rows back, so a micro batch cut
    from a share's rows (``micro_batches``) packs into as many rows as it was cut with."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        r = next((r for r, free in enumerate(room) if lengths[i] <= free), None)
        if r is None:
            rows.append([])
            room.append(capacity)
            r = len(rows) - 1
        rows[r].append(i)
        room[r] -= lengths[i]
    return rows


def micro_batches(
    indices: list[int], pairs: list[tuple[list[int], list[int]]], size: int, packing: bool, shared: bool = False
) -> tuple[list[list[int]], int]:
    """`indices` cut into micro batches, and the row capacity to collate them with (0: not packed). Unpacked:
    `size` samples each, longest first (``by_length``). Packed: `size` rows each, a row as long as the longest
    sample of `indices`, so a micro batch never holds more tokens than unpacked, and often several times the
    samples. Shared prompts (`shared`, collated with ``share_prompts``): `indices` in order, as many as their
    layout fits in `size` x the longest sample's tokens, so a group stays together."""
    if shared:
        return shared_micro_batches(indices, pairs, size), 0
    if not packing:
        return chunks(by_length(indices, pairs), size), 0
    lengths = [len(pairs[i][0]) + len(pairs[i][1]) for i in indices]
    capacity = max(lengths, default=1)
    rows = [[indices[j] for j in row] for row in pack_rows(lengths, capacity)]
    return [[i for row in rows[k : k + size] for i in row] for k in range(0, len(rows), size)], capacity


def shared_micro_batches(indices: list[int], pairs: list[tuple[list[int], list[int]]], size: int) -> list[list[int]]:
    """``micro_batches`` with shared prompts: consecutive runs of `indices`, each as long as its layout (``Shared``:
    the prompts' batch and the response rows, padding included) stays within `size` x the longest sample's tokens,
    the bound a packed micro batch keeps."""
    budget = size * max((len(pairs[i][0]) + len(pairs[i][1]) for i in indices), default=1)
    micros: list[list[int]] = []
    count = SharedCount()
    for i in indices:
        if not micros or count.with_pair(pairs[i])[0] > budget:
            micros.append([])
            count = SharedCount()
        count.add(pairs[i])
        micros[-1].append(i)
    return micros


class SharedCount:
    """``shared_tokens`` of a growing run of pairs, each pair costing the packing of its own prompt's responses only
    (all of them when it widens the rows): a micro batch is cut in time linear in its pairs, not quadratic."""

    def __init__(self):
        self.groups: dict[tuple[int, ...], list[int]] = {}
        """Each distinct prompt's responses' lengths."""
        self.rows: dict[tuple[int, ...], int] = {}
        """Each prompt's rows at the current width."""
        self.longest_prompt, self.width, self.total_rows = 0, 1, 0

    def with_pair(self, pair: tuple[list[int], list[int]]) -> tuple[int, dict, int]:
        """The slots with `pair` added, and the rows and the width they would have (nothing is changed)."""
        prompt, response = pair
        key = tuple(prompt)
        width = max(self.width, len(response))
        lengths = self.groups.get(key, []) + [len(response)]
        if width != self.width:  # wider rows: every prompt's responses pack again
            rows = {k: _rows(v, width) for k, v in self.groups.items()}
            rows[key] = _rows(lengths, width)
        else:
            rows = {**self.rows, key: _rows(lengths, width)}
        prompts = len(self.groups) + (key not in self.groups)
        slots = prompts * max(self.longest_prompt, len(prompt)) + max(sum(rows.values()), 1) * width
        return slots, rows, width

    def add(self, pair: tuple[list[int], list[int]]) -> None:
        _, self.rows, self.width = self.with_pair(pair)
        self.groups.setdefault(tuple(pair[0]), []).append(len(pair[1]))
        self.longest_prompt = max(self.longest_prompt, len(pair[0]))


def _rows(lengths: list[int], width: int) -> int:
    """Rows of `width` that responses of `lengths` pack into (empty responses take none)."""
    return len(pack_rows([n for n in lengths if n], width))


@dataclass
class LayoutWork:
    """What the forwards over a step's samples hold in one layout (``layout_work``)."""

    slots: int
    """Token positions, padding included."""
    forwards: int
    """Model calls: one a micro batch, two with shared prompts (the prompts', then the response rows')."""


SHARED_SLOT_COST = 1.2
"""A token slot of the shared-prompt layout in slots of the packed one (its rows attend to their prompt's keys too)."""
FORWARD_COST = 112
"""A model call's fixed cost (kernel launches, per-layer work that does not grow with the tokens), in packed slots.
Both measured and fitted by benchmarks/layout_auto.py (results/layout-auto)."""


def layout_work(pairs: list[tuple[list[int], list[int]]], size: int, packing: bool) -> tuple[LayoutWork, LayoutWork]:
    """The forwards over `pairs` in micro batches of `size`, laid out packed (or padded, without `packing`) and with
    each prompt run once, as collate lays them out: what model.shared_prompt: auto weighs."""
    indices = list(range(len(pairs)))
    plain = LayoutWork(0, 0)
    micros, capacity = micro_batches(indices, pairs, size, packing)
    for micro in micros:
        lengths = [len(pairs[i][0]) + len(pairs[i][1]) for i in micro]
        if capacity:  # rows as wide as the fullest
            rows = pack_rows(lengths, capacity)
            plain.slots += len(rows) * max(sum(lengths[j] for j in row) for row in rows)
        else:
            plain.slots += len(micro) * max(lengths)
        plain.forwards += 1
    micros = shared_micro_batches(indices, pairs, size)
    shared = LayoutWork(sum(shared_tokens([pairs[i] for i in m]) for m in micros), 2 * len(micros))
    return plain, shared


def shared_pays(plain: LayoutWork, shared: LayoutWork) -> bool:
    """Whether the shared-prompt layout's forwards cost less than the `plain` layout's: slots, weighted by
    SHARED_SLOT_COST, plus FORWARD_COST a model call."""
    cost = SHARED_SLOT_COST * shared.slots + FORWARD_COST * shared.forwards
    return cost < plain.slots + FORWARD_COST * plain.forwards


def use_shared(setting: bool | str, pairs: list[tuple[list[int], list[int]]], size: int, packing: bool) -> bool:
    """model.shared_prompt for a step of `pairs`: true or false as set; ``auto``, the cheaper layout
    (``shared_pays``): shared prompts for groups of long prompts and short responses."""
    if setting != "auto":
        return bool(setting)
    return shared_pays(*layout_work(pairs, size, packing))


def forward_work(pairs: list[tuple[list[int], list[int]]], shared: bool) -> tuple[list[tuple[int, int]], int]:
    """The real tokens of one forward over `pairs` as (tokens, keys each attends to) rows, and the positions the LM
    head runs on, for its FLOPs (``perf.forward_flops``): each sequence whole, the head where a response token is
    predicted; with `shared`, each distinct prompt once (the head on its last position), then each response after
    its prompt (the head on all its positions but the last). Padding is not counted."""
    if not shared:
        return [(len(p) + len(r), len(p) + len(r)) for p, r in pairs], sum(len(r) for _, r in pairs)
    prompts = {tuple(p) for p, _ in pairs}
    rows = [(len(p), len(p)) for p in prompts] + [(len(r), len(p) + len(r)) for p, r in pairs]
    return rows, len(prompts) + sum(max(len(r) - 1, 0) for _, r in pairs)


def shared_tokens(pairs: list[tuple[list[int], list[int]]]) -> int:
    """Token slots of `pairs` in the ``Shared`` layout: distinct prompts x the longest prompt, plus response rows x
    the longest response."""
    prompts, longest, rows, width = shared_shape(pairs)
    return prompts * longest + rows * width


def shared_shape(pairs: list[tuple[list[int], list[int]]]) -> tuple[int, int, int, int]:
    """The ``Shared`` layout's sizes: distinct prompts, the longest prompt, response rows (at least one: a row of
    padding when no response has a token) and their width, the longest response."""
    prompts: dict[tuple[int, ...], list[int]] = {}
    for p, r in pairs:
        prompts.setdefault(tuple(p), []).append(len(r))
    width = max([len(r) for _, r in pairs] + [1])
    rows = sum(_rows(lengths, width) for lengths in prompts.values())
    return len(prompts), max(map(len, prompts)), max(rows, 1), width


def response_values(per_position: torch.Tensor, mask: torch.Tensor) -> list[list[float]]:
    """Per-sample lists of the values at response positions (e.g. logprobs of response tokens)."""
    return [row[m.bool()].tolist() for row, m in zip(per_position, mask)]


def place_values(values: list, mask: torch.Tensor) -> torch.Tensor:
    """Inverse of response_values: a tensor shaped like `mask` with each sample's values (a list of floats or
    a 1-D tensor per sample) at its response positions, on the mask's device."""
    import torch

    out = torch.zeros_like(mask, dtype=torch.float32)
    if values and isinstance(values[0], torch.Tensor):
        flat = torch.cat(values)
    else:
        flat = torch.tensor([v for row in values for v in row])
    out[mask.bool()] = flat.to(mask.device, torch.float32)
    return out


def placed(values, micro: list[int], mask: torch.Tensor) -> torch.Tensor | None:
    """The per-token values of the samples of `micro` (indices into `values`) laid on the response positions of
    `mask`, on its device; None for None."""
    return None if values is None else place_values([values[i] for i in micro], mask)


def chunks(indices: list[int], size: int) -> list[list[int]]:
    return [indices[i : i + size] for i in range(0, len(indices), size)]


def by_length(indices: list[int], pairs: list[tuple[list[int], list[int]]]) -> list[int]:
    """`indices` from the longest sample (prompt + response) to the shortest, ties in their order: micro batches
    cut from it in order pad each sample to a length near its own. The loss sums over tokens with a normaliser
    of the whole mini batch, so which micro batch a sample lands in does not change the gradient."""
    return sorted(indices, key=lambda i: -(len(pairs[i][0]) + len(pairs[i][1])))


def rank_slice(indices: list[int], rank: int, world_size: int) -> list[int]:
    """The contiguous share of `indices` that data-parallel rank `rank` takes: every index taken by one rank, the
    first ``len % world_size`` ranks one more than the others (the learners pair the collectives of ranks whose
    shares then cut into different micro batch counts)."""
    per, extra = divmod(len(indices), world_size)
    start = rank * per + min(rank, extra)
    return indices[start : start + per + (rank < extra)]
