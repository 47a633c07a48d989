"""`agentclaims.release_when_done`: a call whose answer calls no tool lets go of the claims it
carries as it is answered (the agent is done), so the run's last call needs no release of its
own. Through the real gateway app (in-process ASGI), whole and streamed, with a tenant's keys."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest
from gateway_sleeps import RecordingSleep

from agentclaims.backends import EmbeddedBackend
from agentclaims.contract import ClaimState
from agentclaims.errors import UnknownClaim
from agentclaims.gateway.text import Reply

SYSTEM = {"role": "system", "content": "You are a careful agent. " * 6}
OWNER = "workflow:w1"


def body(
    turn: str, claim_id: str, *, node: str = "agent", stream: bool = False, **ext: Any
) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [SYSTEM, {"role": "user", "content": turn}],
        **({"stream": True, "stream_options": {"include_usage": True}} if stream else {}),
        "agentclaims": {
            "session_id": "s1",
            "owner_scope": OWNER,
            "node": node,
            "events_since": 0,
            "claims": [
                {"claim_id": claim_id, "object_id": "@sequence", "protection_mode": "demotable"}
            ],
            **ext,
        },
    }


async def answered(client: httpx2.AsyncClient, payload: dict[str, Any]) -> dict[str, Any]:
    resp = await client.post("/v1/chat/completions", json=payload)
    assert resp.status_code == 200, resp.text
    if not payload.get("stream"):
        return dict(resp.json()["agentclaims"])
    chunks = [
        json.loads(line[6:])
        for line in resp.text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
    return dict(chunks[-1]["agentclaims"])


@pytest.fixture
async def backend() -> Any:
    script = {"searcher": [Reply.tool("search", {"q": "kv"})], "agent": ["done: three papers."]}
    async with EmbeddedBackend(64, 4, script=script, sleep=RecordingSleep()) as b:
        yield b


@pytest.mark.parametrize("stream", [False, True])
async def test_an_answer_without_a_tool_call_releases_the_claims_it_carries(
    backend: EmbeddedBackend, stream: bool
) -> None:
    """The first reply calls a tool: its claim stays held. The second calls none: its claim is
    released as it is answered, ``done``, and the answer says so in ``released`` and in its
    events page (the release's own event): nothing is left for a release request."""
    client = backend.http_client()
    first = await answered(
        client, body("find papers", "s1-c1", node="searcher", stream=stream, release_when_done=True)
    )
    assert "released" not in first
    assert (await backend.get_claim("s1-c1", OWNER)).state is not ClaimState.EXPIRED
    second = await answered(
        client, body("and now?", "s1-c2", stream=stream, release_when_done=True)
    )
    assert [d["claim_id"] for d in second["decisions"]] == ["s1-c2"]
    assert second["decisions"][0]["decision"] != "rejected"
    (released,) = second["released"]
    assert released["claim_id"] == "s1-c2"
    assert released["state"] == ClaimState.EXPIRED.value
    assert (await backend.get_claim("s1-c2", OWNER)).state is ClaimState.EXPIRED
    named = [(e["claim_id"], e["event"]) for e in second["events"]["events"] if e.get("claim_id")]
    assert ("s1-c2", "resident_claim_expired") in named
    assert (await backend.get_claim("s1-c1", OWNER)).state is not ClaimState.EXPIRED


async def test_without_the_flag_an_answer_that_calls_no_tool_keeps_its_claim(
    backend: EmbeddedBackend,
) -> None:
    client = backend.http_client()
    await answered(client, body("find papers", "s1-c1", node="searcher"))
    second = await answered(client, body("and now?", "s1-c2"))
    assert "released" not in second
    assert (await backend.get_claim("s1-c2", OWNER)).state is not ClaimState.EXPIRED


@pytest.mark.parametrize("value", ["yes", 1, None, [True]])
async def test_a_bad_flag_is_refused_and_changes_nothing(
    backend: EmbeddedBackend, value: Any
) -> None:
    client = backend.http_client()
    resp = await client.post(
        "/v1/chat/completions", json=body("find papers", "s1-c9", release_when_done=value)
    )
    assert resp.status_code == 400, resp.text
    assert "agentclaims.release_when_done" in resp.text
    with pytest.raises(UnknownClaim):
        await backend.get_claim("s1-c9", OWNER)


@pytest.mark.parametrize(
    ("answer", "calls"),
    [
        ({"choices": [{"message": {"content": "done"}, "finish_reason": "stop"}]}, False),
        ({"choices": [{"message": {"tool_calls": [{"id": "t"}]}}]}, True),
        ({"choices": [{"message": {"function_call": {"name": "f"}}}]}, True),
        ({"choices": [{"delta": {"tool_calls": [{"index": 0}]}}]}, True),
        ({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}, True),
        ({"choices": [{"text": "a text completion", "finish_reason": "length"}]}, False),
        ({"choices": []}, False),
    ],
)
def test_what_counts_as_an_answer_that_calls_a_tool(answer: dict[str, Any], calls: bool) -> None:
    """Whole answers and streamed chunks alike; the older ``function_call`` too (when unsure
    whether the agent is done, its claim is kept)."""
    from agentclaims.gateway.completions import calls_tools

    assert calls_tools(answer) is calls
