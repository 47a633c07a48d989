"""Reactions to refusals on the embedded engine, under pressure from another owner's claim.

Time is fake: one clock drives the engine (ns), the session (s) and the injected sleep, which
records each delay and advances the clock instead of waiting.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import agentclaims
from agentclaims.backends.embedded import EmbeddedBackend
from agentclaims.backends.pool import BackendPool
from agentclaims.contract import ClaimSpec, ProtectionMode
from agentclaims.engine import BlockHash, ServiceTimes
from agentclaims.errors import BackendUnavailable, ClaimRefused, DeadlineExceeded
from agentclaims.gateway.text import Reply
from agentclaims.planner import ClaimPlan, ClaimPlanner, PrefixContext
from agentclaims.session import ClaimedSession, ReactionPolicy
from agentclaims.testing import FakeBackend

NO_WAIT = ServiceTimes(prefill_s_per_token=0.0, decode_s_per_token=0.0)
BIG = [{"role": "user", "content": "w " * 500}]  # more than the 24 blocks left unclaimed


class FakeTime:
    """A clock in nanoseconds and seconds, and a sleep that records and advances it."""

    def __init__(self) -> None:
        self.ns = 1_000_000_000
        self.sleeps: list[float] = []

    def clock_ns(self) -> int:
        return self.ns

    def clock_s(self) -> float:
        return self.ns / 1e9

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.ns += int(seconds * 1e9)


def make_backend(t: FakeTime, name: str = "embedded", **kw: Any) -> EmbeddedBackend:
    return EmbeddedBackend(
        num_blocks=64, block_size=16, clock=t.clock_ns, service=NO_WAIT, name=name, **kw
    )


def block(backend: EmbeddedBackend, mode: str, blocks: int = 40, ttl_s: float | None = None) -> str:
    """Another owner's claim on ``blocks`` resident blocks; returns its id."""
    engine = backend.engine
    hashes = [BlockHash(10_000 + i) for i in range(blocks)]
    engine.begin("seed", hashes)
    engine.finish("seed")
    spec = ClaimSpec(
        "blocker", "other", "pfx-blocker", engine.cache_identity, blocks, mode, ttl_s=ttl_s
    )
    assert engine.submit_claim(spec, hashes).accepted
    return "blocker"


def session_live(backend: EmbeddedBackend, session: ClaimedSession) -> list[str]:
    return [v.claim_id for v in backend.engine.claims_of(session.owner_scope) if v.state.live]


def reactions(log_dir: Path, session: ClaimedSession) -> list[dict[str, Any]]:
    lines = (log_dir / f"{session.workflow_id}.jsonl").read_text().splitlines()
    return [d for d in map(json.loads, lines) if d["event"].startswith("reaction_")]


async def ask(backend: Any, messages: list[dict[str, Any]] = BIG) -> Any:
    client = agentclaims.openai_client(backend)
    return await client.chat.completions.create(model="scripted", messages=messages)


async def test_defer_honours_retry_after_of_an_expiring_claim(tmp_path):
    """Deferred until the blocking expiring claim's TTL ends: the wait is exactly Retry-After."""
    t = FakeTime()
    backend = make_backend(t)
    block(backend, "expiring", ttl_s=0.75)
    async with ClaimedSession(backend, sleep=t.sleep, clock=t.clock_s, log_dir=tmp_path) as session:
        reply = await ask(backend)
    assert reply.choices[0].message.content.startswith("echo:")
    assert t.sleeps == [pytest.approx(0.75)]
    assert session.stats.deferrals == 1
    assert session.stats.deferral_s == pytest.approx(0.75)
    [defer] = reactions(tmp_path, session)
    assert defer["event"] == "reaction_defer"
    assert defer["outcome"]["blocking_claim_ids"] == ["blocker"]
    assert defer["outcome"]["retry_after_s"] == pytest.approx(0.75)
    assert session_live(backend, session) == []
    await backend.aclose()


async def test_reroute_moves_the_session_and_keeps_affinity(tmp_path):
    """A refusal on one pool member moves the session to the other, where it then stays."""
    t = FakeTime()
    a, b = make_backend(t, "a"), make_backend(t, "b")
    block(a, "hard_protected", ttl_s=60)
    pool = BackendPool([a, b])
    async with ClaimedSession(
        pool, reaction="reroute", sleep=t.sleep, clock=t.clock_s, log_dir=tmp_path
    ) as session:
        assert session.backend.name == "a"
        await ask(a)
        assert session.backend.name == "b"
        await ask(a)  # the client's default backend is a: the session's affinity wins
    assert session.stats.reroutes == 1
    assert session.stats.llm_calls == 2
    assert t.sleeps == [0.0]  # a reroute retries at once
    [reroute] = [r for r in reactions(tmp_path, session) if r["event"] == "reaction_reroute"]
    assert (reroute["from_backend"], reroute["to_backend"]) == ("a", "b")
    assert reroute["outcome"]["action"] == "refuse_active"
    assert a.kv.counters.refused == 1
    assert b.kv.counters.requests == 2
    assert session_live(a, session) == session_live(b, session) == []
    await pool.aclose()


