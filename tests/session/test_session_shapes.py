"""Claimed sessions over real LangGraph graphs of each canonical shape, on the embedded engine.

Each test runs an unmodified LangGraph graph through ``claimed_session`` and checks the
extracted Agent Execution Graph, what the session learned and planned (STE, reuse), the claims
it issued and that none is left live, and the outcome log it wrote.
"""

from __future__ import annotations

import json
import operator
import warnings
from pathlib import Path
from typing import Annotated, Any, Literal, TypedDict

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, StateGraph
from langgraph.prebuilt import create_react_agent
from langgraph.types import Send

import agentclaims
from agentclaims.backends.embedded import EmbeddedBackend
from agentclaims.bindings.decorators import claimed_session
from agentclaims.contract import ClaimState
from agentclaims.demo.workflows import build_supervisor, script, task_for
from agentclaims.engine import ServiceTimes
from agentclaims.gateway.text import Reply, TextRequest
from agentclaims.graph import AgentGraphWarning
from agentclaims.session import ClaimedSession, current_session
from agentclaims.session.calls import SessionCalls

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PROMPT = "You are a careful agent that answers from the tools' results. " * 12
NO_WAIT = ServiceTimes(prefill_s_per_token=0.0, decode_s_per_token=0.0)


def make_backend(script_: Any = None, blocks: int = 2048) -> EmbeddedBackend:
    return EmbeddedBackend(num_blocks=blocks, block_size=16, script=script_, service=NO_WAIT)


def edges_of(graph: Any) -> set[tuple[str, str, str]]:
    return {(u, v, k) for u, v, k, _count in graph.edges()}


def log_lines(log_dir: Path, session: ClaimedSession) -> list[dict[str, Any]]:
    path = log_dir / f"{session.workflow_id}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_claims_accounted(backend: EmbeddedBackend, session: ClaimedSession) -> None:
    """Every claim the session submitted exists on the engine, and none is live any more."""
    views = backend.engine.claims_of(session.owner_scope)
    assert len(views) == session.stats.claims_submitted
    assert [v.claim_id for v in views if v.state.live] == []
    assert session.claims == {}
    # every accepted claim ended, and the session knows it: released, or (a slow run) its TTL
    # ended on the engine first
    accepted = {v.claim_id for v in views if v.state is not ClaimState.REFUSED}
    assert {v.end_reason for v in views if v.claim_id in accepted} <= {"released", "ttl_ended"}
    assert {c.claim_id for c in session.ended_claims} == accepted
    assert len(accepted) == session.stats.claims_accepted


def assert_log_matches(lines: list[dict[str, Any]], session: ClaimedSession) -> None:
    """The log opens and closes the session, has one line per LLM call, every planned claim."""
    events = [line["event"] for line in lines]
    assert events[0] == "session_started"
    assert events[-1] == "session_ended"
    assert {line["workflow_id"] for line in lines} == {session.workflow_id}
    assert events.count("llm_call") == session.stats.llm_calls
    planned = [line for line in lines if line["event"] == "claim_planned"]
    assert len(planned) == session.stats.claims_submitted
    modes: dict[str, int] = {}
    accepted = {line["claim_id"] for line in lines if line["event"] == "resident_claim_accepted"}
    for line in planned:
        if line["claim_id"] in accepted:
            modes[line["mode"]] = modes.get(line["mode"], 0) + 1
    assert modes == session.stats.modes
    assert sum(line["cached_tokens"] for line in lines if line["event"] == "llm_call") == (
        session.stats.cached_tokens
    )


# ---------------------------------------------------------------------- ReAct (prebuilt)


@tool
async def search(query: str) -> str:
    """Search the sources."""
    return f"three papers about {query}. " * 8


def react_script(request: TextRequest) -> Reply | str:
    rounds = sum(1 for m in request.messages if m.get("role") == "tool")
    return Reply.tool("search", {"query": f"kv claims {rounds}"}) if rounds < 2 else "done"


