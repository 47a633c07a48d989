"""The KV half of the gateway: the reference engine, driven by the requests the gateway serves.

A request's KV life on the reference side::

    tokens of each message -> chained block hashes (full blocks) -> register every message
    boundary as a prefix -> engine.begin(prompt + reply full blocks, tail as extra blocks)
      refused / deferred: nothing else happens, the outcome goes back as an HTTP error
      served: submit the request's claims (``@prompt`` / ``@sequence`` resolved now), hold the
      blocks for the modelled service time (prefill of the computed tokens + decode of the reply,
      slept outside the lock, so concurrent requests overlap), then finish and step the engine.

A lowering onto a real runtime (vLLM) is the other KV side: same ``KVSide`` methods, with
tokens and blocks taken from the runtime.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from agentclaims.contract import (
    ArbiterAction,
    CacheIdentity,
    ClaimEvent,
    ClaimSpec,
    LoweringClass,
    ProtectionMode,
)
from agentclaims.engine import (
    ActiveOutcome,
    BlockHash,
    ClaimDecision,
    ClaimView,
    EvictionPolicy,
    KVEngine,
    hash_token_blocks,
    prefix_id_of,
)
from agentclaims.errors import UnknownClaim, UsageError
from agentclaims.gateway.tokenizer import Tokenizer, WordTokenizer, tokenizer_named

__all__ = [
    "PROMPT_OBJECT",
    "SEQUENCE_OBJECT",
    "ActiveRequest",
    "KVSide",
    "ReferenceKV",
    "ServeResult",
    "ServiceTimes",
]

PROMPT_OBJECT = "@prompt"
"""A claim's ``object_id`` meaning: this request's prompt prefix (resolved after hashing)."""
SEQUENCE_OBJECT = "@sequence"
"""A claim's ``object_id`` meaning: this request's prompt + reply full blocks."""

Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class ActiveRequest:
    """One completion request as the KV side sees it (already tokenized)."""

    request_id: str
    segments: tuple[tuple[int, ...], ...]
    """Prompt token ids, one segment per message (one segment for a plain completion)."""
    reply_tokens: tuple[int, ...]
    claims: tuple[Mapping[str, Any], ...] = ()
    """Claim dicts (``ClaimSpec.to_dict`` form) to submit once the request is served."""
    owner_scope: str | None = None
    """Fills a claim's missing ``owner_scope``."""
    admit: bool = True
    cache_salt: str | None = None
    chat: bool = True
    """Chat requests report a prefix id per message boundary."""

    @property
    def prompt_tokens(self) -> int:
        return sum(len(s) for s in self.segments)


@dataclass(frozen=True, slots=True)
class ServeResult:
    """What the KV side did with a request."""

    outcome: ActiveOutcome
    prefix_ids: dict[str, Any]
    decisions: tuple[ClaimDecision, ...] = ()
    events_seq: int = 0
    cached_tokens: int = 0
    """Prompt tokens served from the device prefix cache (hit blocks x block size)."""


