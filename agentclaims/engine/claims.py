"""``ClaimArbiter``: the claim half of the arbiter, the base ``KVEngine`` is built on.

It decides residency claims and keeps them through their lifecycle::

    submit_claim -> accepted | conditionally accepted (durations capped) | rejected
    accepted -> materialized (every block of the predicate's span present)
    live -> expired (duration/TTL ended, or released) | demoted (pressure) | harmed (a loss broke
            the predicate: true harm)

and answers the pool's hooks: an evicted claimed block, a demotable or offloadable tier that must
give, a hash that fell out of the host tier. Requests (``begin``/``finish``, serve, defer or
refuse) are ``KVEngine``'s, in ``engine.py``; the blocks and tiers are ``BlockPool``'s.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from agentclaims.contract import (
    ArbiterAction,
    CacheIdentity,
    ClaimSpec,
    ClaimState,
    Decision,
    EventName,
    ProtectionMode,
    owned_claim,
)
from agentclaims.contract.hints import ReuseHint, hint_owner
from agentclaims.contract.ids import BlockHash, prefix_id_of
from agentclaims.engine.eviction import RankingPolicy
from agentclaims.engine.pool import PROTECTED, TIER_OF_MODE, BlockPool
from agentclaims.engine.record import ClaimRecord
from agentclaims.engine.stats import EngineStats
from agentclaims.errors import UsageError
from agentclaims.kernel import (
    EventLog,
    accepted,
    claim_blocks,
    counts_by_mode_and_state,
    forget_ended,
    harm_fields,
    identity_problem,
    refuse,
    submitted,
)
from agentclaims.protocol.types import ClaimDecision, ClaimView

ClaimGate = Callable[[ClaimSpec], "str | None"]
"""A check before admission: ``None`` lets the claim through, a string refuses it with that
reason (``refuse_residency_claim``)."""

__all__ = ["ClaimArbiter"]

_ENDED = (ClaimState.REFUSED, ClaimState.EXPIRED, ClaimState.HARMED)
"""A claim in these states has ended (a demoted one has not: it may come back)."""


def _has_ended(claim: ClaimRecord) -> bool:
    return claim.state in _ENDED


def _unaccount(used: dict[str, int], owner: str, blocks: int) -> None:
    """``owner``'s claimed blocks less ``blocks``; an owner with none left is forgotten (every
    session is an owner: they would add up for ever)."""
    left = used[owner] - blocks
    if left:
        used[owner] = left
    else:
        del used[owner]


def _admission_problem(
    arbiter: ClaimArbiter, spec: ClaimSpec, hashes: tuple[BlockHash, ...]
) -> str | None:
    """Why ``arbiter`` refuses ``spec`` before anything changes (``None``: it may hold it):
    the tenant gate, the cache identity, the pool's size, the owner's cap, the cap on
    protected blocks."""
    if arbiter.claim_gate is not None:
        reason = arbiter.claim_gate(spec)
        if reason is not None:
            return reason
    mismatch = identity_problem(spec.cache_identity, arbiter.cache_identity)
    if mismatch is not None:
        return mismatch
    if spec.footprint_blocks > arbiter.num_blocks:
        return "exceeds_capacity"
    if (
        spec.protection_mode is not ProtectionMode.BEST_EFFORT
        and arbiter.owner_cap_blocks is not None
    ):
        used = arbiter._owner_blocks.get(spec.owner_scope, 0)
        if used + spec.footprint_blocks > arbiter.owner_cap_blocks:
            return "owner_cap_exceeded"
    if TIER_OF_MODE[spec.protection_mode] == PROTECTED:
        pool = arbiter._pool
        new = sum(1 for h in hashes if h not in pool.protect_ref)
        if len(pool.protect_ref) + new > arbiter.protected_cap_blocks:
            return "protected_capacity_exceeded"
    return None


class ClaimArbiter:
    """Claims: admission, deadlines, renew/release, demotion, offload, expiry and harm.

    ``KVEngine`` sets the configuration, the pool and the event log declared here; this class
    owns the claims themselves (``__init__``)."""

    # Set by KVEngine.__init__ before it calls ClaimArbiter.__init__.
    _ranking: RankingPolicy | None
    num_blocks: int
    host_capacity: int
    owner_cap_blocks: int | None
    max_duration_steps: int | None
    max_ttl_s: float | None
    protected_cap_blocks: int
    cache_identity: CacheIdentity
    clock: Callable[[], int]
    step_count: int
    stats: EngineStats
    _pool: BlockPool
    _events: EventLog
    max_claims: int  # claims kept for readers: past it the oldest ended go (forget_ended)
    claim_gate: ClaimGate | None = None
    """Asked first about every claim (the gateway's tenant quotas): a reason refuses it."""

    def __init__(self) -> None:
        self._claims: dict[str, ClaimRecord] = {}
        self._owner_blocks: dict[str, int] = {}
        self._deadline_steps: list[tuple[int, str]] = []
        self._deadline_ns: list[tuple[int, str]] = []
        self._prefixes: OrderedDict[str, tuple[BlockHash, ...]] = OrderedDict()

    # ------------------------------------------------------------------ prefixes
    def register_prefix(self, block_hashes: Sequence[BlockHash]) -> str:
        """Remember a prefix's blocks under its ``prefix_id`` so claims can name it."""
        pid = prefix_id_of(block_hashes)
        self._prefixes[pid] = tuple(block_hashes)
        self._prefixes.move_to_end(pid)
        if len(self._prefixes) > 100_000:
            self._prefixes.popitem(last=False)
        return pid

    def prefix_blocks(self, prefix_id: str) -> tuple[BlockHash, ...] | None:
        return self._prefixes.get(prefix_id)

    # ------------------------------------------------------------------ losses
    def _lost(self, h: BlockHash, request_id: str) -> None:
        """The pool evicted ``h`` (pool hook): account for every claim on it."""
        claims = self._pool.cover.get(h)
        if claims:
            self.stats.evicted_claimed_blocks += 1
            for claim in list(claims):  # harming a claim takes it off this very list
                self._lose(claim, h, request_id, cause="evicted")
        ended = self._pool.ended_cover.pop(h, None)
        if ended:
            for claim in ended:
                if claim.mark(h, False):
                    self.stats.blocks_lost_after_release += 1
                    self._events.emit(
                        EventName.RESIDENT_CLAIM_BLOCK_LOST_AFTER_RELEASE,
                        claim=claim,
                        request_id=request_id,
                        position=claim.pos_of[h],
                        blocks=1,
                        state=claim.state.value,
                    )

    def _lose(self, claim: ClaimRecord, h: BlockHash, request_id: str | None, cause: str) -> None:
        """A position of a live claim stopped surviving: harm if the predicate breaks."""
        before = claim.holds
        if not claim.mark(h, False):
            return
        self._events.emit(
            EventName.ALLOCATION_VICTIM_SELECTED,
            claim=claim,
            request_id=request_id,
            position=claim.pos_of[h],
            protection_mode=claim.mode.value,
        )
        if before and not claim.holds and claim.mode is not ProtectionMode.BEST_EFFORT:
            if claim.mode is ProtectionMode.HARD_PROTECTED:
                self.stats.true_harm_hard += 1
            self._harm(claim, request_id, cause, position=claim.pos_of[h])

    def _harm(self, claim: ClaimRecord, request_id: str | None, cause: str, **data: Any) -> None:
        """A loss broke a live claim's predicate: true harm; the claim ends harmed."""
        self.stats.true_harm += 1
        self._end(
            claim,
            ClaimState.HARMED,
            EventName.RESIDENT_CLAIM_HARMED,
            request_id=request_id,
            **harm_fields(cause),
            **data,
        )

    def _demote(self, h: BlockHash, request_id: str) -> None:
        """The pool needs the DEMOTABLE block ``h`` (pool hook): demote its demotable claims."""
        for claim in list(self._pool.cover[h]):
            if claim.mode is ProtectionMode.DEMOTABLE:
                self._end(
                    claim,
                    ClaimState.DEMOTED,
                    EventName.RESIDENT_CLAIM_DEMOTED,
                    request_id=request_id,
                    reason="pressure",
                    action=ArbiterAction.RELAX_RESIDENT_CLAIM.value,
                )

    def _offload(self, h: BlockHash, request_id: str) -> None:
        """The pool needs the OFFLOADABLE block ``h`` (pool hook): move each offloadable claim
        on it to the host tier."""
        for claim in [c for c in self._pool.cover[h] if c.mode is ProtectionMode.OFFLOADABLE]:
            moved = self._pool.offload(claim.hashes, request_id)
            self._events.emit(
                EventName.RESIDENT_CLAIM_OFFLOADED,
                claim=claim,
                request_id=request_id,
                action=ArbiterAction.OFFLOAD_RESIDENT.value,
                blocks=moved,
                host_capacity=self.host_capacity,
            )

    def _host_lost(self, h: BlockHash, request_id: str) -> None:
        """``h`` fell out of the host tier (pool hook): a claim that needed it is harmed."""
        for claim in list(self._pool.cover.get(h, ())):
            before = claim.holds
            if claim.mark(h, False) and before and not claim.holds:
                self._events.emit(
                    EventName.RESIDENT_CLAIM_RESTORATION_FAILED,
                    claim=claim,
                    request_id=request_id,
                    position=claim.pos_of[h],
                    cause="host_tier_full",
                )
                self._harm(claim, request_id, "restoration_failed")

    def _arrived(self, h: BlockHash) -> None:
        """A block hash became present: claims on it may now materialize."""
        for claim in self._pool.cover.get(h, ()):
            if claim.mark(h, True) and claim.holds and claim.state is ClaimState.ACCEPTED:
                self._transition(
                    claim, ClaimState.MATERIALIZED, EventName.RESIDENT_CLAIM_MATERIALIZED
                )
        ended = self._pool.ended_cover.get(h)
        if ended:
            for claim in ended:
                claim.mark(h, True)

    def _seconds_to_expiry(self, claims: Iterable[ClaimRecord]) -> float | None:
        now = self.clock()
        waits = [(c.deadline_ns - now) / 1e9 for c in claims if c.deadline_ns is not None]
        return max(0.0, min(waits)) if waits else None

    # ------------------------------------------------------------------ claims
    def submit_claim(
        self,
        spec: ClaimSpec,
        block_hashes: Sequence[BlockHash] | None = None,
        *,
        refusal: str | None = None,
    ) -> ClaimDecision:
        """Decide a residency claim. ``block_hashes`` are the claimed prefix's blocks; without
        them the engine resolves ``spec.object_id`` from the prefixes it has seen.
        ``refusal``: the claim is refused for that reason, as it stands (a request's claim on
        its own prefix when it has no full block), its submission and refusal recorded."""
        if not isinstance(spec, ClaimSpec):
            raise UsageError("spec", f"expected a ClaimSpec, got {type(spec).__name__}")
        if spec.claim_id in self._claims:
            raise UsageError("claim_id", f"claim {spec.claim_id!r} already exists")
        hashes: tuple[BlockHash, ...] = ()
        if refusal is None:
            hashes = claim_blocks(
                spec, self._prefixes.get(spec.object_id) if block_hashes is None else block_hashes
            )
            if len(set(hashes)) != len(hashes):
                raise UsageError("block_hashes", "a prefix's block hashes must be distinct")
        self._expire_due(None)
        claim = ClaimRecord(spec, hashes)
        self._claims[spec.claim_id] = claim
        forget_ended(self._claims, self.max_claims, _has_ended)
        submitted(self._events, claim)
        reason = refusal or _admission_problem(self, spec, hashes)
        if reason is not None:
            self.stats.claims_rejected += 1
            return refuse(self._events, claim, reason)

        conditions: dict[str, Any] = {}
        steps, ttl = spec.duration_steps, spec.ttl_s
        if (
            steps is not None
            and self.max_duration_steps is not None
            and steps > self.max_duration_steps
        ):
            steps = conditions["duration_steps"] = self.max_duration_steps
        if ttl is not None and self.max_ttl_s is not None and ttl > self.max_ttl_s:
            ttl = conditions["ttl_s"] = self.max_ttl_s
        decision = Decision.CONDITIONALLY_ACCEPTED if conditions else Decision.ACCEPTED
        claim.move(ClaimState.ACCEPTED)
        self.stats.claims_accepted += 1
        self._set_deadline(claim, steps, ttl)
        if spec.protection_mode is not ProtectionMode.BEST_EFFORT:
            self._owner_blocks[spec.owner_scope] = self._owner_blocks.get(
                spec.owner_scope, 0
            ) + len(hashes)
        protects = TIER_OF_MODE[spec.protection_mode] == PROTECTED
        hard = spec.protection_mode is ProtectionMode.HARD_PROTECTED
        ranked_hint = spec.protection_mode is ProtectionMode.BEST_EFFORT and self._pool.ranked
        pool = self._pool
        resident = [] if ranked_hint else pool.detach(hashes)
        pool.cover_claim(claim, protects=protects, hard=hard)
        pool.attach(resident)
        self._events.emit(
            EventName.RESIDENT_CLAIM_ACCEPTED,
            claim=claim,
            decision=decision.value,
            protection_mode=spec.protection_mode.value,
            conditions=conditions,
            present_blocks=sum(claim.present),
        )
        if claim.holds:
            self._transition(claim, ClaimState.MATERIALIZED, EventName.RESIDENT_CLAIM_MATERIALIZED)
        if spec.reuse_hint is not None:
            self._hint(spec.owner_scope, spec.reuse_hint)
        return accepted(claim, conditions)

    def _hint(self, owner_scope: str, hint: ReuseHint) -> None:
        """Hand a claim's reuse hint to a ranking policy (others ignore hints)."""
        if self._ranking is not None:
            self._ranking.note_hint(hint_owner(owner_scope, hint.agent), hint, self.clock() / 1e9)

    def _set_deadline(self, claim: ClaimRecord, steps: int | None, ttl: float | None) -> None:
        claim.deadline_step = None if steps is None else self.step_count + steps
        claim.deadline_ns = None if ttl is None else self.clock() + int(ttl * 1e9)
        if claim.deadline_step is not None:
            heapq.heappush(self._deadline_steps, (claim.deadline_step, claim.claim_id))
        if claim.deadline_ns is not None:
            heapq.heappush(self._deadline_ns, (claim.deadline_ns, claim.claim_id))

    def _expire_due(self, request_id: str | None) -> None:
        now = self.clock() if self._deadline_ns else 0
        for heap, current, attr in (
            (self._deadline_steps, self.step_count, "deadline_step"),
            (self._deadline_ns, now, "deadline_ns"),
        ):
            while heap and heap[0][0] <= current:
                due, cid = heapq.heappop(heap)
                claim = self._claims.get(cid)  # ``None``: it ended, and was forgotten since
                if claim is not None and claim.state.live and getattr(claim, attr) == due:
                    self._end(
                        claim,
                        ClaimState.EXPIRED,
                        EventName.RESIDENT_CLAIM_EXPIRED,
                        request_id=request_id,
                        reason="duration_ended" if attr == "deadline_step" else "ttl_ended",
                    )

    def _transition(
        self, claim: ClaimRecord, target: ClaimState, name: EventName, **data: Any
    ) -> None:
        claim.move(target)
        self._events.emit(name, claim=claim, state=target.value, **data)

    def _end(
        self,
        claim: ClaimRecord,
        target: ClaimState,
        name: EventName,
        *,
        request_id: str | None = None,
        reason: str,
        first: bool = False,
        **data: Any,
    ) -> None:
        """End a live claim: the transition is checked first, then its blocks are let go
        (``first``: as the next victims, ``BlockPool.attach``)."""
        claim.end(target, reason)
        spec = claim.spec
        if spec.protection_mode is not ProtectionMode.BEST_EFFORT:
            _unaccount(self._owner_blocks, spec.owner_scope, len(claim.hashes))
        protects = TIER_OF_MODE[spec.protection_mode] == PROTECTED
        refs = [self._pool.protect_ref]
        if spec.protection_mode is ProtectionMode.HARD_PROTECTED:
            refs.append(self._pool.hard_ref)
        best_effort = spec.protection_mode is ProtectionMode.BEST_EFFORT
        # a ranking pool keeps best-effort blocks where unclaimed ones wait: nothing moves
        resident = [] if best_effort and self._pool.ranked else self._pool.detach(claim.hashes)
        # a best-effort claim never protected its blocks: their later losses are ordinary
        track = target is not ClaimState.HARMED and not best_effort
        self._pool.uncover_claim(claim, refs if protects else [], track=track)
        self._events.emit(
            name, claim=claim, request_id=request_id, state=target.value, reason=reason, **data
        )
        self._pool.attach(resident, first=first)

    def _owned(self, claim_id: str, owner_scope: str) -> ClaimRecord:
        return owned_claim(self._claims, claim_id, owner_scope)

    def has_claim(self, claim_id: str) -> bool:
        """Whether ``claim_id`` is taken (by any owner, ended or not)."""
        return claim_id in self._claims

    def get_claim(self, claim_id: str, owner_scope: str) -> ClaimView:
        claim = self._owned(claim_id, owner_scope)  # check the scope before anything changes
        self._expire_due(None)
        return self._view(claim)

    def live_owners(self) -> set[str]:
        """Owner scopes with a claim that has not ended (accepted, materialized or demoted)."""
        return {c.spec.owner_scope for c in self._claims.values() if c.state not in _ENDED}

    def claim_counts(self) -> dict[str, int]:
        """Claims by ``mode/state`` (all the engine still tracks)."""
        return counts_by_mode_and_state(self._claims.values())

    def claims_of(self, owner_scope: str) -> list[ClaimView]:
        self._expire_due(None)
        return [self._view(c) for c in self._claims.values() if c.spec.owner_scope == owner_scope]

    def renew_claim(
        self,
        claim_id: str,
        owner_scope: str,
        *,
        duration_steps: int | None = None,
        ttl_s: float | None = None,
        reuse_hint: ReuseHint | None = None,
    ) -> ClaimView:
        """Extend a live claim's duration, counted from now; a ``reuse_hint`` updates what the
        engine knows about the claimed prefix's next use (no durations: only the hint)."""
        claim = self._owned(claim_id, owner_scope)
        if duration_steps is not None and (
            isinstance(duration_steps, bool)
            or not isinstance(duration_steps, int)
            or duration_steps <= 0
        ):
            raise UsageError(
                "duration_steps", f"must be a positive integer, got {duration_steps!r}"
            )
        if ttl_s is not None and (
            not isinstance(ttl_s, int | float) or not math.isfinite(ttl_s) or ttl_s <= 0
        ):
            raise UsageError("ttl_s", f"must be a positive number of seconds, got {ttl_s!r}")
        self._expire_due(None)
        claim.require_live()
        if reuse_hint is not None:
            if not isinstance(reuse_hint, ReuseHint):
                raise UsageError("reuse_hint", f"expected a ReuseHint, got {reuse_hint!r}")
            self._hint(claim.spec.owner_scope, reuse_hint)
            if duration_steps is None and ttl_s is None:
                return self._view(claim)
        if duration_steps is None and ttl_s is None:
            duration_steps, ttl_s = claim.spec.duration_steps, claim.spec.ttl_s
        if duration_steps is not None and self.max_duration_steps is not None:
            duration_steps = min(duration_steps, self.max_duration_steps)
        if ttl_s is not None and self.max_ttl_s is not None:
            ttl_s = min(ttl_s, self.max_ttl_s)
        self._set_deadline(claim, duration_steps, ttl_s)
        return self._view(claim)

    def release_claim(self, claim_id: str, owner_scope: str, *, done: bool = False) -> ClaimView:
        """End a live claim now (it ends as ``expired``, reason ``released``). ``done``: nothing
        will use the prefix again; its unclaimed blocks wait as the next victims, not as the
        most recently used (as vLLM's connector puts a done release at the head of its queue)."""
        claim = self._owned(claim_id, owner_scope)
        self._expire_due(None)
        if claim.state.live:
            self._end(
                claim,
                ClaimState.EXPIRED,
                EventName.RESIDENT_CLAIM_EXPIRED,
                reason="released",
                first=done,
            )
        return self._view(claim)

    def step(self, n: int = 1) -> None:
        """Advance the engine's step counter (``duration_steps`` count these)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise UsageError("n", f"must be a positive integer, got {n!r}")
        self.step_count += n
        self._expire_due(None)

    def _view(self, claim: ClaimRecord) -> ClaimView:
        return claim.view(
            present_blocks=sum(claim.present),
            holds=claim.holds,
            expires_at_step=claim.deadline_step,
            expires_at_ns=claim.deadline_ns,
        )
