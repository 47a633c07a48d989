"""The backends as a new user meets them: constructors given the wrong thing, gateways that
are down, stopping, slow, killed or not gateways at all. Every failure is one of the SDK's
typed errors, naming the argument or the backend (and the timeout that bounded a call); a pool
never moves a session to a member that does not answer.

Real parts only: `agentclaims serve` processes on loopback (stopped, or killed with SIGKILL, by
PID), a real `python -m http.server`, a socket that listens and never answers, the real OpenAI
client through a ``ClaimedSession``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from servers import free_port, start_gateway, stop

import agentclaims
from agentclaims.backends import EmbeddedBackend, FleetBackend, HTTPBackend
from agentclaims.backends.inprocess import InProcessGateway
from agentclaims.backends.pool import BackendPool
from agentclaims.engine import ReferenceKV
from agentclaims.errors import BackendError, BackendUnavailable, DeadlineExceeded, UsageError
from agentclaims.gateway import ScriptedModel
from agentclaims.session import ClaimedSession, ReactionPolicy


def usage_field(make: Any) -> str:
    """The field of the ``UsageError`` that ``make()`` raises (any other error fails)."""
    with pytest.raises(UsageError) as info:
        make()
    return info.value.field


# ---------------------------------------------------------------------- constructors
@pytest.mark.parametrize(
    "backends",
    [
        pytest.param([1, 2], id="ints"),
        pytest.param(None, id="none"),
        pytest.param("http://127.0.0.1:1", id="a-url"),
        pytest.param(HTTPBackend("http://127.0.0.1:1"), id="one-backend-not-a-list"),
        pytest.param([BackendPool([HTTPBackend("http://127.0.0.1:1")])], id="a-pool-in-a-pool"),
        pytest.param([FleetBackend("http://127.0.0.1:1")], id="a-fleet-in-a-pool"),
        pytest.param(
            [
                HTTPBackend("http://127.0.0.1:1", name="a"),
                HTTPBackend("http://127.0.0.1:1/v1", name="b"),
            ],
            id="one-gateway-twice",
        ),
    ],
)
def test_a_pool_of_what_is_not_backends_names_backends(backends: Any) -> None:
    """``BackendPool([1, 2])`` raised AttributeError, ``BackendPool(None)`` TypeError; a pool
    in a pool, and two members on one gateway (a reroute to the same engine), were taken."""
    assert usage_field(lambda: BackendPool(backends)) == "backends"


@pytest.mark.parametrize(
    "url",
    ["http://h:99999", "http://h:abc", "http://h h:1", "http://h:1/?x=1", "http://h:1/#top"],
)
def test_a_base_url_that_names_no_gateway_names_base_url(url: str) -> None:
    """A port out of range or not a number, whitespace, a query or fragment (to which ``/v1``
    was appended: ``http://h:1/?x=1/v1``) were taken, failing only at the first call."""
    assert usage_field(lambda: HTTPBackend(url)) == "base_url"
    assert usage_field(lambda: FleetBackend(url)) == "router_url"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"name": ""}, "name"),
        ({"name": 3}, "name"),
        ({"client": "not a client"}, "client"),
        ({"timeout_s": math.inf}, "timeout_s"),
        ({"connect_timeout_s": math.inf}, "connect_timeout_s"),
    ],
)
def test_http_backend_arguments_are_checked(kwargs: dict[str, Any], field: str) -> None:
    """An empty name fell back to the URL, a number became the name, a string was kept as
    the client, an infinite timeout left calls unbounded."""
    assert usage_field(lambda: HTTPBackend("http://127.0.0.1:1", **kwargs)) == field


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"router_url": "http://"}, "router_url"),
        ({"max_hops": "2"}, "max_hops"),
        ({"max_hops": 1.5}, "max_hops"),
        ({"api_key": 3}, "api_key"),
        ({"api_key": " "}, "api_key"),
        ({"timeout_s": math.inf}, "timeout_s"),
    ],
)
def test_fleet_backend_arguments_are_checked(kwargs: dict[str, Any], field: str) -> None:
    """A router URL without a host and a fractional hop bound were taken; ``max_hops='2'``
    raised TypeError; a bad key failed only at a session's first call."""
    args = {"router_url": "http://127.0.0.1:1", **kwargs}
    assert usage_field(lambda: FleetBackend(**args)) == field


