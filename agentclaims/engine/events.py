"""``EventLog``: the engine's event stream, numbered, bounded, and indexed by sequence number.

Every event gets the next ``seq`` of the whole stream (one more than the last: sequence numbers
are contiguous, and a replacement engine continues its predecessor's count from ``first_seq``)
and the next ``event_sequence`` of its claim (claimless events share one count of their own).
The envelope (run id, policy name, usable blocks, timestamp) is read from the log's source, the
engine, when the event is emitted.

Only the last ``capacity`` events are kept, in a ring: because numbers are contiguous, the event
``seq = s`` sits at slot ``(s - origin) % capacity`` (``origin`` is the first number this log
handed out), so ``events_since(seq)`` slices out exactly the newer events in O(their number),
and an emit costs O(1) whatever the bound. Readers either resume from a ``seq`` of their own
(``events_since``) or drain what is new since their previous call (``take_events``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

from agentclaims.contract import ClaimEvent, ClaimId, EventName, PrefixId, RequestId
from agentclaims.engine.record import ClaimRecord

__all__ = ["EventLog", "EventSource"]


class EventSource(Protocol):
    """Whose events these are: what the log stamps on each one (``KVEngine`` is one)."""

    run_id: str
    policy_name: str
    num_blocks: int
    clock: Callable[[], int]


class EventLog:
    """Emits ``ClaimEvent``s and keeps the last ``capacity`` of them for readers."""

    __slots__ = ("_capacity", "_claimless_seq", "_origin", "_ring", "_source", "_taken", "seq")

    def __init__(self, source: EventSource, capacity: int, first_seq: int = 0) -> None:
        self._source = source
        self.seq = first_seq
        """The ``seq`` of the last event emitted (``first_seq`` before the first)."""
        self._claimless_seq = -1
        self._capacity = capacity
        self._origin = first_seq + 1  # the seq of the first event, which goes to slot 0
        self._ring: list[ClaimEvent] = []  # grows to ``capacity``, then is overwritten in turn
        self._taken = first_seq  # seq of the last event handed out by take_events

    def emit(
        self,
        name: EventName,
        *,
        claim: ClaimRecord | None = None,
        request_id: str | None = None,
        prefix_id: str | None = None,
        **data: Any,
    ) -> None:
        """Append one event; ``claim`` numbers it in that claim's sequence and names its prefix."""
        self.seq += 1
        if claim is not None:
            claim.seq += 1
            seq = claim.seq
            prefix_id = prefix_id or claim.spec.object_id
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
            claim_id=None if claim is None else ClaimId(claim.claim_id),
            prefix_id=None if prefix_id is None else PrefixId(prefix_id),
            data=data,
        )
        ring = self._ring
        if len(ring) < self._capacity:
            ring.append(event)
        else:
            ring[(self.seq - self._origin) % self._capacity] = event

    def events_since(self, seq: int = 0) -> list[ClaimEvent]:
        """Kept events with ``seq`` greater than the given one, oldest first."""
        last = self.seq
        if not seq < last:  # nothing newer (a NaN is below nothing either)
            return []
        ring = self._ring
        kept = len(ring)
        oldest = last - kept + 1
        start = oldest if seq < oldest else math.floor(seq) + 1
        i = (start - self._origin) % self._capacity
        j = i + last - start + 1
        if j <= kept:
            return ring[i:j]
        return ring[i:] + ring[: j - kept]  # wrapped: only once the ring is full

    def take_events(self) -> list[ClaimEvent]:
        """The kept events emitted since the previous call (all kept ones on the first)."""
        out = self.events_since(self._taken)
        if out:
            self._taken = out[-1].seq
        return out
