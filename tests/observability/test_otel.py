"""OpenTelemetry traces of claimed sessions (``agentclaims.observability.otel``): real LangGraph
runs on the embedded default, on the fake backend and over a real gateway process, exported
by the OpenTelemetry SDK's in-memory exporter; every span checked against the JSONL outcome
log of the same run. Without tracing nothing imports ``opentelemetry``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from planners import Always
from servers import gateway_process

import agentclaims
from agentclaims.backends.http import HTTPBackend
from agentclaims.contract import ProtectionMode
from agentclaims.errors import UsageError
from agentclaims.gateway.text import Reply
from agentclaims.observability import WorkflowLog
from agentclaims.observability.otel import SESSION_SPAN, SessionTracer
from agentclaims.session import ClaimedSession
from agentclaims.testing import FakeBackend, OutcomeLog

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = {"model": [Reply.tool("search", {"query": "kv"}), "found three papers"]}


@tool
async def search(query: str) -> str:
    """Search."""
    await asyncio.sleep(0.02)
    return f"results for {query}"


@pytest.fixture
def traced() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """A tracer provider of the test's own (the global one is never set here)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def wall_ns(stamp: str) -> int:
    when = datetime.fromisoformat(stamp)
    return int(when.timestamp()) * 1_000_000_000 + when.microsecond * 1_000


def lines_of(path: Path | None) -> list[dict[str, Any]]:
    assert path is not None
    return [json.loads(line) for line in path.read_text().splitlines()]