async def test_react_prebuilt_agent(tmp_path):
    """create_react_agent, unmodified: agent<->tools extracted, loop learned, claims released."""
    backend = make_backend(react_script)
    agent = create_react_agent(agentclaims.chat_model(backend), [search], prompt=PROMPT)
    claimed = claimed_session(agent, backend=backend, log_dir=tmp_path)
    assert edges_of(claimed.aeg) == {
        (START, "agent", "plain"),
        ("agent", "tools", "send"),
        ("agent", END, "conditional"),
        ("tools", "agent", "plain"),
    }
    assert claimed.aeg.node_kind("tools") == "tool"
    result = await claimed.ainvoke({"messages": [HumanMessage("find KV cache papers")]})
    assert result["messages"][-1].content == "done"
    session = claimed.last_session
    assert session is not None
    graph = session.graph
    # the ToolNode makes no LLM call; the session learns agent -> tools -> agent, not a self-loop
    assert graph.edge_count("agent", "tools") == 2
    assert graph.edge_count("tools", "agent") == 2
    assert not graph.has_edge("agent", "agent")
    assert session.stats.llm_calls == 3
    assert session.stats.cached_tokens > 0
    lines = log_lines(tmp_path, session)
    planned = [line for line in lines if line["event"] == "claim_planned"]
    # the first two replies call a tool: the prefix comes back to this agent next step, surely
    assert [(p["ste"], p["reuse_probability"]) for p in planned[:2]] == [(1.0, 1.0), (1.0, 1.0)]
    assert [line["ste"] for line in lines if line["event"] == "llm_call"] == [0, 0, 0]
    assert_claims_accounted(backend, session)
    assert_log_matches(lines, session)
    await backend.aclose()


# ---------------------------------------------------------------------- supervisor


async def test_supervisor_with_subgraph_workers(tmp_path):
    """Workers are subgraphs: xray names them parent:child; each worker's loop is learned."""
    backend = make_backend(script)
    claimed = claimed_session(
        build_supervisor(agentclaims.chat_model(backend), tool_delay_s=0.0),
        backend=backend,
        log_dir=tmp_path,
    )
    assert edges_of(claimed.aeg) == {
        (START, "supervisor", "plain"),
        ("supervisor", "researcher:model", "goto"),
        ("supervisor", "writer:model", "goto"),
        ("supervisor", END, "goto"),
        ("researcher:model", "researcher:tools", "send"),
        ("researcher:tools", "researcher:model", "conditional"),
        ("researcher:model", "supervisor", "conditional"),
        ("writer:model", "writer:tools", "send"),
        ("writer:tools", "writer:model", "conditional"),
        ("writer:model", "supervisor", "conditional"),
    }
    await claimed.ainvoke({"messages": [HumanMessage(task_for(3))]}, {"recursion_limit": 60})
    session = claimed.last_session
    assert session is not None
    graph = session.graph
    assert edges_of(graph) == edges_of(claimed.aeg)  # every transition seen was a known one
    for worker in ("researcher", "writer"):
        assert graph.edge_count("supervisor", f"{worker}:model") == 1
        assert graph.edge_count(f"{worker}:model", f"{worker}:tools") == 2
        assert graph.edge_count(f"{worker}:model", "supervisor") == 1
    assert session.stats.llm_calls == 3 + 2 * 3  # supervisor x3, each worker: 2 tools + report
    lines = log_lines(tmp_path, session)
    calls = [line["node"] for line in lines if line["event"] == "llm_call"]
    assert calls == [
        "supervisor",
        *(["researcher:model"] * 3),
        "supervisor",
        *(["writer:model"] * 3),
        "supervisor",
    ]
    tool_turns = [
        p for p in lines if p["event"] == "claim_planned" and p["reuse_probability"] == 1.0
    ]
    assert len(tool_turns) >= 4  # each worker's two tool turns are claimed with certain reuse
    assert_claims_accounted(backend, session)
    assert_log_matches(lines, session)
    await backend.aclose()


# ---------------------------------------------------------------------- Send map-reduce


class MapState(TypedDict):
    sections: list[str]
    summaries: Annotated[list[str], operator.add]
    final: str


def build_map_reduce(backend: EmbeddedBackend) -> Any:
    client = agentclaims.openai_client(backend)

    async def ask(text: str) -> str:
        reply = await client.chat.completions.create(
            model="scripted",
            messages=[{"role": "system", "content": PROMPT}, {"role": "user", "content": text}],
        )
        return reply.choices[0].message.content or ""

    async def summarise(state: dict[str, str]) -> dict[str, list[str]]:
        return {"summaries": [await ask(state["section"])]}

    async def reduce(state: MapState) -> dict[str, str]:
        return {"final": await ask(" ".join(state["summaries"]))}

    def fan_out(state: MapState) -> list[Send]:
        return [Send("summarise", {"section": s}) for s in state["sections"]]

    builder = StateGraph(MapState)
    builder.add_node("summarise", summarise)
    builder.add_node("reduce", reduce)
    builder.add_conditional_edges(START, fan_out, ["summarise"])
    builder.add_edge("summarise", "reduce")
    builder.add_edge("reduce", END)
    return builder.compile()


