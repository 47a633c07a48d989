"""A LangGraph supervisor whose workers are LangChain agents with tools.

``supervisor -> {researcher, writer, END}``; each worker is ``langchain.agents.create_agent`` (a
subgraph: ``model <-> tools``). The scripted model drives it offline: the supervisor routes researcher,
then writer, then finishes; each worker calls its tool ``TOOL_ROUNDS`` times, then reports.
Tools sleep a little (real waiting, so other workflows run meanwhile and press on the KV pool).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any, Literal

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, SystemMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.types import Command

from agentclaims.gateway.text import Reply, TextRequest

__all__ = ["SYSTEM_PROMPT", "TOOL_ROUNDS", "build_supervisor", "script", "task_for"]

TOOL_ROUNDS = 2
WORKERS = ("researcher", "writer")
SYSTEM_PROMPT = (
    "You are part of a small team of agents that writes short technical briefs. "
    "The supervisor routes work to a researcher, who searches sources, and to a writer, "
    "who drafts the brief from the findings. Be precise, cite what the tools return, "
    "and keep every answer short. " * 4
)
_TOOL_OF = {"researcher": "search", "writer": "draft"}
_WORDS = [
    "cache",
    "prefix",
    "block",
    "claim",
    "agent",
    "tool",
    "latency",
    "eviction",
    "workflow",
    "memory",
    "scheduler",
    "session",
    "tensor",
    "request",
    "token",
    "attention",
    "batch",
    "serving",
    "graph",
    "reuse",
    "policy",
]


def task_for(i: int, seed: int = 0, words: int = 220) -> str:
    """A workflow's task: a deterministic, distinct paragraph (so prefixes differ per run)."""
    rng = random.Random(seed * 100_003 + i)
    return f"Task {i}: " + " ".join(rng.choice(_WORDS) for _ in range(words))


def _tool_text(kind: str, query: str, n: int = 160) -> str:
    rng = random.Random(f"{kind}:{query}")
    return f"{kind} result: " + " ".join(rng.choice(_WORDS) for _ in range(n))


def make_tools(delay_s: float = 0.03) -> dict[str, Any]:
    @tool
    async def search(query: str) -> str:
        """Search the sources for a query."""
        await asyncio.sleep(delay_s)
        return _tool_text("search", query)

    @tool
    async def draft(outline: str) -> str:
        """Draft a section from an outline."""
        await asyncio.sleep(delay_s)
        return _tool_text("draft", outline)

    return {"search": search, "draft": draft}


def script(request: TextRequest) -> Reply | str | None:
    """The scripted model's replies, by node (``None``: the default echo)."""
    node = request.node or ""
    texts = [str(m.get("content") or "") for m in request.messages]
    if node == "supervisor":
        done = [w for w in WORKERS if any(f"[{w} done]" in t for t in texts)]
        nxt = next((w for w in WORKERS if w not in done), "FINISH")
        return f"route: {nxt}"
    worker = node.split(":", 1)[0]
    tool_name = _TOOL_OF.get(worker)
    if tool_name is None:
        return None
    rounds = sum(
        1
        for m in request.messages
        for call in m.get("tool_calls") or ()
        if call.get("function", {}).get("name") == tool_name
    )
    if rounds < TOOL_ROUNDS:
        return Reply.tool(
            tool_name, {"query" if tool_name == "search" else "outline": f"{worker} step {rounds}"}
        )
    return f"[{worker} done] summary of {rounds} {tool_name} results."


def build_supervisor(model: Any, *, tool_delay_s: float = 0.03) -> Any:
    """Compile the supervisor graph around a chat model (e.g. ``agentclaims.chat_model``)."""
    tools = make_tools(tool_delay_s)
    workers = {
        name: create_agent(model, [tools[_TOOL_OF[name]]], system_prompt=SYSTEM_PROMPT, name=name)
        for name in WORKERS
    }

    async def supervisor(
        state: MessagesState,
    ) -> Command[Literal["researcher", "writer", "__end__"]]:
        messages: list[BaseMessage] = [SystemMessage(SYSTEM_PROMPT), *state["messages"]]
        reply: AIMessage = await model.ainvoke(messages)
        target = str(reply.content).removeprefix("route: ").strip()
        routes: dict[str, Literal["researcher", "writer"]] = {
            "researcher": "researcher",
            "writer": "writer",
        }
        goto: Literal["researcher", "writer", "__end__"] = routes.get(target, "__end__")
        return Command(goto=goto, update={"messages": [reply]})

    builder = StateGraph(MessagesState)
    builder.add_node("supervisor", supervisor)
    for name, worker in workers.items():
        builder.add_node(name, worker)
        builder.add_edge(name, "supervisor")
    builder.add_edge(START, "supervisor")
    return builder.compile()
