"""The contract's vocabulary: every name below is used verbatim in code, events and logs."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

__all__ = [
    "BACKEND_RESTART",
    "ArbiterAction",
    "ClaimState",
    "ConformanceStatus",
    "Decision",
    "EventName",
    "Feasibility",
    "LoweringClass",
    "ProtectionMode",
    "backend_restart_end",
]


BACKEND_RESTART = "backend_restart"
"""The cause (harm) or reason (expiry) of a claim whose KV side went away with its blocks: a
gateway restart the ledger could not carry over, a vLLM engine that died or restarted."""


class ProtectionMode(StrEnum):
    """How strongly a runtime must keep a claimed prefix resident (strongest first)."""

    HARD_PROTECTED = "hard_protected"
    """Never an ordinary victim; active work that cannot fit is deferred or refused, by name."""
    EXPIRING = "expiring"
    """Protected like hard until ``duration_steps`` or the TTL ends, then expired with an event."""
    SOFT_PRIORITY = "soft_priority"
    """Evicted after every unprotected block; its losses are reported (and are harm)."""
    OFFLOADABLE = "offloadable"
    """May move to a slower tier; must be restored on reuse or fail explicitly."""
    DEMOTABLE = "demotable"
    """May be relaxed under pressure, with the demotion event before any loss."""
    BEST_EFFORT = "best_effort"
    """A hint: evicted after unclaimed blocks, losses are ordinary evictions."""


class ClaimState(StrEnum):
    SUBMITTED = "submitted"
    ACCEPTED = "accepted"
    REFUSED = "refused"
    MATERIALIZED = "materialized"
    DEMOTED = "demoted"
    EXPIRED = "expired"
    HARMED = "harmed"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL

    @property
    def live(self) -> bool:
        """Accepted and not yet ended: the claim protects its blocks."""
        return self in (ClaimState.ACCEPTED, ClaimState.MATERIALIZED)


_TERMINAL = frozenset(
    {ClaimState.REFUSED, ClaimState.DEMOTED, ClaimState.EXPIRED, ClaimState.HARMED}
)


class Decision(StrEnum):
    """The arbiter's answer to a residency claim."""

    ACCEPTED = "accepted"
    REJECTED = "rejected"
    CONDITIONALLY_ACCEPTED = "conditionally_accepted"


class ArbiterAction(StrEnum):
    """The thirteen explicit outcomes of the arbiter."""

    SERVE_ACTIVE_PRESERVE_RESIDENT = "serve_active_preserve_resident"
    SERVE_ACTIVE_EVICT_RESIDENT = "serve_active_evict_resident"
    SERVE_ACTIVE_NO_ADMIT = "serve_active_no_admit"
    DEFER_ACTIVE = "defer_active"
    REFUSE_ACTIVE = "refuse_active"
    OFFLOAD_RESIDENT = "offload_resident"
    OFFLOAD_ACTIVE = "offload_active"
    BOUND_ACTIVE_LIVE = "bound_active_live"
    RECOMPUTE_SPLIT = "recompute_split"
    ROUTE_ELSEWHERE = "route_elsewhere"
    RELAX_RESIDENT_CLAIM = "relax_resident_claim"
    REFUSE_RESIDENCY_CLAIM = "refuse_residency_claim"
    CAPACITY_REQUIRED = "capacity_required"


class Feasibility(StrEnum):
    """Why an active request could or could not be served."""

    FEASIBLE = "feasible"
    FEASIBLE_AFTER_ACTIVE_DRAIN = "feasible_after_active_drain"
    """Fits once other active requests finish: the request is deferred."""
    FEASIBLE_AFTER_CLAIM_EXPIRY = "feasible_after_claim_expiry"
    """Fits once expiring claims end: the request is deferred."""
    INFEASIBLE_PRESERVE_RESIDENT_AND_ACTIVE = "infeasible_preserve_resident_and_active"
    """Cannot be served without breaking a hard claim: the request is refused."""
    INFEASIBLE_EXCEEDS_CAPACITY = "infeasible_exceeds_capacity"
    """Larger than the whole usable pool: more capacity is required."""


