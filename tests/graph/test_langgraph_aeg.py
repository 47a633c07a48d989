"""Agent Execution Graphs from real LangGraph graphs (no mocks)."""

from __future__ import annotations

import math
import operator
from typing import Annotated, Any, Literal, TypedDict

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command, Send

from agentclaims.bindings.langgraph import aeg_from_langgraph, task_path
from agentclaims.errors import UsageError
from agentclaims.graph import AgentGraphWarning, SteTracker, steps_to_execution


class State(TypedDict):
    items: Annotated[list[int], operator.add]


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def step(state: State) -> dict[str, Any]:
    return {"items": [1]}


def route_react(state: State) -> Literal["tools", "__end__"]:
    return END


def _react_builder() -> StateGraph[State]:
    b = StateGraph(State)
    b.add_node("agent", step)
    b.add_node("tools", ToolNode([add]))
    b.add_edge(START, "agent")
    b.add_conditional_edges("agent", route_react)
    b.add_edge("tools", "agent")
    return b


def _edges(g: Any) -> set[tuple[str, str, str]]:
    return {(u, v, k) for u, v, k, _ in g.edges()}


def test_react_nodes_edges_and_kinds() -> None:
    """ReAct: agent -> {tools, END} conditional, tools -> agent; ToolNode is a tool."""
    g = aeg_from_langgraph(_react_builder().compile(), prefixes={"agent": ["sys"]})
    assert g.node_kind("agent") == "agent"
    assert g.node_kind("tools") == "tool"
    assert _edges(g) == {
        (START, "agent", "plain"),
        ("agent", "tools", "conditional"),
        ("agent", END, "conditional"),
        ("tools", "agent", "plain"),
    }
    assert g.warnings == []


def test_react_loop_ste_and_prefix() -> None:
    """From tools, the agent (and its prefix) is one step away, END two."""
    g = aeg_from_langgraph(_react_builder().compile(), prefixes={"agent": ["sys"]})
    tracker = SteTracker(g, ["tools"])
    assert tracker.node_ste("agent") == 1
    assert tracker.node_ste(END) == 2
    assert tracker.prefix_ste("sys") == 1


