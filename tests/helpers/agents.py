"""Agent programs for the endpoint's tests (environment.name: agent): each drives the model itself with the OpenAI
client, as an agent harness does, and returns its reward."""

import socket
import time

import openai


def chat(base_url, row, turns=3):
    """A tool-using loop: the row's messages, then each reply answered by a tool message, `turns` replies; the
    reward is the characters of the replies (0.01 each), so that trajectories differ. Each answer's token-level
    fields must agree with its text."""
    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
    messages, chars = list(row["messages"]), 0
    for k in range(turns):
        out = client.chat.completions.create(model="policy", messages=messages, max_tokens=6)
        reply = out.choices[0].message
        extra = reply.model_extra
        assert len(extra["generation_token_ids"]) == len(extra["generation_log_probs"]) == out.usage.completion_tokens
        chars += len(reply.content)
        messages += [{"role": "assistant", "content": reply.content}, {"role": "tool", "content": f"result {k}"}]
    return 0.01 * chars


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
