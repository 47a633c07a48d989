"""The events endpoint can return one session's events only."""

from __future__ import annotations

from agentclaims.backends.embedded import EmbeddedBackend
from agentclaims.protocol import collect_events


async def test_events_filtered_by_id_prefix_keep_order_and_skip_others():
    """id_prefix keeps events whose claim (else request) id starts with it, in order."""
    backend = EmbeddedBackend(num_blocks=64, block_size=4)
    client = backend.http_client()
    for rid in ("s-a-r1", "s-b-r1", "s-a-r2"):
        body = {
            "model": "scripted",
            "messages": [{"role": "user", "content": "hello there " * 5}],
            "agentclaims": {"request_id": rid, "session_id": rid[:3]},
        }
        assert (
            await client.post(f"{backend.base_url}/chat/completions", json=body)
        ).status_code == 200
    mine = await collect_events(backend, 0, id_prefix="s-a")
    everything = await collect_events(backend, 0)
    assert [e.request_id for e in mine] == [
        e.request_id for e in everything if e.request_id.startswith("s-a")
    ]
    assert {e.request_id for e in mine} == {"s-a-r1", "s-a-r2"}
    assert [e.seq for e in mine] == sorted(e.seq for e in mine)
    await backend.aclose()
