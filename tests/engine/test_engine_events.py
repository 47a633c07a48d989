"""The event log: ``events_since`` and ``take_events`` on long, bounded logs, indexed by seq."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from hypothesis import given
from hypothesis import strategies as st

from agentclaims.contract import ClaimEvent, EventName
from agentclaims.engine import KVEngine
from agentclaims.kernel.events import EventLog

if TYPE_CHECKING:  # annotations only: the fixtures come from conftest.py
    from conftest import ChainFn


class _Source:
    """What the log stamps on each event (a ``KVEngine`` in the engine)."""

    def __init__(self) -> None:
        self.run_id, self.policy_name, self.num_blocks = "run", "lru", 8
        self.clock: Callable[[], int] = lambda: 0


def _log(capacity: int, first_seq: int = 0) -> EventLog:
    return EventLog(_Source(), capacity, first_seq)


def _emit(log: EventLog, n: int) -> None:
    """``n`` claimless events; each carries its own count since the log began (``k``)."""
    for _ in range(n):
        log.emit(EventName.FUTURE_REUSE_ADMITTED, request_id="r", k=log.seq + 1)


def _seqs(events: list[ClaimEvent]) -> list[int]:
    return [e.seq for e in events]


def test_engine_events_since_on_a_long_bounded_log(chain: ChainFn) -> None:
    """After the bound drops old events, ``events_since`` returns exactly the kept events after
    the given seq, in order, also when the stream starts above 0 (``first_seq``)."""
    engine = KVEngine(16, 4, event_buffer=300, first_seq=1_000)
    hashes = chain(1, 3)
    emitted: list[ClaimEvent] = []
    for i in range(1_000):  # one event per finish; refusals emit one each too
        out = engine.begin(f"r{i}", hashes if i % 7 else chain(2, 40))
        if out.served:
            engine.finish(f"r{i}")
        emitted += engine.take_events()
    last = engine.last_seq
    assert _seqs(emitted) == list(range(1_001, last + 1))  # contiguous, from first_seq + 1
    kept = emitted[-300:]
    for since in (-5, 0, 999, 1_000, 1_001, last - 300, last - 299, last - 150, last - 1):
        assert engine.events_since(since) == [e for e in kept if e.seq > since], since
    assert engine.events_since(last) == []
    assert engine.events_since(last + 10) == []
    assert engine.take_events() == []


@given(
    capacity=st.integers(1, 12),
    first_seq=st.integers(0, 40),
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("emit"), st.integers(0, 30)),
            st.tuples(st.just("since"), st.integers(-3, 120)),
            st.tuples(st.just("take"), st.just(0)),
        ),
        max_size=30,
    ),
)
def test_event_log_matches_an_unbounded_model(
    capacity: int, first_seq: int, steps: list[tuple[str, int]]
) -> None:
    """Against a model of every seq emitted: the ring keeps the last ``capacity`` events in
    order across wrap-arounds, each at its own seq, and ``take_events`` hands each out once."""
    log = _log(capacity, first_seq)
    emitted: list[int] = []  # every seq handed out, oldest first
    taken = first_seq
    for op, arg in steps:
        if op == "emit":
            _emit(log, arg)
            emitted += range(len(emitted) + first_seq + 1, log.seq + 1)
            assert log.seq == first_seq + len(emitted)
            continue
        since = first_seq + arg if op == "since" else taken
        want = [s for s in emitted[-capacity:] if s > since]
        got = log.events_since(since) if op == "since" else log.take_events()
        assert _seqs(got) == want
        if op == "since":  # a page copies only what it reads: the first ``limit`` of them
            for limit in (0, 1, 2, capacity):
                assert _seqs(log.events_since(since, limit)) == want[:limit]
        assert all(e.data["k"] == e.seq for e in got)  # the event stored at that seq
        if op == "take" and want:
            taken = want[-1]
    assert _seqs(log.events_since(first_seq - 1)) == emitted[-capacity:]


def test_event_log_numbers_each_claimless_event_and_emits_in_order() -> None:
    log = _log(4)
    _emit(log, 6)
    events = log.events_since(0)
    assert _seqs(events) == [3, 4, 5, 6]
    assert [e.event_sequence for e in events] == [2, 3, 4, 5]


def test_a_claims_events_before_its_record_are_numbered_on_by_the_record() -> None:
    """The vLLM side hears a claim's first events from the connector before it makes the
    claim's record: the record's events go on numbering from there, never back to 0."""
    from agentclaims.contract import CacheIdentity, ClaimSpec, EventName, ProtectionMode
    from agentclaims.kernel import Claim

    class Source:
        run_id, policy_name, num_blocks = "r", "p", 8

        @staticmethod
        def clock() -> int:
            return 0

    log = EventLog(Source(), 16)
    log.emit(EventName.RESIDENT_CLAIM_SUBMITTED, claim_id="c1")
    log.emit(EventName.RESIDENT_CLAIM_ACCEPTED, claim_id="c1")
    identity = CacheIdentity("d", "m", "t", "default", 4)
    claim = Claim(ClaimSpec("c1", "wf", "p-1", identity, 1, ProtectionMode.HARD_PROTECTED))
    log.emit(EventName.RESIDENT_CLAIM_MATERIALIZED, claim=claim)
    log.emit(EventName.RESIDENT_CLAIM_EXPIRED, claim=claim)
    numbers = [(e.claim_id, e.event_sequence) for e in log.events_since(0)]
    assert numbers == [("c1", 0), ("c1", 1), ("c1", 2), ("c1", 3)]
