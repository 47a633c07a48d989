"""``ClaimMirror``'s join with vLLM's KV events reads only the claims on the blocks an event
names (an index by block hash), and the mirror forgets the oldest ended claims past
``max_claims``: neither its memory nor the join grows with every claim ever made. Checked
against the plain scan of every claim it replaced, without vLLM."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agentclaims.contract import BlockHash, CacheIdentity, ClaimSpec, ClaimState, ProtectionMode
from agentclaims.vllm.mirror import ClaimMirror, MirroredClaim

IDENTITY = CacheIdentity("vllm:test", "m", "t", "default", 16)
STATES = [ClaimState.ACCEPTED, ClaimState.MATERIALIZED, ClaimState.EXPIRED, ClaimState.DEMOTED]


class _Source:
    run_id, policy_name, num_blocks = "run", "policy", 64

    @property
    def clock(self) -> Any:
        return time.monotonic_ns


def _mirror(max_claims: int) -> ClaimMirror:
    async def ask() -> Any:
        raise AssertionError("not asked here")

    async def release(claim_id: str, owner: str) -> None:
        return None

    return ClaimMirror(_Source(), asyncio.Lock(), ask=ask, release=release, max_claims=max_claims)


def _claim(i: int, hashes: list[int], state: ClaimState) -> MirroredClaim:
    spec = ClaimSpec(
        f"c{i}",
        "wf",
        f"pfx-{i:016x}-{len(hashes)}",
        IDENTITY,
        len(hashes),
        ProtectionMode.DEMOTABLE,
    )
    held = len(hashes) if state.live else 0
    return MirroredClaim(spec, state, held, hashes=tuple(BlockHash(h) for h in hashes))


_CLAIMS = st.lists(
    st.tuples(
        st.lists(st.integers(0, 30), min_size=1, max_size=6, unique=True), st.sampled_from(STATES)
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(claims=_CLAIMS, lost=st.sets(st.integers(0, 30), max_size=8))
def test_lost_blocks_reach_exactly_the_claims_a_scan_would(
    claims: list[tuple[list[int], ClaimState]], lost: set[int]
) -> None:
    """Blocks leaving vLLM's cache are counted against every ended claim on them (once, in
    the order the claims were made: the same events a scan of every claim gave) and make
    every held claim on them a suspect to judge; no other claim is touched."""

    async def run() -> None:
        mirror = _mirror(max_claims=1000)
        made = [mirror.put(_claim(i, h, s)) for i, (h, s) in enumerate(claims)]
        gone = {BlockHash(h) for h in lost}
        mirror.blocks_lost(gone, "evicted")
        judged = list(mirror.judging)
        for task in judged:
            task.cancel()
        ended = [c for c in made if c.state in (ClaimState.EXPIRED, ClaimState.DEMOTED)]
        for claim in made:
            hit = gone.intersection(claim.hashes)
            assert claim.lost == (hit if claim in ended else set())
        counted = [e.claim_id for e in mirror.events.events_since(0)]
        assert counted == [c.spec.claim_id for c in ended if gone.intersection(c.hashes)]
        held = [c for c in made if c.held and gone.intersection(c.hashes)]
        assert len(judged) == (1 if held else 0)

    asyncio.run(run())


@settings(max_examples=150, deadline=None)
@given(claims=_CLAIMS, max_claims=st.integers(1, 12))
def test_the_oldest_ended_claims_are_forgotten_and_no_live_one(
    claims: list[tuple[list[int], ClaimState]], max_claims: int
) -> None:
    """Past ``max_claims`` the oldest ended claims go (and their blocks from the index), never
    a live one; the index names exactly the blocks of the claims kept."""
    mirror = _mirror(max_claims=max_claims)
    made = [mirror.put(_claim(i, h, s)) for i, (h, s) in enumerate(claims)]
    kept = list(mirror.claims.values())
    assert [c for c in made if c.state.live] == [c for c in kept if c.state.live]
    assert len(kept) <= max_claims or all(c.state.live for c in kept[: len(kept) - max_claims])
    forgotten = [c for c in made if c not in kept]
    assert all(f.made < k.made for f in forgotten for k in kept if not k.state.live)
    every = {h for c in kept for h in c.hashes}
    assert {h for h in every if mirror.covering({h})} == every
    for claim in forgotten:
        assert not any(claim in mirror.covering({h}) for h in claim.hashes)


_VERDICT_EVENTS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "active_request_deferred",
                "active_request_refused",
                "resident_claim_demoted",
                "not_a_contract_event",
            ]
        ),
        st.sampled_from(["gw-r1", "cmpl-other-tenant-0", None]),
    ),
    max_size=30,
)


@settings(max_examples=100, deadline=None)
@given(batches=st.lists(_VERDICT_EVENTS, max_size=4))
def test_every_deferral_and_refusal_the_connector_reports_is_counted_whoever_asked(
    batches: list[list[tuple[str, str | None]]],
) -> None:
    """The connector's admission verdicts (``active_request_deferred`` / ``_refused``) are
    counted once each as they are absorbed, for the gateway's requests and for requests
    sent straight to vLLM alike (another tenant's: no id the gateway knows); other events
    count nothing, and each one lands in the gateway's stream as before."""
    from agentclaims.vllm.client import ConnectorAnswer

    mirror = _mirror(max_claims=1000)
    mirror.name_request("cmpl-gw-r1", "gw-r1")
    seq = 0
    for batch in batches:
        events = []
        for name, request_id in batch:
            seq += 1
            events.append({"seq": seq, "event": name, "request_id": request_id, "claim_id": None})
        before = mirror.events.seq
        mirror.absorb(ConnectorAnswer("r", "stop", 1, 0, events=tuple(events)))
        contract = [e for e in events if e["event"] != "not_a_contract_event"]
        assert mirror.events.seq - before == len(contract)
    every = [name for batch in batches for name, _ in batch]
    assert mirror.verdicts == {
        "deferred": every.count("active_request_deferred"),
        "refused": every.count("active_request_refused"),
    }
