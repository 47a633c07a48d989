"""The decisions every KV side builds the same way, with their events: a claim submitted, a
claim refused (``refuse_residency_claim``), a claim harmed (its predicate held, now it does not).
"""

from __future__ import annotations

from typing import Any

from agentclaims.contract import (
    ArbiterAction,
    ClaimId,
    ClaimSpec,
    ClaimState,
    Decision,
    EventName,
)
from agentclaims.kernel.events import EventLog
from agentclaims.kernel.record import Claim
from agentclaims.protocol.types import ClaimDecision

__all__ = ["accepted", "harm", "harm_fields", "refuse", "submitted"]


def submitted(log: EventLog, claim: Claim, request_id: str | None = None) -> None:
    """``resident_claim_submitted``, saying what the claim asks for."""
    spec: ClaimSpec = claim.spec
    log.emit(
        EventName.RESIDENT_CLAIM_SUBMITTED,
        claim=claim,
        request_id=request_id,
        protection_mode=spec.protection_mode.value,
        owner_scope=spec.owner_scope,
        footprint_blocks=spec.footprint_blocks,
        materialization_predicate=spec.materialization_predicate.to_dict(),
        duration_steps=spec.duration_steps,
        ttl_s=spec.ttl_s,
    )


def refuse(
    log: EventLog, claim: Claim, reason: str, request_id: str | None = None
) -> ClaimDecision:
    """A submitted claim refused for ``reason``: ``resident_claim_rejected`` and the decision."""
    claim.end(ClaimState.REFUSED, reason)
    log.emit(
        EventName.RESIDENT_CLAIM_REJECTED,
        claim=claim,
        request_id=request_id,
        action=ArbiterAction.REFUSE_RESIDENCY_CLAIM.value,
        decision=Decision.REJECTED.value,
        reason=reason,
        state=ClaimState.REFUSED.value,
    )
    return ClaimDecision(
        ClaimId(claim.spec.claim_id),
        Decision.REJECTED,
        ClaimState.REFUSED,
        ArbiterAction.REFUSE_RESIDENCY_CLAIM,
        reason,
    )


def accepted(claim: Claim, conditions: dict[str, Any] | None = None) -> ClaimDecision:
    """The decision of a claim taken (``conditions``: what the side capped)."""
    return ClaimDecision(
        ClaimId(claim.spec.claim_id),
        Decision.CONDITIONALLY_ACCEPTED if conditions else Decision.ACCEPTED,
        claim.state,
        None,
        None,
        dict(conditions or {}),
    )


def harm_fields(cause: str) -> dict[str, Any]:
    """What ``resident_claim_harmed`` says besides the state: the cause, and that the
    predicate held before the loss and does not after."""
    return {"reason": cause, "cause": cause, "predicate_before": True, "predicate_after": False}


def harm(
    log: EventLog, claim: Claim, cause: str, request_id: str | None = None, **data: Any
) -> None:
    """A loss broke a live claim's predicate (true harm): it ends ``harmed``, with the cause."""
    claim.end(ClaimState.HARMED, cause)
    log.emit(
        EventName.RESIDENT_CLAIM_HARMED,
        claim=claim,
        request_id=request_id,
        state=ClaimState.HARMED.value,
        **harm_fields(cause),
        **data,
    )
