"""docs/logs.md's session lines are checked against a real run: each documented example has
exactly the fields the session writes (a ReAct agent, a tool call, a checkpointer thread)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt import create_react_agent

import agentclaims
from agentclaims.gateway.text import Reply

DOC = Path(__file__).resolve().parents[2] / "docs" / "logs.md"
SESSION_EVENTS = (
    "llm_call",
    "tool_call",
    "claim_planned",
    "claim_ended",
    "session_started",
    "session_ended",
)


@tool
async def search(query: str) -> str:
    """Search."""
    await asyncio.sleep(0.01)
    return f"results for {query}"


def documented() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for text in DOC.read_text().splitlines():
        if text.startswith('{"'):
            line = json.loads(text)
            if line["event"] in SESSION_EVENTS:
                out[line["event"]] = line
    return out


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
async def test_documented_session_lines_match_a_real_run(tmp_path):
    script = {"agent": [Reply.tool("search", {"query": "kv"}), "done"] * 2}
    backend = agentclaims.EmbeddedBackend(num_blocks=512, block_size=16, script=script)
    agent = agentclaims.claimed_session(
        create_react_agent(agentclaims.chat_model(backend), [search], checkpointer=InMemorySaver()),
        backend=backend,
        log_dir=tmp_path,
    )
    thread = {"configurable": {"thread_id": "t-1"}}
    await agent.ainvoke({"messages": [HumanMessage("find")]}, thread)
    run = agent.run(thread_id="t-1")
    await run.ainvoke({"messages": [HumanMessage("more")]}, thread)
    await backend.aclose()
    assert run.log_path is not None
    real: dict[str, dict[str, Any]] = {}
    for text in run.log_path.read_text().splitlines():
        line = json.loads(text)
        if line["event"] == "llm_call" and line["claim_id"] is None:
            continue  # the documented call is one a claim held the prefix of
        real.setdefault(line["event"], line)
    docs = documented()
    assert set(docs) == set(SESSION_EVENTS)
    for event in SESSION_EVENTS:
        assert set(docs[event]) == set(real[event]), event
        assert real[event]["thread_id"] == "t-1"
