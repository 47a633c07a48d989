"""Backends that each break exactly one obligation of the contract, in front of the real
reference engine (``ForwardingBackend``): what the conformance suite must catch."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from agentclaims.conformance import ManualClock
from agentclaims.contract import (
    BlockHash,
    CacheIdentity,
    ClaimEvent,
    ClaimId,
    ClaimSpec,
    EventName,
    OwnerScope,
    ProtectionMode,
)
from agentclaims.engine import ReferenceKV
from agentclaims.errors import BackendUnavailable, OperationNotExposed
from agentclaims.protocol import ActiveRequest, ClaimDecision, ClaimView, EventPage, ServeResult
from agentclaims.testing import ForwardingBackend


def reference_kv() -> ReferenceKV:
    return ReferenceKV.create(1, 16, clock=ManualClock(), run_id="mutant", model_id="conformance")


class _Mutant(ForwardingBackend):
    def __init__(self) -> None:
        super().__init__(reference_kv(), name=type(self).__name__)


def _without(page: EventPage, *names: EventName) -> EventPage:
    return dataclasses.replace(page, events=tuple(e for e in page.events if e.event not in names))


class InventsHarm(_Mutant):
    """Reports harm for evictions on an instance where no claim was ever made (breaks L1)."""

    def __init__(self) -> None:
        super().__init__()
        self._claims_made = False
        self._invented: list[ClaimEvent] = []

    async def fresh_instance(self, usable_blocks: int, owner_scope: OwnerScope) -> CacheIdentity:
        self._claims_made, self._invented = False, []
        return await super().fresh_instance(usable_blocks, owner_scope)

    async def submit_claim(
        self, spec: ClaimSpec, block_hashes: Sequence[BlockHash] | None = None
    ) -> ClaimDecision:
        self._claims_made = True
        return await super().submit_claim(spec, block_hashes)

    async def serve(self, request: ActiveRequest) -> ServeResult:
        result = await super().serve(request)
        if result.outcome.evicted_blocks and not self._claims_made:
            page = await super().events(result.events_seq - 1)
            if page.events:
                last = page.events[-1]
                self._invented.append(
                    dataclasses.replace(last, event=EventName.RESIDENT_CLAIM_HARMED, data={})
                )
        return result

    async def events(
        self, since: int = 0, *, id_prefix: str | None = None, limit: int | None = None
    ) -> EventPage:
        page = await super().events(since, id_prefix=id_prefix, limit=limit)
        extra = tuple(e for e in self._invented if e.seq > since)
        return dataclasses.replace(page, events=page.events + extra)


class AdmitsNoAdmit(_Mutant):
    """Ignores write no-admit: a no-admit request's KV stays reusable (breaks L2)."""

    async def serve(self, request: ActiveRequest) -> ServeResult:
        return await super().serve(dataclasses.replace(request, admit=True))


class MisreportsShortfall(_Mutant):
    """Refuses as it should but reports a shortfall one block short (breaks L3)."""

    async def events(
        self, since: int = 0, *, id_prefix: str | None = None, limit: int | None = None
    ) -> EventPage:
        page = await super().events(since, id_prefix=id_prefix, limit=limit)
        events = tuple(
            dataclasses.replace(
                e, data={**e.data, "shortfall_blocks": e.data["shortfall_blocks"] - 1}
            )
            if e.event is EventName.ACTIVE_REQUEST_REFUSED and "shortfall_blocks" in e.data
            else e
            for e in page.events
        )
        return dataclasses.replace(page, events=events)


class DropsDemotions(_Mutant):
    """Demotes as it should but never says so (breaks L4)."""

    async def events(
        self, since: int = 0, *, id_prefix: str | None = None, limit: int | None = None
    ) -> EventPage:
        page = await super().events(since, id_prefix=id_prefix, limit=limit)
        return _without(page, EventName.RESIDENT_CLAIM_DEMOTED)


