"""Every graph method a LangGraph user calls, claimed: sync nodes, sync graph methods, batches,
every stream mode, token events, and clean ends (early break, aclose, cancellation, errors),
on the embedded default and over a real `agentclaims serve` process on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest
from langchain_core.tools import tool as langchain_tool
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import create_react_agent
from surface import SCRIPT, ask, log_lines, search, sync_graph

import agentclaims
from agentclaims.backends.embedded import EmbeddedBackend
from agentclaims.backends.http import HTTPBackend
from agentclaims.backends.pool import BackendPool
from agentclaims.bindings.decorators import claimed_session
from agentclaims.errors import UsageError
from agentclaims.session import ClaimedSession

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def react(backend: Any, **options: Any) -> Any:
    agent = create_react_agent(agentclaims.chat_model(backend), [search])
    return claimed_session(agent, backend=backend, **options)


def ended(session: ClaimedSession | None) -> str | None:
    assert session is not None
    assert session.claims == {}, "every claim released"
    assert all(c.end_reason is not None for c in session.ended_claims)
    return session.end_reason


def session_lines(tmp_path: Any, event: str) -> list[dict[str, Any]]:
    return [line for line in log_lines(tmp_path) if line["event"] == event]


# ---------------------------------------------------------------------- sync use


async def test_sync_node_invoke_under_ainvoke(backend):
    """A `def` node calling `model.invoke()` runs claimed while the graph runs under ainvoke."""
    claimed = claimed_session(sync_graph(agentclaims.chat_model(backend)), backend=backend)
    result = await claimed.ainvoke(ask())
    assert result["messages"][-1].content == "a plain answer in five words"
    assert claimed.last_session is not None
    assert claimed.last_session.stats.llm_calls == 1
    assert claimed.last_session.stats.prompt_tokens > 0
    assert ended(claimed.last_session) == "completed"


async def test_sync_node_stream_under_ainvoke(backend):
    """`model.stream()` in a `def` node: the tokens arrive in pieces and the call is claimed."""
    claimed = claimed_session(
        sync_graph(agentclaims.chat_model(backend), streamed=True), backend=backend
    )
    result = await claimed.ainvoke(ask())
    assert result["messages"][-1].content == "a plain answer in five words"
    assert claimed.last_session.stats.llm_calls == 1


def _sync_backend(kind: str, url: str | None) -> Any:
    if kind == "embedded":
        return EmbeddedBackend(num_blocks=2048, block_size=16, script=SCRIPT)
    assert url is not None
    return HTTPBackend(url)


@pytest.mark.parametrize("kind", ["embedded", "http"])
def test_sync_invoke_stream_batch_from_plain_code(kind, request, tmp_path):
    """`invoke`, `stream` and `batch` from synchronous code, with sync nodes and a ReAct agent:
    each run in a session of its own, logged start to end."""
    url = request.getfixturevalue("gateway_url") if kind == "http" else None
    backend = _sync_backend(kind, url)
    claimed = claimed_session(
        sync_graph(agentclaims.chat_model(backend)), backend=backend, log_dir=tmp_path
    )
    assert claimed.invoke(ask())["messages"][-1].content == "a plain answer in five words"
    chunks = list(claimed.stream(ask(), stream_mode="updates"))
    assert [list(c) for c in chunks] == [["answer"]]
    outputs = claimed.batch([ask("one"), ask("two"), ask("three")])
    assert len(outputs) == 3
    agent = react(backend, log_dir=tmp_path)
    assert agent.invoke(ask())["messages"][-1].content == "found three papers on it"
    assert agent.last_session.stats.claims_submitted >= 1
    assert agent.last_session.stats.tool_calls == 1
    starts = session_lines(tmp_path, "session_started")
    ends = session_lines(tmp_path, "session_ended")
    assert len(starts) == len(ends) == 6  # invoke, stream, 3 batch inputs, the agent
    assert len({line["workflow_id"] for line in ends}) == 6
    assert {line["reason"] for line in ends} == {"completed"}


async def test_abatch_gives_each_input_its_own_session(backend, tmp_path):
    agent = react(backend, log_dir=tmp_path)
    results = await agent.abatch([ask("a"), ask("b")])
    assert [r["messages"][-1].content for r in results] == ["found three papers on it"] * 2
    ends = session_lines(tmp_path, "session_ended")
    assert len({line["session_id"] for line in ends}) == 2
    assert all(line["llm_calls"] == 2 and line["tool_calls"] == 1 for line in ends)
    done = [i async for i, _ in agent.abatch_as_completed([ask("c"), ask("d")])]
    assert sorted(done) == [0, 1]
    assert len(session_lines(tmp_path, "session_ended")) == 4


async def test_sync_call_inside_the_loop_is_refused(backend):
    """A synchronous graph method inside a running loop would block it: a clear error."""
    claimed = claimed_session(sync_graph(agentclaims.chat_model(backend)), backend=backend)
    with pytest.raises(UsageError, match="running event loop"):
        claimed.invoke(ask())
    with pytest.raises(AttributeError, match=r"\.graph"):
        claimed.astream_log  # noqa: B018 - not claimed: reach it on .graph


# ---------------------------------------------------------------------- streaming


def _moded(chunk: Any) -> tuple[str, Any]:
    return chunk if isinstance(chunk, tuple) else ("single", chunk)


@pytest.mark.parametrize(
    "mode", ["values", "updates", "messages", "custom", "debug", ["messages", "updates", "custom"]]
)
async def test_astream_every_mode(backend, mode, tmp_path):
    """`astream` in each stream mode (and several at once) on a claimed ReAct agent with a
    node writing custom chunks: the chunks of the mode come, and the run is claimed."""

    def note(state: MessagesState) -> dict[str, Any]:
        get_stream_writer()({"progress": len(state["messages"])})
        return {}

    inner = create_react_agent(agentclaims.chat_model(backend), [search])
    builder = StateGraph(MessagesState)
    builder.add_node("note", note)
    builder.add_node("react", inner)
    builder.add_edge(START, "note")
    builder.add_edge("note", "react")
    builder.add_edge("react", END)
    claimed = claimed_session(builder.compile(), backend=backend, log_dir=tmp_path)
    seen: dict[str, int] = {}
    tokens = []
    async for chunk in claimed.astream(ask(), stream_mode=mode, subgraphs=True):
        namespace, rest = chunk[0], chunk[1:]
        assert isinstance(namespace, tuple)
        kind, payload = (rest[0], rest[1]) if len(rest) == 2 else (str(mode), rest[0])
        seen[kind] = seen.get(kind, 0) + 1
        if kind == "messages":
            tokens.append(payload[0].content)
    modes = [mode] if isinstance(mode, str) else mode
    assert set(seen) == set(modes)
    if "messages" in modes:
        assert "".join(t for t in tokens if isinstance(t, str)).endswith("found three papers on it")
        assert sum(1 for t in tokens if t) > 3  # in pieces, not one message
    session = claimed.last_session
    assert session.stats.llm_calls == 2
    assert session.stats.claims_submitted >= 1
    assert session.stats.tool_calls == 1
    assert ended(session) == "completed"


async def test_astream_events_token_stream(backend):
    agent = react(backend)
    tokens = [
        ev["data"]["chunk"].content
        async for ev in agent.astream_events(ask(), version="v2")
        if ev["event"] == "on_chat_model_stream"
    ]
    assert "".join(tokens) == "found three papers on it"
    assert len([t for t in tokens if t]) == 5
    assert agent.last_session.stats.llm_calls == 2
    assert agent.last_session.stats.claims_accepted >= 1
    assert ended(agent.last_session) == "completed"


# ---------------------------------------------------------------------- clean ends


async def test_early_break_ends_the_session_once(backend, tmp_path):
    agent = react(backend, log_dir=tmp_path)
    stream = agent.astream(ask(), stream_mode="updates")
    async for _chunk in stream:
        break  # the agent's first reply came with its claim
    await stream.aclose()
    await stream.aclose()  # twice: still one end
    assert ended(agent.last_session) == "closed"
    ends = session_lines(tmp_path, "session_ended")
    assert [line["reason"] for line in ends] == ["closed"]
    assert ends[0]["error"] is None
    claim_ends = session_lines(tmp_path, "claim_ended")
    assert claim_ends
    assert {line["reason"] for line in claim_ends} == {"session_end"}


async def test_break_without_aclose_ends_the_session(backend):
    """Leaving `async for` early (the generator closed by the loop later, in another context)
    raises nothing and still ends the session."""
    agent = react(backend)
    async for _chunk in agent.astream(ask()):
        break
    for _ in range(50):
        if agent.last_session.end_reason is not None:
            break
        await asyncio.sleep(0.01)
    assert ended(agent.last_session) == "closed"


async def test_cancellation_and_errors_end_the_session(backend, tmp_path):
    started, never = asyncio.Event(), asyncio.Event()

    @langchain_tool
    async def search(query: str) -> str:
        """Search the papers (forever)."""
        started.set()
        await never.wait()
        return "never"

    agent = claimed_session(
        create_react_agent(agentclaims.chat_model(backend), [search]),
        backend=backend,
        log_dir=tmp_path,
    )

    async def consume() -> None:
        async for _chunk in agent.astream(ask()):
            pass

    task = asyncio.ensure_future(consume())
    await asyncio.wait_for(started.wait(), 10)  # the graph runs the tool
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ended(agent.last_session) == "cancelled"

    def broken(state: MessagesState) -> dict[str, Any]:
        raise RuntimeError("the node broke")

    builder = StateGraph(MessagesState)
    builder.add_node("broken", broken)
    builder.add_edge(START, "broken")
    claimed = claimed_session(builder.compile(), backend=backend, log_dir=tmp_path)
    with pytest.raises(RuntimeError, match="the node broke"):
        async for _chunk in claimed.astream(ask()):
            pass
    assert ended(claimed.last_session) == "error"
    with pytest.raises(RuntimeError, match="the node broke"):
        await claimed.ainvoke(ask())
    ends = {line["reason"]: line for line in session_lines(tmp_path, "session_ended")}
    assert set(ends) == {"cancelled", "error"}
    assert ends["error"]["error"] == "RuntimeError"


def test_sync_stream_early_break(request):
    backend = EmbeddedBackend(num_blocks=2048, block_size=16, script=SCRIPT)
    agent = react(backend)
    for _chunk in agent.stream(ask()):
        break
    assert ended(agent.last_session) == "closed"


async def test_early_break_releases_pool_affinity():
    members = [
        EmbeddedBackend(num_blocks=2048, block_size=16, script=SCRIPT, name=f"m{i}")
        for i in range(2)
    ]
    pool = BackendPool(members)
    agent = claimed_session(
        create_react_agent(agentclaims.chat_model(members[0]), [search]), backend=pool
    )
    async with contextlib.aclosing(agent.astream(ask())) as stream:
        async for _chunk in stream:
            assert pool._affinity  # the run holds its member
            break
    assert ended(agent.last_session) == "closed"
    assert pool._affinity == {}
    assert set(pool._load.values()) == {0}
    for member in members:
        assert [c for c in member.engine._claims.values() if c.state.live] == []
        await member.aclose()


# ---------------------------------------------------------------------- per-run handles


async def test_each_run_has_its_own_handle(backend, tmp_path):
    """`claimed.run()` gives one run's session, stats and log path, also for concurrent runs."""
    agent = react(backend, log_dir=tmp_path)
    first, second = agent.run(workflow_id="wf-first"), agent.run()
    plain = claimed_session(sync_graph(agentclaims.chat_model(backend)), backend=backend)
    other = plain.run(log_dir=tmp_path)
    results = await asyncio.gather(
        first.ainvoke(ask()), second.ainvoke(ask()), other.ainvoke(ask())
    )
    assert [r["messages"][-1].content for r in results[:2]] == ["found three papers on it"] * 2
    assert first.stats.llm_calls == second.stats.llm_calls == 2
    assert first.stats.tool_calls == 1
    assert other.stats.llm_calls == 1
    assert other.stats.tool_calls == 0
    assert first.log_path == tmp_path / "wf-first.jsonl"
    lines = [json.loads(line) for line in first.log_path.read_text().splitlines()]
    assert {line["workflow_id"] for line in lines} == {"wf-first"}
    assert second.log_path is not None
    assert second.log_path != first.log_path
    assert second.session_of_run.end_reason == "completed"
    with pytest.raises(UsageError, match="runs once"):
        await first.ainvoke(ask())
    with pytest.raises(UsageError, match="one run"):
        await first.abatch([ask()])
    chunks = [c async for c in agent.run().astream(ask(), stream_mode="updates")]
    assert chunks


async def test_a_refusal_inside_a_session_is_the_sdks_error_with_the_detail():
    backend = EmbeddedBackend(num_blocks=8, block_size=4)
    client = agentclaims.openai_client(backend)
    with pytest.raises(agentclaims.ClaimRefused, match=r"short by \d+ blocks; blocking claims"):
        async with ClaimedSession(backend, reaction="fail"):
            await client.completions.create(model="scripted", prompt=list(range(64)))
    await backend.aclose()


@pytest.mark.parametrize("kind", ["embedded", "http"])
def test_sync_clients_outside_a_session(kind, request):
    """The sync chat model and OpenAI client work in plain code with no session (on the
    background loop), streaming chunk by chunk."""
    url = request.getfixturevalue("gateway_url") if kind == "http" else None
    backend = _sync_backend(kind, url)
    model = agentclaims.chat_model(backend)
    assert model.invoke("hello").content == "a plain answer in five words"
    pieces = [chunk.content for chunk in model.stream("hello")]
    assert "".join(pieces) == "a plain answer in five words"
    assert len([p for p in pieces if p]) == 6
    client = agentclaims.openai_sync_client(backend)
    reply = client.chat.completions.create(
        model="scripted", messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.choices[0].message.content == "a plain answer in five words"
