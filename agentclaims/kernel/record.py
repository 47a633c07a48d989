"""``Claim``: what every KV side records of one claim, and the moves of its lifecycle.

The reference engine's record adds which blocks survive; ``FakeKV``'s, the blocks it covers;
the vLLM side's, how many blocks the connector holds. The spec, the state, the end reason and
the claim's own event count are the same on all three, and so is the view a reader gets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from agentclaims.contract import (
    ClaimId,
    ClaimSpec,
    ClaimState,
    OwnerScope,
    PrefixId,
    ProtectionMode,
    check_transition,
)
from agentclaims.errors import UsageError
from agentclaims.protocol.types import ClaimView

__all__ = ["CLAIMS_KEPT", "Claim", "counts_by_mode_and_state", "forget_ended"]

CLAIMS_KEPT = 65_536
"""Claims a KV side keeps for readers: every live one, and the last ended up to this many in
all (``forget_ended``), so that its memory, and any scan of its claims, does not grow with
every claim ever made. A claim forgotten reads as unknown (the ledger, where there is one,
keeps the history)."""


class Claim:
    """One claim as a KV side keeps it: ``spec``, ``state``, ``end_reason`` and ``seq`` (its
    last ``event_sequence``: ``EventLog`` numbers its events)."""

    __slots__ = ("end_reason", "seq", "spec", "state")

    def __init__(self, spec: ClaimSpec, state: ClaimState = ClaimState.SUBMITTED) -> None:
        self.spec = spec
        self.state = state
        self.end_reason: str | None = None
        self.seq = -1

    @property
    def claim_id(self) -> str:
        return self.spec.claim_id

    @property
    def mode(self) -> ProtectionMode:
        return self.spec.protection_mode

    def move(self, target: ClaimState) -> None:
        """To ``target``; a move the lifecycle forbids raises before anything changes."""
        self.state = check_transition(self.spec.claim_id, self.state, target)

    def require_live(self) -> None:
        """What a renewal needs: a claim that has not ended (else ``UsageError`` on
        ``claim_id``, every side's same words)."""
        if not self.state.live:
            raise UsageError(
                "claim_id", f"claim {self.spec.claim_id!r} has ended ({self.state.value})"
            )

    def end(self, target: ClaimState, reason: str) -> None:
        """To the terminal ``target``, for ``reason`` (checked as ``move``)."""
        self.move(target)
        self.end_reason = reason

    def view(
        self,
        *,
        present_blocks: int,
        holds: bool,
        expires_at_step: int | None = None,
        expires_at_ns: int | None = None,
    ) -> ClaimView:
        """What a reader sees (``holds``: the predicate holds; only a live claim's counts)."""
        spec = self.spec
        return ClaimView(
            claim_id=ClaimId(spec.claim_id),
            owner_scope=OwnerScope(spec.owner_scope),
            object_id=PrefixId(spec.object_id),
            protection_mode=spec.protection_mode,
            state=self.state,
            footprint_blocks=spec.footprint_blocks,
            present_blocks=present_blocks,
            predicate_holds=holds and self.state.live,
            expires_at_step=expires_at_step,
            expires_at_ns=expires_at_ns,
            end_reason=self.end_reason,
        )


def counts_by_mode_and_state(claims: Iterable[Claim]) -> dict[str, int]:
    """How many of ``claims`` there are per ``mode/state`` (the ``agentclaims_claims``
    gauge), keys sorted."""
    out: dict[str, int] = {}
    for claim in claims:
        key = f"{claim.spec.protection_mode.value}/{claim.state.value}"
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


C = TypeVar("C", bound=Claim)


def forget_ended(
    claims: dict[str, C],
    keep: int,
    ended: Callable[[C], bool],
    forgotten: Callable[[C], None] | None = None,
) -> None:
    """Past ``keep`` claims, forget the oldest ``ended`` ones (``claims`` is in the order they
    were made; a live one is never forgotten) until a tenth of ``keep`` is free again: a
    claim's insertion pays O(1) for it on average. ``forgotten`` hears of each one."""
    if len(claims) <= keep:
        return
    target = keep - max(1, keep // 10)
    for cid in list(claims):
        if len(claims) <= target:
            return
        claim = claims[cid]
        if ended(claim):
            del claims[cid]
            if forgotten is not None:
                forgotten(claim)
