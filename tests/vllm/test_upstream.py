"""``Upstream``, the gateway's HTTP client to vLLM, against a real server on loopback (a
Starlette app under uvicorn): JSON both ways, statuses and bodies passed back as they are,
transport failures as ``BackendUnavailable``, idle connections reused and never past the
server's own keep-alive, and every wait counted as upstream time."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from servers import app_in_thread, free_port
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from agentclaims.errors import BackendUnavailable, UsageError
from agentclaims.protocol import timing
from agentclaims.vllm.upstream import Upstream


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

    app = Starlette(
        routes=[
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
