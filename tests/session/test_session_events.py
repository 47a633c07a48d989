"""The session takes its claims' events after every call and reacts as they happen: a
demoted or expired claim is re-planned (or dropped), a harmed one is logged, counted and,
under ``fail``, raised. Real engine, real gateway in-process, fake time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from planners import Always
from sinks import StalledSink
from test_session_reactions import FakeTime, ask, make_backend

from agentclaims.contract import BlockHash, EventName, ProtectionMode
from agentclaims.errors import ClaimHarmed
from agentclaims.session import ClaimedSession, ReactionPolicy

PROMPT = [{"role": "user", "content": "q " * 100}]


def lines(log_dir: Path, session: ClaimedSession) -> list[dict[str, Any]]:
    text = (log_dir / f"{session.workflow_id}.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def claimed(
    backend: Any, t: FakeTime, log_dir: Path, mode: ProtectionMode, **options: Any
) -> ClaimedSession:
    """A session on fake time whose planner always asks for ``mode``."""
    ttl = options.pop("ttl_s", None)
    return ClaimedSession(
        backend,
        planner=Always(mode, ttl),
        sleep=t.sleep,
        clock=t.clock_s,
        log_dir=log_dir,
        **options,
    )


def pressure(backend: Any, blocks: int) -> None:
    """Another request that needs ``blocks`` fresh blocks (evicting to make room)."""
    hashes = [BlockHash(50_000 + i) for i in range(blocks)]
    assert backend.engine.begin("pressure", hashes, admit=False).served
    backend.engine.finish("pressure")


async def test_a_demoted_claim_is_replanned_at_the_next_call(tmp_path: Path) -> None:
    """Pressure demotes the held claim between two calls; the second call's event round logs
    the demotion, ends the old claim with reason ``demoted`` and holds a new one."""
    t = FakeTime()
    backend = make_backend(t)
    async with claimed(backend, t, tmp_path, ProtectionMode.DEMOTABLE) as session:
        with session.node("a"):
            await ask(backend, PROMPT)
        await session.settle()
        [first] = session.claims.values()
        pressure(backend, 60)
        with session.node("b"):
            await ask(backend, [{"role": "user", "content": "short"}])
        await session.settle()
        assert first.state == "demoted"
        assert first.end_reason == "demoted"
        assert session.claims["a"].claim_id != first.claim_id
        assert session.stats.claims_demoted == 1
        assert session.stats.claims_replanned == 1
        assert session.log is not None
        assert session.log.flush(timeout=5)
        written = lines(tmp_path, session)  # on disk before the session ends
    names = [d["event"] for d in written]
    assert EventName.RESIDENT_CLAIM_DEMOTED.value in names
    assert "session_ended" not in names
    [replan] = [d for d in written if d["event"] == "reaction_replan"]
    assert replan["claim_id"] == first.claim_id
    assert replan["node"] == "a"
    ended = [d for d in lines(tmp_path, session) if d["event"] == "claim_ended"]
    assert {d["claim_id"]: d["reason"] for d in ended}[first.claim_id] == "demoted"
    await backend.aclose()


async def test_a_lapsed_claim_is_dropped_under_drop(tmp_path: Path) -> None:
    """With ``on_lapsed="drop"`` the demoted claim is let go and not replaced."""
    t = FakeTime()
    backend = make_backend(t)
    policy = ReactionPolicy(on_lapsed="drop")
    async with claimed(backend, t, tmp_path, ProtectionMode.DEMOTABLE, reaction=policy) as session:
        with session.node("a"):
            await ask(backend, PROMPT)
        await session.settle()
        pressure(backend, 60)
        with session.node("b"):
            await ask(backend, [{"role": "user", "content": "short"}])
        await session.settle()
        assert "a" not in session.claims
        assert session.stats.claims_replanned == 0
    drops = [d for d in lines(tmp_path, session) if d["event"] == "reaction_drop"]
    assert [d["node"] for d in drops] == ["a"]
    await backend.aclose()


async def test_an_expired_claim_is_known_expired_and_replanned(tmp_path: Path) -> None:
    """A claim whose TTL ran out while the node still waits is seen expired (not left
    "accepted") at the next call and replaced."""
    t = FakeTime()
    backend = make_backend(t)
    async with claimed(
        backend,
        t,
        tmp_path,
        ProtectionMode.EXPIRING,
        ttl_s=1.0,
        reaction=ReactionPolicy(on_lapsed="renew"),
    ) as session:
        with session.node("a"):
            await ask(backend, PROMPT)
        await session.settle()
        [first] = session.claims.values()
        t.ns += 5_000_000_000  # the TTL ends
        with session.node("b"):
            await ask(backend, [{"role": "user", "content": "short"}])
        await session.settle()
        assert first.state == "expired"
        assert session.stats.claims_expired == 1
        assert session.claims["a"].claim_id != first.claim_id  # renew refused: replanned
    kinds = [d["event"] for d in lines(tmp_path, session)]
    assert EventName.RESIDENT_CLAIM_EXPIRED.value in kinds
    assert "reaction_renew" in kinds
    assert "reaction_replan" in kinds
    await backend.aclose()


async def test_harm_is_counted_logged_and_raised_under_fail(tmp_path: Path) -> None:
    """A soft claim whose prefix loses block 0 is harm: counted, logged with its cause, and
    under the ``fail`` reaction raised as ClaimHarmed naming the claim."""
    t = FakeTime()
    backend = make_backend(t)
    sessions: list[ClaimedSession] = []

    async def run() -> None:
        async with claimed(
            backend, t, tmp_path, ProtectionMode.SOFT_PRIORITY, reaction="fail"
        ) as session:
            sessions.append(session)
            with session.node("a"):
                await ask(backend, PROMPT)
            await session.settle()
            pressure(backend, 64)

    with pytest.raises(ClaimHarmed) as info:
        await run()
    [session] = sessions
    [held] = [h for h in session.ended_claims if h.end_reason == "harmed"]
    assert info.value.claim_id == held.claim_id
    assert info.value.event is not None
    assert info.value.event.event is EventName.RESIDENT_CLAIM_HARMED
    assert session.stats.claims_harmed == 1
    written = lines(tmp_path, session)
    [harm] = [d for d in written if d["event"] == EventName.RESIDENT_CLAIM_HARMED.value]
    assert harm["claim_id"] == held.claim_id
    assert harm.get("cause")
    assert [d for d in written if d["event"] == "reaction_fail"]
    await backend.aclose()


async def test_harm_is_only_logged_by_default(tmp_path: Path) -> None:
    """Under the default reaction a harmed claim is logged and counted, and the run goes on."""
    t = FakeTime()
    backend = make_backend(t)
    async with claimed(backend, t, tmp_path, ProtectionMode.SOFT_PRIORITY) as session:
        with session.node("a"):
            await ask(backend, PROMPT)
        await session.settle()
        pressure(backend, 64)
    assert session.stats.claims_harmed == 1
    [ended] = [h for h in session.ended_claims if h.end_reason == "harmed"]
    assert ended.state == "harmed"
    await backend.aclose()


def test_reaction_policy_checks_its_event_reactions() -> None:
    """Unknown lapse or harm reactions are usage errors naming the field; fail implies fail."""
    with pytest.raises(ValueError, match="on_lapsed"):
        ReactionPolicy(on_lapsed="pray")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="on_harmed"):
        ReactionPolicy(on_harmed="shrug")  # type: ignore[arg-type]
    assert ReactionPolicy.named("fail").on_harmed == "fail"
    assert ReactionPolicy.named("defer").on_harmed == "log"


async def test_harm_during_a_tool_call_counts_after_the_node_supersedes_the_claim(
    tmp_path: Path,
) -> None:
    """The claim held across a tool call is harmed; the node's next call supersedes it before
    the harm event is read: the harm is still counted, and raised under ``fail``."""
    from agentclaims.gateway.text import Reply
    from agentclaims.testing import FakeBackend

    backend = FakeBackend(
        script=lambda r: Reply.tool("search") if r.turn == 0 else Reply.text("ok")
    )
    t = FakeTime()

    async def run() -> ClaimedSession:
        async with claimed(
            backend, t, tmp_path, ProtectionMode.SOFT_PRIORITY, reaction="fail"
        ) as session:
            with session.node("agent"):
                await ask(backend, PROMPT)
                async with session.tool_call("search"):
                    await session.settle()
                    backend.kv.harm(session.claims["agent"].claim_id, cause="evicted")
                await ask(backend, [*PROMPT, {"role": "assistant", "content": "searching"}])
                await session.settle()
        return session

    with pytest.raises(ClaimHarmed) as info:
        await run()
    assert info.value.event is not None
    assert info.value.event.data["cause"] == "evicted"
    await backend.aclose()


async def test_a_claim_is_replanned_once_per_wait(tmp_path: Path) -> None:
    """A claim that lapses again in the same wait (no call of its node in between) is
    dropped, not claimed again on the same evidence; the node's next call plans afresh."""
    t = FakeTime()
    backend = make_backend(t)
    async with claimed(backend, t, tmp_path, ProtectionMode.EXPIRING, ttl_s=1.0) as session:
        with session.node("a"):
            await ask(backend, PROMPT)
        await session.settle()
        for other in ("b", "c"):  # two TTLs end while "a" still waits
            t.ns += 5_000_000_000
            with session.node(other):
                await ask(backend, [{"role": "user", "content": f"short {other}"}])
            await session.settle()
        assert session.stats.claims_expired == 2
        assert session.stats.claims_replanned == 1
        assert "a" not in session.claims
        with session.node("a"):  # a new wait: its claim is planned again
            await ask(backend, PROMPT)
        await session.settle()
        assert "a" in session.claims
    written = lines(tmp_path, session)
    assert [d["node"] for d in written if d["event"] == "reaction_replan"] == ["a"]
    assert [d["node"] for d in written if d["event"] == "reaction_drop"] == ["a"]
    await backend.aclose()


