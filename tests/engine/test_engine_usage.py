"""Owner scopes, caps, cache identity, write no-admit, and bad input that changes nothing."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from agentclaims.contract import (
    ArbiterAction,
    CacheIdentity,
    ClaimState,
    Decision,
    EventName,
    ProtectionMode,
)
from agentclaims.engine import KVEngine
from agentclaims.errors import (
    AgentClaimsError,
    ScopeViolation,
    UnknownClaim,
    UsageError,
)

if TYPE_CHECKING:  # annotations only: the fixtures come from conftest.py
    from conftest import ChainFn, FakeClock, SpecFn, Warm

M = ProtectionMode


def _snapshot(engine: KVEngine, *, claims: bool = True) -> tuple[Any, ...]:
    """Everything an observer can see of the engine's state (``claims_of`` expires due
    claims, a legal change, so ``claims=False`` leaves the claim views out)."""
    views = [v.to_dict() for o in ("wf", "other") for v in engine.claims_of(o)] if claims else []
    return (
        engine.stats.to_dict(),
        engine.free_blocks,
        engine.resident_blocks,
        engine.active_blocks,
        engine.protected_resident_blocks,
        engine.host_resident_blocks,
        engine.last_seq,
        [e.to_dict() for e in engine.events_since(0)],
        engine.active_requests(),
        views,
    )


@pytest.fixture
def busy(clock: FakeClock, chain: ChainFn, spec: SpecFn, warmup: Warm) -> KVEngine:
    """An engine with residents, a live claim, an expiring claim and an active request."""
    engine = KVEngine(16, 4, clock=clock, host_blocks=2, owner_cap_blocks=12)
    hashes = chain(1, 4)
    warmup(engine, "w", hashes)
    engine.submit_claim(spec("h", hashes, M.HARD_PROTECTED), hashes)
    engine.submit_claim(spec("x", chain(2, 2), M.EXPIRING, ttl_s=5.0), chain(2, 2))
    assert engine.begin("running", chain(3, 3)).served
    return engine


def test_other_owner_cannot_touch_a_claim(busy: KVEngine, clock: FakeClock) -> None:
    """get, renew and release from another owner raise ScopeViolation and change nothing."""
    clock.advance(10.0)  # the TTL claim is due: even its expiry must wait for a legal call
    before = _snapshot(busy, claims=False)
    for call in (
        lambda: busy.get_claim("x", "other"),
        lambda: busy.renew_claim("x", "other", duration_steps=3),
        lambda: busy.release_claim("h", "other"),
    ):
        with pytest.raises(ScopeViolation) as info:
            call()
        assert info.value.owner_scope == "other"
        assert _snapshot(busy, claims=False) == before
    assert busy.get_claim("x", "wf").state is ClaimState.EXPIRED


def test_unknown_claim_is_unknown(busy: KVEngine) -> None:
    """An id nobody submitted is UnknownClaim (also a KeyError) for every call."""
    before = _snapshot(busy)
    for call in (busy.get_claim, busy.release_claim, busy.renew_claim):
        with pytest.raises(UnknownClaim) as info:
            call("nope", "wf")
        assert isinstance(info.value, KeyError)
    assert _snapshot(busy) == before


def test_owner_cap_refuses_the_claim_past_it(chain: ChainFn, spec: SpecFn) -> None:
    """Past the per-owner cap a claim is refused (refuse_residency_claim); best_effort is free."""
    engine = KVEngine(32, 4, owner_cap_blocks=6)
    assert engine.submit_claim(spec("a", chain(1, 4), M.SOFT_PRIORITY), chain(1, 4)).accepted
    refused = engine.submit_claim(spec("b", chain(2, 4), M.HARD_PROTECTED), chain(2, 4))
    assert (refused.decision, refused.state, refused.action, refused.reason) == (
        Decision.REJECTED,
        ClaimState.REFUSED,
        ArbiterAction.REFUSE_RESIDENCY_CLAIM,
        "owner_cap_exceeded",
    )
    assert engine.submit_claim(spec("c", chain(3, 4), M.BEST_EFFORT), chain(3, 4)).accepted
    assert engine.submit_claim(spec("d", chain(4, 4), M.DEMOTABLE, owner="t2"), chain(4, 4))
    engine.release_claim("a", "wf")
    assert engine.submit_claim(spec("e", chain(2, 4), M.HARD_PROTECTED), chain(2, 4)).accepted
    assert (engine.stats.claims_accepted, engine.stats.claims_rejected) == (4, 1)


def test_cache_identity_mismatch_is_refused(chain: ChainFn, spec: SpecFn) -> None:
    """A claim made for another model (or block size, tokenizer, adapter) is refused."""
    engine = KVEngine(16, 4)
    for n, ident in enumerate(
        (
            CacheIdentity("agentclaims-embedded", "other-model", "agentclaims-bytes", "default", 4),
            CacheIdentity("agentclaims-embedded", "scripted", "agentclaims-bytes", "default", 8),
            CacheIdentity("agentclaims-embedded", "scripted", "other-tok", "default", 4),
            CacheIdentity(
                "agentclaims-embedded", "scripted", "agentclaims-bytes", "default", 4, "a"
            ),
        )
    ):
        hashes = chain(n, 2)
        out = engine.submit_claim(
            spec(f"c{n}", hashes, M.HARD_PROTECTED, cache_identity=ident), hashes
        )
        assert (out.decision, out.reason) == (Decision.REJECTED, "cache_identity_mismatch")
    assert engine.protected_resident_blocks == 0


def test_claim_larger_than_the_pool_is_refused(chain: ChainFn, spec: SpecFn) -> None:
    """A claim that could never fit is refused as exceeds_capacity."""
    engine = KVEngine(4, 4)
    hashes = chain(1, 5)
    assert engine.submit_claim(spec("big", hashes, M.SOFT_PRIORITY), hashes).reason == (
        "exceeds_capacity"
    )


def test_conditional_acceptance_caps_the_duration(chain: ChainFn, spec: SpecFn) -> None:
    """Past max_duration_steps the claim is conditionally accepted with the cap as condition."""
    engine = KVEngine(8, 4, max_duration_steps=5)
    hashes = chain(1, 2)
    out = engine.submit_claim(spec("x", hashes, M.EXPIRING, duration_steps=50), hashes)
    assert out.decision is Decision.CONDITIONALLY_ACCEPTED
    assert out.conditions == {"duration_steps": 5}
    assert engine.get_claim("x", "wf").expires_at_step == 5


def test_renew_extends_and_release_ends(chain: ChainFn, spec: SpecFn, warmup: Warm) -> None:
    """renew counts from now; release ends the claim as expired (released), once."""
    engine = KVEngine(8, 4)
    hashes = chain(1, 2)
    warmup(engine, "w", hashes)
    engine.submit_claim(spec("x", hashes, M.EXPIRING, duration_steps=2), hashes)
    engine.step()
    assert engine.renew_claim("x", "wf", duration_steps=4).expires_at_step == 5
    engine.step(3)
    assert engine.get_claim("x", "wf").state is ClaimState.MATERIALIZED
    view = engine.release_claim("x", "wf")
    assert (view.state, view.end_reason) == (ClaimState.EXPIRED, "released")
    seq = engine.last_seq
    assert engine.release_claim("x", "wf").state is ClaimState.EXPIRED
    assert engine.last_seq == seq
    with pytest.raises(UsageError) as info:
        engine.renew_claim("x", "wf", duration_steps=1)
    assert info.value.field == "claim_id"


def test_write_no_admit_still_evicts_residents(chain: ChainFn, warmup: Warm) -> None:
    """admit=False: served, future reuse denied, yet active allocation evicts residents (L2)."""
    engine = KVEngine(8, 4)
    resident = chain(1, 6)
    warmup(engine, "w", resident)
    engine.take_events()
    new = chain(2, 4)
    out = engine.begin("na", new, admit=False)
    assert out.action is ArbiterAction.SERVE_ACTIVE_NO_ADMIT
    assert out.evicted_blocks == 2
    assert engine.resident_run(resident) == 4
    engine.finish("na")
    assert not any(engine.is_cached(h) for h in new)
    assert engine.free_blocks == 4
    names = [e.event for e in engine.take_events()]
    assert names.count(EventName.FUTURE_REUSE_DENIED) == 1
    assert EventName.FUTURE_REUSE_ADMITTED not in names


BadCall = Callable[[KVEngine, "ChainFn", "SpecFn"], object]
BAD_CALLS: list[tuple[str, str, BadCall]] = [
    ("empty request id", "request_id", lambda e, c, s: e.begin("", c(9, 2))),
    ("non-str request id", "request_id", lambda e, c, s: e.begin(7, c(9, 2))),  # type: ignore[arg-type]
    ("duplicate request", "request_id", lambda e, c, s: e.begin("running", c(9, 2))),
    ("negative extra", "extra_blocks", lambda e, c, s: e.begin("r", c(9, 2), extra_blocks=-1)),
    ("bool extra", "extra_blocks", lambda e, c, s: e.begin("r", c(9, 2), extra_blocks=True)),
    ("prompt too long", "prompt_blocks", lambda e, c, s: e.begin("r", c(9, 2), prompt_blocks=3)),
    ("prompt negative", "prompt_blocks", lambda e, c, s: e.begin("r", c(9, 2), prompt_blocks=-1)),
    ("prompt float", "prompt_blocks", lambda e, c, s: e.begin("r", c(9, 2), prompt_blocks=1.0)),
    ("finish unknown", "request_id", lambda e, c, s: e.finish("ghost")),
    ("step zero", "n", lambda e, c, s: e.step(0)),
    ("step bool", "n", lambda e, c, s: e.step(True)),
    ("spec not a spec", "spec", lambda e, c, s: e.submit_claim({"claim_id": "z"})),  # type: ignore[arg-type]
    (
        "duplicate claim",
        "claim_id",
        lambda e, c, s: e.submit_claim(s("h", c(9, 2), M.SOFT_PRIORITY), c(9, 2)),
    ),
    (
        "footprint mismatch",
        "footprint_blocks",
        lambda e, c, s: e.submit_claim(s("n", c(9, 2), M.SOFT_PRIORITY), c(9, 3)),
    ),
    (
        "repeated hashes",
        "block_hashes",
        lambda e, c, s: e.submit_claim(s("n", c(9, 2), M.SOFT_PRIORITY), [c(9, 1)[0]] * 2),
    ),
    (
        "unknown prefix",
        "object_id",
        lambda e, c, s: e.submit_claim(s("n", c(9, 2), M.SOFT_PRIORITY)),
    ),
    ("renew zero", "duration_steps", lambda e, c, s: e.renew_claim("x", "wf", duration_steps=0)),
    ("renew bool", "duration_steps", lambda e, c, s: e.renew_claim("x", "wf", duration_steps=True)),
    ("renew nan ttl", "ttl_s", lambda e, c, s: e.renew_claim("x", "wf", ttl_s=math.nan)),
    ("renew negative ttl", "ttl_s", lambda e, c, s: e.renew_claim("x", "wf", ttl_s=-1.0)),
]


@pytest.mark.parametrize(
    ("field", "call"), [b[1:] for b in BAD_CALLS], ids=[b[0] for b in BAD_CALLS]
)
def test_bad_input_names_the_field_and_changes_nothing(
    busy: KVEngine, chain: ChainFn, spec: SpecFn, field: str, call: BadCall
) -> None:
    """Every public entry point refuses bad values by name, before changing any state."""
    before = _snapshot(busy)
    with pytest.raises(UsageError) as info:
        call(busy, chain, spec)
    assert info.value.field == field
    assert _snapshot(busy) == before
    busy.check_invariants()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"num_blocks": 0}, "num_blocks"),
        ({"num_blocks": True}, "num_blocks"),
        ({"num_blocks": 4, "block_size": 0}, "block_size"),
        ({"num_blocks": 4, "host_blocks": -1}, "host_blocks"),
        ({"num_blocks": 4, "owner_cap_blocks": -1}, "owner_cap_blocks"),
        ({"num_blocks": 4, "max_duration_steps": 0}, "max_duration_steps"),
        ({"num_blocks": 4, "max_ttl_s": 0.0}, "max_ttl_s"),
        ({"num_blocks": 4, "event_buffer": 0}, "event_buffer"),
    ],
)
def test_bad_engine_settings_fail_at_construction(kwargs: dict[str, Any], field: str) -> None:
    """Settings are checked when the engine is built, by name."""
    with pytest.raises(UsageError) as info:
        KVEngine(**kwargs)
    assert info.value.field == field
    assert isinstance(info.value, AgentClaimsError)
