"""An OpenAI-compatible endpoint on a generator's engine, for agent programs that drive the model themselves
(``environment.name: agent``, ``grpo_ray.envs.agent``), recording each session token in, token out.

It listens on a Unix socket of the generator's (the agent processes reach it through a loopback port of their own:
``grpo_ray.envs.agent_child``) and answers ``POST /s/<session>/v1/chat/completions`` as OpenAI's chat completions do
(``choices[0].message.content``, ``finish_reason``, ``usage``; with ``stream: true`` as server-sent events of
``chat.completion.chunk``: the reply in one delta, then its finish_reason, then the usage where
``stream_options.include_usage`` asks, then ``[DONE]``, as verifiers' and other harnesses ask), the message (or the
first delta) carrying the token-level variant beside its text, as NeMo Gym's model server and verifiers' interception
server return it: ``prompt_token_ids``, ``generation_token_ids`` and ``generation_log_probs``. Sampling is the recipe's
(``generator.sampling``: temperature, top_p, top_k, and each call's tokens at most its max_tokens): the policy trained
is the policy sampled. A request's own ``max_tokens`` (or ``max_completion_tokens``) may only lower it; its other
sampling fields are ignored.

A session is one trajectory. Its first call's messages are templated as a row's prompt; each later call must be the
conversation so far (the messages of the call before and the reply as answered, text for text) and new messages
after it (a tool's output, the user's next turn): then its prompt is the ids so far, the engine's own for every
reply, and the new messages laid out by the chat template (each message's text tokenized with special tokens split,
so an output that prints ``<|im_end|>`` cannot close a message). So the trajectory trained is exactly what the engine
consumed and produced, the loss mask 1 on the replies. A call that does not extend the conversation (the program
rewrote or dropped a turn) is answered from its own messages and not recorded (``env/off_record_calls``). A
trajectory has at most environment.max_turns replies and environment.max_tokens tokens after its first prompt:
past either, a call answers nothing with finish_reason ``length`` (the episode ended by turns or tokens).

A vision-language model's calls may show pictures as OpenAI's content parts (``{"type": "image_url", "image_url":
{"url": "data:image/png;base64,..."}}`` beside ``{"type": "text", "text": ...}``): data URLs only (the endpoint
fetches nothing for a program). Each is the template's image marker where its part is, the engine reads every
picture of the conversation, and the trajectory keeps them (the first call's as the group's prompt's): the learner
reads them with the tokens the engine expanded them into, as an environment's pictures (``Step.images``).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import socketserver
import threading
import time
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

from grpo_ray.data import images
from grpo_ray.data.template import TemplateError
from grpo_ray.models import vision
from grpo_ray.rollouts.trajectory import turn_params, turn_seed


class Refused(ValueError):
    """A request the endpoint refuses (HTTP 400): what is wrong with it."""


TURN = "\u2063turn-7f3a\u2063"
CONTENT = "\u2063content-{}-7f3a\u2063"


@dataclass
class Session:
    """One agent trajectory as the endpoint has recorded it."""

    key: str
    loop: object
    """The engine loop its calls are sent to."""
    lora: object
    """A callable: the adapters a call is served with as it is sent."""
    sampling: object
    seed: int
    """Its group's seed (each call's: ``turn_seed`` of it, the session's sample and the call)."""
    budget: int
    messages: list[dict] = field(default_factory=list)
    """The conversation as last answered (its reply included)."""
    prompt: list[int] = field(default_factory=list)
    """The first call's prompt ids (the trajectory's prompt)."""
    opened: list[dict] = field(default_factory=list)
    """The first call's messages."""
    ids: list[int] = field(default_factory=list)
    """Tokens after the prompt: replies (mask 1) and the messages between them (mask 0)."""
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    """The replies and the messages between them, alternately, as text."""
    closed: bool = True
    """The last reply ended with the end-of-turn token."""
    calls: int = 0
    off_record: int = 0
    ended: str = ""
    """"turns" or "tokens" once environment.max_turns or max_tokens is spent."""
    cut: bool = False
    """Its last recorded reply was cut at its max_tokens (the trajectory's end is then a cut one)."""
    model_seconds: float = 0.0
    """The time its calls waited for the engine (the rest of its episode's time is the program's)."""
    images: list[bytes] = field(default_factory=list)
    """The pictures of its recorded conversation, in order (its first call's first: `given` of them)."""
    given: int = 0
    """Of `images`, the first call's (the group's prompt's, if its programs open alike)."""
    extra: int = 0
    """Tokens the engine's expansion of the later calls' pictures adds (counted against environment.max_tokens)."""
    turns_at: list[tuple[int, int, int]] = field(default_factory=list)
    """A vision-language model's: each reply's start in the engine's expanded tokens, its start in `ids`, its length
    (``Trajectory.turns_at``)."""
    context: list[int] | None = None
    """A vision-language model's: the engine's expanded tokens of its last recorded call's request."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    sent: Future | None = None
    """Its call in the engine (the last sent), for a hand-back to abort."""


def image_of(value) -> bytes:
    """The image file's bytes of an ``image_url`` part (``{"url": "data:image/...;base64,..."}``, or the URL alone);
    Refused saying why not."""
    url = value.get("url") if isinstance(value, dict) else value
    head, _, data = url.partition(",") if isinstance(url, str) else ("", "", "")
    if not (head.startswith("data:") and head.endswith(";base64")):
        raise Refused(
            "image_url: only data URLs are read (data:image/png;base64,...): the endpoint fetches nothing for a program"
        )
    try:
        found = base64.b64decode(data, validate=True)
        images.opened(found)
    except (binascii.Error, ValueError) as e:
        raise Refused(f"image_url: {e}") from None
    return found


def content_of(content) -> str | list:
    """A message's content as a session keeps it: its text, or, where it shows pictures, its pieces in order (text,
    and each picture's file bytes); Refused saying what is wrong with it."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise Refused("each message's 'content' must be text or a list of content parts (tool calls as text)")
    pieces = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            pieces.append(part["text"])
        elif kind == "image_url":
            pieces.append(image_of(part.get("image_url")))
        else:
            raise Refused(f"content part {k}: expected {{type: text, text}} or {{type: image_url, image_url: {{url}}}}")
    return pieces if any(isinstance(p, bytes) for p in pieces) else "".join(pieces)


