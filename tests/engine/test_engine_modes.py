"""Each protection mode under allocation pressure, as the contract describes it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentclaims.contract import (
    ArbiterAction,
    ClaimEvent,
    ClaimState,
    EventName,
    Feasibility,
    ProtectionMode,
    rebuild_claims,
)
from agentclaims.engine import KVEngine

if TYPE_CHECKING:  # annotations only: the fixtures come from conftest.py
    from conftest import ChainFn, FakeClock, SpecFn, Warm

M = ProtectionMode
E = EventName


def _names(events: list[ClaimEvent], claim_id: str | None = None) -> list[EventName]:
    return [e.event for e in events if claim_id is None or e.claim_id == claim_id]


def test_hard_claim_is_never_a_victim(chain: ChainFn, spec: SpecFn, warmup: Warm) -> None:
    """Many unclaimed requests churn the pool; the hard claim keeps every block."""
    engine = KVEngine(12, 4)
    claimed = chain(1, 6)
    warmup(engine, "w", claimed)
    assert engine.submit_claim(spec("h", claimed, M.HARD_PROTECTED), claimed).state is (
        ClaimState.MATERIALIZED
    )
    for i in range(20):
        warmup(engine, f"r{i}", chain(100 + i, 6))
    assert engine.resident_run(claimed) == 6
    assert engine.stats.evicted_blocks > 0
    assert engine.stats.evicted_claimed_blocks == 0
    engine.check_invariants()


def test_hard_claim_refuses_active_request_naming_the_claim(
    chain: ChainFn, spec: SpecFn, warmup: Warm
) -> None:
    """No room without breaking the claim: refuse, name it, lose nothing (L3)."""
    engine = KVEngine(10, 4)
    claimed = chain(1, 6)
    warmup(engine, "w", claimed)
    engine.submit_claim(spec("h", claimed, M.HARD_PROTECTED), claimed)
    engine.take_events()
    out = engine.begin("big", chain(2, 6))
    assert not out.served
    assert out.action is ArbiterAction.REFUSE_ACTIVE
    assert out.feasibility is Feasibility.INFEASIBLE_PRESERVE_RESIDENT_AND_ACTIVE
    assert out.blocking_claim_ids == ("h",)
    assert out.shortfall_blocks == 2
    (event,) = engine.take_events()
    assert event.event is E.ACTIVE_REQUEST_REFUSED
    assert event.data["blocking_claim_ids"] == ["h"]
    assert event.data["feasibility"] == "infeasible_preserve_resident_and_active"
    assert engine.resident_run(claimed) == 6
    assert engine.active_requests() == []
    assert engine.stats.requests_refused == 1


def test_hard_claim_defers_when_active_work_holds_the_room(
    chain: ChainFn, spec: SpecFn, warmup: Warm
) -> None:
    """Room is held by other active work: defer (feasible_after_active_drain), then serve."""
    engine = KVEngine(10, 4)
    claimed = chain(1, 4)
    warmup(engine, "w", claimed)
    engine.submit_claim(spec("h", claimed, M.HARD_PROTECTED), claimed)
    assert engine.begin("holder", chain(2, 4)).served
    out = engine.begin("late", chain(3, 4))
    assert out.action is ArbiterAction.DEFER_ACTIVE
    assert out.feasibility is Feasibility.FEASIBLE_AFTER_ACTIVE_DRAIN
    assert out.blocking_claim_ids == ()
    assert engine.stats.requests_deferred == 1
    engine.finish("holder")
    again = engine.begin("late", chain(3, 4))
    assert again.served
    assert again.action is ArbiterAction.SERVE_ACTIVE_EVICT_RESIDENT
    assert engine.resident_run(claimed) == 4


def test_request_larger_than_pool_requires_capacity(chain: ChainFn) -> None:
    """A request larger than the whole usable pool is capacity_required, blocking nobody."""
    engine = KVEngine(8, 4)
    out = engine.begin("huge", chain(1, 7), extra_blocks=2)
    assert out.action is ArbiterAction.CAPACITY_REQUIRED
    assert out.feasibility is Feasibility.INFEASIBLE_EXCEEDS_CAPACITY
    assert out.blocking_claim_ids == ()
    assert engine.free_blocks == 8


def test_hard_claim_hit_is_served(chain: ChainFn, spec: SpecFn, warmup: Warm) -> None:
    """A request reusing the claimed prefix is served from it, without recompute."""
    engine = KVEngine(10, 4)
    claimed = chain(1, 6)
    warmup(engine, "w", claimed)
    engine.submit_claim(spec("h", claimed, M.HARD_PROTECTED), claimed)
    out = engine.begin("reuse", [*claimed, *chain(2, 2)], prompt_blocks=6)
    assert out.served
    assert (out.hit_blocks, out.computed_blocks) == (6, 2)


def test_soft_claim_is_evicted_after_unclaimed_blocks_and_harm_is_reported(
    chain: ChainFn, spec: SpecFn, warmup: Warm
) -> None:
    """Unclaimed blocks go first; then the soft claim loses blocks: true harm with predicates."""
    engine = KVEngine(10, 4)
    soft, plain = chain(1, 4), chain(2, 4)
    warmup(engine, "w1", soft)
    warmup(engine, "w2", plain)
    engine.submit_claim(spec("s", soft, M.SOFT_PRIORITY), soft)
    assert engine.begin("a", chain(3, 6)).served  # 2 free + the 4 unclaimed blocks
    assert engine.resident_run(plain) == 0
    assert engine.resident_run(soft) == 4
    assert engine.stats.true_harm == 0
    engine.finish("a")
    out = engine.begin("b", chain(4, 10))
    assert out.action is ArbiterAction.SERVE_ACTIVE_EVICT_RESIDENT
    events = engine.take_events()
    harmed = [e for e in events if e.event is E.RESIDENT_CLAIM_HARMED]
    assert len(harmed) == 1
    assert harmed[0].claim_id == "s"
    assert harmed[0].data["predicate_before"] is True
    assert harmed[0].data["predicate_after"] is False
    assert harmed[0].request_id == "b"
    assert engine.get_claim("s", "wf").state is ClaimState.HARMED
    assert (engine.stats.true_harm, engine.stats.true_harm_hard) == (1, 0)


def test_demotion_comes_before_loss(chain: ChainFn, spec: SpecFn, warmup: Warm) -> None:
    """The demoted event precedes every loss; later losses are post-release, not harm (L4)."""
    engine = KVEngine(8, 4)
    claimed = chain(1, 6)
    warmup(engine, "w", claimed)
    engine.submit_claim(spec("d", claimed, M.DEMOTABLE), claimed)
    engine.take_events()
    assert engine.begin("p", chain(2, 5)).served  # 2 free + 3 of the claim
    events = engine.take_events()
    names = _names(events, "d")
    assert names[0] is E.RESIDENT_CLAIM_DEMOTED
    assert names.count(E.RESIDENT_CLAIM_BLOCK_LOST_AFTER_RELEASE) == 3
    assert E.RESIDENT_CLAIM_HARMED not in names
    assert events[0].data["action"] == "relax_resident_claim"
    assert engine.stats.blocks_lost_after_release == 3
    assert engine.stats.true_harm == 0
    history = rebuild_claims(engine.events_since(0))["d"]
    assert history.state is ClaimState.DEMOTED
    assert history.blocks_lost_after_release == 3


def test_offloaded_claim_is_restored_on_reuse(chain: ChainFn, spec: SpecFn, warmup: Warm) -> None:
    """Pressure moves the claim to the host tier; reuse restores it, with no recompute."""
    engine = KVEngine(8, 4, host_blocks=8)
    claimed = chain(1, 4)
    warmup(engine, "w", claimed)
    engine.submit_claim(spec("o", claimed, M.OFFLOADABLE), claimed)
    warmup(engine, "p", chain(2, 8))
    assert engine.host_resident_blocks == 4
    assert engine.resident_run(claimed) == 0
    view = engine.get_claim("o", "wf")
    assert (view.state, view.present_blocks, view.predicate_holds) == (
        ClaimState.MATERIALIZED,
        4,
        True,
    )
    engine.take_events()
    out = engine.begin("reuse", claimed)
    assert (out.hit_blocks, out.restored_blocks, out.computed_blocks) == (0, 4, 0)
    names = _names(engine.take_events(), "o")
    assert names == [E.RESIDENT_CLAIM_RESTORE_REQUIRED, E.RESIDENT_CLAIM_RESTORED]
    assert engine.host_resident_blocks == 0
    assert engine.resident_run(claimed) == 4
    assert engine.stats.true_harm == 0


def test_host_tier_overflow_fails_restoration_on_the_claim(
    chain: ChainFn, spec: SpecFn, warmup: Warm
) -> None:
    """A host tier too small loses block 0: restoration_failed, then harmed, on that claim."""
    engine = KVEngine(8, 4, host_blocks=2)
    claimed = chain(1, 4)
    warmup(engine, "w", claimed)
    engine.submit_claim(spec("o", claimed, M.OFFLOADABLE), claimed)
    engine.take_events()
    warmup(engine, "p", chain(2, 8))
    events = [e for e in engine.take_events() if e.claim_id == "o"]
    names = _names(events)
    failed = names.index(E.RESIDENT_CLAIM_RESTORATION_FAILED)
    assert names[failed + 1] is E.RESIDENT_CLAIM_HARMED
    assert events[failed].data["cause"] == "host_tier_full"
    assert events[failed + 1].data["cause"] == "restoration_failed"
    assert engine.host_resident_blocks <= 2
    assert engine.get_claim("o", "wf").state is ClaimState.HARMED
    assert (engine.stats.true_harm, engine.stats.true_harm_hard) == (1, 0)


def test_expiring_by_steps_then_ordinary_eviction(
    chain: ChainFn, spec: SpecFn, warmup: Warm
) -> None:
    """duration_steps counts engine steps; the expired event precedes any loss (L5)."""
    engine = KVEngine(8, 4)
    claimed = chain(1, 6)
    warmup(engine, "w", claimed)
    engine.submit_claim(spec("x", claimed, M.EXPIRING, duration_steps=3), claimed)
    engine.step(2)
    assert engine.begin("early", chain(2, 4)).action is ArbiterAction.DEFER_ACTIVE
    engine.step()
    assert engine.get_claim("x", "wf").end_reason == "duration_ended"
    engine.take_events()
    assert engine.begin("late", chain(2, 4)).served
    names = _names(engine.take_events(), "x")
    assert names == [E.RESIDENT_CLAIM_BLOCK_LOST_AFTER_RELEASE] * 2
    assert engine.stats.true_harm == 0
    assert engine.get_claim("x", "wf").state is ClaimState.EXPIRED


def test_expiring_by_ttl_on_an_injected_clock(
    clock: FakeClock, chain: ChainFn, spec: SpecFn, warmup: Warm
) -> None:
    """ttl_s is measured on the engine's clock: it ends when the clock passes the deadline."""
    engine = KVEngine(8, 4, clock=clock)
    claimed = chain(1, 4)
    warmup(engine, "w", claimed)
    engine.submit_claim(spec("x", claimed, M.EXPIRING, ttl_s=10.0), claimed)
    clock.advance(9.9)
    assert engine.get_claim("x", "wf").state is ClaimState.MATERIALIZED
    clock.advance(0.2)
    view = engine.get_claim("x", "wf")
    assert (view.state, view.end_reason) == (ClaimState.EXPIRED, "ttl_ended")
    expired = [e for e in engine.take_events() if e.event is E.RESIDENT_CLAIM_EXPIRED]
    assert expired[0].timestamp_ns == clock.now


