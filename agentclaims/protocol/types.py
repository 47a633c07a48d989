"""The claims protocol's wire types: what every backend answers, in one codec (``Wire``)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from agentclaims.contract import (
    ArbiterAction,
    ClaimEvent,
    ClaimState,
    Decision,
    Feasibility,
    LoweringClass,
    ProtectionMode,
    ReuseHint,
)
from agentclaims.contract.ids import BlockHash, ClaimId, OwnerScope, PrefixId, RequestId
from agentclaims.contract.wire import Wire

__all__ = [
    "CLAIMS_RIDE_ON_REQUESTS",
    "EVENTS_RIDE_ON_ANSWERS",
    "PROMPT_OBJECT",
    "RANKS_BY_HINTS",
    "RENEW_AS_IS",
    "SEQUENCE_OBJECT",
    "SERVED_ACTIONS",
    "SHEDS_BY_HINTS",
    "ActiveOutcome",
    "ActiveRequest",
    "ClaimDecision",
    "ClaimView",
    "Descriptor",
    "EventPage",
    "Renewal",
    "ServeResult",
    "claims_ride_on_requests",
    "events_ride_on_answers",
    "ranks_by_hints",
    "sheds_by_hints",
    "stated_class",
]

PROMPT_OBJECT = "@prompt"
"""A claim's ``object_id`` meaning: this request's prompt prefix (resolved after hashing)."""
SEQUENCE_OBJECT = "@sequence"
"""A claim's ``object_id`` meaning: this request's prompt + reply full blocks."""

SERVED_ACTIONS = frozenset(
    {
        ArbiterAction.SERVE_ACTIVE_PRESERVE_RESIDENT,
        ArbiterAction.SERVE_ACTIVE_EVICT_RESIDENT,
        ArbiterAction.SERVE_ACTIVE_NO_ADMIT,
    }
)


@dataclass(frozen=True, slots=True)
class ActiveOutcome(Wire):
    """The arbiter's answer to an active request (also the body of a refusal or deferral)."""

    request_id: RequestId
    action: ArbiterAction
    feasibility: Feasibility
    hit_blocks: int = 0
    """Leading blocks reused from the device prefix cache."""
    restored_blocks: int = 0
    """Leading blocks brought back from the host tier (no recompute)."""
    computed_blocks: int = 0
    """Full blocks that had to be computed (recomputed prompt KV)."""
    evicted_blocks: int = 0
    blocking_claim_ids: tuple[ClaimId, ...] = ()
    shortfall_blocks: int = 0
    retry_after_s: float | None = None

    wire_name: ClassVar[str] = "outcome"
    wire_computed: ClassVar[tuple[str, ...]] = ("served",)

    @property
    def served(self) -> bool:
        return self.action in SERVED_ACTIONS

    @property
    def deferred(self) -> bool:
        """Not served now, but it fits once active work drains or a claim ends."""
        return self.action is ArbiterAction.DEFER_ACTIVE

    def describe(self) -> str:
        """One line a person reads: what happened, why, by how much, and who is in the way."""
        ids = ", ".join(self.blocking_claim_ids) or "none"
        return (
            f"active request {self.request_id} not served: {self.action.value} "
            f"({self.feasibility.value}); short by {self.shortfall_blocks} blocks; "
            f"blocking claims: {ids}"
        )


@dataclass(frozen=True, slots=True)
class ClaimDecision(Wire):
    """The arbiter's answer to a residency claim."""

    claim_id: ClaimId
    decision: Decision
    state: ClaimState
    action: ArbiterAction | None = None
    reason: str | None = None
    conditions: dict[str, Any] = field(default_factory=dict)

    wire_name: ClassVar[str] = "decision"

    @property
    def accepted(self) -> bool:
        return self.decision is not Decision.REJECTED


@dataclass(frozen=True, slots=True)
class Renewal(Wire):
    """New durations for a claim being renewed; ``None`` restarts the claim's own."""

    duration_steps: int | None = None
    ttl_s: float | None = None
    reuse_hint: ReuseHint | None = None
    """An updated reuse hint; with no durations the renewal only updates the hint."""

    wire_name: ClassVar[str] = "renewal"
    wire_omit_none: ClassVar[tuple[str, ...]] = ("reuse_hint",)


RENEW_AS_IS = Renewal()
"""Renew a claim for its own durations again."""