class KVSide(Protocol):
    """What the gateway app needs from its KV half."""

    name: str
    tokenizer: Tokenizer
    block_size: int

    async def serve(self, request: ActiveRequest) -> ServeResult: ...

    async def submit_claim(
        self, spec: ClaimSpec, block_hashes: Sequence[int] | None
    ) -> ClaimDecision: ...

    async def get_claim(self, claim_id: str, owner_scope: str) -> ClaimView: ...

    async def renew_claim(
        self, claim_id: str, owner_scope: str, *, duration_steps: int | None, ttl_s: float | None
    ) -> ClaimView: ...

    async def release_claim(self, claim_id: str, owner_scope: str) -> ClaimView: ...

    async def events(self, since: int, limit: int) -> tuple[list[ClaimEvent], int]:
        """Events with ``seq > since`` (at most ``limit``) and the last sequence number."""
        ...

    async def residency(self, prefix_ids: Sequence[str]) -> dict[str, int]: ...

    def descriptor(self) -> dict[str, Any]: ...

    def metrics(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class ServiceTimes:
    """Modelled time a request holds its blocks: per computed prompt token and per reply token."""

    prefill_s_per_token: float = 20e-6
    decode_s_per_token: float = 0.5e-3

    def __post_init__(self) -> None:
        for name in ("prefill_s_per_token", "decode_s_per_token"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise UsageError(name, f"must be a non-negative number, got {value!r}")


@dataclass(slots=True)
class _Counters:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    refused: int = 0
    deferred: int = 0
    hold_s: float = 0.0
    by_action: dict[str, int] = field(default_factory=dict)


class ReferenceKV:
    """The KV side on the reference ``KVEngine``. All engine access goes through one lock."""

    name = "reference_engine"

    def __init__(
        self,
        engine: KVEngine,
        *,
        tokenizer: Tokenizer | None = None,
        service: ServiceTimes | None = None,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if tokenizer is None:
            tokenizer = tokenizer_named(engine.cache_identity.tokenizer_id)
        if tokenizer.tokenizer_id != engine.cache_identity.tokenizer_id:
            raise UsageError(
                "tokenizer",
                f"{tokenizer.tokenizer_id!r} differs from the engine's cache identity "
                f"({engine.cache_identity.tokenizer_id!r})",
            )
        self.engine = engine
        self.tokenizer = tokenizer
        self.block_size = engine.block_size
        self.service = service or ServiceTimes()
        self._sleep = sleep
        self._lock = asyncio.Lock()
        self._ends_ns: dict[str, int] = {}
        self.counters = _Counters()

    @classmethod
    def create(
        cls,
        num_blocks: int,
        block_size: int = 16,
        *,
        eviction_policy: EvictionPolicy | None = None,
        host_blocks: int = 0,
        owner_cap_blocks: int | None = None,
        protected_cap_blocks: int | None = None,
        clock: Callable[[], int] | None = None,
        service: ServiceTimes | None = None,
        sleep: Sleep = asyncio.sleep,
        model_id: str = "scripted",
    ) -> ReferenceKV:
        """A fresh engine with the word tokenizer in its cache identity."""
        tokenizer = WordTokenizer()
        identity = CacheIdentity(
            cache_key_domain="agentclaims-gateway",
            model_id=model_id,
            tokenizer_id=tokenizer.tokenizer_id,
            salt_namespace="default",
            block_size=block_size,
        )
        extra: dict[str, Any] = {} if clock is None else {"clock": clock}
        engine = KVEngine(
            num_blocks,
            block_size,
            eviction_policy=eviction_policy,
            host_blocks=host_blocks,
            owner_cap_blocks=owner_cap_blocks,
            protected_cap_blocks=protected_cap_blocks,
            cache_identity=identity,
            **extra,
        )
        return cls(engine, tokenizer=tokenizer, service=service, sleep=sleep)

    # ------------------------------------------------------------------ requests
    async def serve(self, request: ActiveRequest) -> ServeResult:
        engine, bs = self.engine, self.block_size
        prompt = [t for seg in request.segments for t in seg]
        sequence = prompt + list(request.reply_tokens)
        hashes = hash_token_blocks(sequence, bs, cache_salt=request.cache_salt)
        prompt_blocks = len(prompt) // bs
        tail = 1 if len(sequence) % bs else 0
        async with self._lock:
            specs = self._resolve_claims(request, hashes, prompt_blocks)
            prefix_ids = self._register(request, hashes, prompt_blocks)
            outcome = engine.begin(
                request.request_id,
                hashes,
                prompt_blocks=prompt_blocks,
                extra_blocks=tail,
                admit=request.admit,
            )
            self._count(request, outcome)
            if not outcome.served:
                if outcome.retry_after_s is None and outcome.action is ArbiterAction.DEFER_ACTIVE:
                    outcome = replace(outcome, retry_after_s=self._drain_estimate_s())
                return ServeResult(outcome, prefix_ids, events_seq=engine.last_seq)
            decisions = tuple(engine.submit_claim(spec, blocks) for spec, blocks in specs)
            reused = (outcome.hit_blocks + outcome.restored_blocks) * bs
            hold = (
                max(0, len(prompt) - reused) * self.service.prefill_s_per_token
                + len(request.reply_tokens) * self.service.decode_s_per_token
            )
            self.counters.hold_s += hold
            self._ends_ns[request.request_id] = engine.clock() + int(hold * 1e9)
        try:
            await self._sleep(hold)
        finally:
            async with self._lock:
                self._ends_ns.pop(request.request_id, None)
                engine.finish(request.request_id)
                engine.step()
                seq = engine.last_seq
        return ServeResult(
            outcome, prefix_ids, decisions, events_seq=seq, cached_tokens=outcome.hit_blocks * bs
        )

    def _register(
        self, request: ActiveRequest, hashes: list[BlockHash], prompt_blocks: int
    ) -> dict[str, Any]:
        engine, bs = self.engine, self.block_size

        def register(n_blocks: int) -> str | None:
            return engine.register_prefix(hashes[:n_blocks]) if n_blocks else None

        boundaries: list[str | None] = []
        end = 0
        if request.chat:
            for seg in request.segments:
                end += len(seg)
                boundaries.append(register(end // bs))
        return {
            "prompt": register(prompt_blocks),
            "sequence": register(len(hashes)),
            "messages": boundaries,
        }

    def _resolve_claims(
        self, request: ActiveRequest, hashes: list[BlockHash], prompt_blocks: int
    ) -> list[tuple[ClaimSpec, tuple[BlockHash, ...]]]:
        """Parse and check every claim before anything changes (fail closed)."""
        specials = {PROMPT_OBJECT: hashes[:prompt_blocks], SEQUENCE_OBJECT: hashes}
        out: list[tuple[ClaimSpec, tuple[BlockHash, ...]]] = []
        seen: set[str] = set()
        for i, raw in enumerate(request.claims):
            where = f"agentclaims.claims[{i}]"
            if not isinstance(raw, Mapping):
                raise UsageError(where, f"expected a claim object, got {raw!r}")
            data = dict(raw)
            data.setdefault("cache_identity", self.engine.cache_identity.to_dict())
            if request.owner_scope is not None:
                data.setdefault("owner_scope", request.owner_scope)
            oid = data.get("object_id")
            blocks: Sequence[BlockHash] | None
            if oid in specials:
                blocks = specials[oid]
                if not blocks:
                    raise UsageError(f"{where}.object_id", f"{oid} has no full block to claim")
                data["object_id"] = prefix_id_of(blocks)
                data.setdefault("footprint_blocks", len(blocks))
            else:
                blocks = self.engine.prefix_blocks(oid) if isinstance(oid, str) else None
            try:
                spec = ClaimSpec.from_dict(data)
            except UsageError as exc:
                raise UsageError(f"{where}.{exc.field}", exc.message) from None
            if blocks is None:
                raise UsageError(f"{where}.object_id", f"unknown prefix {oid!r}")
            if len(blocks) != spec.footprint_blocks:
                raise UsageError(
                    f"{where}.footprint_blocks",
                    f"is {spec.footprint_blocks} but the prefix has {len(blocks)} blocks",
                )
            if spec.claim_id in seen or self._claim_exists(spec.claim_id, spec.owner_scope):
                raise UsageError(f"{where}.claim_id", f"claim {spec.claim_id!r} already exists")
            seen.add(spec.claim_id)
            out.append((spec, tuple(blocks)))
        return out

    def _claim_exists(self, claim_id: str, owner_scope: str) -> bool:
        try:
            self.engine.get_claim(claim_id, owner_scope)
        except UnknownClaim:
            return False
        except Exception:  # another owner's claim: the id is taken all the same
            return True
        return True

    def _count(self, request: ActiveRequest, outcome: ActiveOutcome) -> None:
        c = self.counters
        c.requests += 1
        c.by_action[outcome.action.value] = c.by_action.get(outcome.action.value, 0) + 1
        if outcome.served:
            c.prompt_tokens += request.prompt_tokens
            c.cached_tokens += outcome.hit_blocks * self.block_size
            c.completion_tokens += len(request.reply_tokens)
        elif outcome.action is ArbiterAction.DEFER_ACTIVE:
            c.deferred += 1
        else:
            c.refused += 1

    def _drain_estimate_s(self) -> float | None:
        """Seconds until the first active request ends (its modelled service time)."""
        if not self._ends_ns:
            return None
        return max(0.0, (min(self._ends_ns.values()) - self.engine.clock()) / 1e9)

    # ------------------------------------------------------------------ claims API
    async def submit_claim(
        self, spec: ClaimSpec, block_hashes: Sequence[int] | None
    ) -> ClaimDecision:
        hashes = None if block_hashes is None else [BlockHash(h) for h in block_hashes]
        async with self._lock:
            return self.engine.submit_claim(spec, hashes)

    async def get_claim(self, claim_id: str, owner_scope: str) -> ClaimView:
        async with self._lock:
            return self.engine.get_claim(claim_id, owner_scope)

    async def renew_claim(
        self, claim_id: str, owner_scope: str, *, duration_steps: int | None, ttl_s: float | None
    ) -> ClaimView:
        async with self._lock:
            return self.engine.renew_claim(
                claim_id, owner_scope, duration_steps=duration_steps, ttl_s=ttl_s
            )

    async def release_claim(self, claim_id: str, owner_scope: str) -> ClaimView:
        async with self._lock:
            return self.engine.release_claim(claim_id, owner_scope)

    async def events(self, since: int, limit: int) -> tuple[list[ClaimEvent], int]:
        async with self._lock:
            return self.engine.events_since(since)[:limit], self.engine.last_seq

    async def residency(self, prefix_ids: Sequence[str]) -> dict[str, int]:
        async with self._lock:
            out = {}
            for pid in prefix_ids:
                blocks = self.engine.prefix_blocks(pid)
                out[pid] = 0 if blocks is None else self.engine.resident_run(blocks)
            return out

    # ------------------------------------------------------------------ introspection
    def descriptor(self) -> dict[str, Any]:
        engine = self.engine
        return {
            "kv_side": self.name,
            "cache_identity": engine.cache_identity.to_dict(),
            "block_size": engine.block_size,
            "num_blocks": engine.num_blocks,
            "host_blocks": engine.host_capacity,
            "owner_cap_blocks": engine.owner_cap_blocks,
            "eviction_policy": engine.policy_name,
            "special_object_ids": [PROMPT_OBJECT, SEQUENCE_OBJECT],
            "evidence": "the reference engine is the contract's executable model; the "
            "conformance suite (L1-L7, C1) runs against it",
            "modes": {
                mode.value: {
                    "lowering_class": LoweringClass.NATIVE_CONFORMANCE.value,
                    "evidence_class": "reference_engine",
                }
                for mode in ProtectionMode
            },
        }

    def metrics(self) -> dict[str, Any]:
        engine, c = self.engine, self.counters
        return {
            "engine": engine.stats.to_dict(),
            "pool": {
                "usable_blocks": engine.num_blocks,
                "free_blocks": engine.free_blocks,
                "active_blocks": engine.active_blocks,
                "resident_blocks": engine.resident_blocks,
                "protected_resident_blocks": engine.protected_resident_blocks,
                "host_resident_blocks": engine.host_resident_blocks,
                "active_requests": len(engine.active_requests()),
            },
            "requests": {
                "total": c.requests,
                "refused": c.refused,
                "deferred": c.deferred,
                "prompt_tokens": c.prompt_tokens,
                "cached_tokens": c.cached_tokens,
                "completion_tokens": c.completion_tokens,
                "modelled_hold_s": round(c.hold_s, 6),
                "by_action": dict(sorted(c.by_action.items())),
            },
            "events_seq": engine.last_seq,
        }
