"""The public session API used wrongly: every bad option is a ``UsageError`` naming it when the
session is made (or the workflow decorated), a session that fails to open leaves nothing behind,
a tool call outside the session's block is refused before the tool runs, two sessions running at
once never share a workflow id, and the clients refuse what is not a backend. Real parts only:
the embedded backend, real LangGraph graphs, real files."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain.agents import create_agent
from surface import SCRIPT, ask, search

import agentclaims
from agentclaims import ClaimedSession, ReactionPolicy, UsageError, claimed_session
from agentclaims.graph import AgentExecutionGraph

SECONDS = ("reload_s_per_block", "queue_delay_s")


@pytest.fixture
async def backend() -> Any:
    b = agentclaims.EmbeddedBackend(num_blocks=512, block_size=16, script=SCRIPT)
    yield b
    await b.aclose()


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def _workflow() -> None:
    return None


BAD_OPTIONS: list[tuple[str, dict[str, Any]]] = [
    ("reload_s_per_block", {"reload_s_per_block": math.nan}),
    ("reload_s_per_block", {"reload_s_per_block": math.inf}),
    ("reload_s_per_block", {"reload_s_per_block": True}),
    ("queue_delay_s", {"queue_delay_s": math.nan}),
    ("queue_delay_s", {"queue_delay_s": -math.inf}),
    ("tool_times", {"tool_times": "search=1s"}),
    ("sleep", {"sleep": None}),
    ("sleep", {"sleep": 0.1}),
    ("clock", {"clock": "monotonic"}),
    ("log_dir", {"log_dir": 5}),
    ("log_stream", {"log_stream": 5}),
    ("workflow_id", {"workflow_id": "   "}),
    ("workflow_id", {"workflow_id": "team/a", "log_dir": "logs"}),
    ("workflow_id", {"workflow_id": "..", "log_dir": "logs"}),
    ("thread_id", {"thread_id": " "}),
]


@pytest.mark.parametrize(("field", "options"), BAD_OPTIONS)
async def test_a_bad_option_is_refused_when_made_naming_it(
    backend: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, field: str, options: Any
) -> None:
    """Not at the first call, mid-run (a NaN cost once failed the second LLM call, a string
    wait model the first tool call, a clock the entry): at construction, decoration and when
    the middleware is made, each a ``UsageError`` naming the option; nothing is written."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as made:
        ClaimedSession(backend, **options)
    assert made.value.field == field
    with pytest.raises(UsageError) as decorated:
        claimed_session(_workflow, backend=backend, **options)
    assert decorated.value.field == field
    with pytest.raises(UsageError) as middleware:
        agentclaims.ClaimsMiddleware(backend, **options)
    assert middleware.value.field == field
    assert not any(tmp_path.iterdir())  # noqa: ASYNC240 - a listing of an empty folder


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(SECONDS),
    value=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 5)),
)
def test_a_duration_option_is_a_finite_number_of_seconds(name: str, value: float) -> None:
    """Property: a duration option is taken exactly when it is a finite number >= 0."""
    backend = agentclaims.EmbeddedBackend(num_blocks=16, block_size=16)
    if math.isfinite(value) and value >= 0:
        ClaimedSession(backend, **{name: value})  # type: ignore[arg-type]
        return
    with pytest.raises(UsageError) as caught:
        ClaimedSession(backend, **{name: value})  # type: ignore[arg-type]
    assert caught.value.field == name


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(("deadline_s", "initial_delay_s", "max_delay_s", "jitter_s")),
    value=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 5), st.booleans()
    ),
)
def test_a_reaction_duration_is_a_finite_number_of_seconds(name: str, value: float) -> None:
    """Property: ``ReactionPolicy``'s durations are finite numbers >= 0 (an infinite backoff
    would sleep forever; ``True`` is no duration)."""
    if not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        assert getattr(ReactionPolicy(**{name: value}), name) == value  # type: ignore[arg-type]
        return
    with pytest.raises(UsageError) as caught:
        ReactionPolicy(**{name: value})  # type: ignore[arg-type]
    assert caught.value.field == f"reaction.{name}"


def test_reaction_relax_claims_is_a_bool() -> None:
    """``relax_claims="no"`` would read as true: refused, as is any other non-bool."""
    for bad in ("no", 0, None):
        with pytest.raises(UsageError, match="relax_claims"):
            ReactionPolicy(relax_claims=bad)  # type: ignore[arg-type]
    assert ReactionPolicy(relax_claims=False).with_(deadline_s=1.0).relax_claims is False


async def test_a_log_that_cannot_be_opened_leaves_nothing_behind(
    backend: Any, tmp_path: Path
) -> None:
    """A ``log_dir`` that is a file cannot hold the log: entering raises ``UsageError``
    naming ``log_dir`` before the body runs, and the session is not entered (no slot, no
    current session, its workflow id free for a session that can log)."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    session = ClaimedSession(backend, workflow_id="wf-blocked", log_dir=blocker)
    ran = False
    with pytest.raises(UsageError) as caught:
        async with session:
            ran = True
    assert caught.value.field == "log_dir"
    assert not ran
    assert session.log is None
    assert agentclaims.current_session() is None
    assert not session.lifecycle.entered
    async with ClaimedSession(backend, workflow_id="wf-blocked", log_dir=tmp_path / "ok") as ok:
        pass
    assert ok.end_reason == "completed"


async def test_a_tool_call_outside_the_sessions_block_is_refused_before_the_tool(
    backend: Any, tmp_path: Path
) -> None:
    """Before entering and after the end, ``tool_call`` raises ``UsageError`` naming the
    session before its block runs: once a tool ran unclaimed and counted, and after the end
    then failed on the closed log, masking the tool's own result."""
    session = ClaimedSession(backend, log_dir=tmp_path)
    ran: list[str] = []
    with pytest.raises(UsageError, match="not entered") as before:
        async with session.tool_call("search"):
            ran.append("before")
    assert before.value.field == "session"
    async with session, session.tool_call("search"):
        ran.append("inside")
    with pytest.raises(UsageError, match="has ended") as after:
        async with session.tool_call("search"):
            ran.append("after")
    assert after.value.field == "session"
    assert ran == ["inside"]
    assert session.stats.tool_calls == 1
    events = [line["event"] for line in _lines(session.log_path)]  # type: ignore[arg-type]
    assert events == ["session_started", "tool_call", "session_ended"]


