"""The session API end to end on the embedded backend, with real LangGraph graphs."""

from __future__ import annotations

import asyncio
import json

import pytest
from langchain_core.messages import HumanMessage

import agentclaims
from agentclaims.backends.embedded import EmbeddedBackend
from agentclaims.backends.pool import BackendPool
from agentclaims.bindings.decorators import claimed_session
from agentclaims.contract import ClaimState
from agentclaims.demo.workflows import build_supervisor, script, task_for
from agentclaims.errors import UnknownNameError, UsageError
from agentclaims.gateway.text import Reply, TextRequest
from agentclaims.session import ClaimedSession, ReactionPolicy, current_session
from agentclaims.testing import FakeBackend


def live_claims(backend: EmbeddedBackend) -> list[str]:
    engine = backend.engine
    return [c.claim_id for c in engine._claims.values() if c.state.live]


@pytest.fixture
async def tool_backend():
    b = EmbeddedBackend(num_blocks=2048, block_size=16, script=lambda request: Reply.tool("search"))
    yield b
    await b.aclose()


@pytest.fixture
async def backend():
    b = EmbeddedBackend(num_blocks=2048, block_size=16, script=script)
    yield b
    await b.aclose()


async def test_supervisor_graph_issues_and_releases_claims(backend, tmp_path):
    """A supervisor run claims prefixes, reuses them, and leaves no claim open at the end."""
    graph = claimed_session(
        build_supervisor(agentclaims.chat_model(backend)), backend=backend, log_dir=tmp_path
    )
    result = await graph.ainvoke({"messages": [HumanMessage(task_for(1))]}, {"recursion_limit": 60})
    assert "[writer done]" in result["messages"][-2].content
    session = graph.last_session
    assert session is not None
    assert session.stats.claims_accepted >= 4
    assert session.stats.cached_tokens > 0
    assert live_claims(backend) == []
    nodes = set(session.graph.nodes)
    assert {"supervisor", "researcher:model", "writer:model"} <= nodes
    lines = [
        json.loads(line)
        for line in (tmp_path / f"{session.workflow_id}.jsonl").read_text().splitlines()
    ]
    events = {line["event"] for line in lines}
    steps = [line["step"] for line in lines if line["event"] == "llm_call"]
    assert steps
    assert all(isinstance(step, int) and step >= 0 for step in steps)
    assert {
        "session_started",
        "llm_call",
        "claim_planned",
        "resident_claim_accepted",
        "session_ended",
    } <= events


async def test_claimed_session_decorator_on_async_function(backend):
    """The decorated workflow runs inside its own session and releases what it claimed."""
    client = agentclaims.openai_client(backend)
    seen: list[ClaimedSession] = []

    @claimed_session(backend=backend)
    async def workflow(question: str) -> str:
        session = current_session()
        assert session is not None
        seen.append(session)
        messages = [
            {"role": "system", "content": "be brief " * 80},
            {"role": "user", "content": question},
        ]
        with session.node("agent"):
            for _ in range(3):
                reply = await client.chat.completions.create(model="scripted", messages=messages)
                messages.append({"role": "assistant", "content": reply.choices[0].message.content})
                async with session.tool_call("search"):
                    await asyncio.sleep(0)
                messages.append({"role": "user", "content": "more " * 20})
        return reply.choices[0].message.content or ""

    answer = await workflow("what is a KV claim?")
    assert answer.startswith("echo:")
    assert seen[0].stats.llm_calls == 3
    assert seen[0].stats.claims_accepted >= 1
    assert seen[0].stats.tool_calls == 3
    assert live_claims(backend) == []
    assert current_session() is None


async def test_exception_inside_workflow_releases_claims(tool_backend):
    """An exception in the workflow propagates and no claim stays open."""
    backend = tool_backend
    client = agentclaims.openai_client(backend)

    @claimed_session(backend=backend)
    async def failing() -> None:
        await client.chat.completions.create(
            model="scripted", messages=[{"role": "user", "content": "x " * 100}]
        )
        session = current_session()
        assert session is not None
        await session.settle()  # the claim round trip runs in the background until settled
        assert live_claims(backend)
        raise RuntimeError("tool crashed")

    with pytest.raises(RuntimeError, match="tool crashed"):
        await failing()
    assert live_claims(backend) == []


async def test_cancellation_inside_workflow_releases_claims(tool_backend):
    """Cancelling a workflow mid-tool leaves no claim open."""
    backend = tool_backend
    client = agentclaims.openai_client(backend)
    started = asyncio.Event()

    async def workflow() -> None:
        async with ClaimedSession(backend) as session:
            await client.chat.completions.create(
                model="scripted", messages=[{"role": "user", "content": "y " * 100}]
            )
            async with session.tool_call("slow"):
                started.set()
                await asyncio.Event().wait()

    task = asyncio.create_task(workflow())
    await started.wait()
    assert live_claims(backend)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert live_claims(backend) == []


