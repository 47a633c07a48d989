"""Claims that cost vLLM nothing of their own, on the real server: a claim rides on the call
that leaves its prefix cached, releases ride on the next request the gateway sends (or go on
their own after the ride bound), and what cannot wait (a renewal, the answer of a streamed
request, a probe) takes the connector's channel, a local socket, never an engine request."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from agentclaims_vllm.channel import call
from agentclaims_vllm.signing import sign
from conftest import ALWAYS_HELD, VllmServer, serve_vllm
from servers import gateway_process, start_gateway, stop

from agentclaims.backends import HTTPBackend
from agentclaims.protocol import collect_events

pytestmark = pytest.mark.vllm


def _args(server: VllmServer, *more: str) -> tuple[str, ...]:
    return (
        "--kv",
        "vllm",
        "--upstream",
        server.url,
        "--claims-key",
        server.key,
        "--kv-events",
        server.events,
        *more,
    )


@pytest.fixture(scope="module")
def gateway(vllm_server: VllmServer) -> Iterator[str]:
    with gateway_process(*_args(vllm_server)) as url:
        yield url


def chat(content: str, max_tokens: int = 4, **agentclaims: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    if agentclaims:
        body["agentclaims"] = agentclaims
    return body


def words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def sequence_claim(claim_id: str, mode: str = "hard_protected") -> dict[str, Any]:
    return {"claim_id": claim_id, "object_id": "@sequence", "protection_mode": mode, "ttl_s": 60}


async def _stats(http: httpx2.AsyncClient) -> dict[str, Any]:
    stats: dict[str, Any] = (await http.get("/v1/stats")).json()
    return stats


async def test_the_connector_names_its_channel_and_operations_take_it(
    vllm_server: VllmServer,
) -> None:
    """The connector's answers name its channel; ``operate`` (a release between turns) goes
    there, not as an engine request, and its answer carries the release's event. A forged or
    replayed envelope on the channel is refused, as on a request."""
    from agentclaims.vllm import ConnectorClient

    client = ConnectorClient(vllm_server.url, vllm_server.key, model=vllm_server.model)
    try:
        first = await client.complete([1], max_tokens=1)
        client.skip_events(first.last_seq)
        assert client.channel is not None
        prompt = [5 + i % 900 for i in range(3 * 32 + 5)]
        hold = {"op": "hold", "claim_id": "ch-1", "mode": "hard_protected", "ttl_s": 60}
        held = await client.complete(prompt, [hold])
        assert held.result_of("ch-1")["decision"] == "accepted"
        requests = client.requests
        answer = await client.operate([{"op": "release", "claim_id": "ch-1"}])
        assert client.requests == requests  # no engine request
        assert client.channel_ops >= 1
        assert answer.results[0]["ok"] is True
        assert [e["event"] for e in answer.events if e.get("claim_id") == "ch-1"][-1] == (
            "resident_claim_expired"
        )
        # the channel authenticates as the requests do
        forged = call(client.channel, {"v": 1, "nonce": "n-forged", "ops": [], "sig": "0" * 64})
        assert forged["ok"] is False
        assert "unsigned or forged" in forged["reason"]
        envelope = sign({"v": 1, "tenant": "t", "nonce": "n-once", "since": 0, "ops": []}, "k")
        assert call(client.channel, envelope)["ok"] is False  # another key
        good = client.envelope([])
        assert call(client.channel, good)["ok"] is True
        replayed = call(client.channel, good)
        assert replayed == {**replayed, "ok": False, "reason": "replayed nonce"}
    finally:
        await client.operate([{"op": "revoke_all", "reason": "test_end"}])
        await client.aclose()


async def test_a_claim_rides_on_its_call_and_its_release_on_the_next(gateway: str) -> None:
    """A ``@sequence`` claim sent with a chat completion and a release named with the next
    one: both ride on the calls (no ``/tokenize``, no engine request of the gateway's own),
    the claim is held, the release ends it with its event, and the answer says so."""
    async with httpx2.AsyncClient(base_url=gateway, timeout=60) as http:
        await http.post("/v1/chat/completions", json=chat("warm"))
        before = await _stats(http)
        first = (
            await http.post(
                "/v1/chat/completions",
                json=chat(words("ride", 40), owner_scope="wf-ride", claims=[sequence_claim("r-1")]),
            )
        ).json()
        [decision] = first["agentclaims"]["decisions"]
        assert decision["decision"] == "accepted", decision
        view = (await http.get("/v1/claims/r-1", params={"owner_scope": "wf-ride"})).json()
        assert view["state"] in ("accepted", "materialized")
        second = (
            await http.post(
                "/v1/chat/completions",
                json=chat(words("ride", 41), owner_scope="wf-ride", release=["r-1", "never"]),
            )
        ).json()
        assert second["agentclaims"]["released"] == [
            {"claim_id": "r-1", "state": "expired"},
            {"claim_id": "never", "state": "unknown"},  # held nowhere here: not an error
        ]
        after = await _stats(http)
        assert after["engine_requests"]["operation"] == before["engine_requests"]["operation"]
        assert after["engine_requests"]["completion"] == before["engine_requests"]["completion"] + 2
        assert after["claim_operations"]["rode"] >= before["claim_operations"]["rode"] + 1
        bad = await http.post(
            "/v1/chat/completions", json=chat("x", owner_scope="wf-ride", release=["a", "a"])
        )
        assert bad.status_code == 400
        assert "agentclaims.release" in bad.text
    async with HTTPBackend(gateway) as backend:
        names = [e.event.value for e in await collect_events(backend, id_prefix="r-1")]
    assert names[0] == "resident_claim_accepted"
    assert names[-1] == "resident_claim_expired"


async def test_a_release_with_nothing_to_ride_on_goes_on_its_own_after_the_bound(
    gateway: str,
) -> None:
    """A release through the claims API on an idle server: answered at once (the claim has
    ended for its owner), handed back over the channel once the ride bound passes with no
    request going to vLLM, its event in the stream; no engine request of its own."""
    async with httpx2.AsyncClient(base_url=gateway, timeout=60) as http:
        body = chat(words("idle", 40), owner_scope="wf-idle", claims=[sequence_claim("i-1")])
        answer = (await http.post("/v1/chat/completions", json=body)).json()
        assert answer["agentclaims"]["decisions"][0]["decision"] == "accepted"
        before = await _stats(http)
        released = (
            await http.post("/v1/claims/i-1/release", json={"owner_scope": "wf-idle"})
        ).json()
        assert released["state"] == "expired"
        deadline = time.monotonic() + 10
        while True:
            stats = await _stats(http)
            if stats["claim_operations"]["standalone"] > before["claim_operations"]["standalone"]:
                break
            assert time.monotonic() < deadline, stats
            await asyncio.sleep(0.05)
        assert stats["engine_requests"]["operation"] == before["engine_requests"]["operation"]
        waited = stats["claim_operation_wait_s"]
        assert waited["max"] >= 0.9 * waited["bound"]  # (the event loop's timer resolution)
        async with HTTPBackend(gateway) as backend:
            events = await collect_events(backend, id_prefix="i-1")
        [ended] = [e for e in events if e.event.value == "resident_claim_expired"]
        assert ended.data["reason"] == "released"


async def test_a_streamed_call_carries_its_claim_and_still_streams(gateway: str) -> None:
    """``stream: true`` with a claim: vLLM's tokens pass on as they come, and the last chunk
    carries the claim's decision, read over the connector's channel; the hold is real."""
    body = {
        **chat(
            words("stri", 40), max_tokens=8, owner_scope="wf-sc", claims=[sequence_claim("s-1")]
        ),
        "stream": True,
    }
    async with httpx2.AsyncClient(timeout=60) as http:
        assert (await http.get(f"{gateway}/v1/descriptor")).json()["connector_channel"] is True
        chunks = []
        async with http.stream("POST", f"{gateway}/v1/chat/completions", json=body) as r:
            assert r.status_code == 200, await r.aread()
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[len("data: ") :]))
        tokens = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
        assert len(tokens) >= 4  # streamed, not one burst
        ext = chunks[-1]["agentclaims"]
        [decision] = ext["decisions"]
        assert decision["claim_id"] == "s-1"
        assert decision["decision"] == "accepted", decision
        view = (await http.get(f"{gateway}/v1/claims/s-1", params={"owner_scope": "wf-sc"})).json()
        assert view["state"] in ("accepted", "materialized")
        assert view["object_id"] == ext["prefix_ids"]["sequence"]
        await http.post(f"{gateway}/v1/claims/s-1/release", json={"owner_scope": "wf-sc"})


async def test_a_langgraph_agent_loop_costs_one_engine_request_per_llm_call(
    gateway: str, tmp_path: Any
) -> None:
    """A real LangGraph graph (an agent node, then a plain async node that does I/O, then the
    agent again) streamed through the SDK on the vLLM gateway: every call carries its claim,
    the superseded one rides away with the next call, the session's end releases the last;
    the gateway sends vLLM exactly one request per LLM call, and the tokens still stream."""
    from langchain_core.messages import AIMessageChunk, HumanMessage
    from langgraph.graph import END, START, MessagesState, StateGraph

    import agentclaims

    backend = HTTPBackend(gateway, timeout_s=120)
    served = await agentclaims.openai_client(backend).models.list()
    model = agentclaims.chat_model(
        backend, model=served.data[0].id, max_tokens=8, temperature=0, streaming=True
    )

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    async def fetch(state: MessagesState) -> dict[str, Any]:
        await asyncio.sleep(0.2)  # I/O in an ordinary node, not a LangChain tool
        return {"messages": [HumanMessage(words("fetched", 3))]}

    def route(state: dict[str, Any]) -> str:  # (a name LangGraph can resolve at run time)
        return "fetch" if len(state["messages"]) < 6 else END

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("fetch", fetch)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["fetch", END])
    builder.add_edge("fetch", "agent")
    async with httpx2.AsyncClient(base_url=gateway, timeout=60) as http:
        await http.post("/v1/chat/completions", json=chat("warm"))
        before = await _stats(http)
        claimed = agentclaims.claimed_session(
            builder.compile(), backend=backend, planner=ALWAYS_HELD, log_dir=tmp_path
        )
        run = claimed.run()
        pieces = [
            message.content
            async for message, _meta in run.astream(
                {"messages": [HumanMessage(words("loop", 15))]}, stream_mode="messages"
            )
            if isinstance(message, AIMessageChunk) and message.content
        ]
        await asyncio.sleep(0.3)  # the session's last release goes within the ride bound
        after = await _stats(http)
    await backend.aclose()
    stats = run.stats
    assert stats.llm_calls == 3
    assert len(pieces) >= 3 * 4  # tokens one by one, every call
    assert stats.claims_accepted == 3, stats
    assert after["engine_requests"]["completion"] - before["engine_requests"]["completion"] == 3
    assert after["engine_requests"]["operation"] == before["engine_requests"]["operation"]
    lines = [json.loads(x) for x in next(tmp_path.glob("*.jsonl")).read_text().splitlines()]
    rode = after["claim_operations"]["rode"] - before["claim_operations"]["rode"]
    story = [
        (d["event"], d.get("claim_id"), d.get("reason") or d.get("state"))
        for d in lines
        if d["event"].startswith(("claim", "resident", "react"))
    ]
    assert rode >= 2, story
    ended = sorted(d["reason"] for d in lines if d["event"] == "claim_ended")
    assert ended == ["session_end", "superseded", "superseded"], ended
    states = {d["claim_id"]: d["state"] for d in lines if d["event"] == "claim_ended"}
    assert set(states.values()) <= {"expired"}, states
    # each call's line carries the pool's churn the connector measured from vLLM's KV events
    pools = [d["pool"] for d in lines if d["event"] == "llm_call"]
    assert len(pools) == 3
    assert all(p["evicted_blocks"] >= 0 and p["free_blocks"] > 0 for p in pools), pools


async def test_astream_events_of_a_claimed_agent_yield_tokens_with_claims_riding(
    gateway: str,
) -> None:
    """``astream_events`` of a claimed LangGraph agent over the vLLM gateway: the model's
    tokens arrive one by one (``on_chat_model_stream``) while each call carries its claim."""
    from langchain_core.messages import HumanMessage
    from langgraph.graph import END, START, MessagesState, StateGraph

    import agentclaims

    backend = HTTPBackend(gateway, timeout_s=120)
    served = await agentclaims.openai_client(backend).models.list()
    model = agentclaims.chat_model(
        backend, model=served.data[0].id, max_tokens=8, temperature=0, streaming=True
    )

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    async def fetch(state: MessagesState) -> dict[str, Any]:
        await asyncio.sleep(0.1)
        return {"messages": [HumanMessage(words("more", 3))]}

    def route(state: dict[str, Any]) -> str:
        return "fetch" if len(state["messages"]) < 4 else END

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("fetch", fetch)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["fetch", END])
    builder.add_edge("fetch", "agent")
    run = agentclaims.claimed_session(builder.compile(), backend=backend, planner=ALWAYS_HELD).run()
    tokens = [
        event["data"]["chunk"].content
        async for event in run.astream_events(
            {"messages": [HumanMessage(words("events", 15))]}, version="v2"
        )
        if event["event"] == "on_chat_model_stream" and event["data"]["chunk"].content
    ]
    await backend.aclose()
    assert run.stats.llm_calls == 2
    assert len(tokens) >= 2 * 4  # one by one, both calls
    assert run.stats.claims_accepted == 2, run.stats


def test_a_gateway_killed_with_a_release_pending_loses_nothing(vllm_server: VllmServer) -> None:
    """kill -9 of a gateway while a release it answered still waits to ride (a long ride
    bound) and its channel connection is open: the connector keeps serving, and the next
    gateway revokes the orphaned hold with its event; its own channel works."""
    first, url = start_gateway(*_args(vllm_server, "--ride-bound-s", "10"))
    try:
        body = chat(words("kill", 40), owner_scope="wf-k", claims=[sequence_claim("k-1")])
        answer = httpx2.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()
        assert answer["agentclaims"]["decisions"][0]["decision"] == "accepted"
        assert httpx2.get(f"{url}/v1/descriptor", timeout=30).json()["connector_channel"]
        released = httpx2.post(
            f"{url}/v1/claims/k-1/release", json={"owner_scope": "wf-k"}, timeout=30
        ).json()
        assert released["state"] == "expired"  # answered; the hand-back still pending
        stats = httpx2.get(f"{url}/v1/stats", timeout=30).json()
        assert stats["claim_operations"]["standalone"] == 0
    finally:
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
    second, url = start_gateway(*_args(vllm_server))
    try:

        async def check() -> None:
            async with HTTPBackend(url) as backend:
                events = await collect_events(backend, id_prefix="k-1")
            [ended] = [e for e in events if e.event.value == "resident_claim_expired"]
            assert ended.data["reason"] == "revoked: gateway_restart"
            assert ended.data["blocks"] > 0

        asyncio.run(check())
        stats = httpx2.get(f"{url}/v1/stats", timeout=30).json()
        assert stats["claim_operations"]["channel"] >= 1  # the revocation took the channel
    finally:
        stop(second)


def test_the_connector_serves_on_after_a_channel_client_dies_mid_line(
    vllm_server: VllmServer,
) -> None:
    """A client that dies half-way through a line (a gateway killed mid-operation) leaves the
    engine serving and the channel answering the next client."""
    from agentclaims.vllm import ConnectorClient

    async def channel_path() -> str:
        client = ConnectorClient(vllm_server.url, vllm_server.key, model=vllm_server.model)
        try:
            await client.complete([1], max_tokens=1)
            assert client.channel is not None
            return client.channel
        finally:
            await client.aclose()

    path = asyncio.run(channel_path())
    script = (
        "import socket, os, signal\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        f"s.connect({path!r})\n"
        's.sendall(b\'{"v": 1, "ops": [\')\n'
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run(["python3", "-c", script], timeout=30, check=False)
    assert done.returncode == -signal.SIGKILL
    answer = httpx2.post(
        f"{vllm_server.url}/v1/completions",
        json={"model": vllm_server.model, "prompt": [7, 8, 9], "max_tokens": 2},
        timeout=60,
    )
    assert answer.status_code == 200
    assert call(path, {"v": 1})["ok"] is False  # answered: not signed


async def _engine_count(http: httpx2.AsyncClient, *gauges: str) -> float:
    """vLLM's own gauges (``vllm:num_requests_waiting``), summed over their labels, from one
    read of its metrics."""
    text = (await http.get("/metrics")).text
    prefixes = tuple(g + end for g in gauges for end in ("{", " "))
    return sum(
        float(line.rpartition(" ")[2]) for line in text.splitlines() if line.startswith(prefixes)
    )


async def _until(http: httpx2.AsyncClient, gauge: str, at_least: float, what: str) -> None:
    deadline = time.monotonic() + 30
    while await _engine_count(http, gauge) < at_least:
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def _queued_behind(http: httpx2.AsyncClient, busy: list[asyncio.Future[Any]]) -> bool:
    """Until the engine holds one request more than the long answers not yet answered (so the
    reusing call is in it) while at least two of them are left: the call then waits in the
    queue for a whole long answer at least (True). Counted against the answers still due, not
    against a fixed number, since a long answer may end between two reads of the gauges.
    False where fewer than two are left first (a loaded machine's slow reads)."""
    deadline = time.monotonic() + 30
    while True:
        due = sum(not f.done() for f in busy)
        inside = await _engine_count(http, "vllm:num_requests_waiting", "vllm:num_requests_running")
        if due >= 2 and inside >= due + 1:
            return True
        if due < 2:
            return False
        assert time.monotonic() < deadline, "the reusing call never reached vLLM"
        await asyncio.sleep(0.01)


SEAT_TRIES = 3


async def _reuse_behind_long_answers(client: Any, http: httpx2.AsyncClient, attempt: int) -> bool:
    """One try of the test below on its own prefix and claim: False where the machine spoiled
    it (the reusing call ran before it was seen waiting), so nothing could be checked;
    otherwise every check made."""
    claim = f"seat-{attempt}"
    prefix = [5 + (i + 97 * attempt) % 600 for i in range(3 * 32)]
    hold = {"op": "hold", "claim_id": claim, "mode": "hard_protected", "ttl_s": 60}
    held = await client.complete(prefix, [hold], max_tokens=1)
    assert held.result_of(claim)["decision"] == "accepted"
    blocks = held.held_blocks
    assert blocks >= 3
    busy = [  # long answers, one after another in the only seat
        asyncio.ensure_future(client.complete([700 + i] * 8, max_tokens=240)) for i in range(5)
    ]
    await _until(http, "vllm:num_requests_running", 1, "no long answer ran")
    release = {"op": "release", "claim_id": claim}
    reuse = asyncio.ensure_future(
        client.complete([*prefix, *range(40, 60)], [release], max_tokens=1)
    )
    queued = await _queued_behind(http, busy)
    waiting = await client.operate([])  # over the channel, between two steps
    still_waiting = await _engine_count(http, "vllm:num_requests_waiting") >= 1
    answer = await reuse
    await asyncio.gather(*busy)
    [result] = [r for r in answer.results if r.get("claim_id") == claim]
    assert result == {**result, "op": "release", "ok": True, "state": "expired"}
    assert (await client.operate([])).held_blocks == 0
    if not (queued and still_waiting):
        return False
    assert waiting.held_blocks == blocks  # still held while its reuser waits
    assert answer.cached_tokens >= 3 * 32
    return True


async def test_a_release_riding_on_the_call_that_reuses_its_prefix_keeps_it_held_till_it_runs(
    tiny_model: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """An agent's next call lets go of the claim on its last sequence, whose blocks it starts
    with. While that call waits in vLLM's queue (one seat here, taken by long answers), the
    prefix stays held: released on arrival, its blocks would sit in the free queue, where
    other requests' allocations take them just before the call's reuse. Once the call has
    its blocks the claim goes, and the call's answer says so, with the prefix a cache hit."""
    from agentclaims.vllm import ConnectorClient

    with serve_vllm(tiny_model, tmp_path_factory, "one-seat", extra=("--max-num-seqs", "1")) as s:
        client = ConnectorClient(s.url, s.key, model=s.model)
        try:
            first = await client.complete([1], max_tokens=1)
            client.skip_events(first.last_seq)
            async with httpx2.AsyncClient(base_url=s.url, timeout=60) as http:
                for attempt in range(SEAT_TRIES):  # a try the loaded machine spoiled is retried
                    if await _reuse_behind_long_answers(client, http, attempt):
                        break
                else:
                    pytest.fail(f"the reusing call never stayed queued in {SEAT_TRIES} tries")
        finally:
            await client.aclose()
