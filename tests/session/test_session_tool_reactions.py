"""The session's reaction applies to the tool call itself when the claim that should hold the
agent's prefix across it was refused: defer asks again while the tool runs (never holding it
back) and holds the planned claim, reroute moves to a member that accepts it, relax runs the tool under the
weaker claim, fail raises before the tool starts. Real ReAct agents on real engines."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langchain_core.tools import tool
from langgraph.prebuilt import create_react_agent
from surface import SCRIPT, ask, log_lines

import agentclaims
from agentclaims.backends.embedded import EmbeddedBackend
from agentclaims.backends.pool import BackendPool
from agentclaims.bindings.decorators import claimed_session
from agentclaims.errors import ClaimRefused
from agentclaims.graph import ToolTimeModel

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PINNING = {"reload_s_per_block": 1.0}
"""Recomputing a block is dear: the planner pins the prefix across the tool (hard), and
waiting up to a few seconds for that claim costs less than recomputing it."""


def search_seen() -> ToolTimeModel:
    """A tool-time model that has seen ``search`` take 0.1 s: a wait the agent is sure of, so
    the planner may pin across it (a prior alone never grounds a pin)."""
    model = ToolTimeModel(prior_mean_s=0.1)
    model.observe("search", 0.1)
    return model


def agent_with(
    backend: Any, ran: list[str], *, until: Callable[[], bool] | None = None, **options: Any
) -> Any:
    """A react agent with a ``search`` tool, claimed; ``until``: the tool (a thread of
    LangGraph's) runs until it says so, 10 s at most."""

    @tool
    def search(query: str) -> str:
        """Search the papers."""
        ran.append(query)
        deadline = time.monotonic() + 10
        while until is not None and not until() and time.monotonic() < deadline:
            time.sleep(0.005)
        return f"results for {query}"

    model_backend = backend.backends[0] if isinstance(backend, BackendPool) else backend
    agent = create_react_agent(agentclaims.chat_model(model_backend), [search])
    return claimed_session(agent, backend=backend, **options)


def lines(directory: Path, event: str) -> list[dict[str, Any]]:
    return [line for line in log_lines(directory) if line["event"] == event]


async def test_fail_raises_before_the_tool_starts(tmp_path):
    backend = EmbeddedBackend(2048, 16, script=SCRIPT, owner_cap_blocks=0)
    ran: list[str] = []
    claimed = agent_with(backend, ran, reaction="fail", log_dir=tmp_path, **PINNING)
    with pytest.raises(ClaimRefused, match="owner_cap_exceeded"):
        await claimed.ainvoke(ask())
    assert ran == []  # the tool never started
    (fail,) = lines(tmp_path, "reaction_fail")
    assert fail["node"] == "agent"
    assert fail["claim_id"]
    assert claimed.last_session.end_reason == "error"
    await backend.aclose()


async def test_relax_runs_the_tool_under_the_weaker_claim(tmp_path):
    backend = EmbeddedBackend(2048, 16, script=SCRIPT, owner_cap_blocks=0)
    ran: list[str] = []
    claimed = agent_with(
        backend, ran, reaction="relax", log_dir=tmp_path, tool_times=search_seen(), **PINNING
    )
    result = await claimed.ainvoke(ask())
    assert result["messages"][-1].content == "found three papers on it"
    assert ran == ["kv papers"]
    relaxed = [line for line in lines(tmp_path, "reaction_relax") if line.get("tool")]
    assert len(relaxed) == 1
    assert relaxed[0]["tool"] == "search"
    assert relaxed[0]["from_mode"] == "hard_protected"
    assert relaxed[0]["to_mode"] == "best_effort"
    assert "owner_cap_exceeded" in relaxed[0]["reason"]
    (call,) = lines(tmp_path, "tool_call")
    assert call["claim_ids"] == [relaxed[0]["claim_id"]]
    await backend.aclose()


async def _blocker(backend: EmbeddedBackend) -> int:
    """Another owner's hard claim on a long prompt; its blocks."""
    words = " ".join(f"word{i}" for i in range(200))
    body = {
        "model": "scripted",
        "messages": [{"role": "user", "content": words}],
        "agentclaims": {
            "owner_scope": "other",
            "node": "other",
            "claims": [
                {
                    "claim_id": "blocker",
                    "object_id": "@prompt",
                    "protection_mode": "hard_protected",
                    "ttl_s": 600,
                }
            ],
        },
    }
    answer = (await backend.http_client().post("/v1/chat/completions", json=body)).json()
    assert answer["agentclaims"]["decisions"][0]["decision"] == "accepted"
    return int(answer["agentclaims"]["prefix_ids"]["prompt"].rsplit("-", 1)[1])


async def test_defer_holds_the_planned_claim_while_the_tool_runs(tmp_path):
    probe = EmbeddedBackend(2048, 16, script=SCRIPT)
    blocks = await _blocker(probe)
    await probe.aclose()
    backend = EmbeddedBackend(2048, 16, script=SCRIPT, protected_cap_blocks=blocks)
    await _blocker(backend)  # the protected cap is full
    waits: list[float] = []

    async def sleep(seconds: float) -> None:  # the blocker goes while the session waits
        waits.append(seconds)
        await backend.release_claim("blocker", "other")

    ran: list[str] = []

    def held_hard() -> bool:  # the deferred claim landed: the tool may end
        held = claimed.last_session.claims.get("agent")
        return held is not None and held.plan.mode.value == "hard_protected"

    claimed = agent_with(
        backend,
        ran,
        until=held_hard,
        reaction="defer",
        sleep=sleep,
        log_dir=tmp_path,
        tool_times=search_seen(),
        **PINNING,
    )
    result = await claimed.ainvoke(ask())
    assert result["messages"][-1].content == "found three papers on it"
    assert ran == ["kv papers"]
    (defer,) = [line for line in lines(tmp_path, "reaction_defer") if line.get("tool")]
    assert defer["tool"] == "search"
    assert defer["outcome"] == "refused"
    assert "protected_capacity_exceeded" in defer["reason"]
    assert waits == [defer["delay_s"]]
    (call,) = lines(tmp_path, "tool_call")
    planned = {line["claim_id"]: line["mode"] for line in lines(tmp_path, "claim_planned")}
    assert [planned[c] for c in call["claim_ids"]] == ["hard_protected"]  # held as planned
    assert claimed.last_session.stats.deferrals == 1
    await backend.aclose()


async def test_defer_asks_again_while_the_tool_runs_never_before_it(tmp_path):
    """The claim is refused for good (no owner may protect a block): the tool starts at once,
    the session asks again while it runs (backing off), and stops when the tool ends; the
    agent never waits for the claim."""
    backend = EmbeddedBackend(2048, 16, script=SCRIPT, owner_cap_blocks=0)
    waits: list[float] = []
    seen_running: list[bool] = []
    ran: list[str] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        seen_running.append(bool(ran))
        await asyncio.sleep(0.01)

    @tool
    async def search(query: str) -> str:
        """Search the papers."""
        ran.append(query)
        await asyncio.sleep(0.2)  # the tool takes a while: the session asks again meanwhile
        return f"results for {query}"

    agent = create_react_agent(agentclaims.chat_model(backend), [search])
    claimed = claimed_session(
        agent, backend=backend, reaction="defer", sleep=sleep, log_dir=tmp_path, **PINNING
    )
    await claimed.ainvoke(ask())
    assert ran == ["kv papers"]
    assert len(waits) >= 2  # asked again, backing off
    assert waits == sorted(waits)
    assert any(seen_running)  # the tool ran while the session asked again
    (drop,) = [line for line in lines(tmp_path, "reaction_drop") if line.get("tool")]
    assert "the tool ended first" in drop["reason"]
    assert sum(waits) >= drop["waited_s"]
    await backend.aclose()


async def test_reroute_sends_the_follow_up_to_a_member_that_accepts(tmp_path):
    refusing = EmbeddedBackend(2048, 16, script=SCRIPT, owner_cap_blocks=0, name="m0")
    accepting = EmbeddedBackend(2048, 16, script=SCRIPT, name="m1")
    primer = agent_with(accepting, [], planner="off")
    await primer.ainvoke(ask())  # the agent's turns are resident on m1 too (no claims there)
    pool = BackendPool([refusing, accepting])
    ran: list[str] = []
    claimed = agent_with(pool, ran, reaction="reroute", log_dir=tmp_path, **PINNING)
    result = await claimed.ainvoke(ask())
    assert result["messages"][-1].content == "found three papers on it"
    assert ran == ["kv papers"]
    (moved,) = [line for line in lines(tmp_path, "reaction_reroute") if line.get("tool")]
    assert (moved["from_backend"], moved["to_backend"]) == ("m0", "m1")
    assert moved["tool"] == "search"
    calls = lines(tmp_path, "llm_call")
    assert [c["backend"] for c in calls] == ["m0", "m1"]
    assert calls[1]["cached_tokens"] > 0
    assert calls[1]["claim_id"] == moved["claim_id"]
    for member in (refusing, accepting):
        assert [c for c in member.engine._claims.values() if c.state.live] == []
        await member.aclose()
    assert json.dumps(claimed.last_session.stats.reroutes) == "1"


async def test_a_tool_is_pinned_only_once_its_wait_was_seen(tmp_path):
    """Fail closed on certainty: the first run's claim across ``search`` (a tool no run has
    seen yet, its wait the model's prior) is no pin; the claimed graph learned the tool's wait
    in that run, and the next run's claim across it is ``hard_protected``."""
    backend = EmbeddedBackend(2048, 16, script=SCRIPT)
    ran: list[str] = []
    claimed = agent_with(backend, ran, log_dir=tmp_path, **PINNING)
    modes, learned = [], []
    for _ in range(2):
        await claimed.ainvoke(ask())
        session = claimed.last_session
        planned = {line["claim_id"]: line["mode"] for line in lines(tmp_path, "claim_planned")}
        (call,) = [
            line
            for line in lines(tmp_path, "tool_call")
            if line.get("session_id") == session.session_id
        ]
        modes.append([planned[c] for c in call["claim_ids"]])
        learned.append(
            [
                line["wait_learned"]
                for line in lines(tmp_path, "claim_planned")
                if line["claim_id"] in call["claim_ids"]
            ]
        )
    assert ran == ["kv papers"] * 2
    assert learned == [[False], [True]]  # the outcome log says why the first was no pin
    assert modes[0]
    assert "hard_protected" not in modes[0]
    assert modes[1] == ["hard_protected"]
    await backend.aclose()


async def test_a_claim_still_being_submitted_when_the_tool_ends_is_kept_not_lost() -> None:
    """The tool ends (the deferral is cancelled) while its claim is being submitted: the
    submission goes on to its end, and a claim it got is returned, for the session to hold
    (the engine has it); one that got none lets the cancellation through."""
    from agentclaims.session.toolhold import _submitted

    for landed in ("the claim", None):
        gate = asyncio.Event()

        async def submit(result: Any = landed, gate: asyncio.Event = gate) -> Any:
            await gate.wait()
            return result

        deferral = asyncio.ensure_future(_submitted(submit()))
        await asyncio.sleep(0)  # the submission is in flight
        deferral.cancel()
        await asyncio.sleep(0)
        gate.set()
        if landed is None:
            with pytest.raises(asyncio.CancelledError):
                await deferral
        else:
            assert await deferral == landed
