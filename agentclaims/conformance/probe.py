"""The allocator probe and the capacity sweep: the reference figures of the contract.

The probe makes ``resident`` blocks resident (one finished request), optionally claims them, then
starts an active request of ``active`` blocks. Against 80 usable blocks, 60 + 70 leaves a
shortfall of 50: without protection 50 resident blocks are lost; under a hard claim the active
request is refused, naming the claim. The sweep repeats it over usable = 80, 90, ..., 150.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from agentclaims.conformance.target import OWNER_SCOPE, Target
from agentclaims.contract import (
    BlockHash,
    CacheIdentity,
    ClaimEvent,
    ClaimId,
    ClaimSpec,
    ProtectionMode,
    prefix_id_of,
)
from agentclaims.engine import hash_token_blocks
from agentclaims.protocol import ActiveOutcome, ClaimDecision, ClaimView

__all__ = [
    "OWNER_SCOPE",
    "PROBE_ACTIVE_BLOCKS",
    "PROBE_CLAIM_ID",
    "PROBE_RESIDENT_BLOCKS",
    "PROBE_USABLE_BLOCKS",
    "SWEEP_USABLE_BLOCKS",
    "ProbeRecord",
    "SweepRow",
    "allocator_probe",
    "capacity_sweep",
    "claim_spec",
    "lost_blocks",
    "prepare_resident",
    "select_events",
    "serve",
    "synthetic_blocks",
]

PROBE_RESIDENT_BLOCKS = 60
PROBE_ACTIVE_BLOCKS = 70
PROBE_USABLE_BLOCKS = 80
SWEEP_USABLE_BLOCKS: tuple[int, ...] = tuple(range(80, 151, 10))
PROBE_CLAIM_ID = "probe-claim"
PROBE_ACTIVE_REQUEST = "probe-active"


def synthetic_blocks(tag: str, n: int) -> list[BlockHash]:
    """``n`` chained block hashes of a synthetic prompt; distinct tags give distinct chains."""
    return hash_token_blocks(list(range(n)), 1, cache_salt=tag)


def claim_spec(
    claim_id: str,
    block_hashes: Sequence[BlockHash],
    mode: ProtectionMode,
    identity: CacheIdentity,
    **extra: Any,
) -> ClaimSpec:
    """A claim of the suite's owner over the prefix made of ``block_hashes``."""
    return ClaimSpec(
        claim_id=claim_id,
        owner_scope=OWNER_SCOPE,
        object_id=prefix_id_of(block_hashes),
        cache_identity=identity,
        footprint_blocks=len(block_hashes),
        protection_mode=mode,
        **extra,
    )


async def serve(
    backend: Target,
    request_id: str,
    block_hashes: Sequence[BlockHash],
    *,
    admit: bool = True,
) -> ActiveOutcome:
    """Run one active request to completion if it is served."""
    return await backend.begin(request_id, block_hashes, admit=admit)


async def lost_blocks(backend: Target, block_hashes: Sequence[BlockHash]) -> int:
    """How many of ``block_hashes`` are no longer resident."""
    return sum(1 for alive in await backend.survival(block_hashes) if not alive)


def select_events(
    events: Iterable[ClaimEvent],
    *names: str,
    claim_id: str | None = None,
    request_id: str | None = None,
) -> list[ClaimEvent]:
    """The events named one of ``names``, of that claim and request when given."""
    return [
        e
        for e in events
        if e.event.value in names
        and (claim_id is None or e.claim_id == claim_id)
        and (request_id is None or e.request_id == request_id)
    ]