class AlwaysHard(ClaimPlanner):
    """A planner that asks for a hard claim on every prefix."""

    def plan(self, ctx: PrefixContext) -> ClaimPlan:
        return ClaimPlan(ProtectionMode.HARD_PROTECTED, 5.0, "test: always hard")


async def test_refused_residency_claim_is_relaxed_one_mode(tmp_path):
    """With no room for protected claims, hard is refused, retried weaker, and logged."""
    t = FakeTime()
    backend = make_backend(t, protected_cap_blocks=0, script=lambda r: Reply.tool("search"))
    async with ClaimedSession(
        backend, planner=AlwaysHard(), sleep=t.sleep, clock=t.clock_s, log_dir=tmp_path
    ) as session:
        await ask(backend, [{"role": "user", "content": "q " * 100}])
        await session.settle()  # the claim is planned and submitted after the answer
        [held] = session.claims.values()
        modes = [v.protection_mode for v in backend.engine.claims_of(session.owner_scope)]
    relaxed = [r for r in reactions(tmp_path, session) if r["event"] == "reaction_relax"]
    assert relaxed[0]["from_mode"] == "hard_protected"
    assert relaxed[0]["to_mode"] == "expiring"
    assert relaxed[0]["outcome"] == "protected_capacity_exceeded"
    ladder = [ProtectionMode.HARD_PROTECTED, ProtectionMode.EXPIRING, ProtectionMode.BEST_EFFORT]
    assert modes == ladder[: len(modes)]
    assert held.plan.mode is modes[-1]
    assert session.stats.claims_relaxed == len(relaxed) == len(modes) - 1
    assert session.stats.claims_accepted == 1
    assert session_live(backend, session) == []
    await backend.aclose()


async def test_fail_names_the_blocking_claim_and_outcome(tmp_path):
    """Under `fail`, a refused request raises ClaimRefused naming the blocker; nothing leaks."""
    t = FakeTime()
    backend = make_backend(t)
    block(backend, "hard_protected", ttl_s=60)
    with pytest.raises(ClaimRefused) as info:
        async with ClaimedSession(
            backend, reaction="fail", sleep=t.sleep, clock=t.clock_s, log_dir=tmp_path
        ) as session:
            await ask(backend)
    assert info.value.blocking_claim_ids == ("blocker",)
    assert info.value.claim_id == "blocker"
    assert info.value.outcome.action.value == "refuse_active"
    assert "blocker" in str(info.value)
    assert t.sleeps == []
    [fail] = reactions(tmp_path, session)
    assert fail["event"] == "reaction_fail"
    assert session_live(backend, session) == []
    await backend.aclose()


async def test_deadline_exceeded_after_deadline_s(tmp_path):
    """A refusal that never clears is retried with backoff until deadline_s, then fails."""
    t = FakeTime()
    backend = FakeBackend(clock=t.clock_ns)
    backend.kv.refuse_requests(1000, blocking=["blocker"])  # more than the deadline allows
    policy = ReactionPolicy(deadline_s=2.0, max_delay_s=0.5)
    with pytest.raises(DeadlineExceeded) as info:
        async with ClaimedSession(
            backend, reaction=policy, sleep=t.sleep, clock=t.clock_s, log_dir=tmp_path
        ) as session:
            await ask(backend)
    assert info.value.blocking_claim_ids == ("blocker",)
    assert info.value.outcome.action.value == "refuse_active"
    # backoff with jitter, capped at max_delay_s, until the session's clock passes deadline_s
    assert 2.0 <= sum(t.sleeps) < 2.0 + 0.5 + 0.02
    assert all(0 < d <= 0.52 for d in t.sleeps)
    assert [r["event"] for r in reactions(tmp_path, session)] == [
        *(["reaction_defer"] * len(t.sleeps)),
        "reaction_fail",
    ]
    assert len(backend.kv.calls_of("serve")) == len(t.sleeps) + 1
    await backend.aclose()


async def test_retry_after_beyond_the_deadline_fails_at_once(tmp_path):
    """A deferral whose Retry-After lies past the deadline fails now instead of oversleeping."""
    t = FakeTime()
    backend = FakeBackend(clock=t.clock_ns)
    backend.kv.defer_requests(retry_after_s=1000, blocking=["blocker"])
    with pytest.raises(DeadlineExceeded) as info:
        async with ClaimedSession(
            backend, reaction=ReactionPolicy(deadline_s=2.0), sleep=t.sleep, clock=t.clock_s
        ):
            await ask(backend)
    assert info.value.outcome.action.value == "defer_active"
    assert info.value.blocking_claim_ids == ("blocker",)
    assert t.sleeps == []
    await backend.aclose()


async def test_backend_down_raises_backend_unavailable():
    """A session on a closed port fails with BackendUnavailable and leaves nothing behind."""
    down = agentclaims.HTTPBackend("http://127.0.0.1:9/v1")
    with pytest.raises(BackendUnavailable):
        async with ClaimedSession(down) as session:
            await ask(down, [{"role": "user", "content": "hello"}])
    assert session.claims == {}
    assert session.stats.claims_submitted == 0
    await down.aclose()
