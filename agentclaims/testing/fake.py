"""``FakeKV`` and ``FakeBackend``: a scriptable, in-memory KV side behind the real gateway.

``FakeKV`` speaks the claims protocol and ``ActiveServing`` without a block pool: every block it
has served stays cached until the test calls ``evict``, every claim is accepted (and
materialized when its prefix is resident) unless the test said otherwise, and nothing happens
by itself: no eviction, no TTL or step runs out. The test tells it what to do::

    kv.refuse_claims(mode="hard_protected", reason="no_room")   claims refused, with an event
    kv.refuse_requests(n=1, blocking=("c1",))                   the next request refused (409)
    kv.defer_requests(n=2, retry_after_s=0.5)                   the next two deferred (503)
    kv.demote(cid) / kv.expire(cid) / kv.harm(cid, cause=...)   a claim ends, with its event
    kv.evict(prefix_id)                                         blocks gone (claims harmed)

and it records every protocol call (``calls``: what the code under test asked for). Events are
a real ordered stream: ``seq`` from 1 without gaps, ``event_sequence`` per claim, lifecycle
transitions checked by ``agentclaims.contract.check_transition``.

``FakeBackend`` is an ``EmbeddedBackend`` in front of a ``FakeKV`` (``.kv``): LLM calls go
through the gateway app, so the OpenAI client, LangChain and ``ClaimedSession`` work unchanged.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from agentclaims.backends.embedded import EmbeddedBackend
from agentclaims.contract import (
    ArbiterAction,
    BlockHash,
    CacheIdentity,
    ClaimEvent,
    ClaimId,
    ClaimSpec,
    ClaimState,
    Decision,
    EventName,
    Feasibility,
    OwnerScope,
    PrefixId,
    ProtectionMode,
    owned_claim,
    parse_mode,
)
from agentclaims.engine import WordTokenizer, hash_token_blocks
from agentclaims.errors import UnknownClaim, UsageError
from agentclaims.gateway import Script
from agentclaims.kernel import (
    EVENTS_KEPT,
    EventLog,
    Resolved,
    accepted,
    claim_blocks,
    harm,
    identity_problem,
    refuse,
    resolve_request_claims,
    submitted,
)
from agentclaims.lowering import LoweringSource
from agentclaims.protocol import (
    PROMPT_OBJECT,
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
from agentclaims.testing.fake_parts import (
    Call,
    FakeCache,
    FakeClaim,
    fake_descriptor,
    positive_count,
    scripted_outcome,
)

__all__ = ["Call", "FakeBackend", "FakeKV", "fake_descriptor"]

_REFUSAL_FIELDS = (
    "action",
    "feasibility",
    "blocking_claim_ids",
    "shortfall_blocks",
    "retry_after_s",
)
"""What a refusal or deferral event says of its outcome (as the reference engine's do)."""


class FakeKV:
    """A KV side that does what the test says. ``clock() -> ns`` stamps the events.
    ``lowering`` is the lowering descriptor the gateway serves for it (``fake_descriptor()``
    unless given: give another to stand in for a runtime that honours less)."""

    name = "fake"

    def __init__(
        self,
        num_blocks: int = 64,
        block_size: int = 16,
        *,
        tokenizer: Tokenizer | None = None,
        model_id: str = "scripted",
        run_id: str = "fake",
        clock: Callable[[], int] = time.time_ns,
        lowering: LoweringSource | None = None,
    ) -> None:
        self.num_blocks = positive_count("num_blocks", num_blocks)
        self.lowering: LoweringSource = fake_descriptor() if lowering is None else lowering
        self.block_size = positive_count("block_size", block_size)
        self.tokenizer: Tokenizer = tokenizer or WordTokenizer()
        self.cache_identity = CacheIdentity(
            cache_key_domain="agentclaims-fake",
            model_id=model_id,
            tokenizer_id=self.tokenizer.tokenizer_id,
            salt_namespace="default",
            block_size=block_size,
        )
        self.run_id = run_id
        self.calls: list[Call] = []
        """Every protocol call, in order (the test's own instructions are not calls)."""
        self.clock = clock
        self._events = EventLog(self, EVENTS_KEPT)
        self._claims: dict[str, FakeClaim] = {}
        self._cache = FakeCache(self.block_size)
        self._outcomes: deque[ActiveOutcome] = deque()
        self._refusals: dict[ProtectionMode | None, str] = {}

    # ------------------------------------------------------------------ what the test says
    def refuse_claims(
        self, mode: ProtectionMode | str | None = None, reason: str = "refused_by_test"
    ) -> None:
        """Refuse every claim from now on (or those of ``mode``), giving ``reason``."""
        if not isinstance(reason, str) or not reason:
            raise UsageError("reason", f"must be a non-empty string, got {reason!r}")
        self._refusals[None if mode is None else parse_mode(mode, "mode")] = reason

    def accept_claims(self) -> None:
        """Undo every ``refuse_claims``."""
        self._refusals.clear()

    def refuse_requests(
        self,
        n: int = 1,
        *,
        blocking: Sequence[str] = (),
        shortfall_blocks: int = 1,
        feasibility: Feasibility = Feasibility.INFEASIBLE_PRESERVE_RESIDENT_AND_ACTIVE,
        retry_after_s: float | None = None,
    ) -> None:
        """Refuse the next ``n`` active requests (``refuse_active``, or ``capacity_required``
        when ``feasibility`` is ``infeasible_exceeds_capacity``), naming ``blocking``."""
        infeasible = {
            Feasibility.INFEASIBLE_PRESERVE_RESIDENT_AND_ACTIVE: ArbiterAction.REFUSE_ACTIVE,
            Feasibility.INFEASIBLE_EXCEEDS_CAPACITY: ArbiterAction.CAPACITY_REQUIRED,
        }
        action = infeasible.get(feasibility)  # a StrEnum: its value finds it too
        if action is None:
            raise UsageError("feasibility", f"a refusal is infeasible, got {feasibility!r}")
        n = positive_count("n", n)
        outcome = scripted_outcome(action, feasibility, blocking, shortfall_blocks, retry_after_s)
        self._outcomes.extend(itertools.repeat(outcome, n))

    def defer_requests(
        self,
        n: int = 1,
        *,
        retry_after_s: float | None = 1.0,
        blocking: Sequence[str] = (),
        shortfall_blocks: int = 1,
    ) -> None:
        """Defer the next ``n`` active requests (``defer_active``): until ``blocking`` claims
        expire when any are named, else until active work drains."""
        feasibility = (
            Feasibility.FEASIBLE_AFTER_CLAIM_EXPIRY
            if blocking
            else Feasibility.FEASIBLE_AFTER_ACTIVE_DRAIN
        )
        n = positive_count("n", n)
        outcome = scripted_outcome(
            ArbiterAction.DEFER_ACTIVE, feasibility, blocking, shortfall_blocks, retry_after_s
        )
        self._outcomes.extend(itertools.repeat(outcome, n))

    def demote(self, claim_id: str, reason: str = "pressure") -> None:
        """Demote a live claim (``resident_claim_demoted``)."""
        self._transition(
            self._claim(claim_id),
            ClaimState.DEMOTED,
            EventName.RESIDENT_CLAIM_DEMOTED,
            reason=reason,
            action=ArbiterAction.RELAX_RESIDENT_CLAIM.value,
        )

    def expire(self, claim_id: str, reason: str = "ttl_ended") -> None:
        """End a live claim as expired (``resident_claim_expired``)."""
        self._transition(
            self._claim(claim_id),
            ClaimState.EXPIRED,
            EventName.RESIDENT_CLAIM_EXPIRED,
            reason=reason,
        )

    def harm(self, claim_id: str, cause: str = "evicted") -> None:
        """Harm a materialized claim: its predicate held, now it does not (true harm)."""
        harm(self._events, self._claim(claim_id), cause)

    def evict(self, prefix_id: str) -> None:
        """Drop a known prefix's blocks from the cache. A materialized claim (not
        ``best_effort``) whose predicate breaks is harmed, cause ``evicted``."""
        self._cache.evict(prefix_id)
        for claim in list(self._claims.values()):
            if (
                claim.state is ClaimState.MATERIALIZED
                and claim.spec.protection_mode is not ProtectionMode.BEST_EFFORT
                and not self._cache.holds(claim)
            ):
                self.harm(claim.spec.claim_id, cause="evicted")

    # ------------------------------------------------------------------ what the test reads
    def calls_of(self, operation: str) -> list[Call]:
        """The recorded calls of one operation (``serve``, ``submit_claim``, ...)."""
        return [c for c in self.calls if c.operation == operation]

    @property
    def event_stream(self) -> tuple[ClaimEvent, ...]:
        """Every event kept (the last ``EVENTS_KEPT``), in order."""
        return tuple(self._events.events_since(0))

    @property
    def last_seq(self) -> int:
        return self._events.seq

    @property
    def policy_name(self) -> str:  # what its events say of the policy (``EventSource``)
        return "fake"

    def views(self, owner_scope: str | None = None) -> list[ClaimView]:
        """Every claim (of ``owner_scope``), in submission order."""
        return [
            self._view(c)
            for c in self._claims.values()
            if owner_scope is None or c.spec.owner_scope == owner_scope
        ]

    # ------------------------------------------------------------------ ActiveServing
    async def serve(self, request: ActiveRequest) -> ServeResult:
        self._record(
            "serve",
            request_id=request.request_id,
            owner_scope=request.owner_scope,
            prompt_tokens=request.prompt_tokens,
            claims=request.claims,
        )
        if request.block_hashes is None:
            tokens = [t for seg in request.segments for t in seg]
            prompt_blocks = len(tokens) // self.block_size
            tokens += request.reply_tokens
            hashes = tuple(
                hash_token_blocks(tokens, self.block_size, cache_salt=request.cache_salt)
            )
        else:
            hashes = tuple(request.block_hashes)
            prompt_blocks = len(hashes)
        specs = self._request_claims(request, hashes[:prompt_blocks], hashes)
        prefix_ids = self._cache.name_prefixes(request, hashes, prompt_blocks)
        if self._outcomes:
            outcome = dataclasses.replace(self._outcomes.popleft(), request_id=request.request_id)
            self._events.emit(
                EventName.ACTIVE_REQUEST_DEFERRED
                if outcome.deferred
                else EventName.ACTIVE_REQUEST_REFUSED,
                request_id=request.request_id,
                needed_blocks=len(hashes),
                **{k: v for k, v in outcome.to_dict().items() if k in _REFUSAL_FIELDS},
            )
            return ServeResult(outcome, prefix_ids, events_seq=self.last_seq, block_hashes=hashes)
        hits = self._cache.leading(hashes[:prompt_blocks])
        if request.admit:
            self._arrive(hashes)
        decisions = tuple(self._decide(r.spec, r.blocks, r.refusal) for r in specs)
        self._events.emit(
            EventName.FUTURE_REUSE_ADMITTED if request.admit else EventName.FUTURE_REUSE_DENIED,
            request_id=request.request_id,
        )
        outcome = ActiveOutcome(
            request.request_id,
            ArbiterAction.SERVE_ACTIVE_PRESERVE_RESIDENT
            if request.admit
            else ArbiterAction.SERVE_ACTIVE_NO_ADMIT,
            Feasibility.FEASIBLE,
            hit_blocks=hits,
            computed_blocks=len(hashes) - hits,
        )
        return ServeResult(
            outcome,
            prefix_ids,
            decisions,
            events_seq=self.last_seq,
            cached_tokens=hits * self.block_size,
            block_hashes=hashes,
        )

    async def block_residency(self, block_hashes: Sequence[BlockHash]) -> list[bool]:
        self._record("block_residency", block_hashes=tuple(block_hashes))
        return [h in self._cache.blocks for h in block_hashes]

    # ------------------------------------------------------------------ claims API
    async def submit_claim(
        self, spec: ClaimSpec, block_hashes: Sequence[BlockHash] | None = None
    ) -> ClaimDecision:
        self._record(
            "submit_claim",
            claim_id=spec.claim_id,
            owner_scope=spec.owner_scope,
            object_id=spec.object_id,
            protection_mode=spec.protection_mode,
            footprint_blocks=spec.footprint_blocks,
            ttl_s=spec.ttl_s,
        )
        given = None if block_hashes is None else tuple(BlockHash(h) for h in block_hashes)
        return self._decide(spec, self._new_claim_blocks(spec, given))

    async def get_claim(self, claim_id: ClaimId, owner_scope: OwnerScope) -> ClaimView:
        self._record("get_claim", claim_id=claim_id, owner_scope=owner_scope)
        return self._view(self._owned(claim_id, owner_scope))

    async def renew_claim(
        self, claim_id: ClaimId, owner_scope: OwnerScope, renewal: Renewal = RENEW_AS_IS
    ) -> ClaimView:
        duration_steps, ttl_s = renewal.duration_steps, renewal.ttl_s
        self._record(
            "renew_claim",
            claim_id=claim_id,
            owner_scope=owner_scope,
            duration_steps=duration_steps,
            ttl_s=ttl_s,
        )
        claim = self._owned(claim_id, owner_scope)
        if duration_steps is None and ttl_s is None:
            duration_steps, ttl_s = claim.spec.duration_steps, claim.spec.ttl_s
        else:  # the spec's own checks name a bad value
            dataclasses.replace(claim.spec, duration_steps=duration_steps, ttl_s=ttl_s)
        claim.require_live()
        self._set_expiry(claim, duration_steps, ttl_s)
        return self._view(claim)

    async def release_claim(
        self, claim_id: ClaimId, owner_scope: OwnerScope, *, done: bool = False
    ) -> ClaimView:
        """End a live claim now, as the reference engine does: ``expired``, reason
        ``released``; releasing an ended claim changes nothing."""
        self._record("release_claim", claim_id=claim_id, owner_scope=owner_scope, done=done)
        claim = self._owned(claim_id, owner_scope)
        if claim.state.live:
            self._transition(
                claim, ClaimState.EXPIRED, EventName.RESIDENT_CLAIM_EXPIRED, reason="released"
            )
        return self._view(claim)

    async def events(
        self, since: int = 0, *, id_prefix: str | None = None, limit: int | None = None
    ) -> EventPage:
        self._record("events", since=since, id_prefix=id_prefix, limit=limit)
        return self._events.page(since, limit=limit, id_prefix=id_prefix)

    async def residency(self, prefix_ids: Sequence[PrefixId]) -> dict[PrefixId, int]:
        self._record("residency", prefix_ids=tuple(prefix_ids))
        return {p: self._cache.leading(self._cache.prefixes.get(p, ())) for p in prefix_ids}

    async def descriptor(self) -> dict[str, Any]:
        self._record("descriptor")
        return {
            "kv_side": self.name,
            "cache_identity": self.cache_identity.to_dict(),
            "block_size": self.block_size,
            "num_blocks": self.num_blocks,
            "eviction_policy": "none",
            "special_object_ids": [PROMPT_OBJECT, SEQUENCE_OBJECT],
        }

    # ------------------------------------------------------------------ internals
    def _record(self, operation: str, **args: Any) -> None:
        self.calls.append(Call(operation, args))

    def _request_claims(
        self,
        request: ActiveRequest,
        prompt: tuple[BlockHash, ...],
        sequence: tuple[BlockHash, ...],
    ) -> list[Resolved]:
        """The claims a request carries, every one checked before anything changes."""
        return resolve_request_claims(
            request.claims,
            identity=self.cache_identity,
            owner_scope=request.owner_scope,
            prompt=prompt,
            sequence=sequence,
            known=lambda pid: self._cache.prefixes.get(PrefixId(pid)),
            exists=self._claims.__contains__,
        )

    def _new_claim_blocks(
        self, spec: ClaimSpec, blocks: tuple[BlockHash, ...] | None
    ) -> tuple[BlockHash, ...]:
        """The blocks a claim made on its own covers (given, else its known prefix's)."""
        if spec.claim_id in self._claims:
            raise UsageError("claim_id", f"claim {spec.claim_id!r} already exists")
        if blocks is None:
            blocks = self._cache.prefixes.get(PrefixId(spec.object_id))
        return claim_blocks(spec, blocks)

    def _refusal(self, spec: ClaimSpec) -> str | None:
        """Why a claim is refused: the test said so, or the backend could not honour it."""
        reason = self._refusals.get(spec.protection_mode) or self._refusals.get(None)
        if reason is not None:
            return reason
        mismatch = identity_problem(spec.cache_identity, self.cache_identity)
        if mismatch is not None:
            return mismatch
        return "exceeds_capacity" if spec.footprint_blocks > self.num_blocks else None

    def _decide(
        self, spec: ClaimSpec, blocks: tuple[BlockHash, ...], refusal: str | None = None
    ) -> ClaimDecision:
        claim = self._claims[spec.claim_id] = FakeClaim(spec, blocks)
        submitted(self._events, claim)
        reason = refusal or self._refusal(spec)
        if reason is not None:
            return refuse(self._events, claim, reason)
        self._set_expiry(claim, spec.duration_steps, spec.ttl_s)
        claim.move(ClaimState.ACCEPTED)
        self._events.emit(
            EventName.RESIDENT_CLAIM_ACCEPTED,
            claim=claim,
            decision=Decision.ACCEPTED.value,
            protection_mode=spec.protection_mode.value,
            conditions={},
            present_blocks=self._cache.present(blocks),
        )
        self._materialize(claim)
        return accepted(claim)

    def _set_expiry(self, claim: FakeClaim, steps: int | None, ttl_s: float | None) -> None:
        """When the claim would end (shown in its view; the fake never ends it by itself)."""
        claim.expires_at_step = steps
        claim.expires_at_ns = None if ttl_s is None else self.clock() + int(ttl_s * 1e9)

    def _arrive(self, hashes: tuple[BlockHash, ...]) -> None:
        self._cache.blocks.update(hashes)
        for claim in list(self._claims.values()):
            self._materialize(claim)

    def _materialize(self, claim: FakeClaim) -> None:
        if claim.state is ClaimState.ACCEPTED and self._cache.holds(claim):
            self._transition(claim, ClaimState.MATERIALIZED, EventName.RESIDENT_CLAIM_MATERIALIZED)

    def _claim(self, claim_id: str) -> FakeClaim:
        claim = self._claims.get(claim_id)
        if claim is None:
            raise UnknownClaim(claim_id)
        return claim

    def _owned(self, claim_id: str, owner_scope: str) -> FakeClaim:
        return owned_claim(self._claims, claim_id, owner_scope)

    def _transition(
        self, claim: FakeClaim, target: ClaimState, name: EventName, **data: Any
    ) -> None:
        """Move ``claim`` to ``target`` (an illegal move raises before anything changes)."""
        claim.move(target)
        if target.terminal:
            claim.end_reason = data.get("reason")
        self._events.emit(name, claim=claim, state=target.value, **data)

    def _view(self, claim: FakeClaim) -> ClaimView:
        return claim.view(
            present_blocks=self._cache.present(claim.blocks),
            holds=self._cache.holds(claim),
            expires_at_step=claim.expires_at_step,
            expires_at_ns=claim.expires_at_ns,
        )


class FakeBackend(EmbeddedBackend):
    """The gateway app in front of a ``FakeKV`` (``.kv``; a new one of ``num_blocks`` blocks of
    ``block_size`` tokens unless given), reached in-process. ``script`` drives the
    ``ScriptedModel`` (e.g. ``lambda r: Reply.tool("search")`` for tool calls)."""

    kv: FakeKV

    def __init__(
        self,
        num_blocks: int = 64,
        block_size: int = 16,
        *,
        script: Script | None = None,
        name: str = "fake",
        kv: FakeKV | None = None,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        fake = FakeKV(num_blocks, block_size, clock=clock) if kv is None else kv
        super().__init__(fake.num_blocks, fake.block_size, script=script, name=name, kv=fake)
        self.kv = fake
