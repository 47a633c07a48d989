"""The engine keeps every live claim and the last ended ones up to ``max_claims``: past it,
the oldest that ended are forgotten, so its memory does not grow with every claim ever made.
A forgotten claim reads as unknown; its TTL ending later is no error."""

from __future__ import annotations

import pytest
from conftest import FakeClock, make_chain, make_spec, warm
from hypothesis import given, settings
from hypothesis import strategies as st

from agentclaims.contract import ClaimState, ProtectionMode
from agentclaims.engine import KVEngine
from agentclaims.errors import UnknownClaim


@settings(max_examples=60, deadline=None)
@given(
    ends=st.lists(st.sampled_from(["keep", "release", "ttl"]), min_size=1, max_size=30),
    keep=st.integers(min_value=1, max_value=8),
)
def test_the_oldest_ended_claims_are_forgotten_never_a_live_one(ends: list[str], keep: int) -> None:
    """Claims made one after another, each kept, released, or left to a 1 s TTL: whatever
    the order, every live claim is still known and reads as it is, the claims known never
    exceed ``keep`` while enough have ended, the forgotten ones are the oldest ended and read
    as unknown, and the TTLs of forgotten claims running out later change nothing."""
    clock = FakeClock()
    engine = KVEngine(256, 4, clock=clock)
    engine.max_claims = keep
    made: list[tuple[str, str]] = []
    for i, end in enumerate(ends):
        hashes = make_chain(i + 1, 2)
        warm(engine, f"w{i}", hashes)
        cid = f"c{i}"
        ttl = 1.0 if end in ("ttl", "release") else 60.0  # a released one keeps its deadline
        decision = engine.submit_claim(
            make_spec(cid, hashes, ProtectionMode.EXPIRING, ttl_s=ttl), hashes
        )
        assert decision.state.live
        if end == "release":
            engine.release_claim(cid, "wf")
        made.append((cid, end))
    live = {cid for cid, end in made if end != "release"}
    for cid in live:
        assert engine.get_claim(cid, "wf").state.live
    known = [cid for cid, _ in made if engine.has_claim(cid)]
    forgotten = [cid for cid, _ in made if cid not in known]
    assert live <= set(known)
    assert len(known) <= keep or all(c in live for c in known[: len(known) - keep])
    ended_known = [cid for cid in known if cid not in live]
    assert all(int(f[1:]) < int(k[1:]) for f in forgotten for k in ended_known)
    for cid in forgotten:
        with pytest.raises(UnknownClaim):
            engine.get_claim(cid, "wf")
    clock.advance(2.0)  # every TTL runs out, the forgotten claims' included
    for cid, end in made:
        if end == "ttl":
            assert engine.get_claim(cid, "wf").state is ClaimState.EXPIRED


def test_an_owner_whose_claims_all_ended_is_not_kept() -> None:
    """Every session is an owner scope: once its claims have ended, the engine keeps no count
    for it (the counts would otherwise grow with every session ever run)."""
    engine = KVEngine(64, 4)
    for i in range(3):
        hashes = make_chain(i + 1, 2)
        warm(engine, f"w{i}", hashes)
        engine.submit_claim(
            make_spec(f"c{i}", hashes, ProtectionMode.DEMOTABLE, owner=f"s{i}"), hashes
        )
    assert engine._owner_blocks == {"s0": 2, "s1": 2, "s2": 2}
    engine.release_claim("c1", "s1")
    assert engine._owner_blocks == {"s0": 2, "s2": 2}