@dataclass(frozen=True, slots=True)
class ClaimView(Wire):
    """A snapshot of one claim, as its owner may read it."""

    claim_id: ClaimId
    owner_scope: OwnerScope
    object_id: PrefixId
    protection_mode: ProtectionMode
    state: ClaimState
    footprint_blocks: int
    present_blocks: int
    predicate_holds: bool
    expires_at_step: int | None
    expires_at_ns: int | None
    end_reason: str | None

    wire_name: ClassVar[str] = "claim_view"


@dataclass(frozen=True, slots=True)
class ActiveRequest(Wire):
    """One active (LLM) request as a KV side serves it: already tokenized.

    ``block_hashes`` names the request's full blocks directly, for a backend that accepts them
    (the reference engine); a real runtime hashes the tokens itself and ignores nothing: it
    refuses such a request as ``not_exposed``.
    """

    request_id: RequestId
    segments: tuple[tuple[int, ...], ...] = ()
    """Prompt token ids, one segment per message (one segment for a plain completion)."""
    reply_tokens: tuple[int, ...] = ()
    claims: tuple[Mapping[str, Any], ...] = ()
    """Claim objects (``ClaimSpec`` form) to submit once the request is served; ``object_id``
    may be ``@prompt`` or ``@sequence`` (this request's prefix, resolved after hashing)."""
    owner_scope: OwnerScope | None = None
    """Fills a claim's missing ``owner_scope``."""
    admit: bool = True
    """``False``: write no-admit (the request's KV is not kept for future reuse)."""
    cache_salt: str | None = None
    chat: bool = True
    """Chat requests report a prefix id per message boundary."""
    block_hashes: tuple[BlockHash, ...] | None = None

    wire_name: ClassVar[str] = "request"

    @property
    def prompt_tokens(self) -> int:
        return sum(len(s) for s in self.segments)


@dataclass(frozen=True, slots=True)
class ServeResult(Wire):
    """What a KV side did with an active request."""

    outcome: ActiveOutcome
    prefix_ids: dict[str, Any] = field(default_factory=dict)
    """``prompt``, ``sequence`` and (chat) ``messages``: the prefix id at each boundary."""
    decisions: tuple[ClaimDecision, ...] = ()
    events_seq: int = 0
    """The backend's last event sequence number once the request was done."""
    cached_tokens: int = 0
    """Prompt tokens served from the device prefix cache."""
    block_hashes: tuple[BlockHash, ...] = ()
    """The request's full blocks, in order (prompt then reply)."""
    deferred_s: float = 0.0
    """Seconds the engine held the request back, inside itself, for claims' blocks before it
    ran (a deferral the client did not have to retry; 0: none)."""
    pool: dict[str, Any] | None = None
    """The engine's pool pressure as it answered, where it measures it (vLLM with the
    connector: evicted blocks per second from its KV events and ``survival_s``, how long an
    unheld block freed now survives them; docs/vllm.md). ``None``: unknown."""

    wire_name: ClassVar[str] = "serve_result"


@dataclass(frozen=True, slots=True)
class EventPage(Wire):
    """One page of the ordered event stream after ``since``.

    ``next_since`` is where the next page starts (pass it back as ``since``); ``more`` says
    whether events after it exist already; ``gap`` that events after ``since`` were dropped
    from the backend's buffer before this read (a reader should say so, not guess)."""

    events: tuple[ClaimEvent, ...]
    last_seq: int
    next_since: int
    more: bool = False
    gap: bool = False

    wire_name: ClassVar[str] = "events"

    @classmethod
    def select(
        cls,
        after: Iterable[ClaimEvent],
        since: int,
        last_seq: int,
        *,
        limit: int | None = None,
        id_prefix: str | None = None,
    ) -> EventPage:
        """The page of ``after`` (the buffered events with ``seq > since``, in order): at most
        ``limit`` scanned, then those of ``id_prefix`` kept (its claim, else its request)."""
        scanned = list(after if limit is None else itertools.islice(after, limit))
        bounds = (scanned[0].seq, scanned[-1].seq) if scanned else None
        return cls.of_scan(scanned, since, last_seq, bounds, id_prefix=id_prefix)

    @classmethod
    def of_scan(
        cls,
        candidates: Iterable[ClaimEvent],
        since: int,
        last_seq: int,
        bounds: tuple[int, int] | None,
        *,
        id_prefix: str | None = None,
    ) -> EventPage:
        """The page of a scan of the events numbered ``bounds`` (the first and the last
        scanned; ``None``: none was), given some of them, ``candidates`` (in order: every one
        the reader could get, an index's or a filter's pick), of which those of ``id_prefix``
        are kept."""
        if bounds is None:
            gap, next_since = last_seq > since, max(since, last_seq)
        else:
            gap, next_since = bounds[0] > since + 1, bounds[1]
        kept = tuple(
            candidates if id_prefix is None else (e for e in candidates if _owned_by(e, id_prefix))
        )
        return cls(kept, last_seq, next_since, next_since < last_seq, gap)


