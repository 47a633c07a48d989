"""``InstanceReset``: ``InstanceControl`` on vLLM, a fresh instance for the conformance suite.

vLLM's pool cannot be resized or stepped; it can be made empty: every hold revoked (each with
its event), the prefix cache reset (``/reset_prefix_cache``, which vLLM serves in dev mode), and
the gateway's claims and event log begun again.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from agentclaims_vllm.ops import RevokeAll

from agentclaims.contract import CacheIdentity, OwnerScope
from agentclaims.errors import BackendError, ContractViolation, OperationNotExposed, UsageError
from agentclaims.vllm.upstream import Upstream

if TYPE_CHECKING:
    from agentclaims.vllm.link import VllmLink

__all__ = ["InstanceReset"]


class InstanceReset:
    """Makes ``kv``'s vLLM (over ``http``) a fresh instance (``lock``: the mirror's)."""

    def __init__(self, kv: VllmLink, http: Upstream, lock: asyncio.Lock) -> None:
        self._kv = kv
        self._http = http
        self._lock = lock

    async def fresh_instance(self, usable_blocks: int, owner_scope: OwnerScope) -> CacheIdentity:
        """vLLM's pool made empty: every hold revoked (each with its event), the prefix cache
        reset (``/reset_prefix_cache``: vLLM started with ``agentclaims vllm serve
        --dev-mode``), and the gateway's claims and event log begun again (the sequence goes
        on). The pool's size is vLLM's own: ``usable_blocks`` must be it (the descriptor's
        ``usable_blocks``). Refused while another owner holds a live claim."""
        kv = self._kv
        mirror, riding, observer = kv.mirror, kv.riding, kv.observer
        await kv.start()
        if isinstance(usable_blocks, bool) or usable_blocks != kv.usable_blocks:
            raise UsageError(
                "usable_blocks",
                f"vLLM's pool is fixed at start: {kv.usable_blocks} usable blocks, "
                f"got {usable_blocks!r}",
            )
        others = sorted(
            {c.spec.owner_scope for c in mirror.claims.values() if c.held} - {owner_scope}
        )
        if others:
            raise ContractViolation(f"a fresh instance would drop live claims of {others}")
        client = await kv.connector_ready()
        held = await riding.send_now([])  # pending releases go first: what is left is held
        async with self._lock:
            mirror.absorb(held)
            ours = sum(c.held_blocks for c in mirror.claims.values() if c.held)
        if held.held_blocks > ours:  # another gateway on this vLLM holds claims too
            raise ContractViolation(
                f"a fresh instance would drop live claims: the connector holds "
                f"{held.held_blocks} blocks, this gateway's claims {ours}"
            )
        riding.clear()  # the revocation below ends every hold they would release
        answer = await client.operate([RevokeAll("fresh_instance")])
        async with self._lock:
            mirror.absorb(answer)
        clears = 0 if observer is None else observer.clears
        status, data = await self._http.post("/reset_prefix_cache", {})
        if status == 404:
            raise OperationNotExposed(
                kv.name,
                "fresh_instance (vLLM's /reset_prefix_cache: start it with "
                "`agentclaims vllm serve --dev-mode`)",
            )
        if status != 200:
            raise BackendError(f"vLLM could not reset its prefix cache: HTTP {status}: {data}")
        if observer is not None:  # vLLM publishes the clear with its next step's events
            await client.operate([])
            await observer.cleared(clears, timeout_s=2.0)
        async with self._lock:
            mirror.restart()
            kv.sight.last_stored = ()
        return kv.identity()
