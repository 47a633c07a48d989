"""Tool calls LangGraph runs (ToolNode, create_react_agent, Command-returning tools, a tool
invoked in a `def` node) are seen by the session: logged with their duration, counted, held
across by the agent's claim, fed to the tool-time model; on both backends."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, create_react_agent, tools_condition
from langgraph.types import Command
from surface import ask, log_lines

import agentclaims
from agentclaims.bindings.decorators import claimed_session
from agentclaims.session import current_session

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@tool
async def search(query: str) -> str:
    """Search the papers (takes a little while)."""
    await asyncio.sleep(0.05)
    return f"results for {query}"


async def test_react_agent_tools_are_logged_counted_and_timed(backend, tmp_path):
    claimed = claimed_session(
        create_react_agent(agentclaims.chat_model(backend), [search]),
        backend=backend,
        log_dir=tmp_path,
    )
    for _ in range(2):
        result = await claimed.ainvoke(ask())
        assert result["messages"][-1].content == "found three papers on it"
        assert claimed.last_session.stats.tool_calls == 1
    assert claimed.tool_times.count("search") == 2  # shared across runs
    assert claimed.tool_times.predict("search") >= 0.04
    lines = list(log_lines(tmp_path))
    tools = [line for line in lines if line["event"] == "tool_call"]
    assert len(tools) == 2
    for line in tools:
        assert line["tool"] == "search"
        assert line["node"] == "agent"
        assert line["duration_s"] >= 0.04
        assert line["error"] is None
        assert line["claim_ids"], "the agent's claim is held across the tool"
    # the claim held across the tool is the one its next call supersedes, not one ended early
    held = {line["claim_ids"][0] for line in tools}
    ends = {line["claim_id"]: line["reason"] for line in lines if line["event"] == "claim_ended"}
    assert {ends[c] for c in held} == {"superseded"}
    # the ToolNode step is the graph's own `tools` node, learned as a transition
    graph = claimed.last_session.graph
    assert graph.has_edge("agent", "tools")
    assert graph.has_edge("tools", "agent")
    assert "tool:search" not in graph


async def test_command_returning_tool_in_a_toolnode(backend, tmp_path):
    """A ToolNode whose tool returns a ``Command`` (the scripted agent calls ``search``)."""

    @tool("search")
    def remember(query: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command[Any]:
        """Search, answering with a state update."""
        return Command(
            update={"messages": [ToolMessage(f"noted {query}", tool_call_id=tool_call_id)]}
        )

    model = agentclaims.chat_model(backend).bind_tools([remember])

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([remember]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    claimed = claimed_session(builder.compile(), backend=backend, log_dir=tmp_path)
    result = await claimed.ainvoke(ask())
    notes = [m.content for m in result["messages"] if isinstance(m, ToolMessage)]
    assert notes == ["noted kv papers"]
    assert result["messages"][-1].content == "found three papers on it"
    assert claimed.last_session.stats.tool_calls == 1
    (line,) = [line for line in log_lines(tmp_path) if line["event"] == "tool_call"]
    assert line["tool"] == "search"
    assert line["node"] == "agent"


async def test_tool_invoked_in_a_sync_node_and_not_twice_inside_tool_call(backend):
    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return key.upper()

    def sync_node(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(lookup.invoke({"key": "a"}))]}

    async def explicit(state: MessagesState) -> dict[str, Any]:
        session = current_session()
        assert session is not None
        async with session.tool_call("lookup"):
            value = await lookup.ainvoke({"key": "b"})
        return {"messages": [AIMessage(value)]}

    builder = StateGraph(MessagesState)
    builder.add_node("sync_node", sync_node)
    builder.add_node("explicit", explicit)
    builder.add_edge(START, "sync_node")
    builder.add_edge("sync_node", "explicit")
    builder.add_edge("explicit", END)
    claimed = claimed_session(builder.compile(), backend=backend)
    result = await claimed.ainvoke(ask())
    assert [m.content for m in result["messages"][-2:]] == ["A", "B"]
    assert claimed.last_session.stats.tool_calls == 2  # one each, never twice
    assert claimed.tool_times.count("lookup") == 2
