"""The event schema, and the observer that rebuilds every claim's history from events alone."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from agentclaims.contract.ids import ClaimId, PrefixId, RequestId
from agentclaims.contract.lifecycle import check_transition
from agentclaims.contract.names import ClaimState, EventName, ProtectionMode
from agentclaims.contract.wire import Wire
from agentclaims.errors import UsageError

__all__ = ["SCHEMA_VERSION", "ClaimEvent", "ClaimHistory", "rebuild_claims"]

SCHEMA_VERSION = 1

#: The lifecycle event that puts a claim into each state.
STATE_OF_EVENT: Mapping[EventName, ClaimState] = {
    EventName.RESIDENT_CLAIM_SUBMITTED: ClaimState.SUBMITTED,
    EventName.RESIDENT_CLAIM_ACCEPTED: ClaimState.ACCEPTED,
    EventName.RESIDENT_CLAIM_REJECTED: ClaimState.REFUSED,
    EventName.RESIDENT_CLAIM_MATERIALIZED: ClaimState.MATERIALIZED,
    EventName.RESIDENT_CLAIM_DEMOTED: ClaimState.DEMOTED,
    EventName.RESIDENT_CLAIM_EXPIRED: ClaimState.EXPIRED,
    EventName.RESIDENT_CLAIM_HARMED: ClaimState.HARMED,
}


@dataclass(frozen=True, slots=True)
class ClaimEvent(Wire):
    """One event. ``event_sequence`` increases per claim (per ``claim_id``; claimless events
    share the ``None`` sequence); ``seq`` orders the whole stream and is what a reader resumes
    from. ``data`` holds the event-specific fields (action, blocking_claim_ids, cause, ...)."""

    event: EventName
    seq: int
    event_sequence: int
    timestamp_ns: int
    run_id: str
    policy: str
    usable_blocks: int
    request_id: RequestId | None = None
    claim_id: ClaimId | None = None
    prefix_id: PrefixId | None = None
    data: Mapping[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    wire_name: ClassVar[str] = "event"
    wire_prefix: ClassVar[str] = "event"
    wire_open: ClassVar[str | None] = "data"
    wire_required: ClassVar[tuple[str, ...]] = (
        "schema_version",
        "request_id",
        "claim_id",
        "prefix_id",
    )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> ClaimEvent:
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError("event", f"not JSON: {exc}") from None
        return cls.from_dict(data)


@dataclass(slots=True)
class ClaimHistory:
    """What an observer knows of one claim after reading the stream."""

    claim_id: str
    state: ClaimState = ClaimState.SUBMITTED
    mode: ProtectionMode | None = None
    prefix_id: str | None = None
    events: list[EventName] = field(default_factory=list)
    materialized: bool = False
    harm_causes: list[str] = field(default_factory=list)
    blocking_requests: list[str] = field(default_factory=list)
    blocks_lost_after_release: int = 0
    end_reason: str | None = None
    last_sequence: int = -1


def rebuild_claims(events: Iterable[ClaimEvent]) -> dict[str, ClaimHistory]:
    """Replay lifecycle events through the state machine; illegal orders raise.

    Also checks that each claim's ``event_sequence`` strictly increases, so a gap-free,
    ordered stream is a precondition an observer can verify.
    """
    claims: dict[str, ClaimHistory] = {}
    for ev in events:
        if ev.event in (EventName.ACTIVE_REQUEST_REFUSED, EventName.ACTIVE_REQUEST_DEFERRED):
            for cid in ev.data.get("blocking_claim_ids", ()):
                if cid in claims and ev.request_id is not None:
                    claims[cid].blocking_requests.append(ev.request_id)
        if ev.claim_id is None:
            continue
        hist = claims.get(ev.claim_id)
        if hist is None:
            hist = claims[ev.claim_id] = ClaimHistory(ev.claim_id)
        if ev.event_sequence <= hist.last_sequence:
            raise UsageError(
                "event.event_sequence",
                f"claim {ev.claim_id!r}: {ev.event_sequence} after {hist.last_sequence}",
            )
        hist.last_sequence = ev.event_sequence
        hist.events.append(ev.event)
        if ev.prefix_id is not None:
            hist.prefix_id = ev.prefix_id
        if "protection_mode" in ev.data:
            hist.mode = ProtectionMode(ev.data["protection_mode"])
        target = STATE_OF_EVENT.get(ev.event)
        if target is ClaimState.SUBMITTED:
            if len(hist.events) != 1:
                raise UsageError("event.event", f"claim {ev.claim_id!r} submitted twice")
        elif target is not None:
            hist.state = check_transition(ev.claim_id, hist.state, target)
            if target is ClaimState.MATERIALIZED:
                hist.materialized = True
            if target.terminal:
                hist.end_reason = ev.data.get("reason")
            if target is ClaimState.HARMED:
                hist.harm_causes.append(str(ev.data.get("cause")))
        elif ev.event is EventName.RESIDENT_CLAIM_BLOCK_LOST_AFTER_RELEASE:
            hist.blocks_lost_after_release += int(ev.data.get("blocks", 1))
    return claims
