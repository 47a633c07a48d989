"""LangChain 1.x agents (`langchain.agents.create_agent`) with claims: wrapped by
`claimed_session`, and through `ClaimsMiddleware` without wrapping. Real agents with real tools,
on the embedded default and over a real gateway process."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command, interrupt
from surface import SCRIPT, ask, log_lines

import agentclaims
from agentclaims.backends.embedded import EmbeddedBackend
from agentclaims.bindings.langgraph import aeg_from_langgraph
from agentclaims.bindings.middleware import RUN_KEY, ClaimsMiddleware, create_agent_aeg
from agentclaims.errors import ClaimRefused, UnknownNameError, UsageError
from agentclaims.gateway.text import Reply


@tool
async def search(query: str) -> str:
    """Search the papers (takes a little while)."""
    await asyncio.sleep(0.05)
    return f"results for {query}"


def events(directory: Path, name: str) -> list[dict[str, Any]]:
    return [line for line in log_lines(directory) if line["event"] == name]


def tool_reply(name: str) -> Reply:
    return Reply.tool(name, {"query": "kv"})


def agent_with(backend: Any, *, tools: list[Any] | None = None, **options: Any) -> Any:
    claims = ClaimsMiddleware(backend, **options)
    agent = create_agent(agentclaims.chat_model(backend), tools or [search], middleware=[claims])
    return agent, claims


def test_the_middleware_graph_is_create_agents_own() -> None:
    """The AEG the middleware plans on is what `aeg_from_langgraph` reads from a real
    `create_agent` graph (so the two ways of claiming an agent plan alike)."""
    backend = EmbeddedBackend(64, 16)
    extracted = aeg_from_langgraph(create_agent(agentclaims.chat_model(backend), [search]))
    assert create_agent_aeg().to_dict() == extracted.to_dict()


async def test_create_agent_under_claimed_session(backend, tmp_path):
    claimed = agentclaims.claimed_session(
        create_agent(agentclaims.chat_model(backend), [search]), backend=backend, log_dir=tmp_path
    )
    result = await claimed.ainvoke(ask())
    assert result["messages"][-1].content == "found three papers on it"
    stats = claimed.last_session.stats
    # each call carries the claim on what it leaves cached (claims ride on calls): the first
    # is held across the tool, the answer's is let go once it calls no tool
    assert (stats.llm_calls, stats.tool_calls, stats.claims_accepted) == (2, 1, 2)
    assert stats.cached_tokens > 0
    (held,) = events(tmp_path, "tool_call")
    assert held["node"] == "model"
    assert held["claim_ids"], "the agent's claim is held across the tool"
    assert claimed.aeg.edge_kind("model", "tools") == "send"


async def test_a_middleware_run_is_one_claimed_session(backend, tmp_path):
    agent, claims = agent_with(backend, log_dir=tmp_path)
    before = (await backend.metrics())["gateway"]["calls"]
    result = await agent.ainvoke(ask())
    after = (await backend.metrics())["gateway"]["calls"]
    assert result["messages"][-1].content == "found three papers on it"
    assert RUN_KEY not in result  # the session's key stays out of the agent's output
    session = claims.last_session
    assert session is not None
    assert session.end_reason == "completed"
    assert claims.open_sessions == 0
    stats = session.stats
    # each call carries the claim on what it leaves cached (claims ride on calls): the first
    # is held across the tool, the answer's is let go once it calls no tool
    assert (stats.llm_calls, stats.tool_calls, stats.claims_accepted) == (2, 1, 2)
    assert stats.cached_tokens > 0
    (held,) = events(tmp_path, "tool_call")
    assert held["node"] == "model"
    assert held["claim_ids"]
    ends = {line["claim_id"]: line["reason"] for line in events(tmp_path, "claim_ended")}
    assert ends[held["claim_ids"][0]] == "superseded"  # held across the tool, then superseded
    # the answer's claim rode on it, asking to be let go if its reply calls no tool (the run
    # ends there): the gateway released it as it answered, so the run's end sends no release
    assert sorted(ends.values()) == ["session_end", "superseded"]
    assert {k: after[k] - before.get(k, 0) for k in after if "release" in k and after[k]} == {}
    assert [line["reason"] for line in events(tmp_path, "session_ended")] == ["completed"]
    assert {line["node"] for line in events(tmp_path, "llm_call")} == {"model"}


async def test_the_middleware_and_the_wrapper_claim_alike(tmp_path):
    """The same agent and script: the middleware's session counts what the wrapper's does."""
    wrapped_backend = EmbeddedBackend(2048, 16, script=SCRIPT)
    wrapped = agentclaims.claimed_session(
        create_agent(agentclaims.chat_model(wrapped_backend), [search]), backend=wrapped_backend
    )
    await wrapped.ainvoke(ask())
    backend = EmbeddedBackend(2048, 16, script=SCRIPT)
    agent, claims = agent_with(backend)
    await agent.ainvoke(ask())
    a, b = wrapped.last_session.stats, claims.last_session.stats
    assert (a.llm_calls, a.tool_calls, a.prompt_tokens, a.cached_tokens, a.modes) == (
        b.llm_calls,
        b.tool_calls,
        b.prompt_tokens,
        b.cached_tokens,
        b.modes,
    )
    await wrapped_backend.aclose()
    await backend.aclose()


async def test_concurrent_runs_each_get_their_own_session(tmp_path):
    backend = EmbeddedBackend(2048, 16, script=SCRIPT)
    agent, claims = agent_with(backend, log_dir=tmp_path)
    results = await asyncio.gather(*(agent.ainvoke(ask(f"question {i}")) for i in range(4)))
    assert {r["messages"][-1].content for r in results} == {"found three papers on it"}
    started = events(tmp_path, "session_started")
    assert len({line["session_id"] for line in started}) == 4
    assert [line["reason"] for line in events(tmp_path, "session_ended")] == ["completed"] * 4
    assert claims.tool_times.count("search") == 4  # the wait model is shared by the runs
    assert claims.open_sessions == 0
    await backend.aclose()


async def test_turns_of_a_thread_carry_its_thread_id(tmp_path):
    backend = EmbeddedBackend(2048, 16, script={"*": ["an answer"]})
    claims = ClaimsMiddleware(backend, log_dir=tmp_path)
    agent = create_agent(
        agentclaims.chat_model(backend),
        [search],
        system_prompt="You answer briefly. " * 20,
        middleware=[claims],
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": "chat-7"}}
    await agent.ainvoke(ask("first"), config)
    first = claims.last_session
    await agent.ainvoke(ask("second"), config)
    assert claims.last_session is not first
    assert {line["thread_id"] for line in events(tmp_path, "session_started")} == {"chat-7"}
    # the second turn's prompt starts with the first turn's: found in the cache
    assert claims.last_session.stats.cached_tokens > 0
    await backend.aclose()


async def test_a_tool_that_raises_ends_the_session_with_its_claims(tmp_path):
    @tool
    async def broken(query: str) -> str:
        """Always fails."""
        raise ValueError("no network")

    backend = EmbeddedBackend(2048, 16, script={"model": [tool_reply("broken"), "never"]})
    agent, claims = agent_with(backend, tools=[broken], log_dir=tmp_path)
    with pytest.raises(ValueError, match="no network"):
        await agent.ainvoke(ask())
    assert claims.last_session.end_reason == "error"
    assert claims.open_sessions == 0
    (call,) = events(tmp_path, "tool_call")
    assert call["error"] == "ValueError"
    assert {line["reason"] for line in events(tmp_path, "claim_ended")} == {"session_end"}
    (ended,) = events(tmp_path, "session_ended")
    assert (ended["reason"], ended["error"]) == ("error", "ValueError")
    await backend.aclose()


async def test_an_interrupt_closes_the_session_and_the_resumed_run_opens_one(tmp_path):
    """Human in the loop: the run pauses in a tool (`interrupt()`); its claims are let go
    (nothing held while a human thinks); the resumed run is claimed again, then ends."""

    @tool
    async def approve(query: str) -> str:
        """Ask a human."""
        return f"human said {interrupt('ok to search?')}"

    backend = EmbeddedBackend(2048, 16, script={"model": [tool_reply("approve"), "approved, done"]})
    claims = ClaimsMiddleware(backend, log_dir=tmp_path)
    agent = create_agent(
        agentclaims.chat_model(backend),
        [approve],
        middleware=[claims],
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": "hitl"}}
    paused = await agent.ainvoke(ask(), config)
    assert "__interrupt__" in paused
    first = claims.last_session
    assert first.end_reason == "closed"
    assert claims.open_sessions == 0
    done = await agent.ainvoke(Command(resume="yes"), config)
    assert done["messages"][-1].content == "approved, done"
    assert claims.last_session is not first
    assert claims.last_session.end_reason == "completed"
    assert claims.open_sessions == 0
    reasons = {line["session_id"]: line["reason"] for line in events(tmp_path, "session_ended")}
    assert reasons == {first.session_id: "closed", claims.last_session.session_id: "completed"}
    await backend.aclose()


async def test_fail_raises_before_the_tool_starts(tmp_path):
    ran: list[str] = []

    @tool
    def lookup(query: str) -> str:
        """Look it up."""
        ran.append(query)
        return "found"

    backend = EmbeddedBackend(
        2048, 16, script={"model": [tool_reply("lookup"), "done"]}, owner_cap_blocks=0
    )
    agent, claims = agent_with(
        backend, tools=[lookup], reaction="fail", reload_s_per_block=1.0, log_dir=tmp_path
    )
    with pytest.raises(ClaimRefused, match="owner_cap_exceeded"):
        await agent.ainvoke(ask())
    assert ran == []  # the tool never started
    assert claims.last_session.end_reason == "error"
    assert claims.open_sessions == 0
    assert events(tmp_path, "reaction_fail")
    await backend.aclose()


def test_a_synchronous_agent_invoke_is_claimed_too():
    """`agent.invoke` from plain synchronous code (a `def` tool): the session lives on the
    process's background loop, the calls go through the claims transport's sync client."""
    lookups: list[str] = []

    @tool
    def lookup(query: str) -> str:
        """Look it up."""
        lookups.append(threading.current_thread().name)
        return f"results for {query}"

    backend = EmbeddedBackend(2048, 16, script={"model": [tool_reply("lookup"), "done"]})
    agent, claims = agent_with(backend, tools=[lookup])
    result = agent.invoke(ask())
    assert result["messages"][-1].content == "done"
    stats = claims.last_session.stats
    # each call carries the claim on what it leaves cached (claims ride on calls): the first
    # is held across the tool, the answer's is let go once it calls no tool
    assert (stats.llm_calls, stats.tool_calls, stats.claims_accepted) == (2, 1, 2)
    assert stats.cached_tokens > 0
    assert claims.last_session.end_reason == "completed"
    assert claims.open_sessions == 0
    assert len(lookups) == 1


async def test_inside_claimed_session_the_middleware_uses_that_session(tmp_path):
    backend = EmbeddedBackend(2048, 16, script=SCRIPT)
    agent, claims = agent_with(backend)
    claimed = agentclaims.claimed_session(agent, backend=backend, log_dir=tmp_path)
    await claimed.ainvoke(ask())
    assert claims.last_session is None  # it opened none of its own
    assert claimed.last_session.stats.tool_calls == 1  # and counted the tool once
    assert len(events(tmp_path, "session_started")) == 1
    await backend.aclose()


async def test_a_model_that_bypasses_the_claims_transport_is_refused():
    backend = EmbeddedBackend(2048, 16, script=SCRIPT)
    claims = ClaimsMiddleware(backend)
    plain = ChatOpenAI(model="scripted", base_url="http://127.0.0.1:9/v1", api_key="k")
    agent = create_agent(plain, [search], middleware=[claims])
    with pytest.raises(UsageError, match=r"model.*agentclaims\.chat_model"):
        await agent.ainvoke(ask())
    assert claims.open_sessions == 0
    await backend.aclose()


def test_bad_options_are_refused_when_the_middleware_is_made():
    backend = EmbeddedBackend(64, 16)
    with pytest.raises(UsageError, match="horizon"):
        ClaimsMiddleware(backend, horizon=0)
    with pytest.raises(UnknownNameError, match="nope"):
        ClaimsMiddleware(backend, nope=1)  # type: ignore[call-arg]
    with pytest.raises(UsageError, match="backend"):
        ClaimsMiddleware(object())  # type: ignore[arg-type]


async def test_a_middleware_run_is_traced_as_one_session_span():
    """With a tracer provider, the middleware's session is one span, and the model and tool
    calls that ran in other LangGraph nodes are its children (OTel SDK, in-memory exporter)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    backend = EmbeddedBackend(2048, 16, script=SCRIPT)
    agent, _ = agent_with(backend, tracer_provider=provider)
    await agent.ainvoke(ask())
    spans = exporter.get_finished_spans()
    (session,) = [s for s in spans if s.name == "agentclaims.session"]
    assert session.attributes["agentclaims.session.end_reason"] == "completed"
    calls = [s for s in spans if s.name.startswith("chat ")]
    tools = [s for s in spans if s.name.startswith("execute_tool ")]
    assert len(calls) == 2
    assert [s.name for s in tools] == ["execute_tool search"]
    for span in (*calls, *tools):
        assert span.parent is not None
        assert span.parent.span_id == session.context.span_id
    assert {s.attributes["agentclaims.node"] for s in calls} == {"model"}
    await backend.aclose()


