"""``EventLog``: a KV side's event stream, numbered, bounded, and indexed by sequence number.

The reference engine, ``FakeKV`` and the vLLM side each keep their events in one.

Every event gets the next ``seq`` of the whole stream (one more than the last: sequence numbers
are contiguous, and a replacement engine continues its predecessor's count from ``first_seq``)
and the next ``event_sequence`` of its claim (claimless events share one count of their own).
The envelope (run id, policy name, usable blocks, timestamp) is read from the log's source (the
engine, say) when the event is emitted. An event of a claim the side has no record of (one the
vLLM connector reports for another gateway, or before the side has made its record) is numbered
by its claim id, among the last ``LOOSE_KEPT`` such ids; a record made later goes on from there.

Only the last ``capacity`` events are kept, in a ring: because numbers are contiguous, the event
``seq = s`` sits at slot ``(s - origin) % capacity`` (``origin`` is the first number this log
handed out), so ``events_since(seq)`` slices out exactly the newer events in O(their number),
and an emit costs O(1) whatever the bound. Readers either resume from a ``seq`` of their own
(``events_since``) or drain what is new since their previous call (``take_events``).

A session reads its own events in every answer (``page`` with its id as ``id_prefix``: the SDK
names its claims and requests ``<session id>-c1``, ``<session id>-r1``). The kept events are
also indexed by owner, the id up to its last ``-``, so such a page reads that session's events
only, not every session's since its cursor (``_Owners``). A prefix the index cannot answer
exactly (an owner that is a prefix of another, say) is scanned, as before.
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any, Protocol

from agentclaims.contract import ClaimEvent, ClaimId, EventName, PrefixId, RequestId
from agentclaims.kernel.record import Claim
from agentclaims.protocol.types import EventPage

__all__ = ["EVENTS_KEPT", "LOOSE_KEPT", "EventLog", "EventSource"]

EVENTS_KEPT = 200_000
"""How many events a KV side keeps for readers by default (a read further back reports a gap)."""

LOOSE_KEPT = 4096
"""Claim ids without a record whose event count the log keeps (the oldest are forgotten)."""


class EventSource(Protocol):
    """Whose events these are: what the log stamps on each one (``KVEngine`` is one)."""

    @property
    def run_id(self) -> str: ...
    @property
    def policy_name(self) -> str: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def clock(self) -> Callable[[], int]: ...


class EventLog:
    """Emits ``ClaimEvent``s and keeps the last ``capacity`` of them for readers."""

    __slots__ = (
        "_capacity",
        "_claimless_seq",
        "_loose",
        "_origin",
        "_owners",
        "_ring",
        "_source",
        "_taken",
        "seq",
    )

    def __init__(self, source: EventSource, capacity: int, first_seq: int = 0) -> None:
        self._source = source
        self.seq = first_seq
        """The ``seq`` of the last event emitted (``first_seq`` before the first)."""
        self._claimless_seq = -1
        self._loose: OrderedDict[str, int] = OrderedDict()
        self._capacity = capacity
        self._origin = first_seq + 1  # the seq of the first event, which goes to slot 0
        self._ring: list[ClaimEvent] = []  # grows to ``capacity``, then is overwritten in turn
        self._taken = first_seq  # seq of the last event handed out by take_events
        self._owners = _Owners()

    def emit(
        self,
        name: EventName,
        *,
        claim: Claim | None = None,
        request_id: str | None = None,
        prefix_id: str | None = None,
        claim_id: str | None = None,
        **data: Any,
    ) -> None:
        """Append one event; ``claim`` numbers it in that claim's sequence and names its prefix
        (``claim_id``: a claim with no record here)."""
        self.seq += 1
        if claim is not None:
            claim_id = claim.spec.claim_id
            if claim.seq < 0 and self._loose:  # numbered before its record: go on from there
                claim.seq = self._loose.pop(claim_id, -1)
            claim.seq += 1
            seq = claim.seq
            prefix_id = prefix_id or claim.spec.object_id
        elif claim_id is not None:
            loose = self._loose
            seq = loose.pop(claim_id, -1) + 1
            loose[claim_id] = seq
            if len(loose) > LOOSE_KEPT:
                loose.popitem(last=False)
        else:
            self._claimless_seq += 1
            seq = self._claimless_seq
        source = self._source
        event = ClaimEvent(
            event=name,
            seq=self.seq,
            event_sequence=seq,
            timestamp_ns=source.clock(),
            run_id=source.run_id,
            policy=source.policy_name,
            usable_blocks=source.num_blocks,
            request_id=None if request_id is None else RequestId(request_id),
            claim_id=None if claim_id is None else ClaimId(claim_id),
            prefix_id=None if prefix_id is None else PrefixId(prefix_id),
            data=data,
        )
        ring = self._ring
        if len(ring) < self._capacity:
            ring.append(event)
        else:
            slot = (self.seq - self._origin) % self._capacity
            self._owners.drop(ring[slot])
            ring[slot] = event
        self._owners.add(event)

    def events_since(self, seq: int = 0, limit: int | None = None) -> list[ClaimEvent]:
        """Kept events with ``seq`` greater than the given one, oldest first (at most
        ``limit``: a page copies no more of the ring than it reads)."""
        bounds = self._bounds(seq, limit)
        if bounds is None:
            return []
        start, last = bounds
        ring = self._ring
        kept = len(ring)
        i = (start - self._origin) % self._capacity
        j = i + last - start + 1
        if j <= kept:
            return ring[i:j]
        return ring[i:] + ring[: j - kept]  # wrapped: only once the ring is full

    def _bounds(self, seq: int, limit: int | None) -> tuple[int, int] | None:
        """The numbers of the first and the last kept event after ``seq`` (at most ``limit``
        of them); ``None`` for none."""
        last = self.seq
        if not seq < last:  # nothing newer (a NaN is below nothing either)
            return None
        oldest = last - len(self._ring) + 1
        start = oldest if seq < oldest else math.floor(seq) + 1
        if limit is not None:
            last = min(last, start + max(0, limit) - 1)
        return (start, last) if start <= last else None

    def page(
        self, since: int = 0, *, limit: int | None = None, id_prefix: str | None = None
    ) -> EventPage:
        """The claims protocol's ``events`` read: ``EventPage.select`` over the kept events,
        or the same page read from the owner index where ``id_prefix`` names one owner's."""
        if id_prefix is not None and self._owners.answers(id_prefix):
            return self._owner_page(since, limit, id_prefix)
        return EventPage.select(
            self.events_since(since, limit), since, self.seq, limit=limit, id_prefix=id_prefix
        )

    def _owner_page(self, since: int, limit: int | None, owner: str) -> EventPage:
        """``page`` for ``owner``'s events: the page ``select`` would give, its scan's bounds
        worked out rather than read."""
        bounds = self._bounds(since, limit)
        events = () if bounds is None else self._owners.between(owner, *bounds)
        return EventPage.of_scan(events, since, self.seq, bounds)

    def take_events(self) -> list[ClaimEvent]:
        """The kept events emitted since the previous call (all kept ones on the first)."""
        out = self.events_since(self._taken)
        if out:
            self._taken = out[-1].seq
        return out


