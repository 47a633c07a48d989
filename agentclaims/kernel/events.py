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
"""

from __future__ import annotations

import math
from collections import OrderedDict
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
            ring[(self.seq - self._origin) % self._capacity] = event

    def events_since(self, seq: int = 0, limit: int | None = None) -> list[ClaimEvent]:
        """Kept events with ``seq`` greater than the given one, oldest first (at most
        ``limit``: a page copies no more of the ring than it reads)."""
        last = self.seq
        if not seq < last:  # nothing newer (a NaN is below nothing either)
            return []
        ring = self._ring
        kept = len(ring)
        oldest = last - kept + 1
        start = oldest if seq < oldest else math.floor(seq) + 1
        if limit is not None:
            last = min(last, start + max(0, limit) - 1)
        i = (start - self._origin) % self._capacity
        j = i + last - start + 1
        if j <= kept:
            return ring[i:j]
        return ring[i:] + ring[: j - kept]  # wrapped: only once the ring is full

    def page(
        self, since: int = 0, *, limit: int | None = None, id_prefix: str | None = None
    ) -> EventPage:
        """The claims protocol's ``events`` read (``EventPage.select`` over the kept events)."""
        return EventPage.select(
            self.events_since(since, limit), since, self.seq, limit=limit, id_prefix=id_prefix
        )

    def take_events(self) -> list[ClaimEvent]:
        """The kept events emitted since the previous call (all kept ones on the first)."""
        out = self.events_since(self._taken)
        if out:
            self._taken = out[-1].seq
        return out