class _ToolCallingFake(GenericFakeChatModel):
    """A fake chat model that accepts bind_tools (the prebuilt agent binds its tools)."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
def test_prebuilt_react_agent_and_run_learning() -> None:
    """create_react_agent: Send edge to tools, tools -> agent; a real run is learned."""
    from langgraph.prebuilt import create_react_agent

    model = _ToolCallingFake(
        messages=iter(
            [
                AIMessage(
                    content="", tool_calls=[{"name": "add", "args": {"a": 1, "b": 2}, "id": "1"}]
                ),
                AIMessage(content="3"),
            ]
        )
    )
    compiled = create_react_agent(model, [add])
    g = aeg_from_langgraph(compiled)
    assert _edges(g) == {
        (START, "agent", "plain"),
        ("agent", "tools", "send"),
        ("agent", END, "conditional"),
        ("tools", "agent", "plain"),
    }
    path = task_path(compiled.stream({"messages": [("user", "1+2?")]}, stream_mode="tasks"))
    assert path == ["agent", "tools", "agent"]
    g.observe_run(path)
    assert (g.edge_count("agent", "tools"), g.edge_count("agent", END)) == (1, 1)


def supervisor(state: State) -> Command[Literal["research", "math", "__end__"]]:
    return Command(goto=END)


def _supervisor() -> Any:
    worker = _react_builder().compile()
    b = StateGraph(State)
    b.add_node("supervisor", supervisor)
    b.add_node("research", worker)
    b.add_node("math", step, destinations=("supervisor",))
    b.add_edge(START, "supervisor")
    b.add_edge("research", "supervisor")
    return b.compile()


def test_supervisor_with_subgraph_workers_xray() -> None:
    """xray inlines the worker as research:agent / research:tools with goto edges in."""
    g = aeg_from_langgraph(_supervisor())
    assert set(g.nodes) == {START, END, "supervisor", "research:agent", "research:tools", "math"}
    assert g.node_kind("research:tools") == "tool"
    assert g.edge_kind("supervisor", "research:agent") == "goto"
    assert g.edge_kind("research:agent", "supervisor") == "conditional"
    assert g.edge_kind("math", "supervisor") == "goto"
    ste = steps_to_execution(g, ["supervisor"])
    assert (ste["research:agent"], ste["research:tools"], ste["math"]) == (1, 2, 1)


def test_supervisor_without_xray_keeps_worker_node() -> None:
    """xray=False keeps a subgraph as one node."""
    g = aeg_from_langgraph(_supervisor(), xray=False)
    assert "research" in g
    assert "research:agent" not in g


def test_command_goto_literal_hint() -> None:
    """Command[Literal[...]] hints become goto edges, END included."""
    g = aeg_from_langgraph(_supervisor())
    assert {v for u, v, k, _ in g.edges() if u == "supervisor" and k == "goto"} == {
        "research:agent",
        "math",
        END,
    }


def fan_out(state: State) -> list[Send]:
    return [Send("map", {"items": [i]}) for i in range(3)]


def test_send_map_reduce() -> None:
    """generate -(send)-> map -> reduce -> END."""
    b = StateGraph(State)
    b.add_node("generate", step)
    b.add_node("map", step)
    b.add_node("reduce", step)
    b.add_edge(START, "generate")
    b.add_conditional_edges("generate", fan_out, ["map"])
    b.add_edge("map", "reduce")
    b.add_edge("reduce", END)
    g = aeg_from_langgraph(b.compile())
    assert g.edge_kind("generate", "map") == "send"
    assert steps_to_execution(g, ["generate"])["reduce"] == 2


def replan_route(state: State) -> Literal["agent", "__end__"]:
    return END


def test_plan_and_execute() -> None:
    """planner -> agent -> replan -> {agent, END}: STE along the plan, loop included."""
    b = StateGraph(State)
    b.add_node("planner", step)
    b.add_node("agent", step)
    b.add_node("replan", step)
    b.add_edge(START, "planner")
    b.add_edge("planner", "agent")
    b.add_edge("agent", "replan")
    b.add_conditional_edges("replan", replan_route)
    g = aeg_from_langgraph(b.compile())
    assert steps_to_execution(g, ["planner"]) == {
        START: math.inf,
        END: 3,
        "planner": 0,
        "agent": 1,
        "replan": 2,
    }
    assert steps_to_execution(g, ["replan"])["planner"] == math.inf


def test_waiting_edge_is_and_join() -> None:
    """add_edge([a, b], c) becomes an AND-join; STE takes the max."""
    b = StateGraph(State)
    for name in ("a", "a2", "b", "c"):
        b.add_node(name, step)
    b.add_edge(START, "a")
    b.add_edge(START, "b")
    b.add_edge("a", "a2")
    b.add_edge(["a2", "b"], "c")
    b.add_edge("c", END)
    g = aeg_from_langgraph(b.compile())
    assert g.join_groups("c") == (frozenset({"a2", "b"}),)
    assert steps_to_execution(g, ["a", "b"])["c"] == 2


def route_blind(state: State) -> str:
    return "tools"


def _blind() -> Any:
    b = StateGraph(State)
    b.add_node("agent", step)
    b.add_node("tools", step)
    b.add_node("other", step)
    b.add_edge(START, "agent")
    b.add_conditional_edges("agent", route_blind)
    b.add_edge("tools", END)
    b.add_edge("other", END)
    return b.compile()


def test_blind_conditional_edge_warns_and_records() -> None:
    """A conditional edge without hints warns, names the node, and drops the false END edge."""
    with pytest.warns(AgentGraphWarning, match="'agent'"):
        g = aeg_from_langgraph(_blind())
    assert [(w.code, w.node) for w in g.warnings] == [("targets-unknown", "agent")]
    assert g.targets_unknown("agent")
    assert not g.has_edge("agent", END)


def test_blind_edge_is_conservative_then_learned() -> None:
    """Until observed, every node is one step away; after a real run, STE is exact."""
    compiled = _blind()
    with pytest.warns(AgentGraphWarning):
        g = aeg_from_langgraph(compiled)
    assert steps_to_execution(g, ["agent"])["other"] == 1
    g.observe_run(task_path(compiled.stream({"items": []}, stream_mode="tasks")))
    ste = steps_to_execution(g, ["agent"])
    assert (ste["tools"], ste["other"], ste[END]) == (1, math.inf, 2)


@task
def plan(x: int) -> int:
    return x + 1


@task
def act(x: int) -> int:
    return x * 2


@entrypoint()
def workflow(x: int) -> int:
    y = plan(x).result()
    for _ in range(2):
        y = act(y).result()
    return y


def test_functional_api_learned_online() -> None:
    """@entrypoint/@task has no static graph: warned, then learned from observed runs."""
    with pytest.warns(AgentGraphWarning, match="no static graph"):
        g = aeg_from_langgraph(workflow)
    path = task_path(workflow.stream(3, stream_mode="tasks"))
    assert path == ["workflow", "plan", "act", "act"]
    g.observe_run(path)
    assert g.edge_count("act", "act") == 1
    ste = steps_to_execution(g, ["workflow"])
    assert (ste["plan"], ste["act"]) == (1, 2)


def test_kind_override() -> None:
    """kinds= overrides the classification by node name."""
    b = StateGraph(State)
    b.add_node("search", step)
    b.add_edge(START, "search")
    g = aeg_from_langgraph(b.compile(), kinds={"search": "tool"})
    assert g.node_kind("search") == "tool"


def test_bad_override_is_usage_error() -> None:
    """kinds= naming an unknown node raises UsageError('kinds')."""
    with pytest.raises(UsageError) as info:
        aeg_from_langgraph(_react_builder().compile(), kinds={"ghost": "tool"})
    assert info.value.field == "kinds"


def test_not_a_graph_is_usage_error() -> None:
    """Anything but a compiled LangGraph graph raises UsageError('compiled')."""
    with pytest.raises(UsageError) as info:
        aeg_from_langgraph(_react_builder())
    assert info.value.field == "compiled"