class EventName(StrEnum):
    RESIDENT_CLAIM_SUBMITTED = "resident_claim_submitted"
    RESIDENT_CLAIM_ACCEPTED = "resident_claim_accepted"
    RESIDENT_CLAIM_REJECTED = "resident_claim_rejected"
    RESIDENT_CLAIM_MATERIALIZED = "resident_claim_materialized"
    RESIDENT_CLAIM_DEMOTED = "resident_claim_demoted"
    RESIDENT_CLAIM_EXPIRED = "resident_claim_expired"
    RESIDENT_CLAIM_HARMED = "resident_claim_harmed"
    ACTIVE_REQUEST_REFUSED = "active_request_refused"
    ACTIVE_REQUEST_DEFERRED = "active_request_deferred"
    # telemetry
    FUTURE_REUSE_ADMITTED = "future_reuse_admitted"
    FUTURE_REUSE_DENIED = "future_reuse_denied"
    ALLOCATION_VICTIM_SELECTED = "allocation_victim_selected"
    RESIDENT_CLAIM_RELAXED = "resident_claim_relaxed"
    RESIDENT_CLAIM_OFFLOADED = "resident_claim_offloaded"
    RESIDENT_CLAIM_RESTORE_REQUIRED = "resident_claim_restore_required"
    RESIDENT_CLAIM_RESTORED = "resident_claim_restored"
    RESIDENT_CLAIM_RESTORATION_FAILED = "resident_claim_restoration_failed"
    RESIDENT_CLAIM_BLOCK_LOST_AFTER_RELEASE = "resident_claim_block_lost_after_release"


class ConformanceStatus(StrEnum):
    PASS = "pass"
    APPROXIMATE = "approximate"
    FAIL = "fail"
    NOT_EXPOSED = "not_exposed"
    NOT_EVALUATED = "not_evaluated"


class LoweringClass(StrEnum):
    """How a runtime x mode mapping is classified (fail closed: unknown and rejected never count).

    Ranked by what the evidence shows (``rank``, strongest highest): ``unknown`` is the bottom,
    because taking every piece of evidence away from any mapping leaves ``unknown``; ``rejected``
    sits above it, since rejecting takes knowing the mapping is unsound. Neither is honoured.
    """

    NATIVE_CONFORMANCE = "native_conformance"
    """The runtime itself carries every obligation of the mode, and that was shown."""
    ADAPTER_OBSERVATIONAL = "adapter_observational"
    """An adapter joins the runtime's events to claims, but nothing enforces them."""
    ADAPTER_POLICY = "adapter_policy"
    """An adapter enforces the mode, shown under controlled pressure."""
    APPROXIMATION_SUBSTRATE = "approximation_substrate"
    """A useful primitive without the obligations."""
    REJECTED = "rejected"
    """Unsound (e.g. hard -> soft priority)."""
    UNKNOWN = "unknown"
    """No anchored evidence."""

    @property
    def rank(self) -> int:
        """0 (``unknown``) .. 5 (``native_conformance``): a lower rank is a weaker class."""
        return _LOWERING_RANK[self]


_LOWERING_RANK = {
    cls: rank
    for rank, cls in enumerate(
        (
            LoweringClass.UNKNOWN,
            LoweringClass.REJECTED,
            LoweringClass.APPROXIMATION_SUBSTRATE,
            LoweringClass.ADAPTER_OBSERVATIONAL,
            LoweringClass.ADAPTER_POLICY,
            LoweringClass.NATIVE_CONFORMANCE,
        )
    )
}


def backend_restart_end(materialized: bool) -> tuple[EventName, ClaimState, dict[str, Any]]:
    """How a live claim ends when its KV side went away with its blocks (``BACKEND_RESTART``):
    a materialized one is harmed (its predicate held, now its blocks are gone), one not yet
    seen resident expires. The event, the state and the event's data."""
    if materialized:
        return (
            EventName.RESIDENT_CLAIM_HARMED,
            ClaimState.HARMED,
            {"cause": BACKEND_RESTART, "state": ClaimState.HARMED.value},
        )
    return (
        EventName.RESIDENT_CLAIM_EXPIRED,
        ClaimState.EXPIRED,
        {"reason": BACKEND_RESTART, "state": ClaimState.EXPIRED.value},
    )