def pictures(messages: list[dict]) -> list[bytes]:
    """The pictures `messages` show, in order."""
    return [p for m in messages if isinstance(m["content"], list) for p in m["content"] if isinstance(p, bytes)]


def text_of(content: str | list) -> str:
    """A message's text (its pictures aside)."""
    return content if isinstance(content, str) else "".join(p for p in content if isinstance(p, str))


def templated(messages: list[dict]) -> list[dict]:
    """`messages` as a chat template takes them: each picture an ``{"type": "image"}`` part."""
    part = lambda p: {"type": "image"} if isinstance(p, bytes) else {"type": "text", "text": p}  # noqa: E731
    return [m if isinstance(m["content"], str) else {**m, "content": list(map(part, m["content"]))} for m in messages]


def as_sent(messages: list[dict], shown: list[bytes]) -> list[dict]:
    """A prompt's messages with its pictures (`shown`, in the order of their ``{"type": "image"}`` parts) as a
    program sends them: ``image_url`` parts with data URLs (what an agent program is given of an image row)."""
    from PIL import Image

    left = iter(shown)

    def part(p: dict) -> dict:
        if p.get("type") != "image":
            return p
        data = next(left)
        kind = (Image.open(io.BytesIO(data)).format or "png").lower()
        return {
            "type": "image_url",
            "image_url": {"url": f"data:image/{kind};base64,{base64.b64encode(data).decode()}"},
        }

    return [m if isinstance(m["content"], str) else {**m, "content": list(map(part, m["content"]))} for m in messages]


def continuation(tokenizer, kwargs: dict, before: list[dict], new: list[dict], closed: bool, body=None) -> list[int]:
    """The ids after a reply (the last message of `before`, sampled: its own ids are not here) up to the next
    reply's generation prompt: the reply's closing (its end-of-turn token when the reply did not sample it), then
    `new` as the chat template lays them out, each message's content as `body(content)` gives its ids (its text
    with special tokens split, by default). TemplateError where the template is not append-only."""
    body = body or (lambda text: tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))

    def render(messages, generation):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation, **kwargs)

    head = [*templated(before[:-1]), {**before[-1], "content": TURN}]
    marked = [{**m, "content": CONTENT.format(i)} for i, m in enumerate(new)]
    a, b = render(head, False), render(head + marked, True)
    if not b.startswith(a):
        raise TemplateError("the chat template is not append-only: a message after the reply rewrites the reply")
    closing = a[a.index(TURN) + len(TURN) :]
    eos = tokenizer.eos_token or ""
    if eos and closing.startswith(eos):
        closing = closing[len(eos) :]
    text, ids = closing + b[len(a) :], [] if closed else [tokenizer.eos_token_id]
    for i, m in enumerate(new):
        piece, _, text = text.partition(CONTENT.format(i))
        ids += tokenizer.encode(piece, add_special_tokens=False)
        ids += body(m["content"])
    return ids + tokenizer.encode(text, add_special_tokens=False)


