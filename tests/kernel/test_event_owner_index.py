"""A session's page of events read from ``EventLog``'s owner index is the page a scan of
every kept event gives (``EventPage.select``), whatever the ids, the ring's wrap, the cursor
and the limit."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from agentclaims.kernel.events import EventLog
from agentclaims.protocol.types import EventPage

_IDS = st.sampled_from(
    # session-like ids, owners that prefix one another, ids without "-", a bare "-"
    ["s-1-c1", "s-1-r2", "s-12-c1", "s-1-x-c3", "s-1", "s", "a-c", "a-c1-c2", "b", "-", "-z"]
)
_PREFIXES = st.sampled_from(
    ["s-1", "s-12", "s-1-x", "s", "s-", "a", "a-c", "a-c1", "b", "", "-", "zz", "s-1-c"]
)


@dataclass
class _Source:
    run_id: str = "run"
    policy_name: str = "test"
    num_blocks: int = 8
    ticks: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def clock(self):  # type: ignore[no-untyped-def]
        return lambda: next(self.ticks)


_EMITS = st.lists(
    st.tuples(st.booleans(), st.one_of(st.none(), _IDS), st.one_of(st.none(), _IDS)),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(
    emits=_EMITS,
    capacity=st.integers(1, 12),
    first=st.integers(0, 5),
    reads=st.lists(
        st.tuples(st.integers(-2, 70), st.one_of(st.none(), st.integers(0, 15)), _PREFIXES),
        min_size=1,
        max_size=8,
    ),
)
def test_owner_pages_equal_the_scan(
    emits: list[tuple[bool, str | None, str | None]],
    capacity: int,
    first: int,
    reads: list[tuple[int, int | None, str]],
) -> None:
    log = EventLog(_Source(), capacity, first_seq=first)
    for as_claim, claim_id, request_id in emits:
        log.emit(
            "resident_claim_accepted" if as_claim else "active_request_deferred",
            claim_id=claim_id if as_claim else None,
            request_id=request_id,
        )
    for since, limit, prefix in reads:
        scanned = EventPage.select(
            log.events_since(since, limit), since, log.seq, limit=limit, id_prefix=prefix
        )
        assert log.page(since, limit=limit, id_prefix=prefix) == scanned


def test_a_session_page_reads_only_its_own_events() -> None:
    """Beside 500 other sessions' events, a session's page holds its own, and the index
    answers it (no scan of the others)."""
    log = EventLog(_Source(), 10_000)
    for i in range(500):
        log.emit("active_request_deferred", request_id=f"s-{i}-r1")
        if i == 250:
            log.emit("resident_claim_accepted", claim_id="s-mine-c1")
    assert log._owners.answers("s-mine")
    page = log.page(0, id_prefix="s-mine")
    assert [e.claim_id for e in page.events] == ["s-mine-c1"]
    assert page.next_since == log.seq
    assert not page.more
    assert not page.gap
    assert not log._owners.answers("s-2")  # s-2 prefixes s-20..s-29: scanned
    assert len(log.page(0, id_prefix="s-2").events) == 111