async def test_a_tool_that_outlives_its_session_ends_quietly(backend: Any, tmp_path: Path) -> None:
    """A tool call running in another task when the session ends finishes without an error
    of the session's (its log is closed, its stats final): the tool's result stands and
    ``session_ended`` stays the log's last line."""
    go = asyncio.Event()
    started = asyncio.Event()

    async def tool(session: ClaimedSession) -> str:
        async with session.tool_call("search"):
            started.set()
            await go.wait()
            return "result"

    async with ClaimedSession(backend, log_dir=tmp_path) as session:
        task = asyncio.create_task(tool(session))
        await started.wait()
    go.set()
    assert await task == "result"
    lines = _lines(session.log_path)  # type: ignore[arg-type]
    assert lines[-1]["event"] == "session_ended"
    assert lines[-1]["tool_calls"] == session.stats.tool_calls == 0


async def test_two_running_sessions_never_share_a_workflow_id(backend: Any, tmp_path: Path) -> None:
    """A second session entering with the id of one still running raises ``UsageError``
    naming ``workflow_id`` before anything is written: once both wrote into one file, which
    ``agentclaims report`` then read as one workflow. Once the first ends, the id is free."""
    first = ClaimedSession(backend, workflow_id="wf-same", log_dir=tmp_path)
    async with first:
        twin = ClaimedSession(backend, workflow_id="wf-same", log_dir=tmp_path)
        with pytest.raises(UsageError) as caught:
            async with twin:
                pass
        assert caught.value.field == "workflow_id"
        assert agentclaims.current_session() is first
    assert [line["session_id"] for line in _lines(tmp_path / "wf-same.jsonl")] == [
        first.session_id
    ] * 2
    async with ClaimedSession(backend, workflow_id="wf-same", log_dir=tmp_path) as again:
        pass
    assert again.end_reason == "completed"

    @claimed_session(backend=backend, workflow_id="wf-fixed")
    async def fixed() -> None:
        await asyncio.sleep(0)

    results = await asyncio.gather(fixed(), fixed(), return_exceptions=True)
    errors = [r for r in results if isinstance(r, UsageError)]
    assert [error.field for error in errors] == ["workflow_id"]


async def test_the_clients_refuse_what_is_not_a_backend(backend: Any) -> None:
    """``openai_client``, ``openai_sync_client`` and ``chat_model`` raise ``UsageError``
    naming ``backend`` for a URL, ``None`` or a pool (whose members they take), not an
    ``AttributeError`` from deep inside."""
    pool = agentclaims.BackendPool([backend])
    for make in (agentclaims.openai_client, agentclaims.openai_sync_client):
        for bad in ("http://127.0.0.1:8099/v1", None, pool):
            with pytest.raises(UsageError) as caught:
                make(bad)  # type: ignore[arg-type]
            assert caught.value.field == "backend"
    for bad in ("http://127.0.0.1:8099/v1", None, pool):
        with pytest.raises(UsageError, match="backend"):
            agentclaims.chat_model(bad)  # type: ignore[arg-type]
    assert agentclaims.chat_model(pool.backends[0]).openai_api_base == backend.base_url
    fleet = agentclaims.FleetBackend("http://127.0.0.1:9")  # a pool with one URL: its router's
    try:
        client = agentclaims.openai_client(fleet)
        assert str(client.base_url).rstrip("/") == fleet.base_url
        await client.close()
    finally:
        await fleet.aclose()


async def test_a_claimed_graph_is_not_claimed_twice(backend: Any) -> None:
    """``claimed_session`` on a ``ClaimedGraph`` raises ``UsageError("target")`` saying how
    (its ``.graph``, or ``run(**options)``), as the docs say for anything not a target."""
    claimed = claimed_session(
        create_agent(agentclaims.chat_model(backend), [search]), backend=backend
    )
    with pytest.raises(UsageError, match="claimed already") as caught:
        claimed_session(claimed, backend=backend)
    assert caught.value.field == "target"
    assert (await claimed.ainvoke(ask()))["messages"][-1].content == "found three papers on it"


def test_the_middleware_names_itself_and_keeps_the_graph_given(backend: Any) -> None:
    """``ClaimsMiddleware(None)`` names the middleware, not ``claimed_session``; an empty
    Agent Execution Graph given (to learn online and share) is the one it uses."""
    with pytest.raises(UsageError, match="ClaimsMiddleware needs a backend"):
        agentclaims.ClaimsMiddleware(None)  # type: ignore[arg-type]
    graph = AgentExecutionGraph()
    assert agentclaims.ClaimsMiddleware(backend, graph=graph).aeg is graph
