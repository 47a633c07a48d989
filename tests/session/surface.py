"""Shared pieces of the LangGraph-surface tests: one script, the backends (the embedded
default and a real `agentclaims serve` process on loopback), real graphs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph

from agentclaims.gateway.text import Reply

SCRIPT_JSON: dict[str, list[Any]] = {
    "agent": [{"tool": "search", "arguments": {"query": "kv papers"}}, "found three papers on it"],
    "react:agent": [
        {"tool": "search", "arguments": {"query": "kv papers"}},
        "found three papers on it",
    ],
    "model": [{"tool": "search", "arguments": {"query": "kv papers"}}, "found three papers on it"],
    "*": ["a plain answer in five words"],
}
"""The same replies on every backend: the ReAct ``agent`` calls ``search`` once, then answers;
the same agent as a subgraph (``react:agent``) too, and ``create_agent``'s ``model``; any other
node answers in words."""

SCRIPT: dict[str, list[Reply | str]] = {
    "agent": [Reply.tool("search", {"query": "kv papers"}), "found three papers on it"],
    "react:agent": [Reply.tool("search", {"query": "kv papers"}), "found three papers on it"],
    "model": [Reply.tool("search", {"query": "kv papers"}), "found three papers on it"],
    "*": ["a plain answer in five words"],
}


@tool
def search(query: str) -> str:
    """Search the papers."""
    return f"results for {query}"


def ask(text: str = "find KV papers") -> dict[str, Any]:
    return {"messages": [HumanMessage(text)]}


def sync_graph(model: Any, *, streamed: bool = False) -> Any:
    """One ``def`` node calling ``model.invoke()`` (or ``model.stream()``)."""

    def answer(state: MessagesState) -> dict[str, Any]:
        if streamed:
            parts = list(model.stream(state["messages"]))
            message = parts[0]
            for part in parts[1:]:
                message = message + part
            return {"messages": [message]}
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("answer", answer)
    builder.add_edge(START, "answer")
    builder.add_edge("answer", END)
    return builder.compile()


def log_lines(directory: Path) -> Iterator[dict[str, Any]]:
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            yield json.loads(line)


async def tool_turn(session: Any, client: Any, node: str, messages: list[dict[str, Any]]) -> None:
    """One turn of ``node`` in ``session``: a model call with ``messages`` and a new user line,
    its answer appended, then a tool call (the node's prefix held across it)."""
    with session.node(node):
        messages.append({"role": "user", "content": "next step " * 10})
        reply = await client.chat.completions.create(model="scripted", messages=messages)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        async with session.tool_call("search"):
            pass
