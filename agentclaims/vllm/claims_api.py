"""``ClaimsApi``: the claims protocol's own operations on vLLM, beside the completions.

A claim on an already served prefix (``POST /v1/claims``) re-runs that prefix for one token
with a ``hold``: its blocks are prefix-cache hits, held when the request finishes. A renewal
takes the connector's channel at once; a release rides on the next request to vLLM
(``RidingOps``). The event stream and residency are read once the pending operations are
applied (and, with the observer, once vLLM's KV events caught up: ``CacheSight``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from agentclaims_vllm.ops import Release, Renew

from agentclaims.contract import (
    BlockHash,
    ClaimId,
    ClaimSpec,
    ClaimState,
    OwnerScope,
    PrefixId,
)
from agentclaims.errors import OperationNotExposed, UsageError
from agentclaims.kernel import identity_problem
from agentclaims.protocol import RENEW_AS_IS, ClaimDecision, ClaimView, EventPage, Renewal
from agentclaims.vllm.payloads import hold_op

if TYPE_CHECKING:
    from agentclaims.vllm.link import VllmLink

__all__ = ["ClaimsApi"]


class ClaimsApi:
    """Submit, read, renew and release ``kv``'s claims; its events and residency (``lock``:
    the mirror's and the prompt book's; ``gate``: why a claim is refused here, if it is)."""

    def __init__(
        self, kv: VllmLink, lock: asyncio.Lock, gate: Callable[[ClaimSpec], str | None]
    ) -> None:
        self._kv = kv
        self._lock = lock
        self._gate = gate

    async def submit_claim(
        self, spec: ClaimSpec, block_hashes: Sequence[BlockHash] | None = None
    ) -> ClaimDecision:
        """Claim an already served prefix: re-run it for one token with a ``hold``."""
        kv = self._kv
        await kv.start()
        if block_hashes is not None:
            raise OperationNotExposed(kv.name, "claims by block hashes (vLLM's are its own)")
        if spec.claim_id in kv.mirror.claims:
            raise UsageError("claim_id", f"claim {spec.claim_id!r} already exists")
        await kv.model()
        mismatch = identity_problem(spec.cache_identity, kv.identity())
        if mismatch is not None:
            async with self._lock:
                return kv.mirror.refuse(spec, mismatch, None)
        known = kv.prompts.get(spec.object_id)
        if known is None:
            raise UsageError("object_id", f"unknown prefix {spec.object_id!r}: serve it first")
        reason = self._gate(spec)
        if reason is not None:
            async with self._lock:
                return kv.mirror.refuse(spec, reason, None)
        client = await kv.connector_ready()
        hashes = known.hashes  # as served: not hashed again
        answer = await client.complete(
            known.token_ids(),
            [hold_op(spec)],
            max_tokens=1,
            tenant=spec.owner_scope,
            cache_salt=known.salt,
        )
        if answer.served:
            kv.sight.last_stored = hashes
            await kv.sight.seen_stored(hashes[: spec.footprint_blocks])
        async with self._lock:
            kv.mirror.absorb(answer)
            return kv.mirror.decide(spec, answer, hashes)

    async def get_claim(self, claim_id: ClaimId, owner_scope: OwnerScope) -> ClaimView:
        return self._kv.mirror.view(self._kv.mirror.owned(claim_id, owner_scope))

    async def renew_claim(
        self, claim_id: ClaimId, owner_scope: OwnerScope, renewal: Renewal = RENEW_AS_IS
    ) -> ClaimView:
        await self._kv.start()
        claim = self._kv.mirror.owned(claim_id, owner_scope)
        ttl = renewal.ttl_s if renewal.ttl_s is not None else claim.spec.ttl_s
        if renewal.duration_steps is not None:
            raise UsageError(
                "duration_steps", "vLLM claims count seconds (ttl_s), not engine steps"
            )
        claim.require_live()
        if not claim.held:
            # live and holding nothing on vLLM (``best_effort`` is only observed): there is
            # no hold to extend, and such a claim ends only by release
            return self._kv.mirror.view(claim)
        answer = await self._kv.riding.send_now([Renew(claim_id, ttl, owner_scope)])
        async with self._lock:
            self._kv.mirror.absorb(answer)
        result = next(
            (r for r in answer.results if r.get("op") == "renew" and r.get("claim_id") == claim_id),
            None,
        )
        if result is None or not result.get("ok"):
            reason = "no answer" if result is None else str(result.get("reason"))
            field = "ttl_s" if reason.startswith("ttl_s") else "claim_id"
            raise UsageError(field, f"claim {claim_id!r} cannot be renewed: {reason}")
        claim.expires_at_ns = time.time_ns() + int(float(result.get("ttl_s", ttl)) * 1e9)
        return self._kv.mirror.view(claim)

    async def release_claim(
        self, claim_id: ClaimId, owner_scope: OwnerScope, *, done: bool = False
    ) -> ClaimView:
        if self._kv.liveness.dead is None:  # else its claims have all ended: nothing to hand back
            await self._kv.start()
        claim = self._kv.mirror.owned(claim_id, owner_scope)
        # the hand-back rides on the next request to vLLM (``RidingOps``), for a demoted claim
        # too (the connector may still keep its head); ``done``: to the free queue's head
        if claim.held or claim.state is ClaimState.DEMOTED:
            self._kv.riding.queue(Release(claim_id, owner_scope, evict_first=done))
        if claim.state in (ClaimState.MATERIALIZED, ClaimState.ACCEPTED, ClaimState.DEMOTED):
            self._kv.mirror.end(claim)  # its resident_claim_expired follows from the connector
        return self._kv.mirror.view(claim)

    async def events(
        self, since: int = 0, *, id_prefix: str | None = None, limit: int | None = None
    ) -> EventPage:
        if self._kv.liveness.dead is None:  # a dead engine's events stay readable: they say so
            await self._kv.start()
            await self._kv.riding.settle()
        if self._kv.mirror.judging:
            await asyncio.gather(*list(self._kv.mirror.judging), return_exceptions=True)
        async with self._lock:
            return self._kv.mirror.events.page(since, limit=limit, id_prefix=id_prefix)

    async def residency(self, prefix_ids: Sequence[PrefixId]) -> dict[PrefixId, int]:
        """Leading blocks known resident: those vLLM's events show cached (with the observer),
        and those of held claims (unknown is 0: fail closed)."""
        out = dict.fromkeys(prefix_ids, 0)
        if self._kv.liveness.dead is not None:
            return out  # its cache went with it
        await self._kv.riding.settle()
        observer = self._kv.sight.observer
        if observer is not None:
            await self._kv.sight.settle()
            for pid in out:
                known = self._kv.prompts.get(pid)
                if known is not None:
                    out[pid] = observer.leading_run(known.hashes)
        for claim in self._kv.mirror.claims.values():
            pid = PrefixId(claim.spec.object_id)
            if pid in out and claim.state is ClaimState.MATERIALIZED:
                out[pid] = max(out[pid], claim.held_blocks)
        return out

    async def block_residency(self, block_hashes: Sequence[BlockHash]) -> list[bool]:
        """Whether each block (the gateway's hash) is in vLLM's prefix cache, from its events."""
        observer = self._kv.sight.observer
        if observer is None:
            raise OperationNotExposed(
                self._kv.name, "block_residency (start the gateway with --kv-events ENDPOINT)"
            )
        await self._kv.start()
        await self._kv.sight.settle()
        return observer.resident(block_hashes)