async def test_refusal_with_fail_policy_raises_typed_error():
    """A hard claim of one session makes another's oversized request fail with ClaimRefused."""
    backend = EmbeddedBackend(num_blocks=40, block_size=16)
    client = agentclaims.openai_client(backend)
    async with ClaimedSession(backend, planner="aggressive") as holder:
        with holder.node("agent"):
            await client.chat.completions.create(
                model="scripted", messages=[{"role": "user", "content": "hold " * 300}]
            )
        async with holder.tool_call("search"):

            async def other() -> None:
                async with ClaimedSession(backend, reaction="fail"):
                    await client.chat.completions.create(
                        model="scripted", messages=[{"role": "user", "content": "need " * 420}]
                    )

            held = live_claims(backend)
            if held:
                with pytest.raises(agentclaims.ClaimRefused) as info:
                    await other()
                assert info.value.outcome.action.value in (
                    "refuse_active",
                    "defer_active",
                    "capacity_required",
                )
    assert live_claims(backend) == []
    await backend.aclose()


async def test_defer_policy_waits_out_refusal_with_injected_sleep():
    """Under defer, a refused call is retried (sleeps go through the injected sleep)."""
    backend = FakeBackend()
    backend.kv.refuse_requests(2, blocking=["blocker"])  # another owner's claim, twice
    client = agentclaims.openai_client(backend)
    sleeps: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)

    async with ClaimedSession(
        backend, reaction=ReactionPolicy(deadline_s=5), sleep=fake_sleep
    ) as s:
        await client.chat.completions.create(
            model="scripted", messages=[{"role": "user", "content": "w " * 500}]
        )
        assert s.stats.deferrals == 2
    assert len(sleeps) == 2
    assert len(backend.kv.calls_of("serve")) == 3
    await backend.aclose()


async def test_pool_keeps_session_affinity():
    """A session sticks to one pool member; two sessions spread over two members."""
    a = EmbeddedBackend(num_blocks=256, name="a")
    b = EmbeddedBackend(num_blocks=256, name="b")
    pool = BackendPool([a, b])
    s1, s2 = ClaimedSession(pool), ClaimedSession(pool)
    assert s1.backend is s1.backend
    assert {s1.backend.name, s2.backend.name} == {"a", "b"}
    await pool.aclose()


def test_bad_input_is_rejected_with_typed_errors(backend):
    """Unknown names, non-workflows and bad values raise typed errors naming the field."""
    with pytest.raises(UnknownNameError, match="policy"):
        ClaimedSession(backend, planner="nonsense")
    with pytest.raises(UnknownNameError, match="reaction"):
        ClaimedSession(backend, reaction="pray")
    with pytest.raises(UsageError, match="backend"):
        ClaimedSession(object())  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="deadline_s"):
        ReactionPolicy(deadline_s=-1)
    with pytest.raises(UsageError, match="target"):
        claimed_session(backend=backend)(lambda: None)
    with pytest.raises(UsageError, match="target"):
        claimed_session(42, backend=backend)
    with pytest.raises(UsageError, match="backend"):
        claimed_session(lambda: None)


async def test_backend_down_is_backend_unavailable():
    """Talking to a closed port raises BackendUnavailable and leaves nothing open."""
    http = agentclaims.HTTPBackend("http://127.0.0.1:9/v1")
    with pytest.raises(agentclaims.BackendUnavailable):
        await http.health() or await http.descriptor()
    await http.aclose()


def test_scripted_replies_are_deterministic():
    """The demo script routes researcher, writer, then finishes."""
    first = script(
        TextRequest(
            kind="chat", model="m", messages=({"role": "user", "content": "t"},), node="supervisor"
        )
    )
    assert first == "route: researcher"
    tool = script(
        TextRequest(
            kind="chat",
            model="m",
            messages=({"role": "user", "content": "t"},),
            node="researcher:model",
        )
    )
    assert isinstance(tool, Reply)
    assert tool.tool_calls[0].name == "search"
    assert ClaimState.EXPIRED.terminal


async def test_pool_forgets_a_finished_session():
    """When a session ends, its pool member's load drops back."""
    a = EmbeddedBackend(num_blocks=256, name="a")
    b = EmbeddedBackend(num_blocks=256, name="b")
    pool = BackendPool([a, b])
    for _ in range(3):
        async with ClaimedSession(pool) as session:
            assert session.backend.name == "a"  # the least loaded, with nothing else running
    await pool.aclose()