def spans_named(spans: list[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def event_names(span: ReadableSpan) -> list[str]:
    return [e.name for e in span.events]


def check_trace_against_log(spans: list[ReadableSpan], lines: list[dict[str, Any]]) -> ReadableSpan:
    """The span tree of one session's run says what its outcome log says; its session span."""
    [session] = spans_named(spans, SESSION_SPAN)
    started = next(d for d in lines if d["event"] == "session_started")
    ended = next(d for d in lines if d["event"] == "session_ended")
    attrs = session.attributes or {}
    assert attrs["agentclaims.workflow.id"] == started["workflow_id"]
    assert attrs["agentclaims.session.id"] == started["session_id"]
    assert attrs["agentclaims.backend"] == started["backend"]
    assert attrs["agentclaims.session.end_reason"] == ended["reason"] == "completed"
    assert session.start_time == wall_ns(started["timestamp"])
    assert session.end_time == wall_ns(ended["timestamp"])
    assert session.context is not None
    ours = [s for s in spans if s.name.startswith(("chat", "claim", "execute_tool"))]
    for span in ours:  # every call, claim and tool span is a child of the session span
        assert span.parent is not None, span.name
        assert span.parent.span_id == session.context.span_id, span.name
        assert span.context is not None
        assert span.context.trace_id == session.context.trace_id
        assert session.start_time is not None
        assert span.start_time is not None
        assert span.end_time is not None
        assert session.end_time is not None
        assert session.start_time <= span.start_time <= span.end_time <= session.end_time

    calls = [d for d in lines if d["event"] == "llm_call"]
    by_response = {
        (s.attributes or {})["gen_ai.response.id"]: s for s in spans_named(spans, "chat")
    }
    assert len(by_response) == len(calls) == ended["llm_calls"] >= 2
    for call in calls:
        span = by_response[call["request_id"]]
        a = span.attributes or {}
        assert span.name == f"chat {call['model']}"
        assert span.kind is SpanKind.CLIENT
        assert a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.provider.name"] == "agentclaims"
        assert a["gen_ai.request.model"] == call["model"]
        assert a["gen_ai.usage.input_tokens"] == call["prompt_tokens"]
        assert a["gen_ai.usage.output_tokens"] == call["completion_tokens"]
        assert a["gen_ai.usage.cache_read.input_tokens"] == call["cached_tokens"]
        assert a["agentclaims.cached_tokens"] == call["cached_tokens"]
        assert a["agentclaims.recomputed_tokens"] == call["recomputed_tokens"]
        assert a["agentclaims.node"] == call["node"]
        assert a["agentclaims.step"] == call["step"]
        assert a.get("agentclaims.claim.id") == call["claim_id"]
        assert a["agentclaims.claim.outcome"] != "unclaimed" or call["claim_id"] is None
        assert span.end_time == wall_ns(call["timestamp"])
        assert span.start_time is not None
        assert span.end_time is not None
        assert abs((span.end_time - span.start_time) / 1e9 - call["latency_s"]) < 2e-9

    planned = [d for d in lines if d["event"] == "claim_planned"]
    ends = {d["claim_id"]: d for d in lines if d["event"] == "claim_ended"}
    claims = {(s.attributes or {})["agentclaims.claim.id"]: s for s in spans_named(spans, "claim")}
    assert set(claims) == {d["claim_id"] for d in planned}
    assert claims
    for plan in planned:
        span = claims[plan["claim_id"]]
        a = span.attributes or {}
        assert span.name == f"claim {plan['mode']}"
        assert a["agentclaims.claim.mode"] == plan["mode"]
        assert a.get("agentclaims.claim.ttl_s") == plan["ttl_s"]
        assert a.get("agentclaims.claim.expected_wait_s") == plan["expected_wait_s"]
        assert a["agentclaims.claim.wait_learned"] is plan["wait_learned"]
        assert a["agentclaims.node"] == plan["node"]
        assert a["agentclaims.prefix_id"] == plan["prefix_id"]
        assert span.start_time == wall_ns(plan["timestamp"])
        assert "resident_claim_submitted" in event_names(span)
        end = ends.get(plan["claim_id"])
        if end is not None:  # ended by the session: with its reason, at or after the line
            assert a["agentclaims.claim.end_reason"] == end["reason"]
            assert a["agentclaims.claim.held_s"] == end["held_s"]
            assert span.end_time is not None
            assert span.end_time >= wall_ns(end["timestamp"])
            assert "agentclaims.claim.open_at_session_end" not in a

    tools = [d for d in lines if d["event"] == "tool_call"]
    tool_spans = spans_named(spans, "execute_tool")
    assert len(tool_spans) == len(tools) == ended["tool_calls"] >= 1
    for line, span in zip(tools, sorted(tool_spans, key=lambda s: s.end_time or 0), strict=True):
        a = span.attributes or {}
        assert span.name == f"execute_tool {line['tool']}"
        assert a["gen_ai.tool.name"] == line["tool"]
        assert a["agentclaims.tool.duration_s"] == line["duration_s"]
        assert a["agentclaims.tool.predicted_s"] == line["predicted_s"]
        assert a.get("agentclaims.claim.ttl_s") == line["ttl_s"]
        assert list(a["agentclaims.claim.ids"]) == line["claim_ids"]
        assert a["agentclaims.node"] == line["node"]
        assert span.end_time == wall_ns(line["timestamp"])
        assert span.start_time is not None
        assert span.end_time is not None
        assert abs((span.end_time - span.start_time) / 1e9 - line["duration_s"]) < 2e-9
        for cid in line["claim_ids"]:  # linked to the claims held across it
            linked = {link.context.span_id for link in span.links}
            claim_context = claims[cid].context
            assert claim_context is not None
            assert claim_context.span_id in linked
    return session


async def test_a_react_run_is_a_session_span_with_call_claim_and_tool_spans(tmp_path, traced):
    """A LangChain agent (`create_agent`) on the embedded default, run inside the application's own span:
    the session span is its child, the LLM calls, claims and the tool call are the session
    span's, with the tokens, modes, TTLs and end reasons of the JSONL log of the same run; a
    span the tool itself starts nests in the session span."""
    provider, exporter = traced
    app = provider.get_tracer("app")

    @tool
    async def lookup(query: str) -> str:
        """Search."""
        with app.start_as_current_span("lookup-backend"):
            await asyncio.sleep(0.02)
        return f"results for {query}"

    script = {"model": [Reply.tool("lookup", {"query": "kv"}), "found three papers"]}
    backend = agentclaims.EmbeddedBackend(num_blocks=512, block_size=16, script=script)
    agent = agentclaims.claimed_session(
        create_agent(agentclaims.chat_model(backend), [lookup]),
        backend=backend,
        log_dir=tmp_path,
        tracer_provider=provider,
    )
    run = agent.run()
    with app.start_as_current_span("handle-request") as outer:
        result = await run.ainvoke({"messages": [HumanMessage("find")]})
    await backend.aclose()
    assert result["messages"][-1].content == "found three papers"
    spans = list(exporter.get_finished_spans())
    session = check_trace_against_log(spans, lines_of(run.log_path))
    assert session.parent is not None
    assert session.parent.span_id == outer.get_span_context().span_id
    [inner] = spans_named(spans, "lookup-backend")
    assert inner.parent is not None
    assert session.context is not None
    assert inner.parent.span_id == session.context.span_id
    # each call carries the claim on what it leaves cached: the first is held across the
    # tool, the answer's is let go as its reply calls no tool (the run ends there)
    claims = spans_named(spans, "claim")
    ends = sorted((c.attributes or {})["agentclaims.claim.end_reason"] for c in claims)
    assert ends == ["session_end", "superseded"]
    [claim] = [
        c for c in claims if (c.attributes or {})["agentclaims.claim.end_reason"] == "superseded"
    ]
    a = claim.attributes or {}
    assert a["agentclaims.claim.outcome"] == "accepted"
    assert a["agentclaims.claim.harmed"] is False
    assert a["agentclaims.claim.end_reason"] == "superseded"
    names = event_names(claim)
    assert names.index("resident_claim_accepted") < names.index("tool_call")
    assert names.index("claim_ended") < names.index("resident_claim_expired")
    [held_call] = [
        s for s in spans_named(spans, "chat") if (s.attributes or {}).get("agentclaims.claim.id")
    ]
    assert (held_call.attributes or {})["agentclaims.claim.outcome"] == "materialized"
    assert (held_call.attributes or {})["agentclaims.cached_tokens"] > 0
    assert run.session_of_run.tracer is not None
    assert not run.session_of_run.tracer.open_claims


@pytest.fixture(scope="module")
def gateway_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `agentclaims serve` process with the scripted replies of ``SCRIPT``."""
    script = tmp_path_factory.mktemp("gw") / "script.json"
    script.write_text(
        json.dumps({"model": [{"tool": "search", "arguments": {"query": "kv"}}, "found it"]})
    )
    with gateway_process("--blocks", "1024", "--block-size", "16", "--script", str(script)) as url:
        yield url


async def test_a_run_over_a_real_gateway_process_is_traced(tmp_path, traced, gateway_url):
    """The same span tree over HTTP to a real gateway process, with expiring claims: the
    claim spans carry the mode and TTL the log gives them."""
    provider, exporter = traced
    backend = HTTPBackend(gateway_url)
    agent = agentclaims.claimed_session(
        create_agent(agentclaims.chat_model(backend), [search]),
        backend=backend,
        log_dir=tmp_path,
        planner=Always(ProtectionMode.EXPIRING, ttl_s=5.0),
        tracing=True,
        tracer_provider=provider,
    )
    run = agent.run()
    result = await run.ainvoke({"messages": [HumanMessage("find")]})
    await backend.aclose()
    assert result["messages"][-1].content == "found it"
    spans = list(exporter.get_finished_spans())
    lines = lines_of(run.log_path)
    session = check_trace_against_log(spans, lines)
    assert session.parent is None  # no span was current: a trace of its own
    assert (session.attributes or {})["agentclaims.backend"] == backend.name
    claims = spans_named(spans, "claim expiring")
    assert claims
    for claim in claims:
        a = claim.attributes or {}
        assert a["agentclaims.claim.mode"] == "expiring"
        assert a["agentclaims.claim.ttl_s"] == 5.0
        assert a["agentclaims.claim.end_reason"] in ("superseded", "session_end")


async def test_a_harmed_claim_span_says_so(tmp_path, traced):
    """The tool evicts the agent's claimed prefix (a soft claim: true harm): the claim span
    has the harm event with its cause, ``agentclaims.claim.harmed`` and an error status."""
    provider, exporter = traced
    backend = FakeBackend(num_blocks=256, block_size=16, script=SCRIPT)

    @tool
    async def evicting(query: str) -> str:
        """Search, while the engine evicts the agent's prefix."""
        session = agentclaims.current_session()
        assert session is not None
        await session.settle()
        backend.kv.evict(session.claims["model"].prefix_id)
        return f"results for {query}"

    script = {"model": [Reply.tool("evicting", {"query": "kv"}), "found three papers"]}
    backend.model.script = script
    agent = agentclaims.claimed_session(
        create_agent(agentclaims.chat_model(backend), [evicting]),
        backend=backend,
        log_dir=tmp_path,
        planner=Always(ProtectionMode.SOFT_PRIORITY),
        tracer_provider=provider,
    )
    run = agent.run()
    await run.ainvoke({"messages": [HumanMessage("find")]})
    await backend.aclose()
    assert run.stats.claims_harmed == 1
    lines = lines_of(run.log_path)
    [harm] = [d for d in lines if d["event"] == "resident_claim_harmed"]
    spans = list(exporter.get_finished_spans())
    check_trace_against_log(spans, lines)
    harmed = [
        s for s in spans_named(spans, "claim") if (s.attributes or {})["agentclaims.claim.harmed"]
    ]
    [claim] = harmed
    a = claim.attributes or {}
    assert a["agentclaims.claim.id"] == harm["claim_id"]
    assert a["agentclaims.claim.harm_cause"] == harm["cause"] == "evicted"
    assert a["agentclaims.claim.state"] == "harmed"
    assert claim.status.status_code is StatusCode.ERROR
    [event] = [e for e in claim.events if e.name == "resident_claim_harmed"]
    assert (event.attributes or {})["cause"] == "evicted"
    assert event.timestamp == wall_ns(harm["timestamp"])
    others = [s for s in spans_named(spans, "claim") if s is not claim]
    assert all(not (s.attributes or {})["agentclaims.claim.harmed"] for s in others)


async def test_deferrals_and_refusals_land_on_their_call_and_claim(traced):
    """The engine defers the first call once and refuses hard claims: the deferral is an
    event of that call's span (``agentclaims.deferrals``), the refused claim's span has the
    rejection and the session's relaxation, outcome ``refused``; the relaxed claim is a span
    of its own."""
    provider, exporter = traced
    backend = FakeBackend(num_blocks=256, block_size=16, script=SCRIPT)
    backend.kv.defer_requests(n=1, retry_after_s=0.01)
    backend.kv.refuse_claims(mode="hard_protected", reason="no_room")
    log = OutcomeLog()
    agent = agentclaims.claimed_session(
        create_agent(agentclaims.chat_model(backend), [search]),
        backend=backend,
        log_stream=log,
        planner=Always(ProtectionMode.HARD_PROTECTED, ttl_s=1.0),
        tracer_provider=provider,
    )
    await agent.ainvoke({"messages": [HumanMessage("find")]})
    await backend.aclose()
    spans = list(exporter.get_finished_spans())
    # the call's deferral (around a tool, the session asks again for the refused pin too)
    [defer] = [r for r in log.reactions("defer") if not r.get("tool")]
    [first] = [
        s
        for s in spans_named(spans, "chat")
        if (s.attributes or {})["gen_ai.response.id"] == log.of("llm_call")[0]["request_id"]
    ]
    assert (first.attributes or {})["agentclaims.deferrals"] == 1
    assert (first.attributes or {})["agentclaims.deferral_s"] == defer["delay_s"]
    assert "reaction_defer" in event_names(first)
    [session] = spans_named(spans, SESSION_SPAN)
    assert "reaction_defer" not in event_names(session)
    refused = spans_named(spans, "claim hard_protected")
    assert refused
    for claim in refused:
        a = claim.attributes or {}
        assert a["agentclaims.claim.outcome"] == "refused"
        assert a["agentclaims.claim.refusal_reason"] == "no_room"
        assert a["agentclaims.claim.state"] == "refused"
        assert "resident_claim_rejected" in event_names(claim)
        assert "agentclaims.claim.open_at_session_end" not in a
    # the planned pin, relaxed; the tool's deferral asked for it again, strictly (no relax)
    assert any("reaction_relax" in event_names(claim) for claim in refused)
    relaxed = spans_named(spans, "claim expiring")
    assert relaxed
    assert all((s.attributes or {})["agentclaims.claim.outcome"] == "accepted" for s in relaxed)


def test_claims_left_open_are_ended_with_the_session(traced):
    """Records fed to the tracer by hand: a claim the session never ended is ended with the
    session span, marked ``agentclaims.claim.open_at_session_end``; a record of no known kind
    is a session span event."""
    provider, exporter = traced
    tracer = SessionTracer(provider)
    log = WorkflowLog("wf-open", "s-open", listeners=[tracer], thread_id="t-9")
    log.session("session_started", backend="fake")
    log.claim_planned("s-open-c1", "pfx-1", "hard_protected", ttl_s=2.0, node="agent")
    log.reaction("replan", claim_id="s-other", outcome="x", node="agent")
    log.session("session_ended", reason="error", error="ValueError", llm_calls=0)
    log.close()
    [claim] = spans_named(list(exporter.get_finished_spans()), "claim")
    [session] = spans_named(list(exporter.get_finished_spans()), SESSION_SPAN)
    assert (claim.attributes or {})["agentclaims.claim.open_at_session_end"] is True
    assert claim.end_time == session.end_time
    assert event_names(session) == ["reaction_replan"]
    a = session.attributes or {}
    assert a["agentclaims.thread.id"] == a["gen_ai.conversation.id"] == "t-9"
    assert a["error.type"] == "ValueError"
    assert session.status.status_code is StatusCode.ERROR
    tracer.close()  # idempotent
    assert len(exporter.get_finished_spans()) == 2


def test_workflow_log_delivers_records_to_listeners_without_a_sink():
    """A log with listeners and no file or stream: each listener gets every record (a dict
    of its own, envelope included); one that raises is counted, warned about once, and does
    not stop the others; bad listeners are refused."""
    got: list[dict[str, Any]] = []

    def broken(record: dict[str, Any]) -> None:
        raise RuntimeError("no")

    log = WorkflowLog("wf-l", "s-l", listeners=[broken, got.append])
    with pytest.warns(RuntimeWarning, match="listener"):
        log.session("session_started", backend="b")
    log.tool_call("search", 0.5, claim_ids=["c1"], node="agent")
    log.close()
    assert [d["event"] for d in got] == ["session_started", "tool_call"]
    for record in got:
        assert {"workflow_id", "session_id", "timestamp", "ts_ns"} <= set(record)
    assert got[1]["claim_ids"] == ["c1"]
    assert log.listener_errors == 2
    assert log.path is None
    with pytest.raises(UsageError, match="listeners"):
        WorkflowLog("wf-l", "s-l", listeners=[42])  # type: ignore[list-item]
    with pytest.raises(UsageError, match="directory"):
        WorkflowLog("wf-l", "s-l")


async def test_bad_tracing_options_are_refused():
    """``tracing`` is True, False or None and ``tracer_provider`` a provider: anything else is
    a ``UsageError`` naming the option, at construction and at decoration; ``tracing=True``
    without the OpenTelemetry API says how to install it. ``tracing=False`` traces nothing,
    even with a provider."""
    backend = agentclaims.EmbeddedBackend(num_blocks=64, block_size=16)
    for bad in ("yes", 1, 0, "auto"):
        with pytest.raises(UsageError, match="tracing"):
            ClaimedSession(backend, tracing=bad)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="tracer_provider"):
        ClaimedSession(backend, tracer_provider=object())  # type: ignore[arg-type]
    graph = create_agent(agentclaims.chat_model(backend), [search])
    with pytest.raises(UsageError, match="tracing"):
        agentclaims.claimed_session(graph, backend=backend, tracing="on")  # type: ignore[arg-type]
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with ClaimedSession(backend, tracing=False, tracer_provider=provider) as session:
        pass
    assert session.tracer is None
    assert session.log is None
    assert exporter.get_finished_spans() == ()
    await backend.aclose()


def test_tracing_true_without_the_api_says_how_to_install_it(monkeypatch):
    backend = agentclaims.EmbeddedBackend(num_blocks=64, block_size=16)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    monkeypatch.setitem(sys.modules, "opentelemetry.trace", None)
    with pytest.raises(UsageError, match=r"tracing.*agentclaims\[otel\]"):
        ClaimedSession(backend, tracing=True)


def _python(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_nothing_imports_opentelemetry_without_tracing():
    """``import agentclaims`` and sessions with tracing off or auto (no provider: auto looks
    at ``sys.modules`` only) never import ``opentelemetry``."""
    out = _python(
        """
        import asyncio, sys
        import agentclaims
        assert "opentelemetry" not in sys.modules

        async def main():
            script = {"*": [agentclaims.Reply.tool("search", {"q": "kv"}), "Done."]}
            backend = agentclaims.EmbeddedBackend(num_blocks=128, block_size=16, script=script)
            client = agentclaims.openai_client(backend)
            for tracing in (None, False):
                async with agentclaims.ClaimedSession(backend, tracing=tracing) as session:
                    messages = [{"role": "user", "content": "find"}]
                    await client.chat.completions.create(model="scripted", messages=messages)
                    async with session.tool_call("search"):
                        await asyncio.sleep(0.01)
                assert session.tracer is None and session.stats.llm_calls == 1
            await backend.aclose()

        asyncio.run(main())
        print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
        """
    )
    assert out == "[]"


def test_auto_tracing_follows_the_global_provider():
    """``tracing=None``: off while OpenTelemetry's default (proxy) provider is the global one,
    even with ``opentelemetry`` imported; on once the application sets a provider."""
    out = _python(
        """
        import asyncio
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        import agentclaims

        async def run(backend):
            client = agentclaims.openai_client(backend)
            async with agentclaims.ClaimedSession(backend) as session:
                messages = [{"role": "user", "content": "hello"}]
                await client.chat.completions.create(model="scripted", messages=messages)
            return session

        async def main():
            backend = agentclaims.EmbeddedBackend(num_blocks=128, block_size=16)
            assert (await run(backend)).tracer is None
            exporter = InMemorySpanExporter()
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            trace.set_tracer_provider(provider)
            assert (await run(backend)).tracer is not None
            await backend.aclose()
            print(sorted(s.name for s in exporter.get_finished_spans()))

        asyncio.run(main())
        """
    )
    assert out == "['agentclaims.session', 'chat scripted']"


@pytest.mark.parametrize("sync_tool", [False, True])
async def test_under_the_middleware_spans_in_tools_nest_in_the_session_span(
    traced: tuple[TracerProvider, InMemorySpanExporter], sync_tool: bool
) -> None:
    """``ClaimsMiddleware`` as ``claimed_session``: inside the agent's tools (async, and sync
    ones LangGraph runs in a thread) the session span is the current span, so a span the
    application starts there is its child, in the same trace."""
    provider, exporter = traced
    app = provider.get_tracer("app")

    if sync_tool:

        @tool
        def lookup(query: str) -> str:
            """Look it up."""
            with app.start_as_current_span("inside-tool"):
                return f"results for {query}"

    else:

        @tool
        async def lookup(query: str) -> str:
            """Look it up."""
            with app.start_as_current_span("inside-tool"):
                await asyncio.sleep(0.01)
                return f"results for {query}"

    script = {"model": [Reply.tool("lookup", {"query": "kv"}), "found three papers"]}
    backend = agentclaims.EmbeddedBackend(num_blocks=512, block_size=16, script=script)
    claims = agentclaims.ClaimsMiddleware(backend, tracer_provider=provider)
    agent = create_agent(agentclaims.chat_model(backend), [lookup], middleware=[claims])
    with app.start_as_current_span("handle-request") as outer:
        await agent.ainvoke({"messages": [HumanMessage("find")]})
    await backend.aclose()
    spans = list(exporter.get_finished_spans())
    [session] = spans_named(spans, SESSION_SPAN)
    [inner] = spans_named(spans, "inside-tool")
    assert session.parent is not None
    assert session.parent.span_id == outer.get_span_context().span_id
    assert session.context is not None
    assert inner.parent is not None
    assert inner.parent.span_id == session.context.span_id
    assert inner.context is not None
    assert inner.context.trace_id == session.context.trace_id


async def test_a_run_that_raises_records_the_exception_on_the_session_span(
    traced: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """A tool that raises ends the run in error: the session span's status is ERROR and it
    carries OpenTelemetry's ``exception`` event (type, message, stack trace)."""
    provider, exporter = traced

    @tool
    async def broken(query: str) -> str:
        """Always fails."""
        raise ValueError("no network")

    script = {"model": [Reply.tool("broken", {"query": "kv"}), "never"]}
    backend = agentclaims.EmbeddedBackend(num_blocks=512, block_size=16, script=script)
    claims = agentclaims.ClaimsMiddleware(backend, tracer_provider=provider)
    agent = create_agent(agentclaims.chat_model(backend), [broken], middleware=[claims])
    with pytest.raises(ValueError, match="no network"):
        await agent.ainvoke({"messages": [HumanMessage("find")]})
    await backend.aclose()
    [session] = spans_named(list(exporter.get_finished_spans()), SESSION_SPAN)
    assert session.status.status_code is StatusCode.ERROR
    [event] = [e for e in session.events if e.name == "exception"]
    attributes = event.attributes or {}
    assert attributes["exception.type"] == "ValueError"
    assert attributes["exception.message"] == "no network"
    assert "Traceback" in str(attributes["exception.stacktrace"])