def _owned_by(event: ClaimEvent, id_prefix: str) -> bool:
    key = event.claim_id if event.claim_id is not None else event.request_id
    return key is not None and key.startswith(id_prefix)


Descriptor = Mapping[str, Any]
"""What a backend can honour (``GET /v1/descriptor``): its identity, block size, the lowering
descriptor it was checked on, and per mode (``modes``) the class the checker gave it."""


RANKS_BY_HINTS = "ranks_by_hints"
"""Descriptor capability: ``true`` when the backend ranks resident blocks by predicted next use
from the claims' reuse hints (the reference engine with ``NextUsePolicy``). Best-effort claims
carrying hints are then ranked with everything else (never harmed); a session's default planner
(``"auto"``) plans ``ranked`` there. Absent, or anything but ``true``: the backend does not."""


SHEDS_BY_HINTS = "sheds_by_hints"
"""Descriptor capability: ``true`` when the backend ranks no unclaimed block (its free queue is
LRU, as vLLM's) but holds claimed blocks and, when memory is needed, sheds soft holds
(``demotable``) farthest expected next use first, from the claims' reuse hints, each shed a
``resident_claim_demoted`` (the agentclaims connector in vLLM). The ``held`` planner preset is
made for it: ``demotable`` where ``default`` would claim ``best_effort`` (which such a backend
only watches); a session names it (``planner="held"``), and its claims are still submitted
only in the modes the backend's checked lowering honours."""


CLAIMS_RIDE_ON_REQUESTS = "claims_ride_on_requests"
"""Descriptor capability: ``true`` when a claim sent with a completion (on its ``@sequence``)
and a release named in its ``agentclaims.release`` ride on that request to the engine at no
cost of their own, while a claim or a release sent on its own costs the engine a request of
its own (vLLM with the agentclaims connector). A session then sends each call's claim with the
call and its releases with its next call (the reference engine states it too: a claim sent
on its own costs the gateway a request there). Absent, or anything but ``true``: claims are
sent on their own."""


EVENTS_RIDE_ON_ANSWERS = "events_ride_on_answers"
"""Descriptor capability: ``true`` when a completion whose ``agentclaims`` object names an
``events_since`` cursor is answered with the events after it (``agentclaims.events``, the
page ``GET /v1/events`` would give for its ``session_id``): a session then reads its events
from its calls' answers, and polls only when no call went out since its last claim request
(the gateway states it for every KV side)."""


def events_ride_on_answers(descriptor: Descriptor) -> bool:
    """Whether ``descriptor`` states ``events_ride_on_answers`` (only a JSON ``true``)."""
    return descriptor.get(EVENTS_RIDE_ON_ANSWERS) is True


def claims_ride_on_requests(descriptor: Descriptor) -> bool:
    """Whether ``descriptor`` states ``claims_ride_on_requests`` (only a JSON ``true``)."""
    return descriptor.get(CLAIMS_RIDE_ON_REQUESTS) is True


def sheds_by_hints(descriptor: Descriptor) -> bool:
    """Whether ``descriptor`` states the ``sheds_by_hints`` capability (fail closed: only a
    JSON ``true`` counts)."""
    return descriptor.get(SHEDS_BY_HINTS) is True


def ranks_by_hints(descriptor: Descriptor) -> bool:
    """Whether ``descriptor`` states the ``ranks_by_hints`` capability (fail closed: only a
    JSON ``true`` counts)."""
    return descriptor.get(RANKS_BY_HINTS) is True


def stated_class(descriptor: Descriptor, mode: ProtectionMode) -> LoweringClass:
    """The class ``descriptor`` states for ``mode``, read fail closed: a mode it does not
    state, or states in a shape or a name this version does not know, is ``unknown``."""
    modes = descriptor.get("modes")
    entry = modes.get(mode.value) if isinstance(modes, Mapping) else None
    name = entry.get("lowering_class") if isinstance(entry, Mapping) else None
    try:
        return LoweringClass(str(name))
    except ValueError:
        return LoweringClass.UNKNOWN
