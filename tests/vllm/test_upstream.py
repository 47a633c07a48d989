"""``Upstream``, the gateway's HTTP client to vLLM, against a real server on loopback (a
Starlette app under uvicorn): JSON both ways, statuses and bodies passed back as they are,
transport failures as ``BackendUnavailable``, idle connections reused and never past the
server's own keep-alive, and every wait counted as upstream time."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from servers import app_in_thread, free_port
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from agentclaims import _json
from agentclaims.errors import BackendUnavailable, UsageError
from agentclaims.protocol import timing
from agentclaims.vllm.upstream import SseFramer, Upstream

_PIECES = {
    # one event cut in two, then the rest of it with two more, a comment and a payload that
    # is no JSON; then the end, and an event after it that is never read
    "batched": [
        b'data: {"i": 0',
        b'}\n\ndata: {"i": 1}\n\n: a comment\n\ndata: not json\n\ndata: {"i": 2}\r\n\r\n',
        b'data: [DONE]\n\ndata: {"i": 99}\n\n',
    ],
    "unterminated": [b'data: {"i": 5}\n\n', b'data: {"i": 6}'],  # closed without a newline
}


def _app() -> Starlette:
    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def echo(request: Request) -> Response:
        peer = request.client.port if request.client else None
        return JSONResponse({"got": await request.json(), "peer": peer})

    async def refuse(request: Request) -> Response:
        return JSONResponse({"error": {"message": "no such model"}}, status_code=404)

    async def text(request: Request) -> Response:
        return PlainTextResponse("Internal Server Error", status_code=500)

    async def slow(request: Request) -> Response:
        await asyncio.sleep(2.0)
        return JSONResponse({})

    async def held(request: Request) -> Response:
        state = request.app.state
        state.now += 1
        state.most = max(state.most, state.now)
        await asyncio.sleep(0.2)
        state.now -= 1
        return JSONResponse({"most": state.most})

    async def stream(request: Request) -> Response:
        async def pieces() -> Any:
            for piece in _PIECES[request.path_params["name"]]:
                yield piece
                await asyncio.sleep(0.1)  # each piece read on its own

        return StreamingResponse(pieces(), media_type="text/event-stream")

    app = Starlette(
        routes=[
            Route("/v1/stream/{name}", stream, methods=["POST"]),
            Route("/held", held),
            Route("/health", health),
            Route("/v1/echo", echo, methods=["POST"]),
            Route("/v1/refuse", refuse, methods=["POST"]),
            Route("/text", text),
            Route("/slow", slow),
        ]
    )
    app.state.now = app.state.most = 0
    return app


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with app_in_thread(_app()) as url:
        yield url


async def test_json_goes_both_ways_over_one_kept_connection(server: str) -> None:
    upstream = Upstream(server + "/v1/")  # a trailing /v1 names the same server
    try:
        assert upstream.base_url == server
        first = await upstream.post("/v1/echo", {"prompt": [1, 2, 3], "n": "é"})
        second = await upstream.post("/v1/echo", {"k": None})
    finally:
        await upstream.aclose()
    assert first[0] == 200
    assert first[1]["got"] == {"prompt": [1, 2, 3], "n": "é"}
    assert second[1]["got"] == {"k": None}
    assert first[1]["peer"] == second[1]["peer"], "the idle connection was not reused"


async def test_statuses_and_bodies_come_back_as_the_server_sent_them(server: str) -> None:
    upstream = Upstream(server)
    try:
        status, body = await upstream.post("/v1/refuse", {})
        assert (status, body) == (404, {"error": {"message": "no such model"}})
        status, body = await upstream.get("/text")  # not JSON: the text, as an error message
        assert (status, body) == (500, {"error": {"message": "Internal Server Error"}})
        status, text = await upstream.get_text("/health")
        assert (status, text) == (200, "ok")
    finally:
        await upstream.aclose()


async def test_a_server_not_listening_is_unavailable_naming_it() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    upstream = Upstream(url)
    try:
        with pytest.raises(BackendUnavailable, match=url):
            await upstream.post("/v1/completions", {"prompt": [1]})
    finally:
        await upstream.aclose()


async def test_a_wait_past_the_timeout_is_unavailable(server: str) -> None:
    upstream = Upstream(server, timeout_s=30)
    try:
        with pytest.raises(BackendUnavailable, match="unreachable"):
            await upstream.get("/slow", timeout_s=0.2)
        assert (await upstream.post("/v1/echo", {"after": 1}))[1]["got"] == {"after": 1}
    finally:
        await upstream.aclose()


async def test_a_connection_the_server_closed_while_idle_is_not_reused() -> None:
    """The server's keep-alive (1 s) is shorter than ours: the next request after it closed
    the idle connection goes out on a new one, and succeeds."""
    with app_in_thread(_app(), keep_alive_s=1) as url:
        upstream = Upstream(url)
        try:
            before = await upstream.post("/v1/echo", {"i": 0})
            await asyncio.sleep(1.5)
            after = await upstream.post("/v1/echo", {"i": 1})
        finally:
            await upstream.aclose()
    assert before[0] == after[0] == 200
    assert before[1]["peer"] != after[1]["peer"]


async def test_requests_past_the_connection_limit_wait_for_one() -> None:
    with app_in_thread(_app()) as url:
        upstream = Upstream(url, max_connections=2)
        try:
            answers = await asyncio.gather(*(upstream.get("/held") for _ in range(5)))
        finally:
            await upstream.aclose()
    assert all(status == 200 for status, _ in answers)
    assert max(body["most"] for _, body in answers) == 2


async def test_every_wait_counts_as_upstream_time(server: str) -> None:
    upstream = Upstream(server)
    try:
        waited = timing.track()
        await upstream.post("/v1/echo", {})
        once = waited[0]
        await upstream.get_text("/health")
    finally:
        await upstream.aclose()
    assert 0 < once < waited[0]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"base_url": "127.0.0.1:8000"}, "upstream"),
        ({"base_url": "ftp://h"}, "upstream"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"max_connections": 0}, "max_connections"),
        ({"max_connections": True}, "max_connections"),
    ],
)
def test_bad_arguments_are_refused_naming_them(change: dict[str, Any], field: str) -> None:
    with pytest.raises(UsageError, match=field):
        Upstream(**{"base_url": "http://127.0.0.1:8000", **change})


async def test_a_stream_comes_in_batches_of_the_events_that_came_together(server: str) -> None:
    upstream = Upstream(server)
    try:
        stream = await upstream.stream("/v1/stream/batched", {"stream": True})
        batched = [batch async for batch in stream.batches()]
        stream = await upstream.stream("/v1/stream/unterminated", {"stream": True})
        unterminated = [batch async for batch in stream.batches()]
    finally:
        await upstream.aclose()
    # the cut event waited for its end; the three that came together are one batch; nothing
    # after [DONE]
    assert batched == [[{"i": 0}, {"i": 1}, {"i": 2}]]
    assert unterminated == [[{"i": 5}], [{"i": 6}]]


_EVENT = st.dictionaries(
    st.sampled_from(["id", "i", "text"]), st.integers() | st.text(), max_size=3
)


@given(
    events=st.lists(_EVENT, max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=2_000), max_size=12),
    done=st.booleans(),
)
def test_the_framer_reads_the_same_events_however_the_bytes_are_cut(
    events: list[dict[str, Any]], cuts: list[int], done: bool
) -> None:
    whole = b"".join(b"data: " + _json.dumps(e) + b"\n\n" for e in events)
    whole += b'data: [DONE]\n\ndata: {"after": 1}\n\n' if done else b""
    bounds = sorted({0, len(whole), *(c for c in cuts if c < len(whole))})
    framer, got = SseFramer(), []
    for start, end in itertools.pairwise(bounds):
        got.extend(framer.feed(whole[start:end]))
    got.extend(framer.end())
    assert got == events
    assert framer.done is done
