"""Graphs declared with decorators."""

from __future__ import annotations

import asyncio

import pytest

from agentclaims.errors import UsageError
from agentclaims.graph import END, START, GraphRegistry


def _registry() -> tuple[GraphRegistry, dict[str, object]]:
    registry = GraphRegistry()

    @registry.agent("planner", next=["search", "writer"], prefixes=["sys"])
    async def planner(task: str) -> str:
        """Plan."""
        return f"plan:{task}"

    @registry.tool("search", next=["planner"])
    def search(query: str) -> str:
        return f"found:{query}"

    @registry.agent(prefixes=["sys", "style"])
    def writer(notes: str) -> str:
        return notes.upper()

    return registry, {"planner": planner, "search": search, "writer": writer}


def test_graph_has_declared_nodes_and_edges() -> None:
    """Steps, kinds, prefixes and edge kinds follow the decorators."""
    g = _registry()[0].graph()
    assert g.nodes == [START, END, "planner", "search", "writer"]
    assert g.node_kind("search") == "tool"
    assert g.prefixes_of("writer") == {"sys", "style"}
    assert g.edge_kind(START, "planner") == "plain"
    assert g.edge_kind("planner", "search") == "conditional"
    assert g.edge_kind("search", "planner") == "plain"
    assert g.edge_kind("writer", END) == "plain"


def test_decorated_functions_keep_behaviour() -> None:
    """Sync and async functions still return the same values, with their metadata."""
    _, fns = _registry()
    assert asyncio.run(fns["planner"]("x")) == "plan:x"  # type: ignore[operator]
    assert fns["writer"]("a") == "A"  # type: ignore[operator]
    assert fns["planner"].__doc__ == "Plan."
    assert fns["search"].__name__ == "search"  # type: ignore[attr-defined]


async def test_runs_are_learned() -> None:
    """Calls inside registry.run() become observed transitions."""
    registry, fns = _registry()
    with registry.run() as path:
        await fns["planner"]("x")  # type: ignore[operator]
        fns["search"]("y")  # type: ignore[operator]
        await fns["planner"]("x")  # type: ignore[operator]
        fns["writer"]("z")  # type: ignore[operator]
    assert path == ["planner", "search", "planner", "writer"]
    g = registry.graph()
    assert g.edge_count("planner", "search") == 1
    assert g.edge_count("writer", END) == 1
    assert g.transition_probabilities("planner") == pytest.approx({"search": 0.5, "writer": 0.5})


def test_calls_outside_a_run_are_not_recorded() -> None:
    """Without registry.run() nothing is learned."""
    registry, fns = _registry()
    fns["writer"]("a")  # type: ignore[operator]
    assert registry.graph().edge_count("writer", END) == 0


def test_after_all_declares_and_join() -> None:
    """after_all makes a step an AND-join of the named steps."""
    registry = GraphRegistry()
    registry.agent("a", next=["b", "c"], entry=True)(lambda: None)
    registry.tool("b")(lambda: None)
    registry.tool("c")(lambda: None)
    registry.agent("merge", after_all=["b", "c"])(lambda: None)
    g = registry.graph()
    assert g.join_groups("merge") == (frozenset({"b", "c"}),)
    assert not g.has_edge("b", END)


def test_decorating_non_callable_is_usage_error() -> None:
    """Only callables can be steps."""
    with pytest.raises(UsageError) as info:
        GraphRegistry().agent("x")(42)  # type: ignore[type-var]
    assert info.value.field == "fn"


def test_duplicate_step_is_usage_error() -> None:
    """A step name can be registered once."""
    registry, _ = _registry()
    with pytest.raises(UsageError, match="name"):
        registry.tool("search")(lambda: None)


def test_unknown_next_is_usage_error() -> None:
    """graph() rejects a next naming no registered step."""
    registry = GraphRegistry()
    registry.agent("a", next=["ghost"])(lambda: None)
    with pytest.raises(UsageError, match="next"):
        registry.graph()
