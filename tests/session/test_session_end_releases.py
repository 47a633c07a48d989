"""A session that ends holding claims of several nodes lets them all go in one or two requests
(the first alone, the rest together: ``POST /v1/releases``), each claim's end logged, over a
real gateway process on loopback."""

from __future__ import annotations

import json
from pathlib import Path

from surface import tool_turn

import agentclaims
from agentclaims.backends.http import HTTPBackend
from agentclaims.session import ClaimedSession

NODES = ("planner", "coder", "reviewer", "tester")


def release_requests(calls: dict[str, int]) -> int:
    return calls.get("POST /v1/claims/{claim_id}/release", 0) + calls.get("POST /v1/releases", 0)


async def test_a_sessions_held_claims_go_together_at_its_end(
    gateway_url: str, tmp_path: Path
) -> None:
    async with HTTPBackend(gateway_url) as backend:
        client = agentclaims.openai_client(backend)
        session = ClaimedSession(backend, log_dir=tmp_path)
        async with session:
            # the nodes take turns (as under a supervisor), a tool after each call: each
            # node's prefix held for its next turn
            history = {
                node: [{"role": "system", "content": f"you are the {node}. " * 60}]
                for node in NODES
            }
            for _ in range(3):
                for node in NODES:
                    await tool_turn(session, client, node, history[node])
            await session.calls.settle()
            held = [claim.claim_id for claim in session.io.held.values()]
            assert len(held) >= 3
            before = release_requests((await backend.metrics())["gateway"]["calls"])
        after = release_requests((await backend.metrics())["gateway"]["calls"])
        assert 1 <= after - before <= 2 < len(held)
        for claim_id in held:
            view = await backend.get_claim(claim_id, session.owner_scope)
            assert not view.state.live
        log = tmp_path / f"{session.workflow_id}.jsonl"
        ended = [
            line["claim_id"]
            for line in map(json.loads, log.read_text().splitlines())
            if line["event"] == "claim_ended" and line["reason"] == "session_end"
        ]
        assert sorted(ended) == sorted(held)