class Endpoint:
    """The endpoint of one generator: its sessions by key, served on a Unix socket at `path`."""

    def __init__(self, episodes, path: str):
        """`episodes`: the generator's ``Episodes``, whose tokenizer, recipe and vision-language facts it shares (its
        ``pieces(role)``: the layout of a call that adds one message without rendering the conversation again; its
        ``banned`` tokens, never sampled; its image ``marker``, ``most_images`` and ``expansion``)."""
        recipe, self.episodes = episodes.recipe, episodes
        self.tokenizer, self.env, self.path, self.pieces = episodes.tokenizer, recipe.environment, path, episodes.pieces
        self.banned, self.marker, self.most_images = episodes.banned, episodes.marker, episodes.most_images
        self.kwargs = recipe.model.chat_template_kwargs or {}
        self.sessions: dict[str, Session] = {}
        self.server = _Server(path, _Handler)
        self.server.endpoint = self
        threading.Thread(target=self.server.serve_forever, name="endpoint", daemon=True).start()

    def open(self, session: Session) -> None:
        self.sessions[session.key] = session

    def close(self, key: str) -> Session | None:
        """Session `key` ended: its program's next call is refused (404)."""
        return self.sessions.pop(key, None)

    def shutdown(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def chat(self, key: str, body: dict) -> dict:
        """The answer to one chat completion of session `key` (Refused: a request this endpoint refuses)."""
        s = self.sessions.get(key)
        if s is None:
            raise LookupError(f"no session {key!r} (its trajectory has ended)")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise Refused("messages: expected a non-empty list")
        if any(not isinstance(m, dict) or not isinstance(m.get("role"), str) for m in messages):
            raise Refused("each message needs a string 'role' and a 'content'")
        messages = [{"role": m["role"], "content": content_of(m.get("content"))} for m in messages]
        for m in messages:
            chars = len(text_of(m["content"]))
            if chars > self.env.max_observation_chars:
                raise Refused(f"a message of {chars} characters, over environment.max_observation_chars")
        shown = len(pictures(messages))
        if shown and not self.marker:
            raise Refused("the model reads no images (its chat template writes no image marker): send text alone")
        if shown > self.most_images:
            raise Refused(
                f"{shown} images in the conversation, over the {self.most_images} a request may carry "
                "(generator.vllm_kwargs.limit_mm_per_prompt)"
            )
        asked = body.get("max_completion_tokens") or body.get("max_tokens") or s.sampling.max_tokens
        if not isinstance(asked, int) or asked < 1:
            raise Refused(f"max_tokens={asked!r}: expected a positive integer")
        with s.lock:  # one call of a session at a time: each extends the one before
            return self._answer(s, messages, asked)

    def _answer(self, s: Session, messages: list[dict], asked: int) -> dict:
        seen = len(s.messages)
        extends = s.calls > 0 and messages[:seen] == s.messages and len(messages) > seen
        extends = extends and all(m["role"] != "assistant" for m in messages[seen:])
        shown, new, extra = pictures(messages), [], 0
        if s.calls == 0:
            prompt = self._template(messages)
            s.prompt, s.opened, s.images, s.given, record = prompt, messages, shown, len(shown), True
        elif extends and not s.ended:
            new = messages[seen:]
            if len(new) == 1:
                gap = self.pieces(new[0]["role"]).ids("", s.closed, self._body(new[0]["content"]))
            else:
                gap = continuation(self.tokenizer, self.kwargs, s.messages, new, s.closed, self._body)
            prompt, record, extra = s.prompt + s.ids + gap, True, self.episodes.expansion(pictures(new))
        else:  # answered as asked, not recorded: the trajectory is what the conversation was up to here
            prompt, record = self._template(messages), False
            s.off_record += not s.ended
        s.calls += 1
        room = s.budget - (len(prompt) - len(s.prompt)) - s.extra - extra if record else s.sampling.max_tokens
        limit = min(asked, s.sampling.max_tokens, room)
        if record and (limit <= 0 or s.calls > self.env.max_turns):
            s.ended = "tokens" if limit <= 0 else "turns"
            return self._response(prompt, [], [], "length")
        seed = turn_seed(s.seed, int(s.key.rpartition("/")[2]), s.calls)
        request = {"prompt_token_ids": prompt}
        if shown:  # every picture of the conversation (a recorded call's: its session's, in order)
            request["multi_modal_data"] = {"image": vision.decoded(shown)}
        params = turn_params(s.sampling, self.env.stop, limit, seed, self.banned)
        start = time.perf_counter()
        s.sent = s.loop.submit(request, params, s.lora(), f"{s.key}/{s.calls}")
        try:
            done = s.sent.result()
        except CancelledError:  # (``AgentRuns.start``: its group handed back)
            raise LookupError(f"session {s.key!r} was handed back: its engine's node goes") from None
        s.model_seconds += time.perf_counter() - start
        out = done.outputs[0]
        ids, logprobs = list(out.token_ids), [lp[t].logprob for t, lp in zip(out.token_ids, out.logprobs)]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if record:
            gap = prompt[len(s.prompt) + len(s.ids) :]
            if self.banned:  # where the engine's expanded tokens put the reply (``Trajectory.expanded``)
                s.turns_at.append((len(done.prompt_token_ids), len(s.ids) + len(gap), len(ids)))
                s.context = list(done.prompt_token_ids)
            if s.texts:
                s.texts.append("\n\n".join(text_of(m["content"]) for m in new))
            s.images, s.extra = s.images + pictures(new), s.extra + extra
            s.ids += gap + ids
            s.mask += [0] * len(gap) + [1] * len(ids)
            s.logprobs += [0.0] * len(gap) + logprobs
            labels = [int(span.version) for span in out.weight_versions or [] for _ in range(span.start, span.end)]
            s.versions += (s.versions[-1:] or labels[:1]) * len(gap) + labels
            s.texts.append(text)
            s.messages = [*messages, {"role": "assistant", "content": text}]
            s.closed = bool(ids) and ids[-1] == self.tokenizer.eos_token_id
            s.cut = out.finish_reason == "length"
        return self._response(prompt, ids, logprobs, out.finish_reason or "stop", text)

    def _template(self, messages: list[dict]) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            templated(messages), tokenize=False, add_generation_prompt=True, **self.kwargs
        )
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _body(self, content: str | list) -> list[int]:
        """A later call's message content as ids: its text with special tokens split, each picture the model's image
        marker (the engine expands it)."""
        ids = []
        for piece in [content] if isinstance(content, str) else content:
            text, split = (self.marker, False) if isinstance(piece, bytes) else (piece, True)
            ids += self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=split)
        return ids

    def _response(self, prompt: list[int], ids: list[int], logprobs: list[float], finish: str, text: str = "") -> dict:
        message = {
            "role": "assistant",
            "content": text,
            "prompt_token_ids": prompt,
            "generation_token_ids": ids,
            "generation_log_probs": logprobs,
        }
        return {
            "id": f"chatcmpl-{time.time_ns()}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": "policy",
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(ids),
                "total_tokens": len(prompt) + len(ids),
            },
        }


