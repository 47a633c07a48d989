"""``ForwardsClaims``: the claims API of a speaker that passes each claim operation on to
another speaker, written once.

A test double that injects faults (``ForwardingBackend``), a pool that sends each claim to the
member holding it (``BackendPool``, ``FleetBackend``), a fleet session's routing key
(``RoutedBackend``) and the conformance suite's view of a backend (``Target``) differ only in
where a claim's operations go: ``claim_target``. Submitting and the stream stay theirs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentclaims.protocol.types import RENEW_AS_IS, Renewal

if TYPE_CHECKING:
    from agentclaims.contract.ids import ClaimId, OwnerScope
    from agentclaims.protocol.api import ClaimsProtocol
    from agentclaims.protocol.types import ClaimView

__all__ = ["ForwardsClaims"]


class ForwardsClaims:
    """``get_claim``, ``renew_claim`` and ``release_claim`` passed to ``claim_target``."""

    __slots__ = ()

    def claim_target(self, claim_id: ClaimId) -> ClaimsProtocol:
        """The speaker that holds claim ``claim_id`` (``UnknownClaim`` where none does)."""
        raise NotImplementedError

    async def get_claim(self, claim_id: ClaimId, owner_scope: OwnerScope) -> ClaimView:
        return await self.claim_target(claim_id).get_claim(claim_id, owner_scope)

    async def renew_claim(
        self, claim_id: ClaimId, owner_scope: OwnerScope, renewal: Renewal = RENEW_AS_IS
    ) -> ClaimView:
        return await self.claim_target(claim_id).renew_claim(claim_id, owner_scope, renewal)

    async def release_claim(
        self, claim_id: ClaimId, owner_scope: OwnerScope, *, done: bool = False
    ) -> ClaimView:
        return await self.claim_target(claim_id).release_claim(claim_id, owner_scope, done=done)