def test_in_process_gateway_timeouts_and_upstream_are_checked() -> None:
    """``InProcessGateway(timeout_s=-1)`` was taken (a timeout httpx2 then uses as is);
    ``over_vllm(timeout_s='x')`` raised TypeError and ``over_vllm(5)`` AttributeError."""
    kv = ReferenceKV.create(8, 16)
    for bad in (-1, 0, math.nan, math.inf, "x"):
        make = lambda t=bad: InProcessGateway(kv, ScriptedModel(None), timeout_s=t)  # noqa: E731
        assert usage_field(make) == "timeout_s"
        over = lambda t=bad: InProcessGateway.over_vllm("http://127.0.0.1:1", "k", timeout_s=t)  # noqa: E731
        assert usage_field(over) == "timeout_s"
    assert usage_field(lambda: InProcessGateway.over_vllm(5, "k")) == "upstream"  # type: ignore[arg-type]


SHARED = httpx2.AsyncClient()  # the property builds backends on it: no client of their own


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    scheme=st.sampled_from(["http://", "https://", "ftp://", "", "http:/"]),
    host=st.sampled_from(["127.0.0.1", "gw", "[::1]", "", "h h", "h\t"]),
    port=st.one_of(st.none(), st.integers(-5, 70_000), st.sampled_from(["x", ""])),
    tail=st.sampled_from(["", "/", "/v1", "/v1/", "/?q=1", "#f", "/api"]),
)
def test_a_url_is_refused_with_usage_error_or_kept_usable(
    scheme: str, host: str, port: int | str | None, tail: str
) -> None:
    """Whatever the user types: ``UsageError('base_url')``, or a backend whose URL httpx2
    reaches (a host, a port in 1..65535) ending in ``/v1`` and nothing after it."""
    url = f"{scheme}{host}{'' if port is None else f':{port}'}{tail}"
    made: HTTPBackend | UsageError
    try:
        made = HTTPBackend(url, client=SHARED)
    except UsageError as exc:
        made = exc
    if isinstance(made, UsageError):
        assert made.field == "base_url"
        return
    backend = made
    parts = urlsplit(backend.base_url)
    assert parts.hostname
    assert parts.port is None or 1 <= parts.port <= 65535
    assert not parts.query
    assert not parts.fragment
    assert backend.base_url.endswith("/v1")
    assert httpx2.URL(backend.base_url).host


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10, 10), st.booleans())
)
def test_a_timeout_is_taken_iff_positive_and_finite(value: float) -> None:
    """The same rule on every backend that takes a timeout: a call is always bounded."""
    good = not isinstance(value, bool) and 0 < value < math.inf
    for make in (
        lambda: HTTPBackend("http://127.0.0.1:1", client=SHARED, timeout_s=value),
        lambda: HTTPBackend("http://127.0.0.1:1", client=SHARED, connect_timeout_s=value),
        lambda: FleetBackend("http://127.0.0.1:1", timeout_s=value),
    ):
        if good:
            make()
        else:
            assert usage_field(make).endswith("timeout_s")


