"""What a job's rows carry beyond the prompt, as token ids: an SFT row's target (``target_tokens``: the answer, or a
multi-turn trace with its mask) and a reward-model row's conversations (``rm_tokens``: a preference pair's two, or a
pointwise row's one and its label). A row without what its job needs is a DataError naming its file and row."""

from __future__ import annotations

from grpo_ray.data import DataError, conversation_text, dotted
from grpo_ray.data.template import trace_ids

RM_IDS = ("chosen_ids", "rejected_ids", "response_ids")
"""A reward-model row's rendered conversations: a preference pair's two, or a pointwise row's one."""


def rm_tokens(row: dict, recipe, tokenizer, where: str, pieces: dict | None = None) -> dict:
    """A reward-model row as the classifier reads it, each response after the prompt's messages in the model's chat
    template (``data.conversation_text``, as the reward-model pool renders rollouts): 'chosen_ids' and
    'rejected_ids' of a preference pair, or 'response_ids' and 'label' of a pointwise row (rm.label_key). A response
    is text, or messages whose last is the assistant's answer. DataError naming `where` when one is missing."""
    c = recipe.rm
    keys = (
        {"response_ids": "response_key"}
        if c.label_key
        else {"chosen_ids": "chosen_key", "rejected_ids": "rejected_key"}
    )
    out = {}
    for name, field in keys.items():
        key = getattr(c, field)
        value = dotted(row, key)
        if isinstance(value, list) and value and isinstance(value[-1], dict) and value[-1].get("role") == "assistant":
            value = value[-1].get("content")
        if not isinstance(value, str) or not value.strip():
            raise DataError(
                f"{where}: rm.{field}={key!r} holds {_shown(value)}; expected the response as text, or messages "
                "ending with the assistant's"
            )
        out[name] = tokenizer(conversation_text(tokenizer, row["prompt"], value), add_special_tokens=False)["input_ids"]
    if c.label_key:
        label = dotted(row, c.label_key)
        if isinstance(label, bool) or not isinstance(label, (int, float)) or not 0 <= label <= 1:
            raise DataError(
                f"{where}: rm.label_key={c.label_key!r} holds {_shown(label)}; expected a number from 0 (bad) to 1 "
                "(good)"
            )
        out["label"] = float(label)
    return out


def _shown(value) -> str:
    """A row's value in an error line: short."""
    return "nothing" if value is None else repr(value)[:60]


def target_tokens(row: dict, recipe, tokenizer, where: str, pieces: dict | None = None) -> dict:
    """The SFT target of `row` at sft.target_key: 'target_ids' (its text, then end of sequence), or for a list of
    messages (a multi-turn tool-use trace) the trajectory a rollout would make of it, with 'target_mask' (1 on the
    assistant's tokens: the observations are not trained on). DataError naming `where` when there is none."""
    key = recipe.sft.target_key
    value = dotted(row, key)
    if isinstance(value, list):
        try:
            ids, mask = trace_ids(tokenizer, value, recipe.model.chat_template_kwargs, pieces)
        except ValueError as e:
            raise DataError(f"{where}: sft.target_key={key!r} holds messages: {e}") from None
        return {"target_ids": ids, "target_mask": mask}
    target = target_text(row, key, recipe.data.response_prefix)
    if target is None:
        raise DataError(f"{where}: no text or messages at sft.target_key={key!r}")
    return {"target_ids": tokenizer(target, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]}


def target_text(row: dict, key: str, response_prefix: str = "") -> str | None:
    """The SFT target of `row` at dotted `key` (``extra_info.answer``) without the response prefix the prompt
    already ends with; None when missing or empty."""
    value = dotted(row, key)
    if not isinstance(value, str) or not value.strip():
        return None
    return value.removeprefix(response_prefix) if response_prefix else value
