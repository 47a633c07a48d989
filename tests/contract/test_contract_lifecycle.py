"""The claim lifecycle state machine, and the observer that replays it from events."""

from __future__ import annotations

import itertools

import pytest

from agentclaims.contract import (
    LEGAL_TRANSITIONS,
    ClaimEvent,
    ClaimState,
    EventName,
    check_transition,
    rebuild_claims,
)
from agentclaims.errors import IllegalTransition, UsageError

S = ClaimState
LEGAL = {
    (S.SUBMITTED, S.ACCEPTED),
    (S.SUBMITTED, S.REFUSED),
    (S.ACCEPTED, S.MATERIALIZED),
    (S.ACCEPTED, S.DEMOTED),
    (S.ACCEPTED, S.EXPIRED),
    (S.MATERIALIZED, S.DEMOTED),
    (S.MATERIALIZED, S.EXPIRED),
    (S.MATERIALIZED, S.HARMED),
}
PAIRS = list(itertools.product(ClaimState, ClaimState))


@pytest.mark.parametrize(("current", "target"), sorted(LEGAL))
def test_legal_transition_returns_target(current: ClaimState, target: ClaimState) -> None:
    """Every transition the contract allows is accepted and yields the target state."""
    assert check_transition("c", current, target) is target


@pytest.mark.parametrize(("current", "target"), [p for p in PAIRS if p not in LEGAL])
def test_illegal_transition_raises(current: ClaimState, target: ClaimState) -> None:
    """Every other pair (skips, self-loops, leaving a terminal state) is IllegalTransition."""
    with pytest.raises(IllegalTransition) as info:
        check_transition("c1", current, target)
    assert (info.value.claim_id, info.value.current, info.value.target) == (
        "c1",
        current.value,
        target.value,
    )


def test_table_matches_the_contract() -> None:
    """The exported table holds exactly the legal pairs; terminal states have no way out."""
    table = {(a, b) for a, targets in LEGAL_TRANSITIONS.items() for b in targets}
    assert table == LEGAL
    assert {s for s in ClaimState if s.terminal} == {S.REFUSED, S.DEMOTED, S.EXPIRED, S.HARMED}
    assert all(not LEGAL_TRANSITIONS[s] for s in ClaimState if s.terminal)
    assert {s for s in ClaimState if s.live} == {S.ACCEPTED, S.MATERIALIZED}


def _event(name: EventName, seq: int, claim_id: str = "c", **data: object) -> ClaimEvent:
    return ClaimEvent(
        event=name,
        seq=seq,
        event_sequence=seq,
        timestamp_ns=seq,
        run_id="r",
        policy="lru",
        usable_blocks=8,
        claim_id=claim_id,
        prefix_id="pfx",
        data=data,
    )


def _stream(*names: EventName) -> list[ClaimEvent]:
    return [_event(n, i) for i, n in enumerate(names)]


E = EventName


def test_rebuild_follows_a_full_history() -> None:
    """submitted, accepted, materialized, harmed rebuilds to harmed with the cause."""
    events = _stream(
        E.RESIDENT_CLAIM_SUBMITTED, E.RESIDENT_CLAIM_ACCEPTED, E.RESIDENT_CLAIM_MATERIALIZED
    )
    events.append(_event(E.RESIDENT_CLAIM_HARMED, 3, cause="evicted", reason="evicted"))
    hist = rebuild_claims(events)["c"]
    assert hist.state is S.HARMED
    assert hist.materialized
    assert hist.harm_causes == ["evicted"]
    assert hist.end_reason == "evicted"


@pytest.mark.parametrize(
    "names",
    [
        (E.RESIDENT_CLAIM_SUBMITTED, E.RESIDENT_CLAIM_MATERIALIZED),
        (E.RESIDENT_CLAIM_SUBMITTED, E.RESIDENT_CLAIM_REJECTED, E.RESIDENT_CLAIM_ACCEPTED),
        (E.RESIDENT_CLAIM_SUBMITTED, E.RESIDENT_CLAIM_ACCEPTED, E.RESIDENT_CLAIM_HARMED),
        (
            E.RESIDENT_CLAIM_SUBMITTED,
            E.RESIDENT_CLAIM_ACCEPTED,
            E.RESIDENT_CLAIM_EXPIRED,
            E.RESIDENT_CLAIM_DEMOTED,
        ),
    ],
)
def test_rebuild_rejects_illegal_orders(names: tuple[EventName, ...]) -> None:
    """A stream that skips or leaves a terminal state is an IllegalTransition."""
    with pytest.raises(IllegalTransition):
        rebuild_claims(_stream(*names))


def test_rebuild_rejects_double_submit_and_unordered_sequences() -> None:
    """A second submit, or an event_sequence that does not increase, is a UsageError."""
    with pytest.raises(UsageError) as twice:
        rebuild_claims(_stream(E.RESIDENT_CLAIM_SUBMITTED, E.RESIDENT_CLAIM_SUBMITTED))
    assert twice.value.field == "event.event"
    a, b = _stream(E.RESIDENT_CLAIM_SUBMITTED, E.RESIDENT_CLAIM_ACCEPTED)
    with pytest.raises(UsageError) as order:
        rebuild_claims([b, a])
    assert order.value.field == "event.event_sequence"


def test_rebuild_joins_refusals_to_blocking_claims() -> None:
    """An active refusal naming a claim is recorded against that claim's history."""
    events = _stream(
        E.RESIDENT_CLAIM_SUBMITTED, E.RESIDENT_CLAIM_ACCEPTED, E.RESIDENT_CLAIM_MATERIALIZED
    )
    refusal = ClaimEvent(
        event=E.ACTIVE_REQUEST_REFUSED,
        seq=9,
        event_sequence=0,
        timestamp_ns=9,
        run_id="r",
        policy="lru",
        usable_blocks=8,
        request_id="req-1",
        data={"blocking_claim_ids": ["c", "unknown"]},
    )
    claims = rebuild_claims([*events, refusal])
    assert claims["c"].blocking_requests == ["req-1"]
    assert set(claims) == {"c"}