async def test_send_map_reduce(tmp_path):
    """A Send fan-out: send edges extracted; the shared system prompt is hit by later calls."""
    backend = make_backend()
    claimed = claimed_session(build_map_reduce(backend), backend=backend, log_dir=tmp_path)
    assert edges_of(claimed.aeg) == {
        (START, "summarise", "send"),
        ("summarise", "reduce", "plain"),
        ("reduce", END, "plain"),
    }
    sections = ["blocks and pages", "claims and modes", "harm and refusals"]
    out = await claimed.ainvoke({"sections": sections, "summaries": [], "final": ""})
    assert out["final"].startswith("echo:")
    session = claimed.last_session
    assert session is not None
    graph = session.graph
    assert graph.edge_count(START, "summarise") == 1
    assert graph.edge_count("summarise", "reduce") == 1
    assert session.stats.llm_calls == 4
    lines = log_lines(tmp_path, session)
    calls = [line for line in lines if line["event"] == "llm_call"]
    assert [c["node"] for c in calls] == ["summarise"] * 3 + ["reduce"]
    assert all(c["cached_tokens"] > 0 for c in calls[1:])  # the system prompt is shared
    # after a summary, `reduce` is next and `summarise` is not reached again: STE is infinite
    assert session.stats.claims_submitted == 0
    assert_claims_accounted(backend, session)
    assert_log_matches(lines, session)
    await backend.aclose()


# ---------------------------------------------------------------------- plan-and-execute


class PlanState(TypedDict):
    task: str
    plan: list[str]
    done: list[str]
    answer: str


PLAN_STEPS = 3


def plan_script(request: TextRequest) -> str:
    if request.node == "planner":
        return "; ".join(f"step {i}" for i in range(PLAN_STEPS))
    if request.node == "replan":
        return "continue"
    return f"did {request.last_text[-6:]}"


def build_plan_execute(backend: EmbeddedBackend) -> Any:
    client = agentclaims.openai_client(backend)

    async def ask(text: str) -> str:
        reply = await client.chat.completions.create(
            model="scripted",
            messages=[{"role": "system", "content": PROMPT}, {"role": "user", "content": text}],
        )
        return reply.choices[0].message.content or ""

    async def planner(state: PlanState) -> dict[str, Any]:
        return {"plan": (await ask(state["task"])).split("; "), "done": []}

    async def agent(state: PlanState) -> dict[str, Any]:
        step = state["plan"][len(state["done"])]
        return {"done": [*state["done"], await ask(f"{state['task']} {step}")]}

    async def replan(state: PlanState) -> dict[str, Any]:
        verdict = await ask(f"{state['task']} done: {' '.join(state['done'])}")
        return {"answer": verdict if len(state["done"]) < len(state["plan"]) else "finished"}

    def should_end(state: PlanState) -> Literal["agent", "__end__"]:
        return END if state["answer"] == "finished" else "agent"

    builder = StateGraph(PlanState)
    builder.add_node("planner", planner)
    builder.add_node("agent", agent)
    builder.add_node("replan", replan)
    builder.add_edge(START, "planner")
    builder.add_edge("planner", "agent")
    builder.add_edge("agent", "replan")
    builder.add_conditional_edges("replan", should_end)
    return builder.compile()


