"""``StreamingASGITransport``: an app in this process answers as it sends, a client that leaves
is heard by the app, and the app's errors reach the client. Real ASGI apps: hand-written ones
for the edges, the gateway app for a streamed completion."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx2
import pytest

from agentclaims.backends.asgi import StreamingASGITransport
from agentclaims.backends.embedded import EmbeddedBackend
from agentclaims.engine import ServiceTimes

BOUND_S = 10.0  # every wait is bounded: a transport that buffers fails here instead of hanging
STREAM = {"stream": True}  # what a request asking for a stream says


class _Paced:
    """Sends its first chunk, then its second only once the test says so."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.heard: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        assert (await receive())["type"] == "http.request"
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"first", "more_body": True})
        await self.go.wait()
        await send({"type": "http.response.body", "body": b"second", "more_body": False})


async def test_the_first_chunk_reaches_the_client_before_the_app_sends_the_second() -> None:
    """The app holds its second chunk until the client has read the first: a transport that
    waited for the whole body would never hand the first over."""
    app = _Paced()
    client = httpx2.AsyncClient(transport=StreamingASGITransport(app), base_url="http://app")
    async with (
        asyncio.timeout(BOUND_S),
        client,
        client.stream("POST", "/", json=STREAM) as response,
    ):
        chunks = response.aiter_bytes()
        first = await chunks.__anext__()
        app.go.set()
        rest = [chunk async for chunk in chunks]
    assert (first, rest) == (b"first", [b"second"])


async def test_a_client_that_leaves_the_stream_is_heard_as_a_disconnect() -> None:
    """Closing the stream after its first chunk: the app's next ``receive()`` is
    ``http.disconnect``, and the app ends."""
    heard: list[str] = []
    ended = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"x", "more_body": True})
        heard.append((await receive())["type"])
        ended.set()

    client = httpx2.AsyncClient(transport=StreamingASGITransport(app), base_url="http://app")
    async with client, client.stream("POST", "/", json=STREAM) as response:
        async for _ in response.aiter_bytes():
            break
    await asyncio.wait_for(ended.wait(), BOUND_S)
    assert heard == ["http.disconnect"]


async def test_a_request_that_asks_for_no_stream_runs_the_app_in_the_callers_task() -> None:
    """Without ``"stream": true`` the app runs to its end in the caller's own task, as
    ``httpx2.ASGITransport`` runs it (no task or queue of its own); with it, in a task of its
    own."""
    tasks: list[asyncio.Task[Any] | None] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        tasks.append(asyncio.current_task())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok", "more_body": False})

    client = httpx2.AsyncClient(transport=StreamingASGITransport(app), base_url="http://app")
    async with client:
        for body in ({"stream": False}, {"messages": []}, STREAM):
            assert (await client.post("/", json=body)).content == b"ok"
        assert (await client.post("/", content=b"stream")).content == b"ok"  # not JSON
    caller = asyncio.current_task()
    assert [task is caller for task in tasks] == [True, True, False, True]


async def test_the_apps_errors_reach_the_client() -> None:
    """An error before the response starts is raised by the request; one after it, by the
    stream, once the chunks sent before it are read."""

    async def before(scope: Any, receive: Any, send: Any) -> None:
        raise ValueError("no response")

    async def after(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})
        raise KeyError("mid-stream")

    async with httpx2.AsyncClient(
        transport=StreamingASGITransport(before), base_url="http://app"
    ) as c:
        with pytest.raises(ValueError, match="no response"):
            await c.post("/", json=STREAM)
    async with httpx2.AsyncClient(
        transport=StreamingASGITransport(after), base_url="http://app"
    ) as c:
        got: list[bytes] = []

        async def read() -> None:
            async with c.stream("POST", "/", json=STREAM) as response:
                async for chunk in response.aiter_bytes():
                    got.append(chunk)

        with pytest.raises(KeyError, match="mid-stream"):
            await read()
        assert got == [b"part"]


async def test_an_embedded_streamed_completion_arrives_token_by_token() -> None:
    """The embedded default's app streams a chat completion event by event (the reference
    engine holds the request for its whole decode, 0.2 s a token here, then the gateway
    writes the reply's chunks); with each write taking a while (10 ms, as a slow network
    would), the client reads the first content chunk while the app has not yet sent its last
    one, and the other tokens follow, each its own event."""
    backend = EmbeddedBackend(
        num_blocks=256,
        block_size=16,
        script=lambda request: "one two three four five six seven eight",
        service=ServiceTimes(prefill_s_per_token=0.0, decode_s_per_token=0.2),
    )
    finished = asyncio.Event()

    async def watched(scope: Any, receive: Any, send: Any) -> None:
        async def sending(message: Any) -> None:
            if message["type"] == "http.response.body":
                await asyncio.sleep(0.01)
                if not message.get("more_body"):
                    finished.set()
            await send(message)

        await backend.app(scope, receive, sending)

    client = httpx2.AsyncClient(transport=StreamingASGITransport(watched), base_url="http://e")
    body = {"model": "scripted", "messages": [{"role": "user", "content": "count"}], "stream": True}
    try:
        async with client, client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            lines = response.aiter_lines()
            first = None
            while first is None:
                line = await asyncio.wait_for(lines.__anext__(), BOUND_S)
                if line.startswith("data: {"):
                    first = json.loads(line[6:])["choices"][0]["delta"].get("content") or None
            assert not finished.is_set()  # the rest is still being decoded
            rest = [line async for line in lines if line.startswith("data: ")]
        assert finished.is_set()
        assert rest[-1] == "data: [DONE]"
        assert len(rest) > 3
    finally:
        await backend.aclose()
