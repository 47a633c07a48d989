"""What the conformance suite needs from a runtime, and the adapter over the reference engine.

The suite drives a backend through ``ConformanceBackend``: a handful of async operations that a
gateway reached over HTTP, a lowering onto vLLM, or the in-process ``KVEngine`` can each offer.
An operation a backend cannot offer raises ``OperationNotExposed``; the scenario that needed it
then reports ``not_exposed``, never ``pass``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from agentclaims.contract import CacheIdentity, ClaimEvent, ClaimSpec
from agentclaims.engine import ActiveOutcome, BlockHash, ClaimDecision, ClaimView, KVEngine
from agentclaims.errors import BackendError, UsageError

__all__ = [
    "ConformanceBackend",
    "EmbeddedConformanceBackend",
    "ManualClock",
    "OperationNotExposed",
]


class OperationNotExposed(BackendError):
    """The backend cannot perform an operation a scenario needs (the level is ``not_exposed``)."""

    def __init__(self, backend: str, operation: str) -> None:
        super().__init__(f"backend {backend!r} does not expose {operation}")
        self.backend = backend
        self.operation = operation


@runtime_checkable
class ConformanceBackend(Protocol):
    """The operations the conformance scenarios drive. Every scenario starts with ``fresh``."""

    name: str

    async def fresh(self, usable_blocks: int) -> CacheIdentity:
        """Start a fresh instance with ``usable_blocks`` usable KV blocks, nothing resident.

        Returns the cache identity claims on this instance must carry."""
        ...

    async def begin(
        self, request_id: str, block_hashes: Sequence[BlockHash], *, admit: bool = True
    ) -> ActiveOutcome:
        """Start an active request over ``block_hashes``; ``admit=False`` is write no-admit."""
        ...

    async def finish(self, request_id: str) -> None:
        """End an active request that was served."""
        ...

    async def submit_claim(
        self, spec: ClaimSpec, block_hashes: Sequence[BlockHash]
    ) -> ClaimDecision: ...

    async def release_claim(self, claim_id: str, owner_scope: str) -> ClaimView: ...

    async def get_claim(self, claim_id: str, owner_scope: str) -> ClaimView:
        """The backend's own view of a claim (what L7 checks the rebuilt trace against)."""
        ...

    async def step(self, n: int = 1) -> None:
        """Advance the step counter that ``duration_steps`` counts."""
        ...

    async def advance_clock(self, seconds: float) -> None:
        """Advance the clock that TTLs and event timestamps read."""
        ...

    async def events(self, since: int = 0) -> list[ClaimEvent]:
        """Events with ``seq`` greater than ``since``, in order."""
        ...

    async def survival(self, block_hashes: Sequence[BlockHash]) -> list[bool]:
        """For each block hash, whether it is resident (reusable) on the device now."""
        ...

    async def aclose(self) -> None: ...


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


class EmbeddedConformanceBackend:
    """The suite's adapter over the in-process ``KVEngine``: a fresh engine per scenario,
    driven by a ``ManualClock``, so every run is deterministic."""

    name = "embedded"

    def __init__(self, block_size: int = 16, *, run_id_prefix: str = "conformance") -> None:
        self.block_size = block_size
        self.run_id_prefix = run_id_prefix
        self.clock = ManualClock()
        self._engine: KVEngine | None = None
        self._instances = 0

    @property
    def engine(self) -> KVEngine:
        """The current instance; ``fresh`` must have been called."""
        if self._engine is None:
            raise UsageError("backend", "call fresh() before driving the backend")
        return self._engine

    async def fresh(self, usable_blocks: int) -> CacheIdentity:
        self._instances += 1
        self.clock = ManualClock()
        self._engine = KVEngine(
            usable_blocks,
            self.block_size,
            clock=self.clock,
            run_id=f"{self.run_id_prefix}-{self._instances}",
        )
        return self._engine.cache_identity

    async def begin(
        self, request_id: str, block_hashes: Sequence[BlockHash], *, admit: bool = True
    ) -> ActiveOutcome:
        return self.engine.begin(request_id, block_hashes, admit=admit)

    async def finish(self, request_id: str) -> None:
        self.engine.finish(request_id)

    async def submit_claim(
        self, spec: ClaimSpec, block_hashes: Sequence[BlockHash]
    ) -> ClaimDecision:
        return self.engine.submit_claim(spec, block_hashes)

    async def release_claim(self, claim_id: str, owner_scope: str) -> ClaimView:
        return self.engine.release_claim(claim_id, owner_scope)

    async def get_claim(self, claim_id: str, owner_scope: str) -> ClaimView:
        return self.engine.get_claim(claim_id, owner_scope)

    async def step(self, n: int = 1) -> None:
        self.engine.step(n)

    async def advance_clock(self, seconds: float) -> None:
        self.clock.advance(seconds)

    async def events(self, since: int = 0) -> list[ClaimEvent]:
        return self.engine.events_since(since)

    async def survival(self, block_hashes: Sequence[BlockHash]) -> list[bool]:
        engine = self.engine
        return [engine.is_cached(h) for h in block_hashes]

    async def aclose(self) -> None:
        self._engine = None