@dataclass(frozen=True, slots=True)
class ProbeRecord:
    """What one allocator probe observed."""

    usable_blocks: int
    mode: ProtectionMode | None
    resident: tuple[BlockHash, ...]
    active: tuple[BlockHash, ...]
    decision: ClaimDecision | None
    outcome: ActiveOutcome
    resident_lost: int
    events: tuple[ClaimEvent, ...]
    claim_view: ClaimView | None
    demand_blocks: int | None = None
    """Blocks the claims and the active work want at once, where that is not the resident and
    active prefixes alone (a served engine's probe: held claims beside a burst)."""

    @property
    def overcommitted(self) -> bool:
        """The claims and the active work cannot all fit in the pool."""
        demand = len(self.resident) + len(self.active)
        return (demand if self.demand_blocks is None else self.demand_blocks) > self.usable_blocks

    claim_id: ClassVar[str] = PROBE_CLAIM_ID
    request_id: ClassVar[str] = PROBE_ACTIVE_REQUEST

    def named(self, *names: str, claim_id: str | None = None) -> list[ClaimEvent]:
        """The probe's events named one of ``names`` (of that claim, if given)."""
        return select_events(self.events, *names, claim_id=claim_id)


async def prepare_resident(
    backend: Target,
    usable_blocks: int,
    mode: ProtectionMode | None = None,
    *,
    resident_blocks: int = PROBE_RESIDENT_BLOCKS,
    **claim_extra: Any,
) -> tuple[CacheIdentity, list[BlockHash], ClaimDecision | None]:
    """A fresh instance with one finished request's prefix resident, claimed under ``mode``."""
    identity = await backend.fresh(usable_blocks)
    resident = synthetic_blocks("probe-resident", resident_blocks)
    await serve(backend, "probe-resident", resident)
    decision = None
    if mode is not None:
        spec = claim_spec(PROBE_CLAIM_ID, resident, mode, identity, **claim_extra)
        decision = await backend.submit_claim(spec, resident)
    return identity, resident, decision


async def allocator_probe(
    backend: Target,
    usable_blocks: int = PROBE_USABLE_BLOCKS,
    mode: ProtectionMode | None = None,
    *,
    admit: bool = True,
    resident_blocks: int = PROBE_RESIDENT_BLOCKS,
    active_blocks: int = PROBE_ACTIVE_BLOCKS,
) -> ProbeRecord:
    """Resident prefix (claimed under ``mode`` if given), then one active request."""
    _, resident, decision = await prepare_resident(
        backend, usable_blocks, mode, resident_blocks=resident_blocks
    )
    active = synthetic_blocks("probe-active", active_blocks)
    outcome = await serve(backend, PROBE_ACTIVE_REQUEST, active, admit=admit)
    view = None if mode is None else await backend.get_claim(ClaimId(PROBE_CLAIM_ID), OWNER_SCOPE)
    return ProbeRecord(
        usable_blocks=usable_blocks,
        mode=mode,
        resident=tuple(resident),
        active=tuple(active),
        decision=decision,
        outcome=outcome,
        resident_lost=await lost_blocks(backend, resident),
        events=tuple(await backend.events(0)),
        claim_view=view,
    )


@dataclass(frozen=True, slots=True)
class SweepRow:
    """One usable-capacity point of the sweep."""

    usable_blocks: int
    resident_lost_unprotected: int
    hard_served: bool
    hard_action: str
    hard_shortfall_blocks: int
    hard_resident_lost: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "usable_blocks": self.usable_blocks,
            "resident_lost_unprotected": self.resident_lost_unprotected,
            "hard_served": self.hard_served,
            "hard_action": self.hard_action,
            "hard_shortfall_blocks": self.hard_shortfall_blocks,
            "hard_resident_lost": self.hard_resident_lost,
        }


async def capacity_sweep(
    backend: Target, usable: Iterable[int] = SWEEP_USABLE_BLOCKS
) -> list[SweepRow]:
    """The probe at each capacity, without protection and under a hard claim."""
    rows = []
    for n in usable:
        plain = await allocator_probe(backend, n)
        hard = await allocator_probe(backend, n, ProtectionMode.HARD_PROTECTED)
        rows.append(
            SweepRow(
                usable_blocks=n,
                resident_lost_unprotected=plain.resident_lost,
                hard_served=hard.outcome.served,
                hard_action=hard.outcome.action.value,
                hard_shortfall_blocks=hard.outcome.shortfall_blocks,
                hard_resident_lost=hard.resident_lost,
            )
        )
    return rows