class ExpiresLate(_Mutant):
    """Keeps an expiring claim one step past its ``duration_steps`` (breaks L5)."""

    async def submit_claim(
        self, spec: ClaimSpec, block_hashes: Sequence[BlockHash] | None = None
    ) -> ClaimDecision:
        if spec.duration_steps is not None:
            spec = dataclasses.replace(spec, duration_steps=spec.duration_steps + 1)
        return await super().submit_claim(spec, block_hashes)


class CountsAnySurvivor(_Mutant):
    """Says a claim's predicate holds when most of its blocks survive, block 0 or not
    (breaks L6)."""

    async def get_claim(self, claim_id: ClaimId, owner_scope: OwnerScope) -> ClaimView:
        view = await super().get_claim(claim_id, owner_scope)
        return dataclasses.replace(
            view, predicate_holds=view.present_blocks * 2 > view.footprint_blocks
        )


class ForgetsEndReason(_Mutant):
    """Reports an ended claim without the reason its trace gives (breaks L7)."""

    async def get_claim(self, claim_id: ClaimId, owner_scope: OwnerScope) -> ClaimView:
        view = await super().get_claim(claim_id, owner_scope)
        return dataclasses.replace(view, end_reason=None)


class SoftAsHard(_Mutant):
    """Honours soft_priority claims as hard: soft's weakness never shows, so the hard -> soft
    lowering is rejected by rule only (C1 is not a pass)."""

    async def submit_claim(
        self, spec: ClaimSpec, block_hashes: Sequence[BlockHash] | None = None
    ) -> ClaimDecision:
        if spec.protection_mode is ProtectionMode.SOFT_PRIORITY:
            spec = spec.with_mode(ProtectionMode.HARD_PROTECTED)
        return await super().submit_claim(spec, block_hashes)


ONE_PER_LEVEL: dict[str, type[_Mutant]] = {
    "L1": InventsHarm,
    "L2": AdmitsNoAdmit,
    "L3": MisreportsShortfall,
    "L4": DropsDemotions,
    "L5": ExpiresLate,
    "L6": CountsAnySurvivor,
    "L7": ForgetsEndReason,
    "C1": SoftAsHard,
}
"""Each mutant breaks one obligation, that of its level."""


class SilentEviction(_Mutant):
    """Runs hard claims as soft_priority and hides the victim and harm events."""

    async def submit_claim(
        self, spec: ClaimSpec, block_hashes: Sequence[BlockHash] | None = None
    ) -> ClaimDecision:
        if spec.protection_mode is ProtectionMode.HARD_PROTECTED:
            spec = spec.with_mode(ProtectionMode.SOFT_PRIORITY)
        return await super().submit_claim(spec, block_hashes)

    async def events(
        self, since: int = 0, *, id_prefix: str | None = None, limit: int | None = None
    ) -> EventPage:
        page = await super().events(since, id_prefix=id_prefix, limit=limit)
        return _without(page, EventName.ALLOCATION_VICTIM_SELECTED, EventName.RESIDENT_CLAIM_HARMED)


class NoBlockResidency(_Mutant):
    """Cannot say which blocks are resident (like a runtime without per-block residency)."""

    async def block_residency(self, block_hashes: Sequence[BlockHash]) -> list[bool]:
        raise OperationNotExposed(self.name, "block_residency")


class Unreachable(_Mutant):
    """A backend whose requests cannot reach the server."""

    async def serve(self, request: ActiveRequest) -> ServeResult:
        raise BackendUnavailable("connection refused")


class Crashing(_Mutant):
    """A backend that answers a request with an unexpected error."""

    async def serve(self, request: ActiveRequest) -> ServeResult:
        raise RuntimeError("boom")


class DropsLifecycleEvents(_Mutant):
    """Enforces like the reference engine but drops the demotion and expiry events."""

    async def events(
        self, since: int = 0, *, id_prefix: str | None = None, limit: int | None = None
    ) -> EventPage:
        page = await super().events(since, id_prefix=id_prefix, limit=limit)
        return _without(page, EventName.RESIDENT_CLAIM_DEMOTED, EventName.RESIDENT_CLAIM_EXPIRED)
