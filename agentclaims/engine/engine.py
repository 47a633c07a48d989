"""``KVEngine``, the reference KV engine: a paged block pool, a prefix cache, and the arbiter of
claims, composed of

* ``BlockPool`` (``pool.py``): the blocks, the prefix cache, the tiers where resident blocks wait
  (the table and diagram are there) and the host tier of offloadable claims;
* ``EventLog`` (``events.py``): the numbered, bounded event stream, indexed by ``seq``;
* ``ClaimArbiter`` (``claims.py``, its base class): claim admission, deadlines, renew/release,
  demotion, offload, expiry and harm.

This module holds the request half of the arbiter (``begin``/``finish``: serve, defer or refuse).
It models KV only (no text generation). A request is a list of chained block hashes; the engine
answers with an explicit arbiter action and keeps the rule

    protected_resident_kv + active_live_kv <= usable_kv

Allocation takes free blocks first, then victims tier by tier. When even PROTECTED would have to
give, the request is deferred (it fits once other active work drains or an expiring claim ends)
or refused, naming the blocking claims: never a silent loss.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Container, Sequence
from typing import Any

from agentclaims.contract import (
    ArbiterAction,
    CacheIdentity,
    ClaimEvent,
    ClaimId,
    EventName,
    Feasibility,
    ProtectionMode,
    RequestId,
)
from agentclaims.contract.ids import BlockHash
from agentclaims.engine.blocks import Block
from agentclaims.engine.claims import ClaimArbiter
from agentclaims.engine.eviction import EvictionPolicy, LRUPolicy, RankingPolicy
from agentclaims.engine.pool import EXPIRY_HELD, ORDINARY, BlockPool
from agentclaims.engine.record import ClaimRecord
from agentclaims.engine.stats import EngineStats
from agentclaims.errors import UsageError
from agentclaims.kernel.events import EVENTS_KEPT, EventLog
from agentclaims.kernel.record import CLAIMS_KEPT
from agentclaims.protocol.types import ActiveOutcome, EventPage

__all__ = ["EngineStats", "KVEngine", "check_begin"]


def check_begin(request_id: object, extra_blocks: object, active: Container[str]) -> None:
    """A request's id (a non-empty string, not ``active`` already) and its ``extra_blocks`` (a
    non-negative integer), checked before an engine starts it; ``UsageError`` naming which."""
    if not isinstance(request_id, str) or not request_id:
        raise UsageError("request_id", f"must be a non-empty string, got {request_id!r}")
    if request_id in active:
        raise UsageError("request_id", f"request {request_id!r} is already active")
    if isinstance(extra_blocks, bool) or not isinstance(extra_blocks, int) or extra_blocks < 0:
        raise UsageError("extra_blocks", f"must be a non-negative integer, got {extra_blocks!r}")


def _check_settings(
    num_blocks: object,
    block_size: object,
    host_blocks: object,
    event_buffer: object,
    owner_cap_blocks: object,
    max_duration_steps: Any,
    max_ttl_s: Any,
    protected_cap_blocks: object,
) -> None:
    """``KVEngine``'s settings checked before anything is built (``UsageError`` naming the
    first bad one)."""
    for name, value, minimum in (
        ("num_blocks", num_blocks, 1),
        ("block_size", block_size, 1),
        ("host_blocks", host_blocks, 0),
        ("event_buffer", event_buffer, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise UsageError(name, f"must be an integer >= {minimum}, got {value!r}")
    if owner_cap_blocks is not None and (
        not isinstance(owner_cap_blocks, int) or owner_cap_blocks < 0
    ):
        raise UsageError(
            "owner_cap_blocks", f"must be a non-negative integer, got {owner_cap_blocks!r}"
        )
    if max_duration_steps is not None and max_duration_steps <= 0:
        raise UsageError("max_duration_steps", f"must be positive, got {max_duration_steps}")
    if max_ttl_s is not None and not max_ttl_s > 0:
        raise UsageError("max_ttl_s", f"must be positive, got {max_ttl_s}")
    if protected_cap_blocks is not None and (
        isinstance(protected_cap_blocks, bool)
        or not isinstance(protected_cap_blocks, int)
        or not 0 <= protected_cap_blocks <= num_blocks  # type: ignore[operator]
    ):
        raise UsageError(
            "protected_cap_blocks",
            f"must be an integer within 0..{num_blocks}, got {protected_cap_blocks!r}",
        )


class KVEngine(ClaimArbiter):
    """The reference engine: block pool + prefix cache + claim arbiter.

    ``num_blocks`` is the usable pool; ``host_blocks`` the host tier for offloadable claims;
    ``owner_cap_blocks`` caps the claimed blocks (all modes but best_effort) of one owner.
    The clock (``clock() -> ns``) drives TTLs and event timestamps and is injectable.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        *,
        eviction_policy: EvictionPolicy | None = None,
        host_blocks: int = 0,
        owner_cap_blocks: int | None = None,
        max_duration_steps: int | None = None,
        max_ttl_s: float | None = None,
        protected_cap_blocks: int | None = None,
        cache_identity: CacheIdentity | None = None,
        clock: Callable[[], int] = time.time_ns,
        run_id: str | None = None,
        policy_name: str | None = None,
        event_buffer: int = EVENTS_KEPT,
        first_seq: int = 0,
    ) -> None:
        _check_settings(
            num_blocks,
            block_size,
            host_blocks,
            event_buffer,
            owner_cap_blocks,
            max_duration_steps,
            max_ttl_s,
            protected_cap_blocks,
        )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.owner_cap_blocks = owner_cap_blocks
        self.max_duration_steps = max_duration_steps
        self.max_ttl_s = max_ttl_s
        self.max_claims = CLAIMS_KEPT
        self.protected_cap_blocks = (
            num_blocks if protected_cap_blocks is None else protected_cap_blocks
        )
        """At most this many distinct blocks under hard/expiring claims (headroom for active work)."""
        self.cache_identity = cache_identity or CacheIdentity(
            cache_key_domain="agentclaims-embedded",
            model_id="scripted",
            tokenizer_id="agentclaims-bytes",
            salt_namespace="default",
            block_size=block_size,
        )
        if self.cache_identity.block_size != block_size:
            raise UsageError("cache_identity.block_size", "must equal the engine's block_size")
        self.clock = clock
        self.run_id = run_id or uuid.uuid4().hex[:12]
        policy = LRUPolicy() if eviction_policy is None else eviction_policy
        self.policy_name = policy_name or policy.name
        self.step_count = 0
        self.stats = EngineStats()
        self._pool = BlockPool(
            num_blocks,
            policy,
            host_blocks,
            self.stats,
            on_lost=self._lost,
            on_demote=self._demote,
            on_offload=self._offload,
            on_host_lost=self._host_lost,
        )
        # a replacement instance continues its predecessor's stream from first_seq
        self._events = EventLog(self, event_buffer, first_seq)
        self._requests: dict[str, tuple[list[Block], bool, str | None]] = {}
        self._ranking: RankingPolicy | None = policy if isinstance(policy, RankingPolicy) else None
        """The policy, when it ranks by reuse hints (best-effort claims are then ranked by it
        with everything else instead of waiting in a tier of their own)."""
        self._pool.ranked = self._ranking is not None
        super().__init__()

    # ------------------------------------------------------------------ the pool's settings
    @property
    def policy(self) -> EvictionPolicy:
        """The eviction policy of ordinary resident blocks."""
        return self._pool.policy

    @property
    def ranks_by_hints(self) -> bool:
        """Whether the policy ranks resident blocks by the claims' reuse hints (a
        ``RankingPolicy`` such as ``NextUsePolicy``): the descriptor's ``ranks_by_hints``."""
        return self._ranking is not None

    @property
    def host_capacity(self) -> int:
        """Blocks the host tier holds (``host_blocks``)."""
        return self._pool.host_capacity

    @host_capacity.setter
    def host_capacity(self, value: int) -> None:
        self._pool.host_capacity = value

    # ------------------------------------------------------------------ accounting
    @property
    def free_blocks(self) -> int:
        return len(self._pool.free)

    @property
    def active_blocks(self) -> int:
        return self._pool.active

    @property
    def resident_blocks(self) -> int:
        return self._pool.resident

    @property
    def protected_resident_blocks(self) -> int:
        return self._pool.protected_resident

    @property
    def host_resident_blocks(self) -> int:
        return len(self._pool.host)

    def is_cached(self, block_hash: BlockHash) -> bool:
        return block_hash in self._pool.cached

    def resident_run(self, block_hashes: Sequence[BlockHash]) -> int:
        """How many leading blocks of ``block_hashes`` are in the device prefix cache now."""
        return self._pool.resident_run(block_hashes)

    def check_invariants(self) -> None:
        """Assert the pool's bookkeeping (for tests): blocks are conserved, maps agree."""
        self._pool.check_invariants()
        assert self.stats.true_harm_hard == 0

    # ------------------------------------------------------------------ events
    def take_events(self) -> list[ClaimEvent]:
        """Drain the events emitted since the last call (vLLM style: queued, not pushed)."""
        return self._events.take_events()

    def events_since(self, seq: int = 0) -> list[ClaimEvent]:
        """Buffered events with ``seq`` greater than the given one (for resumable streams).
        O(number returned): the log is indexed by sequence number."""
        return self._events.events_since(seq)

    def events_page(
        self, since: int = 0, *, limit: int | None = None, id_prefix: str | None = None
    ) -> EventPage:
        """The claims protocol's ``events`` read of the buffered events."""
        return self._events.page(since, limit=limit, id_prefix=id_prefix)

    @property
    def last_seq(self) -> int:
        return self._events.seq

    # ------------------------------------------------------------------ requests
    def begin(
        self,
        request_id: str,
        block_hashes: Sequence[BlockHash],
        *,
        prompt_blocks: int | None = None,
        extra_blocks: int = 0,
        admit: bool = True,
        owner: str | None = None,
    ) -> ActiveOutcome:
        """Start an active request over the full blocks ``block_hashes`` (plus ``extra_blocks``
        unhashed ones: the partial tail and generated tokens). Only the first ``prompt_blocks``
        (default all) can be prefix-cache hits. ``admit=False`` denies future reuse of the new
        KV (write no-admit), which does not stop this request from evicting residents.
        ``owner`` names the agent the request is for (``hint_owner``): a ranking policy groups
        the blocks it leaves resident under it and learns its waits."""
        check_begin(request_id, extra_blocks, self._requests)
        n = len(block_hashes)
        limit = n if prompt_blocks is None else prompt_blocks
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= n:
            raise UsageError("prompt_blocks", f"must be within 0..{n}, got {prompt_blocks!r}")
        self._expire_due(request_id)

        pool = self._pool
        cached = pool.cached
        host = pool.host
        hits = 0
        while hits < limit and block_hashes[hits] in cached:
            hits += 1
        restores = 0
        while hits + restores < limit and block_hashes[hits + restores] in host:
            restores += 1
        needed = n - hits + extra_blocks
        pinned_resident = 0
        pinned_protected = 0
        for i in range(hits):
            block = cached[block_hashes[i]]
            if block.ref_cnt == 0:
                if block.tier >= EXPIRY_HELD:
                    pinned_protected += 1
                else:
                    pinned_resident += 1
        available = len(pool.free) + pool.evictable() - pinned_resident
        if needed > available:
            return self._refuse_or_defer(
                request_id, needed, available, pinned_protected, n + extra_blocks
            )

        evicted_before = self.stats.evicted_blocks
        blocks: list[Block] = []
        ranking = self._ranking
        unparked: list[Block] = []
        policy_remove: Callable[[Block], None] = (
            pool.policy.remove if ranking is None else unparked.append
        )
        repinned = 0
        for i in range(hits):
            block = cached[block_hashes[i]]
            if block.ref_cnt == 0:
                if block.tier == ORDINARY:  # the common case, inlined from BlockPool.unpark
                    policy_remove(block)
                else:
                    pool.unpark(block)
                repinned += 1
            block.ref_cnt += 1
            blocks.append(block)
        pool.active += repinned
        if ranking is not None:
            ranking.remove_many(unparked)
            now_s = self.clock() / 1e9
            if owner is not None:
                # its hits left the policy: a rewrite's dead tail goes before any eviction
                ranking.note_begin(owner, now_s)
            else:
                ranking.note_time(now_s)
        restored_claims: dict[str, ClaimRecord] = {}
        cover, ended_cover, allocate = pool.cover, pool.ended_cover, pool.allocate
        lately = pool.evicted_lately
        for i in range(hits, n):
            h = block_hashes[i]
            block = allocate(request_id)
            block.ref_cnt = 1
            blocks.append(block)
            if h in cached:  # an orphan of a chain whose head was evicted: keep it unhashed
                continue
            if i < hits + restores and h in host:
                del host[h]
                for claim in cover.get(h, ()):
                    if claim.claim_id not in restored_claims:
                        restored_claims[claim.claim_id] = claim
                        self._events.emit(
                            EventName.RESIDENT_CLAIM_RESTORE_REQUIRED,
                            claim=claim,
                            request_id=request_id,
                        )
            elif not admit:
                continue
            if lately and h in lately:  # computed again after an eviction: a regret
                del lately[h]
                self.stats.recomputed_blocks += 1
            block.block_hash = h
            cached[h] = block
            if h in cover or h in ended_cover:
                self._arrived(h)
        for _ in range(extra_blocks):
            block = allocate(request_id)
            block.ref_cnt = 1
            blocks.append(block)
        pool.active += n - hits + extra_blocks
        for claim in restored_claims.values():
            self._events.emit(EventName.RESIDENT_CLAIM_RESTORED, claim=claim, request_id=request_id)
        self._requests[request_id] = (blocks, admit, owner)

        evicted = self.stats.evicted_blocks - evicted_before
        if not admit:
            action = ArbiterAction.SERVE_ACTIVE_NO_ADMIT
        elif evicted:
            action = ArbiterAction.SERVE_ACTIVE_EVICT_RESIDENT
        else:
            action = ArbiterAction.SERVE_ACTIVE_PRESERVE_RESIDENT
        stats = self.stats
        stats.requests_served += 1
        stats.hit_blocks += hits
        stats.restored_blocks += restores
        stats.computed_blocks += n - hits - restores
        return ActiveOutcome(
            RequestId(request_id),
            action,
            Feasibility.FEASIBLE,
            hit_blocks=hits,
            restored_blocks=restores,
            computed_blocks=n - hits - restores,
            evicted_blocks=evicted,
        )

    def _refuse_or_defer(
        self, request_id: str, needed: int, available: int, pinned_protected: int, total: int
    ) -> ActiveOutcome:
        """Explain why ``needed`` new blocks (``total`` with the pinned hits) cannot be had now.

        A refusal by hard claims that all carry a TTL still names them and refuses, but hints
        when the first of them ends (``retry_after_s``)."""
        shortfall = needed - available
        blocking = self._pool.blockers
        others_active = self._pool.active
        expiring_only = len(self._pool.tiers[EXPIRY_HELD])
        retry: float | None = None
        if total > self.num_blocks:
            action, feasibility = (
                ArbiterAction.CAPACITY_REQUIRED,
                Feasibility.INFEASIBLE_EXCEEDS_CAPACITY,
            )
            blocking = {}
        elif needed <= available + others_active:
            action, feasibility = (
                ArbiterAction.DEFER_ACTIVE,
                Feasibility.FEASIBLE_AFTER_ACTIVE_DRAIN,
            )
            blocking = {}
        elif needed <= available + others_active + expiring_only - pinned_protected:
            action, feasibility = (
                ArbiterAction.DEFER_ACTIVE,
                Feasibility.FEASIBLE_AFTER_CLAIM_EXPIRY,
            )
            blocking = {k: c for k, c in blocking.items() if c.mode is ProtectionMode.EXPIRING}
            retry = self._seconds_to_expiry(blocking.values())
        else:
            action = ArbiterAction.REFUSE_ACTIVE
            feasibility = Feasibility.INFEASIBLE_PRESERVE_RESIDENT_AND_ACTIVE
            if blocking and all(c.deadline_ns is not None for c in blocking.values()):
                retry = self._seconds_to_expiry(blocking.values())
        ids = tuple(sorted(blocking))
        if action is ArbiterAction.DEFER_ACTIVE:
            self.stats.requests_deferred += 1
            name = EventName.ACTIVE_REQUEST_DEFERRED
        else:
            self.stats.requests_refused += 1
            name = EventName.ACTIVE_REQUEST_REFUSED
        self._events.emit(
            name,
            request_id=request_id,
            action=action.value,
            feasibility=feasibility.value,
            blocking_claim_ids=list(ids),
            needed_blocks=needed,
            shortfall_blocks=shortfall,
            retry_after_s=retry,
        )
        return ActiveOutcome(
            RequestId(request_id),
            action,
            feasibility,
            blocking_claim_ids=tuple(ClaimId(c) for c in ids),
            shortfall_blocks=shortfall,
            retry_after_s=retry,
        )

    def finish(self, request_id: str) -> None:
        """The request is done: its hashed blocks become resident (if admitted), the rest free.

        Blocks are released tail first, so under LRU a sequence's tail is evicted before its head
        (vLLM does the same), which keeps the reusable leading run as long as possible."""
        entry = self._requests.pop(request_id, None)
        if entry is None:
            raise UsageError("request_id", f"no active request {request_id!r}")
        blocks, admit, owner = entry
        pool = self._pool
        cover, free = pool.cover, pool.free
        insert: Callable[[Block], None] = pool.policy.insert
        ranking = self._ranking if owner is not None else None
        parked: list[Block] = []
        if ranking is not None:  # the owner's blocks go to the ranking policy in one call
            assert owner is not None
            ranking.note_finish(owner, self.clock() / 1e9)
            insert = parked.append
        released = 0
        for block in reversed(blocks):
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                released += 1
                h = block.block_hash
                if h is None:
                    free.append(block)
                elif h in cover:  # claimed (protected hashes are covered too): find its tier
                    if ranking is not None and pool.tier_for(h) == ORDINARY:
                        block.tier = ORDINARY
                        insert(block)
                    else:
                        pool.park(block)
                else:  # unclaimed: ordinary, inlined from BlockPool.park
                    block.tier = ORDINARY
                    insert(block)
        if ranking is not None:
            ranking.insert_many(parked)
            ranking.note_parked()
        pool.active -= released
        self._events.emit(
            EventName.FUTURE_REUSE_ADMITTED if admit else EventName.FUTURE_REUSE_DENIED,
            request_id=request_id,
        )

    def active_requests(self) -> list[str]:
        return list(self._requests)
