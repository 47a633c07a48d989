"""The log tells each claim's story (real claimed LangGraph runs on the embedded default):
every line names its workflow, session, thread and node; every claim ends with its reason;
`agentclaims report` shows failed and cancelled runs, per-claim timelines (text, --json, a PNG
with --plot) and the runs of each thread."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import create_react_agent

import agentclaims
from agentclaims.backends.embedded import EmbeddedBackend
from agentclaims.cli.main import main
from agentclaims.gateway.text import Reply

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

CONTRACT_PREFIXES = ("resident_claim_", "active_request_", "future_reuse_", "allocation_")


@tool
async def search(query: str) -> str:
    """Search."""
    await asyncio.sleep(0.01)
    return f"results for {query}"


@pytest.fixture
async def logs(tmp_path):
    """Two turns of one thread, a failed run and a cancelled one, logged to ``tmp_path``."""
    script = {
        "agent": [Reply.tool("search", {"query": "kv"}), "done", Reply.tool("search", {}), "ok"]
    }
    backend = EmbeddedBackend(num_blocks=512, block_size=16, script=script)
    agent = agentclaims.claimed_session(
        create_react_agent(agentclaims.chat_model(backend), [search], checkpointer=InMemorySaver()),
        backend=backend,
        log_dir=tmp_path,
    )
    thread = {"configurable": {"thread_id": "chat-7"}}
    await agent.ainvoke({"messages": [HumanMessage("find")]}, thread)
    await agent.ainvoke({"messages": [HumanMessage("more")]}, thread)

    def broken(state: MessagesState) -> dict[str, Any]:
        raise ValueError("bad state")

    builder = StateGraph(MessagesState)
    builder.add_node("broken", broken)
    builder.add_edge(START, "broken")
    failing = agentclaims.claimed_session(builder.compile(), backend=backend, log_dir=tmp_path)
    with pytest.raises(ValueError, match="bad state"):
        await failing.ainvoke({"messages": []}, {"configurable": {"thread_id": "chat-8"}})
    gate = asyncio.Event()

    @tool
    async def slow(query: str) -> str:
        """Wait forever."""
        gate.set()
        await asyncio.Event().wait()
        return ""

    waiting = agentclaims.claimed_session(
        create_react_agent(agentclaims.chat_model(backend), [slow]),
        backend=backend,
        log_dir=tmp_path,
    )
    backend.model.script = {"agent": [Reply.tool("slow", {"query": "x"})]}
    task = asyncio.ensure_future(waiting.ainvoke({"messages": [HumanMessage("wait")]}))
    await asyncio.wait_for(gate.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await backend.aclose()
    return tmp_path


def _lines(directory) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in sorted(directory.glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]


async def test_every_line_names_its_workflow_session_node_and_thread(logs):
    lines = _lines(logs)
    assert lines
    for line in lines:
        assert line["workflow_id"]
        assert line["session_id"]
    threaded = [line for line in lines if line.get("thread_id") == "chat-7"]
    assert len({line["workflow_id"] for line in threaded}) == 2
    for line in lines:
        event = line["event"]
        if event.startswith(("claim_", "llm_call", "tool_call", "reaction_")) or (
            event.startswith(CONTRACT_PREFIXES) and line.get("claim_id")
        ):
            assert line.get("node"), line
    planned = {line["claim_id"] for line in lines if line["event"] == "claim_planned"}
    ended = {line["claim_id"]: line["reason"] for line in lines if line["event"] == "claim_ended"}
    assert planned
    assert planned <= set(ended), "every claim's end is logged, with its reason"
    assert set(ended.values()) <= {"superseded", "session_end", "reuse_unlikely"}
    calls = [line for line in lines if line["event"] == "llm_call"]
    assert any(line["claim_id"] for line in calls), "a call names the claim that held its prefix"


def test_report_text_json_and_plot(logs, tmp_path_factory, capsys):
    assert main(["report", str(logs)]) == 0
    text = capsys.readouterr().out
    assert "workflows that did not complete" in text
    assert ": error (ValueError)" in text
    assert ": cancelled (CancelledError)" in text
    assert "chat-7: wf-" in text
    assert "claim timelines" in text
    assert "claim_planned" in text
    assert "end=superseded" in text
    png = tmp_path_factory.mktemp("plot") / "claims.png"
    assert main(["report", str(logs), "--json", "--plot", str(png)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    workflows = data["workflows"]
    statuses = sorted(s["status"] for s in workflows.values())
    assert statuses == ["cancelled", "completed", "completed", "error"]
    assert data["totals"]["not_completed"] == {"error": 1, "cancelled": 1, "closed": 0}
    (turns,) = [wfs for thread, wfs in data["threads"].items() if thread == "chat-7"]
    assert len(turns) == 2
    first = workflows[turns[0]]
    (timeline,) = [t for t in first["claim_timelines"].values() if t["end_reason"] == "superseded"]
    events = [step["event"] for step in timeline["events"]]
    assert events[0] == "claim_planned"
    assert "tool_call" in events
    assert "claim_ended" in events
    assert timeline["node"] == "agent"
    times = [step["t_s"] for step in timeline["events"]]
    assert times == sorted(times)
