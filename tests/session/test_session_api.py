"""The typed entry points at run time: ``SessionOptions``, ``claimed_session`` and the
``ClaimedGraph`` pass-throughs."""

from __future__ import annotations

import inspect
import operator
from typing import Annotated, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph

from agentclaims.backends.embedded import EmbeddedBackend
from agentclaims.bindings.decorators import ClaimedGraph, claimed_session
from agentclaims.errors import UnknownNameError, UsageError
from agentclaims.session import ClaimedSession, SessionOptions


class Count(TypedDict):
    steps: Annotated[list[str], operator.add]


def _step(state: Count) -> Count:
    return {"steps": ["step"]}


@pytest.fixture
async def backend():
    b = EmbeddedBackend(num_blocks=256, block_size=16)
    yield b
    await b.aclose()


@pytest.fixture
def claimed(backend) -> ClaimedGraph:
    builder = StateGraph(Count)
    builder.add_node("step", _step)
    builder.add_edge(START, "step")
    return claimed_session(builder.compile(checkpointer=InMemorySaver()), backend=backend)


def test_session_options_are_the_session_keywords():
    """``SessionOptions`` has one optional field per keyword of ``ClaimedSession`` but
    ``backend``."""
    parameters = inspect.signature(ClaimedSession.__init__).parameters
    keywords = {n for n, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert set(SessionOptions.__optional_keys__) == keywords
    assert not SessionOptions.__required_keys__


def test_options_are_checked_at_decoration(backend):
    """An unknown option name or a bad value fails when decorating, before any run."""
    with pytest.raises(UnknownNameError, match="option") as caught:
        claimed_session(backend=backend, horizn=3)  # type: ignore[call-overload]
    assert caught.value.value == "horizn"
    assert "horizon" in caught.value.known
    with pytest.raises(UsageError, match="horizon"):
        claimed_session(backend=backend, horizon=0)
    with pytest.raises(UsageError, match="reload_s_per_block"):
        claimed_session(backend=backend, reload_s_per_block=-1.0)


async def test_decorated_workflow_keeps_its_signature(backend):
    """The decorated function has the workflow's name and signature, and runs in a session."""

    async def research(topic: str, *, depth: int = 1) -> str:
        return f"{topic}:{depth}"

    claimed = claimed_session(research, backend=backend, workflow_id="research")
    assert claimed.__name__ == "research"
    assert inspect.signature(claimed) == inspect.signature(research)
    assert await claimed("kv", depth=2) == "kv:2"


async def test_claimed_graph_exposes_its_graph_and_passes_state_through(claimed):
    """``graph`` (alias ``compiled``) is the compiled graph; state methods pass through; no
    other attribute is proxied."""
    assert claimed.compiled is claimed.graph
    config = {"configurable": {"thread_id": "t1"}}
    assert await claimed.ainvoke({"steps": []}, config) == {"steps": ["step"]}
    assert claimed.last_session is not None
    assert claimed.get_state(config).values == {"steps": ["step"]}
    assert (await claimed.aget_state(config)).values == {"steps": ["step"]}
    claimed.update_state(config, {"steps": ["manual"]})
    await claimed.aupdate_state(config, {"steps": ["async"]})
    assert claimed.get_state(config).values == {"steps": ["step", "manual", "async"]}
    assert len(list(claimed.get_state_history(config, limit=2))) == 2
    assert len([s async for s in claimed.aget_state_history(config, limit=1)]) == 1
    assert "step" in claimed.get_graph().nodes
    assert "step" in (await claimed.aget_graph()).nodes
    with pytest.raises(AttributeError):
        claimed.nodes  # type: ignore[attr-defined]  # noqa: B018


async def test_with_config_stays_claimed(claimed):
    """``with_config`` returns a claimed graph sharing the AEG and wait model."""
    configured = claimed.with_config({"configurable": {"thread_id": "t2"}})
    assert isinstance(configured, ClaimedGraph)
    assert configured.aeg is claimed.aeg
    assert configured.tool_times is claimed.tool_times
    assert await configured.ainvoke({"steps": []}) == {"steps": ["step"]}
    assert configured.last_session is not None
    assert claimed.last_session is None
    chunks = [chunk async for chunk in configured.astream({"steps": []})]
    assert chunks == [{"step": {"steps": ["step"]}}]


def test_the_sessions_parts_share_its_state_not_the_facade(backend):
    """Each part holds the session's state record, never the ``ClaimedSession`` facade (the
    lifecycle keeps it only as what ``current_session()`` returns); the facade's shared
    attributes read the state and cannot be set past it."""
    session = ClaimedSession(backend, workflow_id="wf-parts")
    parts = [session.lifecycle, session.calls, session.keeper, session.outcomes]
    parts += [session.moves, session.tools]
    for part in parts:
        held = {name: value for name, value in vars(part).items() if value is session}
        assert held == ({"_face": session} if part is session.lifecycle else {}), part
        assert part._s is session.state
    state = session.state
    assert (state.calls, state.keeper, state.lifecycle) == (
        session.calls,
        session.keeper,
        session.lifecycle,
    )
    assert session.workflow_id == state.workflow_id == "wf-parts"
    assert session.claims is state.io.held
    with pytest.raises(AttributeError, match="read-only"):
        session.workflow_id = "other"  # type: ignore[misc]
