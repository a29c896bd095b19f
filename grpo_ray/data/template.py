"""An observation's tokens after a model turn, from the model's chat template, without re-tokenizing the turn.

A trajectory's ids are the prompt's, then each model turn's ids as the engine sampled them, then the tokens of
each observation as the chat template lays out a message of `role`: what closes the model's turn after its
end-of-turn token (Qwen's newline), the message's header, the observation's text, its footer and the next
assistant header. Those pieces are read once from the template by rendering a conversation with markers, and
the template must be append-only: rendering one message more only adds text at the end, and the assistant's
turn starts where the generation prompt ends. A template that rewrites earlier turns (one that drops past
reasoning, say) is refused with a clear message: its trained tokens could not be the sampled ones.

The observation's own text is tokenized with special tokens split, so a tool that prints ``<|im_end|>`` cannot
end a message or open one.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_ray.errors import UserError

TURN, OBSERVATION = "\u2063turn-7f3a\u2063", "\u2063observation-7f3a\u2063"
REASONING = "<think>\nreasoning\n</think>\n\n"
"""Opens the probe turn: a template that drops an earlier turn's reasoning shows it by rewriting the turn."""


class TemplateError(UserError):
    """A chat template that cannot lay out observations append-only."""


@dataclass
class Observations:
    """The template's pieces around an observation, as token ids."""

    eos_ids: frozenset[int]
    """Tokens that end a model turn."""
    before: list[int]
    """After a turn that ended with an end-of-turn token: the rest of its closing, then the message's header."""
    after: list[int]
    """The message's footer and the next assistant header (the generation prompt)."""
    tokenizer: object

    @classmethod
    def of(cls, tokenizer, role: str, template_kwargs: dict | None = None) -> Observations:
        """Read from `tokenizer`'s chat template; TemplateError when it is not append-only or refuses `role`."""
        kw = template_kwargs or {}

        def render(messages, generation):
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation, **kw)

        user = [{"role": "user", "content": "question"}]
        turn = user + [{"role": "assistant", "content": REASONING + TURN}]
        try:
            prompt, turned = render(user, True), render(turn, False)
            observed = render(turn + [{"role": role, "content": OBSERVATION}], True)
        except Exception as e:
            raise TemplateError(
                f"environment.role={role}: the chat template refuses a {role} message after the assistant's "
                f"({type(e).__name__}: {str(e)[:200]}); set environment.role to a role it takes (user)"
            ) from None
        if not turned.startswith(prompt) or not turned[len(prompt) :].startswith(REASONING + TURN):
            raise TemplateError(
                "the chat template is not append-only: the assistant's turn does not start where the generation "
                "prompt ends, so the trained tokens could not be the sampled ones; set model.chat_template to one "
                "that is"
            )
        if not observed.startswith(turned):
            raise TemplateError(
                f"the chat template is not append-only: a {role} message after the assistant's turn rewrites the "
                "turn (e.g. it drops past reasoning), so the trained tokens could not be the sampled ones; set "
                "model.chat_template to one that only appends"
            )
        closing = turned[turned.index(TURN) + len(TURN) :]
        eos = tokenizer.eos_token or ""
        if eos and closing.startswith(eos):
            closing = closing[len(eos) :]  # the model sampled its end-of-turn token itself
        head, _, foot = observed[len(turned) :].partition(OBSERVATION)
        encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
        eos_ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        return cls(frozenset(eos_ids), encode(closing + head), encode(foot), tokenizer)

    def ids(self, observation: str, ended: bool = True, head: list[int] = ()) -> list[int]:
        """The tokens that follow a model turn: its end-of-turn token unless it `ended` with it (a turn cut by a stop
        string did not), closing, header, the `head` tokens (an image marker for each image the observation shows),
        the observation (special tokens split), footer, the next assistant header."""
        text = self.tokenizer.encode(observation, add_special_tokens=False, split_special_tokens=True)
        return ([] if ended else [self.tokenizer.eos_token_id]) + self.before + list(head) + text + self.after


def trace_ids(
    tokenizer, messages: list, template_kwargs: dict | None = None, pieces: dict[str, Observations] | None = None
) -> tuple[list[int], list[int]]:
    """A multi-turn SFT target (a tool-use trace, as verl's multi-turn SFT data holds it: the messages after the
    prompt, ``[{"role": "assistant", "content": ...}, {"role": "tool", ...}, ..., {"role": "assistant", ...}]``) as
    a rollout lays it out: each assistant turn's text and its end-of-turn token, each other message as an
    observation of its role. Returns (ids, loss mask): 1 on the assistant's tokens, 0 on the observations'.
    `pieces` keeps each role's ``Observations`` across calls (the template is read once per role, not per row).
    ValueError saying what is wrong with the messages' shape."""
    if not messages or any(not isinstance(m, dict) or not isinstance(m.get("content"), str) for m in messages):
        raise ValueError("expected a list of messages, each {role, content} with text content")
    if messages[0].get("role") != "assistant" or messages[-1].get("role") != "assistant":
        raise ValueError("the first and the last message must be the assistant's")
    pieces = {} if pieces is None else pieces
    ids, mask = [], []
    for m in messages:
        role = str(m.get("role"))
        if role == "assistant":
            seen = tokenizer.encode(m["content"], add_special_tokens=False) + [tokenizer.eos_token_id]
        else:
            if role not in pieces:
                pieces[role] = Observations.of(tokenizer, role, template_kwargs)
            seen = pieces[role].ids(m["content"], ended=True)
        ids += seen
        mask += [int(role == "assistant")] * len(seen)
    return ids, mask