# ---------------------------------------------------------------------- unhealthy, not gateways
@contextlib.contextmanager
def plain_http_server() -> Iterator[str]:
    """``python -m http.server`` on a free loopback port (not a gateway), stopped by PID."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=Path(__file__).parent,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:  # bounded: it answers anything (404 for /health) once it listens
            try:
                httpx2.get(url, timeout=0.5)
                break
            except httpx2.TransportError:
                assert time.monotonic() < deadline, "http.server did not come up"
                time.sleep(0.05)
        yield url
    finally:
        stop(proc)


async def test_a_server_that_is_no_gateway_is_unhealthy_and_named() -> None:
    """``health()`` raised BackendError on a plain HTTP server; every other call's error said
    only ``HTTP 404 without an agentclaims error body: None``: neither which backend nor
    which URL."""
    with plain_http_server() as url:
        async with HTTPBackend(url, name="plain") as backend:
            assert await backend.health() is False
            with pytest.raises(BackendError) as info:
                await backend.descriptor()
            assert not isinstance(info.value, BackendUnavailable)
            assert "'plain'" in str(info.value)
            assert f"{url}/v1/descriptor" in str(info.value)
            assert "HTTP 404" in str(info.value)


async def test_an_unhealthy_gateway_is_unhealthy_not_an_error() -> None:
    """The gateway app over a vLLM that is not there answers ``/health`` 503 ``unavailable``
    (docs/operations.md): ``health()`` raised BackendError instead of answering False."""
    backend = InProcessGateway.over_vllm(f"http://127.0.0.1:{free_port()}", "k", timeout_s=5)
    try:
        answer = await backend.http_client().get("/health")
        assert answer.status_code == 503
        assert answer.json()["status"] == "unavailable"
        assert await backend.health() is False
    finally:
        await backend.aclose()


async def test_a_timeout_names_the_setting_that_bounded_it() -> None:
    """A server that accepts and never answers: the error said ``ReadTimeout:`` and nothing
    more; it now names ``timeout_s`` and its value."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        async with HTTPBackend(url, timeout_s=0.2, connect_timeout_s=2) as backend:
            with pytest.raises(BackendUnavailable) as info:
                await backend.get_claim("c", "o")
            assert "timeout_s" in str(info.value)
            assert "0.2 s" in str(info.value)


async def test_a_closed_backend_answers_no_descriptor() -> None:
    """The descriptor, once read, was answered from memory after ``aclose()``; every call
    of a closed backend raises BackendUnavailable (docs/gateway.md), that one too."""
    proc, url = start_gateway("--blocks", "16")
    try:
        backend = HTTPBackend(url)
        assert (await backend.descriptor())["cache_identity"]
        await backend.aclose()
        await backend.aclose()
        with pytest.raises(BackendUnavailable, match="closed"):
            await backend.descriptor()
        with pytest.raises(BackendUnavailable, match="closed"):
            await backend.cache_identity()
    finally:
        stop(proc)


async def test_a_closed_fleet_raises_typed_errors_and_builds_no_client() -> None:
    """After ``aclose()`` a FleetBackend raised httpx2's RuntimeError ("the client has been
    closed") from every call, and ``assign`` built a new routed backend with a client of its
    own that nothing would close."""
    fleet = FleetBackend("http://127.0.0.1:1")
    await fleet.aclose()
    await fleet.aclose()
    assert await fleet.health() is False
    for call in (fleet.discover, lambda: fleet.events(0), fleet.descriptor):
        with pytest.raises(BackendUnavailable, match="closed"):
            await call()
    with pytest.raises(BackendUnavailable, match="closed"):
        fleet.assign("s")
    with pytest.raises(BackendUnavailable, match="closed"):
        fleet.http_client()
    fleet.release("s")  # nothing to end, and no task on a closed client


