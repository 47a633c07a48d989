"""Streamed completions (server-sent events, as the OpenAI API), in-process and from a real
`agentclaims serve` process on loopback; refusals stay HTTP errors; the OpenAI SDK reads them."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx2
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st
from servers import gateway_process

import agentclaims
from agentclaims.backends.embedded import EmbeddedBackend
from agentclaims.errors import ClaimRefused
from agentclaims.gateway.streaming import DONE, FLUSH, ChunkStream, chunks_of, event, joined
from agentclaims.gateway.text import Reply

SCRIPT = {"agent": [Reply.tool("search", {"q": "kv"}), "three papers on it"]}
CHAT = {"model": "scripted", "messages": [{"role": "user", "content": "find the papers"}]}


def events(raw: bytes) -> list[Any]:
    """The ``data:`` payloads of a server-sent event stream, ``[DONE]`` as a string."""
    out: list[Any] = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        payload = block[len("data: ") :]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


async def _post(client: httpx2.AsyncClient, path: str, body: dict[str, Any]) -> httpx2.Response:
    return await client.post(path, json=body)


@pytest.fixture
async def client():
    backend = EmbeddedBackend(num_blocks=256, block_size=4, script=SCRIPT)
    yield backend.http_client()
    await backend.aclose()


async def test_chat_stream_matches_the_json_answer(client):
    body = {**CHAT, "agentclaims": {"node": "other", "session_id": "s-1"}}
    plain = (await _post(client, "/v1/chat/completions", body)).json()
    streamed = await _post(
        client,
        "/v1/chat/completions",
        {**body, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert streamed.status_code == 200
    assert streamed.headers["content-type"].startswith("text/event-stream")
    chunks = events(streamed.content)
    assert chunks[-1] == "[DONE]"
    data = chunks[:-1]
    assert {c["object"] for c in data} == {"chat.completion.chunk"}
    assert data[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in data if c["choices"])
    assert text == plain["choices"][0]["message"]["content"]
    assert len([c for c in data if c["choices"] and c["choices"][0]["delta"].get("content")]) > 1
    assert all(c["usage"] is None for c in data[:-1])
    last = data[-1]
    assert last["choices"] == []
    assert last["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"]
    ext = last["agentclaims"]
    assert ext["prefix_ids"]["prompt"] == plain["agentclaims"]["prefix_ids"]["prompt"]
    assert ext["usage"] == last["usage"]
    assert ext["outcome"]["served"] is True


async def test_chat_stream_of_tool_calls_without_usage(client):
    body = {**CHAT, "stream": True, "agentclaims": {"node": "agent"}}
    chunks = events((await _post(client, "/v1/chat/completions", body)).content)[:-1]
    calls = [
        call
        for c in chunks
        for call in (c["choices"][0]["delta"].get("tool_calls") or ())
        if c["choices"]
    ]
    assert calls[0]["function"]["name"] == "search"
    assert calls[0]["id"].startswith("call_")
    assert json.loads("".join(c["function"]["arguments"] for c in calls)) == {"q": "kv"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert all("usage" not in c for c in chunks)  # not asked for
    assert chunks[-1]["agentclaims"]["usage"]["prompt_tokens"] > 0  # the transport's copy


async def test_text_completion_stream(client):
    plain = (await _post(client, "/v1/completions", {"prompt": "the quick brown fox"})).json()
    raw = await _post(client, "/v1/completions", {"prompt": "the quick brown fox", "stream": True})
    chunks = events(raw.content)[:-1]
    assert {c["object"] for c in chunks} == {"text_completion"}
    assert "".join(c["choices"][0]["text"] for c in chunks) == plain["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_a_refused_stream_is_an_http_error_and_the_sdk_error_has_the_detail():
    backend = EmbeddedBackend(num_blocks=8, block_size=4)
    try:
        big = {"model": "scripted", "prompt": list(range(64)), "stream": True}
        raw = await _post(backend.http_client(), "/v1/completions", big)
        assert raw.status_code == 409
        assert raw.json()["error"]["type"] == "active_request_refused"
        client = agentclaims.openai_client(backend)
        with pytest.raises(ClaimRefused, match=r"short by \d+ blocks") as caught:
            await client.completions.create(model="scripted", prompt=list(range(64)))
        assert caught.value.outcome is not None
    finally:
        await backend.aclose()


def test_a_real_gateway_process_streams_to_the_openai_sdk():
    with gateway_process("--blocks", "256", "--block-size", "4") as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        stream = client.chat.completions.create(
            **CHAT, stream=True, stream_options={"include_usage": True}
        )
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "echo: find the papers"
        assert chunks[-1].usage is not None
        assert chunks[-1].usage.prompt_tokens > 0
        client.close()


async def _pieces(stream: Any) -> list[bytes]:
    return [piece async for piece in stream]


async def _batches(batches: list[list[dict[str, Any]]]) -> Any:
    for batch in batches:
        yield batch


async def test_a_chunk_stream_writes_the_chunks_that_came_together_in_one_piece() -> None:
    """What came from the engine together goes on in one write; an API writing its own events
    of the chunks (``/v1/messages``, ``/v1/responses``) reads them as objects, batch by batch,
    and writes its events of a batch in one piece too."""
    a, b, c = {"i": 0}, {"i": 1}, {"i": 2}
    written = await _pieces(ChunkStream(_batches([[a, b], [c]])).body_iterator)
    assert written == [event(a) + event(b), event(c), DONE]
    read = [x async for x in chunks_of(ChunkStream(_batches([[a, b], [c]])))]
    assert read == [a, b, None, c, None]

    async def translated() -> Any:  # an API's events: two of each chunk, flushed per batch
        async for chunk in chunks_of(ChunkStream(_batches([[a, b], [c]]))):
            if chunk is None:
                yield FLUSH
                continue
            yield b"<%d>" % chunk["i"]
            yield b"</%d>" % chunk["i"]
        yield b"<end/>"

    assert await _pieces(joined(translated())) == [b"<0></0><1></1>", b"<2></2>", b"<end/>"]


@given(st.lists(st.binary(max_size=4), max_size=12))
def test_joined_writes_every_piece_in_order_and_no_empty_write(pieces: list[bytes]) -> None:
    async def source() -> Any:
        for piece in pieces:
            yield piece

    written = asyncio.run(_pieces(joined(source())))
    assert b"".join(written) == b"".join(pieces)
    assert all(written)
    assert len(written) <= pieces.count(FLUSH) + 1
