"""``ForwardingBackend``: speak the claims protocol by forwarding to another speaker.

Subclass it and override one method to inject a fault (drop an event, run a hard claim as
soft, hide residency) in front of a real backend; the conformance suite's mutants are built so.
A capability the inner backend lacks raises ``OperationNotExposed``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentclaims.contract import BlockHash, CacheIdentity, ClaimId, ClaimSpec, OwnerScope, PrefixId
from agentclaims.errors import OperationNotExposed
from agentclaims.protocol import (
    ActiveRequest,
    ActiveServing,
    ClaimDecision,
    ClaimsProtocol,
    Descriptor,
    EventPage,
    ForwardsClaims,
    InstanceControl,
    ServeResult,
)

__all__ = ["ForwardingBackend"]


class ForwardingBackend(ForwardsClaims):
    """Every operation of the claims protocol, passed to ``inner``."""

    def __init__(self, inner: ClaimsProtocol, *, name: str | None = None) -> None:
        self.inner = inner
        self.name = name or inner.name

    def __getattr__(self, name: str) -> Any:  # tokenizer, block_size, metrics, engine, ...
        return getattr(self.inner, name)

    def _capable(self, capability: type, operation: str) -> Any:
        if not isinstance(self.inner, capability):
            raise OperationNotExposed(self.name, operation)
        return self.inner

    async def submit_claim(
        self, spec: ClaimSpec, block_hashes: Sequence[BlockHash] | None = None
    ) -> ClaimDecision:
        return await self.inner.submit_claim(spec, block_hashes)

    def claim_target(self, claim_id: ClaimId) -> ClaimsProtocol:
        return self.inner

    async def events(
        self, since: int = 0, *, id_prefix: str | None = None, limit: int | None = None
    ) -> EventPage:
        return await self.inner.events(since, id_prefix=id_prefix, limit=limit)

    async def residency(self, prefix_ids: Sequence[PrefixId]) -> dict[PrefixId, int]:
        return await self.inner.residency(prefix_ids)

    async def descriptor(self) -> Descriptor:
        return await self.inner.descriptor()

    async def serve(self, request: ActiveRequest) -> ServeResult:
        inner: ActiveServing = self._capable(ActiveServing, "serve")
        return await inner.serve(request)

    async def block_residency(self, block_hashes: Sequence[BlockHash]) -> list[bool]:
        inner: ActiveServing = self._capable(ActiveServing, "block_residency")
        return await inner.block_residency(block_hashes)

    async def fresh_instance(self, usable_blocks: int, owner_scope: OwnerScope) -> CacheIdentity:
        inner: InstanceControl = self._capable(InstanceControl, "fresh_instance")
        return await inner.fresh_instance(usable_blocks, owner_scope)

    async def step(self, n: int = 1) -> None:
        inner: InstanceControl = self._capable(InstanceControl, "step")
        await inner.step(n)
