"""A claim let go because its reuse became unlikely rides on the next call as ``done``
(``agentclaims.release_done``): its blocks are handed back as the next victims, not as the
freshest. One superseded by the node's next call is not: that call reuses its blocks."""

from __future__ import annotations

import json
from typing import Any

import httpx2
from surface import tool_turn

import agentclaims
from agentclaims.backends.asgi import StreamingASGITransport
from agentclaims.backends.embedded import EmbeddedBackend
from agentclaims.backends.http import HTTPBackend
from agentclaims.session import ClaimedSession


async def test_a_claim_whose_reuse_became_unlikely_rides_as_done() -> None:
    inner = EmbeddedBackend(num_blocks=2048, block_size=16)
    sent: list[dict[str, Any]] = []

    async def record(request: httpx2.Request) -> None:
        if request.url.path.endswith("/chat/completions"):
            sent.append(json.loads(request.content).get("agentclaims") or {})

    client = httpx2.AsyncClient(
        transport=StreamingASGITransport(inner.app),
        base_url="http://gw",
        event_hooks={"request": [record]},
    )
    backend = HTTPBackend("http://gw", client=client)
    try:
        openai = agentclaims.openai_client(backend)
        session = ClaimedSession(backend)
        async with session:
            for node in ("a", "b"):  # a's turns, then b's: a is not coming back
                messages = [{"role": "system", "content": f"you are {node}. " * 60}]
                for _ in range(3):
                    await tool_turn(session, openai, node, messages)
    finally:
        await backend.aclose()
        await client.aclose()
        await inner.aclose()
    rode = [(ext.get("release", []), ext.get("release_done", [])) for ext in sent]
    done = [c for _, d in rode for c in d]
    superseded = [c for r, d in rode for c in r if c not in d]
    assert done, f"no release rode as done: {rode}"
    assert superseded, "a node's own next call superseded its claim, not done"
    assert all(set(d) <= set(r) for r, d in rode)