async def test_plan_and_execute(tmp_path):
    """planner -> agent -> replan -> {agent, END}: the loop is learned and claimed along it."""
    backend = make_backend(plan_script)
    claimed = claimed_session(build_plan_execute(backend), backend=backend, log_dir=tmp_path)
    assert edges_of(claimed.aeg) == {
        (START, "planner", "plain"),
        ("planner", "agent", "plain"),
        ("agent", "replan", "plain"),
        ("replan", "agent", "conditional"),
        ("replan", END, "conditional"),
    }
    out = await claimed.ainvoke(
        {"task": task_for(7, words=60), "plan": [], "done": [], "answer": ""}
    )
    assert out["answer"] == "finished"
    assert len(out["done"]) == PLAN_STEPS
    session = claimed.last_session
    assert session is not None
    graph = session.graph
    assert graph.edge_count("planner", "agent") == 1
    assert graph.edge_count("agent", "replan") == PLAN_STEPS
    assert graph.edge_count("replan", "agent") == PLAN_STEPS - 1
    assert session.stats.llm_calls == 1 + 2 * PLAN_STEPS
    lines = log_lines(tmp_path, session)
    planned = {p["claim_id"]: p for p in lines if p["event"] == "claim_planned"}
    # seen from the next step (replan), the agent runs one step on if replan loops back: the
    # learned (Laplace-smoothed) probability of replan -> agent, 1/2, then 2/3, then 3/4
    agent_plans = [planned[c.claim_id] for c in session.ended_claims if c.node == "agent"]
    assert [p["ste"] for p in agent_plans] == [1] * PLAN_STEPS
    assert [p["reuse_probability"] for p in agent_plans] == pytest.approx(
        [1 / 2, 2 / 3, 3 / 4], abs=1e-6
    )
    assert_claims_accounted(backend, session)
    assert_log_matches(lines, session)
    await backend.aclose()


# ---------------------------------------------------------------------- functional API


async def test_functional_api_two_runs_on_one_thread(tmp_path, monkeypatch):
    """@entrypoint with a checkpointer, two runs on one thread: relative steps, claims released
    after each run, and the second run hits the first run's resident blocks."""
    backend = make_backend({"workflow": [Reply.tool("search"), "final answer"]})
    client = agentclaims.openai_client(backend)
    steps: list[int | None] = []
    before_call = SessionCalls.before_call

    def record(self: SessionCalls, node: str, step: int | None = None) -> dict[str, Any]:
        ext = before_call(self, node, step)
        steps.append(ext["step"])
        return ext

    monkeypatch.setattr(SessionCalls, "before_call", record)

    async def ask(messages: list[dict[str, Any]]) -> Any:
        reply = await client.chat.completions.create(model="scripted", messages=messages)
        return reply.choices[0].message

    @task
    async def outline(topic: str) -> str:
        message = await ask(
            [{"role": "system", "content": PROMPT}, {"role": "user", "content": topic}]
        )
        return str(message.content)

    @entrypoint(checkpointer=InMemorySaver())
    async def workflow(topic: str, *, previous: int | None = None) -> Any:
        session = current_session()
        assert session is not None
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": PROMPT},
            {"role": "user", "content": await outline(topic)},
        ]
        first = await ask(messages)
        assert first.tool_calls
        messages.append(first.model_dump(exclude_none=True))
        async with session.tool_call("search"):
            result = "search results " * 10
        messages.append({"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": result})
        final = await ask(messages)
        return entrypoint.final(value=final.content, save=(previous or 0) + 1)

    with pytest.warns(AgentGraphWarning, match="no static graph"):
        claimed = claimed_session(workflow, backend=backend, log_dir=tmp_path)
    assert claimed.aeg.targets_unknown("workflow")
    config = {"configurable": {"thread_id": "thread-1"}}
    sessions = []
    for _ in range(2):
        assert await claimed.ainvoke(task_for(5, words=80), config) == "final answer"
        session = claimed.last_session
        assert session is not None
        sessions.append(session)
        assert session.stats.llm_calls == 3
        assert session.stats.tool_calls == 1
        assert session.stats.claims_accepted >= 1  # the prefix held across the tool
        assert_claims_accounted(backend, session)
        assert_log_matches(log_lines(tmp_path, session), session)
    # LangGraph's step counts on across the thread's runs; the session's steps restart
    assert steps[:3] == steps[3:] == [0, 0, 0]
    graph = sessions[1].graph
    assert graph.edge_count("workflow:outline", "workflow") == 2
    assert graph.edge_count("workflow", "tool:search") == 2
    first_run, second_run = (
        [line for line in log_lines(tmp_path, s) if line["event"] == "llm_call"] for s in sessions
    )
    assert first_run[0]["cached_tokens"] < second_run[0]["cached_tokens"]
    assert second_run[0]["cached_tokens"] == second_run[0]["prompt_tokens"] // 16 * 16
    await backend.aclose()


def test_functional_graph_warns_once_per_extraction():
    """Extracting a functional graph warns that its steps are learned at run time."""
    backend = make_backend()

    @entrypoint()
    async def flow(x: int) -> int:
        return x

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        claimed = claimed_session(flow, backend=backend)
    assert [w.category for w in caught] == [AgentGraphWarning]
    assert [w.code for w in claimed.aeg.warnings] == ["no-static-graph"]
