"""A call whose reply, if it calls no tool, leaves nothing to use its prefix asks
``release_when_done``: the gateway lets its claim go as it answers, so the end of the run
sends no release. A manual session (a tool loop of the application's own), on the embedded
default and over a real gateway process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from planners import Always
from surface import log_lines

import agentclaims
from agentclaims.contract import ProtectionMode
from agentclaims.planner import ClaimPlanner
from agentclaims.session import ClaimedSession


async def _others(backend: Any) -> dict[str, int]:
    calls = ((await backend.metrics()).get("gateway") or {}).get("calls") or {}
    return {k: n for k, n in calls.items() if "completions" not in k and "/v1/stats" not in k}


async def _tool_loop(
    backend: Any, tmp_path: Path, planner: str | ClaimPlanner
) -> tuple[Any, dict[str, int]]:
    """The script's ``agent``: a reply that calls ``search``, the tool run, then a reply that
    calls none; the requests beyond the completions that the session made meanwhile."""
    openai = agentclaims.openai_client(backend)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "you are a careful agent. " * 40},
        {"role": "user", "content": "find KV papers"},
    ]
    before = await _others(backend)
    async with ClaimedSession(backend, planner=planner, log_dir=tmp_path) as session:
        while True:
            with session.node("agent"):
                reply = await openai.chat.completions.create(model="m", messages=messages)
                message = reply.choices[0].message
                messages.append(message.model_dump(exclude_none=True))
                if not message.tool_calls:
                    break
                for call in message.tool_calls:
                    async with session.tool_call(call.function.name):
                        found = f"results for {json.loads(call.function.arguments)['query']}"
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": found})
    after = await _others(backend)
    return session, {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}


async def test_the_last_calls_claim_ends_with_its_answer(backend: Any, tmp_path: Path) -> None:
    """The default planner claims nothing for the human: the call after the tool carries its
    claim (a tool wait expected) and asks it be let go if the reply calls no tool, which the
    gateway does as it answers. The session's end has nothing to release."""
    session, sent = await _tool_loop(backend, tmp_path, "default")
    assert session.stats.llm_calls == 2
    lines = list(log_lines(tmp_path))
    ends = [(d["reason"], d["state"]) for d in lines if d["event"] == "claim_ended"]
    assert ends[-1] == ("reuse_unlikely", "expired"), ends
    assert session.claims == {}
    assert not [k for k in sent if "release" in k], sent


async def test_where_the_planner_keeps_a_claim_for_the_human_the_call_asks_nothing(
    backend: Any, tmp_path: Path
) -> None:
    """A planner that keeps a claim for the human's turn (here every prefix ``soft_priority``):
    the call does not ask for ``release_when_done``, its claim outlives the answer, and the
    session's end releases it."""
    keeps = Always(ProtectionMode.SOFT_PRIORITY)
    session, sent = await _tool_loop(backend, tmp_path, keeps)
    assert session.stats.claims_accepted >= 2
    lines = list(log_lines(tmp_path))
    ends = [d["reason"] for d in lines if d["event"] == "claim_ended"]
    assert ends[-1] == "session_end", ends
    assert any("release" in k for k in sent), sent