# ---------------------------------------------------------------------- a pool through a kill -9
def kill9(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


async def test_a_pool_with_a_killed_member_reads_the_others_and_never_moves_there() -> None:
    """After a ``kill -9`` of one member the pool's merged events and residency raised
    BackendUnavailable (one dead member stopped them all), and a reroute moved the session
    to the dead member. Now the living member answers, the dead one is no candidate (the
    reroute finds none), and only with every member down is the pool unavailable."""
    pa, ua = start_gateway("--blocks", "64")
    pb, ub = start_gateway("--blocks", "64")
    pool = BackendPool([HTTPBackend(ua, name="a"), HTTPBackend(ub, name="b")])
    try:
        hold_everything(ua)  # events on a
        assert pool.assign("s").name == "a"
        assert [b.name for b in await pool.candidates("s")] == ["b"]
        kill9(pb)
        page = await pool.events(0)
        assert "hold" in {e.claim_id for e in page.events}  # a's own
        assert await pool.residency(["p"]) == {"p": 0}
        assert await pool.candidates("s") == []
        assert await pool.candidates("s", ["p"]) == []
        assert await pool.reroute("s") is None
        assert pool.assign("s").name == "a"
        kill9(pa)
        with pytest.raises(BackendUnavailable, match=r"pool\(a,b\): no member answers"):
            await pool.events(0)
        with pytest.raises(BackendUnavailable):
            await pool.residency(["p"])
    finally:
        await pool.aclose()
        stop(pa)
        stop(pb)


def hold_everything(url: str) -> None:
    """Another owner's hard claim on 6 blocks of the gateway (all but 2 of an 8-block one), made
    through the real OpenAI client."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=10)
    claim = {"claim_id": "hold", "object_id": "@prompt", "protection_mode": "hard_protected"}
    ext = {"agentclaims": {"owner_scope": "other", "claims": [claim]}}
    answer = client.completions.create(model="m", prompt=list(range(5000, 5096)), extra_body=ext)
    assert answer.model_extra is not None
    assert answer.model_extra["agentclaims"]["decisions"][0]["decision"] == "accepted"
    client.close()


async def test_a_refused_session_is_not_rerouted_to_a_killed_member(tmp_path: Path) -> None:
    """``reaction='reroute'`` over a pool of two gateways: refused on the full one while the
    other is killed (``kill -9``), the session moved to the dead member and ended in
    BackendUnavailable. Now it defers, as the docs say a reroute does with no member to go
    to, and ends in DeadlineExceeded; its log has no reroute."""
    pa, ua = start_gateway("--blocks", "8")
    pb, ub = start_gateway("--blocks", "256")
    a, b = HTTPBackend(ua, name="a"), HTTPBackend(ub, name="b")
    pool = BackendPool([a, b])
    try:
        hold_everything(ua)
        kill9(pb)
        client = agentclaims.openai_client(a)
        policy = ReactionPolicy(on_refused="reroute", deadline_s=0.5, max_delay_s=0.1)
        with pytest.raises(DeadlineExceeded):
            async with ClaimedSession(
                pool, workflow_id="wf-dead", reaction=policy, log_dir=tmp_path
            ) as session:
                await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "w " * 40}]
                )
        lines = [json.loads(x) for x in (tmp_path / "wf-dead.jsonl").read_text().splitlines()]
        events = [line["event"] for line in lines]
        assert "reaction_reroute" not in events
        assert "reaction_defer" in events
        assert session.stats.reroutes == 0
        assert lines[-1]["event"] == "session_ended"
        assert lines[-1]["error"] == "DeadlineExceeded"
    finally:
        await pool.aclose()
        stop(pa)
        stop(pb)


async def test_a_refused_session_is_rerouted_to_the_living_member(tmp_path: Path) -> None:
    """The same refusal with both members up: rerouted to the other and served there, and
    the session's calls stay there (affinity)."""
    pa, ua = start_gateway("--blocks", "8")
    pb, ub = start_gateway("--blocks", "256")
    a, b = HTTPBackend(ua, name="a"), HTTPBackend(ub, name="b")
    pool = BackendPool([a, b])
    try:
        hold_everything(ua)
        client = agentclaims.openai_client(a)
        async with ClaimedSession(
            pool, workflow_id="wf-up", reaction="reroute", log_dir=tmp_path
        ) as session:
            for turn in range(2):
                await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": f"{turn} " + "w " * 40}]
                )
                assert session.backend.name == "b"
        assert session.stats.reroutes == 1
        lines = [json.loads(x) for x in (tmp_path / "wf-up.jsonl").read_text().splitlines()]
        [moved] = [line for line in lines if line["event"] == "reaction_reroute"]
        assert (moved["from_backend"], moved["to_backend"]) == ("a", "b")
        calls = [line["backend"] for line in lines if line["event"] == "llm_call"]
        assert calls == ["b", "b"]
    finally:
        await pool.aclose()
        stop(pa)
        stop(pb)


def test_an_embedded_member_still_joins_a_pool() -> None:
    """Members reached in-process (no URL of their own to share) are backends too."""
    pool = BackendPool([EmbeddedBackend(8, name="x"), EmbeddedBackend(8, name="y")])
    assert [b.name for b in pool.backends] == ["x", "y"]