async def test_a_run_paused_between_nodes_keeps_its_session_until_resumed_or_closed(tmp_path):
    """``interrupt_before=["tools"]`` pauses the run between nodes (no hook sees it): its
    session stays open, holding the claim across the pause; the resumed run goes on in it and
    ends it; a run never resumed is ended by ``aclose()`` (``closed``), its claims let go."""
    backend = EmbeddedBackend(2048, 16, script=SCRIPT)
    claims = ClaimsMiddleware(backend, log_dir=tmp_path)
    agent = create_agent(
        agentclaims.chat_model(backend),
        [search],
        middleware=[claims],
        checkpointer=InMemorySaver(),
        interrupt_before=["tools"],
    )
    config = {"configurable": {"thread_id": "paused"}}
    await agent.ainvoke(ask(), config)
    assert claims.open_sessions == 1
    paused = claims.last_session
    assert paused.claims, "the claim is held across the pause"
    done = await agent.ainvoke(None, config)
    assert done["messages"][-1].content == "found three papers on it"
    assert claims.last_session is paused  # the same run, the same session
    assert paused.end_reason == "completed"
    # a run paused and never resumed
    await agent.ainvoke(ask(), {"configurable": {"thread_id": "abandoned"}})
    assert claims.open_sessions == 1
    left = claims.last_session
    await claims.aclose()
    assert claims.open_sessions == 0
    assert left.end_reason == "closed"
    assert not left.claims
    await backend.aclose()


async def test_a_tool_loops_first_call_carries_its_claim(backend, tmp_path):
    """A node's first call, before anything is learned of the agent, carries its claim on
    what it leaves cached (the agent's graph has a tool step after the model: its reply is
    expected to call one), held across the tool: no claim goes through the claims API on its
    own."""
    agent, _ = agent_with(backend, log_dir=tmp_path)
    before = (await backend.metrics())["gateway"]["calls"]
    await agent.ainvoke(ask())
    after = (await backend.metrics())["gateway"]["calls"]
    lines = list(log_lines(tmp_path))
    kinds = [line["event"] for line in lines]
    first_call = kinds.index("llm_call")
    planned = [line for line in lines[:first_call] if line["event"] == "claim_planned"]
    assert [line["prefix_id"] for line in planned] == ["@sequence"], kinds[: first_call + 1]
    assert after.get("POST /v1/claims", 0) == before.get("POST /v1/claims", 0), after
    (held,) = events(tmp_path, "tool_call")
    assert held["claim_ids"] == [planned[0]["claim_id"]]  # the first call's, across the tool
