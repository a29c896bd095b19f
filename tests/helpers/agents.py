"""Agent programs for the endpoint's tests (environment.name: agent): each drives the model itself with the OpenAI
client, as an agent harness does, and returns its reward."""

import socket
import time

import openai


def chat(base_url, row, turns=3):
    """A tool-using loop: the row's messages, then each reply answered by a tool message, `turns` replies (the second
    asked for as a stream, as verifiers' harnesses ask); the reward is the characters of the replies (0.01 each), so
    that trajectories differ. Each answer's token-level fields must agree with its text."""
    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
    messages, chars = list(row["messages"]), 0
    for k in range(turns):
        if k == 1:
            content, extra, usage = streamed(client, messages)
        else:
            out = client.chat.completions.create(model="policy", messages=messages, max_tokens=6)
            content, extra, usage = out.choices[0].message.content, out.choices[0].message.model_extra, out.usage
        assert len(extra["generation_token_ids"]) == len(extra["generation_log_probs"]) == usage.completion_tokens
        chars += len(content)
        messages += [{"role": "assistant", "content": content}, {"role": "tool", "content": f"result {k}"}]
    return 0.01 * chars


def streamed(client, messages):
    """One call as a stream: the reply's text, its token-level fields and the usage, from the chunks."""
    chunks = list(
        client.chat.completions.create(
            model="policy", messages=messages, max_tokens=6, stream=True, stream_options={"include_usage": True}
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert [c.choices[0].finish_reason is not None for c in chunks if c.choices] == [False, True]
    return "".join(d.content or "" for d in deltas), deltas[0].model_extra, chunks[-1].usage


async def rewrites(base_url, row):
    """An async program whose second call drops its first reply (a history rewrite): that call is answered, not
    recorded."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0)
    messages = list(row["messages"])
    first = await client.chat.completions.create(model="policy", messages=messages, max_tokens=4)
    await client.chat.completions.create(model="policy", messages=[*messages, {"role": "user", "content": "again"}])
    return float(len(first.choices[0].message.content) > 0)


def raises(base_url, row):
    openai.OpenAI(base_url=base_url, api_key="none").chat.completions.create(model="p", messages=row["messages"])
    raise ValueError("the harness broke")


def silent(base_url, row):
    return 1.0


def hangs(base_url, row):
    time.sleep(3600)


def reaches_out(base_url, row):
    """1.0 when nothing but the endpoint can be reached (another address, another loopback port)."""
    blocked = 0
    for address in (("1.1.1.1", 53), ("127.0.0.1", 9)):
        try:
            socket.create_connection(address, timeout=1).close()
        except OSError:
            blocked += 1
    openai.OpenAI(base_url=base_url, api_key="none").chat.completions.create(
        model="p", messages=row["messages"], max_tokens=2
    )
    return float(blocked == 2)


def pictured(base_url, row):
    """Sends the row's messages (an image row's picture as an image_url part, as given), then answers the reply with a
    picture of its own (random colours drawn from the reply) between two pieces of text; the reward is the second
    reply's length, odd or even. A picture at a web address is refused (the endpoint fetches nothing)."""
    import base64
    import io
    import random

    from PIL import Image

    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
    messages = list(row["messages"])
    try:
        far = {"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/red.png"}}
        client.chat.completions.create(model="p", messages=[{"role": "user", "content": [far]}], max_tokens=2)
        raise AssertionError("a picture at a web address was answered")
    except openai.BadRequestError as e:
        assert "only data URLs are read" in str(e), e
    reply = client.chat.completions.create(model="policy", messages=messages, max_tokens=6).choices[0].message.content
    g, out = random.Random(reply), io.BytesIO()
    Image.frombytes("RGB", (40, 30), bytes(g.randrange(256) for _ in range(40 * 30 * 3))).save(out, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()
    shown = [{"type": "text", "text": "And"}, {"type": "image_url", "image_url": {"url": url}}]
    messages += [
        {"role": "assistant", "content": reply},
        {"role": "user", "content": [*shown, {"type": "text", "text": " this?"}]},
    ]
    second = client.chat.completions.create(model="policy", messages=messages, max_tokens=6).choices[0].message
    return float(len(second.content) % 2)


def opens_apart(base_url, row):
    """Opens with the row's messages and a word of its own (a group's programs then open with different prompts: its
    trajectories end as errors, each given a turn from the row's prompt)."""
    import random

    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
    word = {"role": "user", "content": f"word {random.randrange(10**9)}"}
    client.chat.completions.create(model="policy", messages=[*row["messages"], word], max_tokens=4)
    return 1.0