def test_request_blocked_only_by_expiring_claims_is_deferred_with_retry(
    clock: FakeClock, chain: ChainFn, spec: SpecFn, warmup: Warm
) -> None:
    """Room frees when the expiring claim ends: defer, name it, say how long to wait."""
    engine = KVEngine(8, 4, clock=clock)
    claimed = chain(1, 6)
    warmup(engine, "w", claimed)
    engine.submit_claim(spec("x", claimed, M.EXPIRING, ttl_s=10.0), claimed)
    clock.advance(4.0)
    out = engine.begin("r", chain(2, 4))
    assert out.action is ArbiterAction.DEFER_ACTIVE
    assert out.feasibility is Feasibility.FEASIBLE_AFTER_CLAIM_EXPIRY
    assert out.blocking_claim_ids == ("x",)
    assert out.retry_after_s == 6.0
    clock.advance(6.0)
    assert engine.begin("r", chain(2, 4)).served


def test_hard_and_expiring_together_refuse_naming_both(
    chain: ChainFn, spec: SpecFn, warmup: Warm
) -> None:
    """When expiry alone would not make room, the request is refused naming every blocker."""
    engine = KVEngine(10, 4)
    hard, exp = chain(1, 4), chain(2, 4)
    warmup(engine, "w1", hard)
    warmup(engine, "w2", exp)
    engine.submit_claim(spec("h", hard, M.HARD_PROTECTED), hard)
    engine.submit_claim(spec("x", exp, M.EXPIRING, duration_steps=5), exp)
    assert engine.begin("fits-after-expiry", chain(3, 6)).feasibility is (
        Feasibility.FEASIBLE_AFTER_CLAIM_EXPIRY
    )
    out = engine.begin("never", chain(4, 7))
    assert out.action is ArbiterAction.REFUSE_ACTIVE
    assert out.blocking_claim_ids == ("h", "x")


