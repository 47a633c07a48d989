"""``ReferenceKV``: the reference engine speaking the claims protocol.

It is the KV side the gateway serves by default, the target ``agentclaims conformance
--backend embedded`` drives, and the contract's executable model. A request's KV life::

    tokens of each message -> chained block hashes (full blocks) -> register every message
    boundary as a prefix -> engine.begin(prompt + reply full blocks, tail as extra blocks)
      refused / deferred: nothing else happens, the outcome goes back to the caller
      served: submit the request's claims (``@prompt`` / ``@sequence`` resolved now), hold the
      blocks for the modelled service time (prefill of the computed tokens + decode of the reply,
      slept outside the lock, so concurrent requests overlap), then finish and step the engine.

It speaks every part of the protocol: the claims API, ``ActiveServing`` and
``InstanceControl``. All engine access goes through one asyncio lock.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agentclaims.contract import (
    ArbiterAction,
    BlockHash,
    CacheIdentity,
    ClaimId,
    ClaimSpec,
    OwnerScope,
    PrefixId,
)
from agentclaims.engine.blocks import hash_token_blocks
from agentclaims.engine.claims import ClaimGate
from agentclaims.engine.engine import KVEngine
from agentclaims.engine.eviction import EvictionPolicy
from agentclaims.engine.tokenizer import WordTokenizer, tokenizer_named
from agentclaims.errors import ContractViolation, UsageError
from agentclaims.kernel import Resolved, resolve_request_claims
from agentclaims.protocol import (
    CLAIMS_RIDE_ON_REQUESTS,
    PROMPT_OBJECT,
    RANKS_BY_HINTS,
    RENEW_AS_IS,
    SEQUENCE_OBJECT,
    ActiveOutcome,
    ActiveRequest,
    ClaimDecision,
    ClaimView,
    EventPage,
    Renewal,
    ServeResult,
    Tokenizer,
)

CHURN_WINDOW_S = 30.0
"""The window an answer's eviction rate is measured over (as vLLM's connector does)."""
MIN_EVICTED = 32
"""Evictions in the window below which the share computed again is not said (too few)."""

__all__ = ["ReferenceKV", "ServiceTimes"]

Sleep = Callable[[float], Awaitable[None]]
EngineFactory = Callable[[int, int], KVEngine]
"""``(usable_blocks, first_seq) -> KVEngine``: how a fresh instance is made."""


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
    """The claims protocol over one reference ``KVEngine`` (replaced by ``fresh_instance``)."""

    name = "reference_engine"

    def __init__(
        self,
        engine: KVEngine,
        *,
        tokenizer: Tokenizer | None = None,
        service: ServiceTimes | None = None,
        sleep: Sleep = asyncio.sleep,
        factory: EngineFactory | None = None,
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
        self._factory = factory or _same_as(engine)
        self._lock = asyncio.Lock()
        self._evictions: deque[tuple[float, int, int]] = deque()
        """(engine seconds, blocks evicted so far) samples over the last ``CHURN_WINDOW_S``."""
        self._ends_ns: dict[str, int] = {}
        self.counters = _Counters()

    @classmethod
    def create(
        cls,
        num_blocks: int,
        block_size: int = 16,
        *,
        eviction_policy: EvictionPolicy | Callable[[], EvictionPolicy] | None = None,
        host_blocks: int = 0,
        owner_cap_blocks: int | None = None,
        protected_cap_blocks: int | None = None,
        clock: Callable[[], int] | None = None,
        service: ServiceTimes | None = None,
        sleep: Sleep = asyncio.sleep,
        model_id: str = "scripted",
        run_id: str | None = None,
    ) -> ReferenceKV:
        """A fresh engine with the word tokenizer in its cache identity. ``eviction_policy``
        may be a factory, so every fresh instance gets a policy of its own."""
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise UsageError("block_size", f"must be an integer >= 1, got {block_size!r}")
        tokenizer = WordTokenizer()
        identity = CacheIdentity(
            cache_key_domain="agentclaims-gateway",
            model_id=model_id,
            tokenizer_id=tokenizer.tokenizer_id,
            salt_namespace="default",
            block_size=block_size,
        )
        extra: dict[str, Any] = {} if clock is None else {"clock": clock}
        instances = iter(range(1, 1 << 62))

        def factory(usable_blocks: int, first_seq: int) -> KVEngine:
            policy = eviction_policy() if callable(eviction_policy) else eviction_policy
            n = next(instances)
            return KVEngine(
                usable_blocks,
                block_size,
                eviction_policy=policy,
                host_blocks=host_blocks,
                owner_cap_blocks=owner_cap_blocks,
                protected_cap_blocks=None
                if protected_cap_blocks is None
                else min(protected_cap_blocks, usable_blocks),
                cache_identity=identity,
                run_id=None if run_id is None else (run_id if n == 1 else f"{run_id}-{n}"),
                first_seq=first_seq,
                **extra,
            )

        return cls(
            factory(num_blocks, 0),
            tokenizer=tokenizer,
            service=service,
            sleep=sleep,
            factory=factory,
        )

    @property
    def claim_gate(self) -> ClaimGate | None:
        """The engine's claim gate (kept across fresh instances): the gateway's tenant limits."""
        return self.engine.claim_gate

    @claim_gate.setter
    def claim_gate(self, gate: ClaimGate | None) -> None:
        self.engine.claim_gate = gate

    # ------------------------------------------------------------------ requests
    async def serve(self, request: ActiveRequest) -> ServeResult:
        prompt = [t for seg in request.segments for t in seg]
        async with self._lock:
            engine, bs = self.engine, self.block_size  # this request's instance, to the end
            if request.block_hashes is not None:  # a request named by its blocks (no tokens)
                hashes = list(request.block_hashes)
                prompt_blocks, tail = len(hashes), 0
            else:
                sequence = prompt + list(request.reply_tokens)
                hashes = hash_token_blocks(sequence, bs, cache_salt=request.cache_salt)
                prompt_blocks, tail = len(prompt) // bs, 1 if len(sequence) % bs else 0
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
                return ServeResult(
                    outcome,
                    prefix_ids,
                    events_seq=engine.last_seq,
                    block_hashes=tuple(hashes),
                    pool=self._churn(),
                )
            decisions = tuple(
                engine.submit_claim(r.spec, r.blocks, refusal=r.refusal) for r in specs
            )
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
                pool = self._churn()
        return ServeResult(
            outcome,
            prefix_ids,
            decisions,
            events_seq=seq,
            cached_tokens=outcome.hit_blocks * bs,
            block_hashes=tuple(hashes),
            pool=pool,
        )

    def _churn(self) -> dict[str, Any]:
        """The pool's pressure as an answer says it (the same figures vLLM's connector gives
        from its KV events): usable and free blocks, cached blocks evicted per second over
        the last ``CHURN_WINDOW_S`` (or the time measured, ``window_s``, when shorter), and how
        long a block freed now survives them (the blocks it could take, unheld and not in
        use, over that rate; ``None`` while nothing is evicted), and of the blocks evicted in
        the window the share computed again (``evicted_reused_p``: regretted evictions;
        ``None`` under ``MIN_EVICTED``)."""
        engine = self.engine
        now, evicted = engine.clock() / 1e9, engine.stats.evicted_blocks
        again = engine.stats.recomputed_blocks
        samples = self._evictions
        if samples and evicted < samples[-1][1]:
            samples.clear()  # a fresh instance counts from 0
        samples.append((now, evicted, again))
        while len(samples) > 2 and samples[1][0] <= now - CHURN_WINDOW_S:
            samples.popleft()
        since, before, again_before = samples[0]
        span = min(CHURN_WINDOW_S, now - since)
        rate = (evicted - before) / (now - since) if now > since else 0.0
        gone = evicted - before
        room = engine.num_blocks - engine.active_blocks - engine.protected_resident_blocks
        return {
            "usable_blocks": engine.num_blocks,
            "free_blocks": engine.free_blocks,
            "evicted_blocks": evicted,
            "evicted_per_s": round(rate, 3),
            "survival_s": round(max(0, room) / rate, 3) if rate > 0 else None,
            "reused_blocks": again,
            # of the blocks evicted in the window, the share computed again (regretted)
            "evicted_reused_p": (
                round(min(1.0, (again - again_before) / gone), 3) if gone >= MIN_EVICTED else None
            ),
            "window_s": round(span, 3),
        }

    def _register(
        self, request: ActiveRequest, hashes: list[BlockHash], prompt_blocks: int
    ) -> dict[str, Any]:
        engine, bs = self.engine, self.block_size

        def register(n_blocks: int) -> str | None:
            return engine.register_prefix(hashes[:n_blocks]) if n_blocks else None

        boundaries: list[str | None] = []
        end = 0
        if request.chat and request.block_hashes is None:
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
    ) -> list[Resolved]:
        """Parse and check every claim before anything changes (fail closed)."""
        engine = self.engine
        return resolve_request_claims(
            request.claims,
            identity=engine.cache_identity,
            owner_scope=request.owner_scope,
            prompt=hashes[:prompt_blocks],
            sequence=hashes,
            known=engine.prefix_blocks,
            exists=self._claim_exists,
        )

    def _claim_exists(self, claim_id: str) -> bool:
        return self.engine.has_claim(claim_id)

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
        self, spec: ClaimSpec, block_hashes: Sequence[BlockHash] | None = None
    ) -> ClaimDecision:
        hashes = None if block_hashes is None else [BlockHash(h) for h in block_hashes]
        async with self._lock:
            return self.engine.submit_claim(spec, hashes)

    async def get_claim(self, claim_id: ClaimId, owner_scope: OwnerScope) -> ClaimView:
        async with self._lock:
            return self.engine.get_claim(claim_id, owner_scope)

    async def renew_claim(
        self, claim_id: ClaimId, owner_scope: OwnerScope, renewal: Renewal = RENEW_AS_IS
    ) -> ClaimView:
        async with self._lock:
            return self.engine.renew_claim(
                claim_id,
                owner_scope,
                duration_steps=renewal.duration_steps,
                ttl_s=renewal.ttl_s,
                reuse_hint=renewal.reuse_hint,
            )

    async def release_claim(
        self, claim_id: ClaimId, owner_scope: OwnerScope, *, done: bool = False
    ) -> ClaimView:
        async with self._lock:
            return self.engine.release_claim(claim_id, owner_scope, done=done)

    async def events(
        self, since: int = 0, *, id_prefix: str | None = None, limit: int | None = None
    ) -> EventPage:
        async with self._lock:
            return self.engine.events_page(since, limit=limit, id_prefix=id_prefix)

    async def residency(self, prefix_ids: Sequence[PrefixId]) -> dict[PrefixId, int]:
        async with self._lock:
            out = {}
            for pid in prefix_ids:
                blocks = self.engine.prefix_blocks(pid)
                out[pid] = 0 if blocks is None else self.engine.resident_run(blocks)
            return out

    async def descriptor(self) -> dict[str, Any]:
        """The engine's facts. The lowering class per mode is not stated here: it comes from
        conformance evidence, which the gateway attaches."""
        engine = self.engine
        return {
            "kv_side": self.name,
            "cache_identity": engine.cache_identity.to_dict(),
            "block_size": engine.block_size,
            "num_blocks": engine.num_blocks,
            "host_blocks": engine.host_capacity,
            "owner_cap_blocks": engine.owner_cap_blocks,
            "eviction_policy": engine.policy_name,
            RANKS_BY_HINTS: engine.ranks_by_hints,
            "special_object_ids": [PROMPT_OBJECT, SEQUENCE_OBJECT],
            # a claim on the call's ``@sequence`` and the releases that wait for a call go
            # with the call: holding a prefix costs no request of its own
            CLAIMS_RIDE_ON_REQUESTS: True,
        }

    # ------------------------------------------------------------------ ActiveServing
    async def block_residency(self, block_hashes: Sequence[BlockHash]) -> list[bool]:
        async with self._lock:
            return [self.engine.is_cached(h) for h in block_hashes]

    # ------------------------------------------------------------------ InstanceControl
    async def fresh_instance(self, usable_blocks: int, owner_scope: OwnerScope) -> CacheIdentity:
        """A new, empty engine of ``usable_blocks`` in place of this one; its events continue
        the sequence. Refused while another owner holds a live claim (their claims would
        vanish) or a request is active."""
        if (
            isinstance(usable_blocks, bool)
            or not isinstance(usable_blocks, int)
            or usable_blocks < 1
        ):
            raise UsageError("usable_blocks", f"must be a positive integer, got {usable_blocks!r}")
        async with self._lock:
            others = sorted(self.engine.live_owners() - {owner_scope})
            active = len(self.engine.active_requests())
            if others or active:
                raise ContractViolation(
                    f"a fresh instance would drop live work: claims of {others}, "
                    f"{active} active requests"
                )
            gate = self.engine.claim_gate
            self.engine = self._factory(usable_blocks, self.engine.last_seq)
            self.engine.claim_gate = gate
            self.block_size = self.engine.block_size
            return self.engine.cache_identity

    async def step(self, n: int = 1) -> None:
        async with self._lock:
            self.engine.step(n)

    # ------------------------------------------------------------------ introspection
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
            "claims": engine.claim_counts(),
            "events_seq": engine.last_seq,
        }


def _same_as(engine: KVEngine) -> EngineFactory:
    """A factory of engines configured like ``engine`` (its policy's class, fresh)."""

    def factory(usable_blocks: int, first_seq: int) -> KVEngine:
        return KVEngine(
            usable_blocks,
            engine.block_size,
            eviction_policy=type(engine.policy)(),
            host_blocks=engine.host_capacity,
            owner_cap_blocks=engine.owner_cap_blocks,
            cache_identity=engine.cache_identity,
            clock=engine.clock,
            first_seq=first_seq,
        )

    return factory