@given(
    mode=st.sampled_from(list(ProtectionMode)),
    ttl=st.one_of(st.none(), st.floats(0.0, 100.0)),
    held_for=st.floats(0.0, 100.0),
)
def test_only_a_pin_with_time_left_is_released_on_its_own(
    mode: ProtectionMode, ttl: float | None, held_for: float
) -> None:
    """Letting a claim go: a soft hold always rides on the next call; a pin does too when its
    TTL ends within ``PIN_RIDE_S`` (its blocks stay pinned no longer than that), else it is
    released at once."""
    from agentclaims.planner import ClaimPlan
    from agentclaims.session.claims import PIN_MODES, PIN_RIDE_S, release_at_once
    from agentclaims.session.held import HeldClaim

    now = 1000.0
    held = HeldClaim("s-1-c1", "agent", "p", ClaimPlan(mode, ttl, "test"), "b", now - held_for)
    at_once = release_at_once(held, now)
    if mode not in PIN_MODES:
        assert not at_once
    elif ttl is None:
        assert at_once
    else:
        assert at_once == (ttl - held_for > PIN_RIDE_S)


async def test_a_stalled_log_sink_holds_up_no_call(tmp_path: Path) -> None:
    """The session's log is written by the log thread: with its stream stalled (a full pipe),
    the calls and their claims go on and nothing is written yet; once the stream takes lines
    again, the session's end writes every line, ``session_ended`` last."""
    t = FakeTime()
    backend = make_backend(t)
    sink = StalledSink()
    always = Always(ProtectionMode.DEMOTABLE, None)
    async with ClaimedSession(
        backend, planner=always, sleep=t.sleep, clock=t.clock_s, log_stream=sink
    ) as session:
        for node in ("a", "b", "a"):
            with session.node(node):
                await ask(backend, PROMPT)
        await session.settle()
        assert session.stats.llm_calls == 3
        assert session.stats.claims_accepted >= 1
        assert sink.getvalue() == ""  # every line still waits in the log thread
        sink.go.set()
    written = [json.loads(line) for line in sink.getvalue().splitlines()]
    assert [d["event"] for d in written].count("llm_call") == 3
    assert written[0]["event"] == "session_started"
    assert written[-1]["event"] == "session_ended"
    await backend.aclose()