class _Owners:
    """The kept events by owner (an event's claim id, else its request id, up to its last
    ``-``), each owner's in order; the owners sorted, to tell whether an id prefix names
    exactly one owner's events."""

    __slots__ = ("_bare", "_by_owner", "_sorted")

    def __init__(self) -> None:
        self._by_owner: dict[str, deque[ClaimEvent]] = {}
        self._sorted: list[str] = []
        self._bare = 0  # kept events whose id has no ``-``

    def add(self, event: ClaimEvent) -> None:
        self._move(event, 1)

    def drop(self, event: ClaimEvent) -> None:
        """Forget ``event``, the oldest kept (the ring overwrites its slot)."""
        self._move(event, -1)

    def _move(self, event: ClaimEvent, step: int) -> None:
        key = event.claim_id if event.claim_id is not None else event.request_id
        if key is None:
            return
        cut = key.rfind("-")
        if cut < 0:
            self._bare += step
            return
        owner = key[:cut]
        events = self._by_owner.get(owner)
        if step > 0:
            if events is None:
                events = self._by_owner[owner] = deque()
                bisect.insort(self._sorted, owner)
            events.append(event)
            return
        assert events is not None
        events.popleft()  # the owner's oldest: events leave the ring oldest first
        if not events:
            del self._by_owner[owner]
            del self._sorted[bisect.bisect_left(self._sorted, owner)]

    def answers(self, prefix: str) -> bool:
        """Whether the kept events whose id starts with ``prefix`` are exactly the events
        of the owner ``prefix``: no id without ``-`` could start with it, no owner is
        ``prefix`` cut at its last ``-`` (``a`` for ``a-c``: ``a-c1`` starts with it), and
        no other owner starts with it (``a-b`` for ``a``)."""
        cut = prefix.rfind("-")
        if cut < 0:
            if self._bare:
                return False
        elif prefix[:cut] in self._by_owner:
            return False
        owners = self._sorted
        i = bisect.bisect_left(owners, prefix)
        if i < len(owners) and owners[i] == prefix:
            i += 1
        return not (i < len(owners) and owners[i].startswith(prefix))

    def between(self, owner: str, start: int, end: int) -> list[ClaimEvent]:
        """``owner``'s kept events with ``start <= seq <= end``, in order: read from its
        newest back, as a reader's cursor is near the end."""
        events = self._by_owner.get(owner)
        if not events:
            return []
        out = []
        for event in reversed(events):
            if event.seq < start:
                break
            if event.seq <= end:
                out.append(event)
        out.reverse()
        return out