def test_best_effort_is_a_hint(chain: ChainFn, spec: SpecFn, warmup: Warm) -> None:
    """best_effort goes after unclaimed blocks; its losses are ordinary, never harm."""
    engine = KVEngine(10, 4)
    hinted, plain = chain(1, 4), chain(2, 4)
    warmup(engine, "w1", hinted)
    warmup(engine, "w2", plain)
    engine.submit_claim(spec("b", hinted, M.BEST_EFFORT), hinted)
    assert engine.begin("a", chain(3, 6)).served
    assert (engine.resident_run(plain), engine.resident_run(hinted)) == (0, 4)
    engine.finish("a")
    assert engine.begin("b2", chain(4, 10)).served
    assert engine.resident_run(hinted) == 0
    names = _names(engine.take_events(), "b")
    assert E.RESIDENT_CLAIM_HARMED not in names
    assert E.ALLOCATION_VICTIM_SELECTED in names
    assert engine.stats.true_harm == 0
    assert engine.stats.evicted_claimed_blocks == 4
    assert engine.get_claim("b", "wf").predicate_holds is False


def test_claim_materializes_when_its_blocks_arrive(chain: ChainFn, spec: SpecFn) -> None:
    """A claim on a prefix not yet computed is accepted, then materialized by the request."""
    engine = KVEngine(8, 4)
    claimed = chain(1, 3)
    decision = engine.submit_claim(spec("h", claimed, M.HARD_PROTECTED), claimed)
    assert decision.state is ClaimState.ACCEPTED
    assert engine.begin("r", claimed).served
    names = _names(engine.take_events(), "h")
    assert names == [
        E.RESIDENT_CLAIM_SUBMITTED,
        E.RESIDENT_CLAIM_ACCEPTED,
        E.RESIDENT_CLAIM_MATERIALIZED,
    ]


def test_every_soft_claim_on_an_evicted_block_is_harmed(
    chain: ChainFn, spec: SpecFn, warmup: Warm
) -> None:
    """Two soft claims on one prefix both lose it when its block is evicted: both harmed."""
    engine = KVEngine(4, 4)  # the block size of the shared cache identity
    prefix = chain(1, 2)
    warmup(engine, "warm", prefix)
    for cid in ("a", "b"):
        assert engine.submit_claim(spec(cid, prefix, "soft_priority"), prefix).accepted
    assert engine.begin("pressure", chain(2, 4), admit=False).served
    states = {cid: engine.get_claim(cid, "wf").state for cid in ("a", "b")}
    assert states == {"a": ClaimState.HARMED, "b": ClaimState.HARMED}
    assert engine.stats.true_harm == 2
