"""What the conformance scenarios drive: any backend that speaks the claims protocol.

``Target`` wraps one ``ClaimsProtocol`` speaker (the reference engine in-process, the gateway
through ``EmbeddedBackend`` or over HTTP, a lowering onto vLLM, a user's test double) and gives
the scenarios their operations. The claims API is required; an active request needs
``ActiveServing`` and a fresh instance or a step needs ``InstanceControl``. An operation a
backend lacks raises ``OperationNotExposed`` and the level that needed it reports
``not_exposed``, never ``pass``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentclaims.contract import (
    BlockHash,
    CacheIdentity,
    ClaimEvent,
    ClaimId,
    ClaimSpec,
    OwnerScope,
    RequestId,
)
from agentclaims.errors import AgentClaimsError, OperationNotExposed, UsageError
from agentclaims.protocol import (
    ActiveOutcome,
    ActiveRequest,
    ActiveServing,
    ClaimDecision,
    ClaimsProtocol,
    ForwardsClaims,
    InstanceControl,
    collect_events,
)

__all__ = ["OWNER_SCOPE", "ManualClock", "ServedPool", "Target", "reference_target", "served_pool"]

_UNKNOWN = object()

OWNER_SCOPE = OwnerScope("conformance")
"""The owner of every claim the suite makes."""


class ManualClock:
    """A clock in nanoseconds that moves only when told to (injected into the engine)."""

    __slots__ = ("now_ns",)

    def __init__(self, start_ns: int = 1_700_000_000_000_000_000) -> None:
        self.now_ns = start_ns

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, seconds: float) -> None:
        if not seconds >= 0:
            raise UsageError("seconds", f"must be a non-negative number, got {seconds!r}")
        self.now_ns += int(seconds * 1e9)


class Target(ForwardsClaims):
    """The scenario-facing view of one backend. Every scenario starts with ``fresh``."""

    def __init__(self, backend: ClaimsProtocol) -> None:
        if not isinstance(backend, ClaimsProtocol):
            raise UsageError("backend", f"does not speak the claims protocol: {backend!r}")
        self.backend = backend
        self.name = backend.name
        self._pool: Any = _UNKNOWN

    async def served_pool(self) -> ServedPool | None:
        """The pool of a served engine (vLLM: the suite runs its served variant of each
        level), or ``None`` (a synthetic pool: the reference scenarios). Asked once."""
        if self._pool is _UNKNOWN:
            self._pool = await served_pool(self)
        pool: ServedPool | None = self._pool
        return pool

    async def tidy(self) -> None:
        """After a suite on a served engine: its holds revoked and its cache reset, so the
        suite leaves nothing held (best effort: a level may have left it unreachable)."""
        if self._pool is not _UNKNOWN and self._pool is not None:
            with contextlib.suppress(AgentClaimsError):
                await self.fresh(self._pool.usable_blocks)

    def _need(self, capability: type, operation: str) -> None:
        if not isinstance(self.backend, capability):
            raise OperationNotExposed(self.name, operation)

    async def fresh(self, usable_blocks: int) -> CacheIdentity:
        """A fresh instance with ``usable_blocks`` usable KV blocks, nothing resident; returns
        the cache identity claims on it must carry."""
        self._need(InstanceControl, "fresh_instance")
        assert isinstance(self.backend, InstanceControl)
        return await self.backend.fresh_instance(usable_blocks, OWNER_SCOPE)

    async def begin(
        self, request_id: str, block_hashes: Sequence[BlockHash], *, admit: bool = True
    ) -> ActiveOutcome:
        """Run an active request over ``block_hashes`` (``admit=False``: write no-admit)."""
        self._need(ActiveServing, "serve")
        assert isinstance(self.backend, ActiveServing)
        request = ActiveRequest(
            RequestId(request_id), block_hashes=tuple(block_hashes), admit=admit, chat=False
        )
        return (await self.backend.serve(request)).outcome

    async def submit_claim(
        self, spec: ClaimSpec, block_hashes: Sequence[BlockHash]
    ) -> ClaimDecision:
        return await self.backend.submit_claim(spec, block_hashes)

    def claim_target(self, claim_id: ClaimId) -> ClaimsProtocol:
        return self.backend

    async def step(self, n: int = 1) -> None:
        self._need(InstanceControl, "step")
        assert isinstance(self.backend, InstanceControl)
        await self.backend.step(n)

    async def events(self, since: int = 0) -> list[ClaimEvent]:
        """Every event of this instance with ``seq > since``, in order."""
        return await collect_events(self.backend, since)

    async def survival(self, block_hashes: Sequence[BlockHash]) -> list[bool]:
        """For each block hash, whether it is resident (reusable) on the device now."""
        self._need(ActiveServing, "block_residency")
        assert isinstance(self.backend, ActiveServing)
        return await self.backend.block_residency(block_hashes)


def reference_target(
    block_size: int = 16, *, clock: Callable[[], int] | None = None, run_id: str = "conformance"
) -> Target:
    """The reference engine in-process, on a ``ManualClock``: deterministic runs."""
    from agentclaims.engine import ReferenceKV

    kv = ReferenceKV.create(
        1, block_size, clock=clock or ManualClock(), run_id=run_id, model_id="conformance"
    )
    return Target(kv)


@dataclass(frozen=True, slots=True)
class ServedPool:
    """The served engine's pool, as its descriptor states it."""

    usable_blocks: int
    block_size: int
    max_model_len: int
    cap_blocks: int
    max_ttl_s: float
    max_defer_s: float
    connector: bool

    @property
    def prompt_blocks(self) -> int:
        """Full blocks of the longest prompt that still leaves a block for its reply."""
        return max(1, (self.max_model_len - self.block_size) // self.block_size)


async def served_pool(target: Target) -> ServedPool | None:
    """The pool of a served engine (``kv_side: vllm``), or ``None`` for a synthetic one."""
    describe: Callable[[], Awaitable[Mapping[str, Any]]] | None = getattr(
        target.backend, "descriptor", None
    )
    if describe is None:
        return None
    try:
        desc = await describe()
    except (OperationNotExposed, NotImplementedError):
        return None
    if not isinstance(desc, Mapping) or desc.get("kv_side") != "vllm":
        return None
    usable = int(desc.get("usable_blocks") or 0)
    bs = int(desc.get("block_size") or 0)
    if usable <= 0 or bs <= 0:
        raise OperationNotExposed(target.name, "its pool's size (usable_blocks)")
    return ServedPool(
        usable_blocks=usable,
        block_size=bs,
        max_model_len=int(desc.get("max_model_len") or bs * 8),
        cap_blocks=int(desc.get("hold_cap_blocks") or 0),
        max_ttl_s=float(desc.get("hold_max_ttl_s") or 0.0),
        max_defer_s=float(desc.get("hold_max_defer_s") or 0.0),
        connector=bool(desc.get("connector")),
    )