def chunks(answer: dict, usage: bool) -> list[dict]:
    """A chat completion as the ``chat.completion.chunk`` events of a stream: the whole reply as one delta (its
    token-level fields beside the text), then the finish_reason, then (`usage`) the usage with no choices."""
    choice = answer["choices"][0]
    head = {k: answer[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    events = [
        head | {"choices": [{"index": 0, "delta": choice["message"], "finish_reason": None, "logprobs": None}]},
        head | {"choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"], "logprobs": None}]},
    ]
    return events + [head | {"choices": [], "usage": answer["usage"]}] * usage


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    endpoint: Endpoint


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: an agent's client reuses its connection

    def do_POST(self) -> None:
        parts = self.path.split("/")  # /s/<key>/v1/chat/completions (a key may hold slashes)
        if len(parts) < 6 or parts[1] != "s" or "/".join(parts[-3:]) != "v1/chat/completions":
            return self._send(404, {"error": {"message": f"no such route {self.path} (POST .../v1/chat/completions)"}})
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            answer = self.server.endpoint.chat("/".join(parts[2:-3]), body)
        except LookupError as e:
            return self._send(404, {"error": {"message": str(e)}})
        except (Refused, TemplateError, json.JSONDecodeError) as e:
            return self._send(400, {"error": {"message": str(e)}})
        except Exception as e:  # the engine failed: the agent's call fails, said
            return self._send(500, {"error": {"message": f"{type(e).__name__}: {e}"}})
        if body.get("stream"):
            return self._stream(chunks(answer, bool((body.get("stream_options") or {}).get("include_usage"))))
        self._send(200, answer)

    def _stream(self, events: list[dict]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")  # the stream ends with the connection (no length, no chunking)
        self.end_headers()
        self.close_connection = True
        for event in events:
            self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def address_string(self) -> str:
        return "agent"

    def log_message(self, format, *args) -> None:  # noqa: A002
        pass
