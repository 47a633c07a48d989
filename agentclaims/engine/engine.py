"""The reference KV engine: a paged block pool, a prefix cache, and the arbiter of claims.

It models KV only (no text generation). A request is a list of chained block hashes; the engine
answers with an explicit arbiter action and keeps the rule

    protected_resident_kv + active_live_kv <= usable_kv

Where blocks wait::

    ref_cnt > 0                         active live KV (held by running requests)
    ref_cnt == 0, no hash               free
    ref_cnt == 0, hashed                resident reusable KV, in one tier:
        ORDINARY     unclaimed / released claims: the pluggable EvictionPolicy (LRU by default)
        BEST_EFFORT  hint only, evicted next; losses are ordinary
        DEMOTABLE    the claim is demoted (event first), then its blocks become ORDINARY
        OFFLOADABLE  the claim moves to the host tier (bounded), restored on reuse
        SOFT         evicted last; a loss that breaks the predicate is true harm
        EXPIRY_HELD  held by expiring claims only: never a victim, free once they end
        PROTECTED    held by a hard_protected claim: never a victim

Allocation takes free blocks first, then victims tier by tier in that order. When even
PROTECTED would have to give, the request is deferred (it fits once other active work drains or
an expiring claim ends) or refused, naming the blocking claims: never a silent loss.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from agentclaims.contract import (
    ArbiterAction,
    CacheIdentity,
    ClaimEvent,
    ClaimSpec,
    ClaimState,
    ContiguousRange,
    Decision,
    EventName,
    Feasibility,
    ProtectionMode,
    check_transition,
)
from agentclaims.contract.ids import (
    BlockHash,
    ClaimId,
    OwnerScope,
    PrefixId,
    RequestId,
    prefix_id_of,
)
from agentclaims.engine.blocks import Block
from agentclaims.engine.eviction import EvictionPolicy, LRUPolicy
from agentclaims.errors import ScopeViolation, UnknownClaim, UsageError
from agentclaims.protocol.types import ActiveOutcome, ClaimDecision, ClaimView

__all__ = ["EngineStats", "KVEngine"]

# Tiers of resident blocks, weakest first. ACTIVE/FREE are bookkeeping values only.
FREE, ORDINARY, BEST_EFFORT, DEMOTABLE, OFFLOADABLE, SOFT, EXPIRY_HELD, PROTECTED = range(8)
_EVICTABLE_CLAIM_TIERS = (BEST_EFFORT, DEMOTABLE, OFFLOADABLE, SOFT)
_HELD_TIERS = (EXPIRY_HELD, PROTECTED)
TIER_OF_MODE = {
    ProtectionMode.BEST_EFFORT: BEST_EFFORT,
    ProtectionMode.DEMOTABLE: DEMOTABLE,
    ProtectionMode.OFFLOADABLE: OFFLOADABLE,
    ProtectionMode.SOFT_PRIORITY: SOFT,
    ProtectionMode.EXPIRING: PROTECTED,
    ProtectionMode.HARD_PROTECTED: PROTECTED,
}


@dataclass(slots=True)
class EngineStats:
    """Counters since the engine started."""

    requests_served: int = 0
    requests_deferred: int = 0
    requests_refused: int = 0
    hit_blocks: int = 0
    restored_blocks: int = 0
    computed_blocks: int = 0
    evicted_blocks: int = 0
    evicted_claimed_blocks: int = 0
    true_harm: int = 0
    true_harm_hard: int = 0
    blocks_lost_after_release: int = 0
    claims_accepted: int = 0
    claims_rejected: int = 0

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


class _Claim:
    """Engine-side record of one claim. Positions are the claimed prefix's blocks."""

    __slots__ = (
        "deadline_ns",
        "deadline_step",
        "end_reason",
        "hashes",
        "held",
        "missing_in_span",
        "pos_of",
        "present",
        "seq",
        "span_end",
        "span_start",
        "spec",
        "state",
    )

    def __init__(self, spec: ClaimSpec, hashes: Sequence[BlockHash]) -> None:
        self.spec = spec
        self.hashes = tuple(hashes)
        self.pos_of = {h: i for i, h in enumerate(self.hashes)}
        self.present = bytearray(len(self.hashes))
        pred = spec.materialization_predicate
        self.span_start = pred.start if isinstance(pred, ContiguousRange) else 0
        self.span_end = pred.span
        self.missing_in_span = self.span_end - self.span_start
        self.state = ClaimState.SUBMITTED
        self.seq = -1
        self.deadline_step: int | None = None
        self.deadline_ns: int | None = None
        self.end_reason: str | None = None
        self.held = 0
        """Blocks of a hard/expiring claim parked in a held tier (it blocks others while > 0)."""

    @property
    def claim_id(self) -> str:
        return self.spec.claim_id

    @property
    def mode(self) -> ProtectionMode:
        return self.spec.protection_mode

    @property
    def holds(self) -> bool:
        return self.missing_in_span == 0

    def mark(self, h: BlockHash, present: bool) -> bool:
        """Set position of ``h`` present/absent; return whether anything changed."""
        pos = self.pos_of[h]
        if self.present[pos] == present:
            return False
        self.present[pos] = present
        if self.span_start <= pos < self.span_end:
            self.missing_in_span += -1 if present else 1
        return True


class KVEngine:
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
        event_buffer: int = 200_000,
        first_seq: int = 0,
    ) -> None:
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
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.host_capacity = host_blocks
        self.owner_cap_blocks = owner_cap_blocks
        self.max_duration_steps = max_duration_steps
        self.max_ttl_s = max_ttl_s
        if protected_cap_blocks is not None and (
            isinstance(protected_cap_blocks, bool)
            or not isinstance(protected_cap_blocks, int)
            or not 0 <= protected_cap_blocks <= num_blocks
        ):
            raise UsageError(
                "protected_cap_blocks",
                f"must be an integer within 0..{num_blocks}, got {protected_cap_blocks!r}",
            )
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
        self.policy = LRUPolicy() if eviction_policy is None else eviction_policy
        self.policy_name = policy_name or self.policy.name
        self.step_count = 0
        self.stats = EngineStats()

        self._blocks = [Block(i) for i in range(num_blocks)]
        self._free: list[Block] = self._blocks[::-1]  # pop() hands out block 0 first
        self._cached: dict[BlockHash, Block] = {}
        self._tiers: dict[int, OrderedDict[int, Block]] = {
            t: OrderedDict() for t in (*_EVICTABLE_CLAIM_TIERS, *_HELD_TIERS)
        }
        self._active_blocks = 0
        self._host: OrderedDict[BlockHash, None] = OrderedDict()
        self._requests: dict[str, tuple[list[Block], bool]] = {}

        self._claims: dict[str, _Claim] = {}
        self._cover: dict[BlockHash, list[_Claim]] = {}  # live claims by block hash
        self._ended_cover: dict[BlockHash, list[_Claim]] = {}  # ended claims still resident
        self._protect_ref: dict[BlockHash, int] = {}  # hard/expiring claims per hash
        self._hard_ref: dict[BlockHash, int] = {}  # hard_protected claims per hash
        self._blockers: dict[str, _Claim] = {}  # hard/expiring claims with held blocks
        self._owner_blocks: dict[str, int] = {}
        self._deadline_steps: list[tuple[int, str]] = []
        self._deadline_ns: list[tuple[int, str]] = []
        self._prefixes: OrderedDict[str, tuple[BlockHash, ...]] = OrderedDict()

        self._seq = first_seq  # a replacement instance continues its predecessor's stream
        self._claimless_seq = -1
        self._events: deque[ClaimEvent] = deque(maxlen=event_buffer)
        self._taken = first_seq  # seq of the last event handed out by take_events

    # ------------------------------------------------------------------ accounting
    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def active_blocks(self) -> int:
        return self._active_blocks

    @property
    def resident_blocks(self) -> int:
        return len(self.policy) + sum(len(q) for q in self._tiers.values())

    @property
    def protected_resident_blocks(self) -> int:
        return len(self._tiers[PROTECTED]) + len(self._tiers[EXPIRY_HELD])

    @property
    def host_resident_blocks(self) -> int:
        return len(self._host)

    def is_cached(self, block_hash: BlockHash) -> bool:
        return block_hash in self._cached

    def resident_run(self, block_hashes: Sequence[BlockHash]) -> int:
        """How many leading blocks of ``block_hashes`` are in the device prefix cache now."""
        n = 0
        cached = self._cached
        for h in block_hashes:
            if h not in cached:
                break
            n += 1
        return n

    def check_invariants(self) -> None:
        """Assert the pool's bookkeeping (for tests): blocks are conserved, maps agree."""
        assert self.free_blocks + self.resident_blocks + self.active_blocks == self.num_blocks
        assert all(b.block_hash == h for h, b in self._cached.items())
        assert sum(1 for b in self._blocks if b.ref_cnt > 0) == self._active_blocks
        assert len(self._host) <= self.host_capacity
        held = {
            c.claim_id
            for t in _HELD_TIERS
            for b in self._tiers[t].values()
            for c in self._cover[b.block_hash]  # type: ignore[index]
            if TIER_OF_MODE[c.mode] == PROTECTED
        }
        assert held == set(self._blockers), "blocking claims out of step with held blocks"
        assert self.stats.true_harm_hard == 0

    # ------------------------------------------------------------------ events
    def _emit(
        self,
        name: EventName,
        *,
        claim: _Claim | None = None,
        request_id: str | None = None,
        prefix_id: str | None = None,
        **data: Any,
    ) -> None:
        self._seq += 1
        if claim is not None:
            claim.seq += 1
            seq = claim.seq
            prefix_id = prefix_id or claim.spec.object_id
        else:
            self._claimless_seq += 1
            seq = self._claimless_seq
        self._events.append(
            ClaimEvent(
                event=name,
                seq=self._seq,
                event_sequence=seq,
                timestamp_ns=self.clock(),
                run_id=self.run_id,
                policy=self.policy_name,
                usable_blocks=self.num_blocks,
                request_id=None if request_id is None else RequestId(request_id),
                claim_id=None if claim is None else ClaimId(claim.claim_id),
                prefix_id=None if prefix_id is None else PrefixId(prefix_id),
                data=data,
            )
        )

    def take_events(self) -> list[ClaimEvent]:
        """Drain the events emitted since the last call (vLLM style: queued, not pushed)."""
        out = [e for e in self._events if e.seq > self._taken]
        if out:
            self._taken = out[-1].seq
        return out

    def events_since(self, seq: int = 0) -> list[ClaimEvent]:
        """Buffered events with ``seq`` greater than the given one (for resumable streams)."""
        return [e for e in self._events if e.seq > seq]

    @property
    def last_seq(self) -> int:
        return self._seq

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

    # ------------------------------------------------------------------ parking
    def _tier_for(self, h: BlockHash) -> int:
        if h in self._protect_ref:
            return PROTECTED if h in self._hard_ref else EXPIRY_HELD
        claims = self._cover.get(h)
        if not claims:
            return ORDINARY
        return max(TIER_OF_MODE[c.mode] for c in claims)

    def _park(self, block: Block) -> None:
        """A hashed block lost its last active user: it becomes resident in its tier."""
        assert block.block_hash is not None
        tier = self._tier_for(block.block_hash)
        block.tier = tier
        if tier == ORDINARY:
            self.policy.insert(block)
        else:
            self._tiers[tier][block.block_id] = block
            if tier >= EXPIRY_HELD:
                self._count_held(block.block_hash, 1)

    def _unpark(self, block: Block) -> None:
        tier = block.tier
        if tier == ORDINARY:
            self.policy.remove(block)
        else:
            del self._tiers[tier][block.block_id]
            if tier >= EXPIRY_HELD:
                assert block.block_hash is not None
                self._count_held(block.block_hash, -1)

    def _count_held(self, h: BlockHash, delta: int) -> None:
        """Keep each protecting claim's count of held blocks, and the set of blockers."""
        for claim in self._cover[h]:
            if TIER_OF_MODE[claim.mode] == PROTECTED:
                claim.held += delta
                if claim.held == 0:
                    del self._blockers[claim.claim_id]
                elif claim.held == 1 and delta == 1:
                    self._blockers[claim.claim_id] = claim

    def _detach(self, hashes: Iterable[BlockHash]) -> list[Block]:
        """Unpark the resident blocks of ``hashes`` before their claims change (see _attach)."""
        cached = self._cached
        out = []
        for h in hashes:
            block = cached.get(h)
            if block is not None and block.ref_cnt == 0:
                self._unpark(block)
                out.append(block)
        return out

    def _attach(self, blocks: Sequence[Block]) -> None:
        """Park detached blocks again, in the tiers their claims now give them.

        Tail first, as ``finish`` does: under LRU the prefix's head becomes the most recently
        used, so a released prefix loses its tail before its reusable leading run."""
        for block in reversed(blocks):
            self._park(block)

    # ------------------------------------------------------------------ losses
    def _drop_hash(self, block: Block, request_id: str | None) -> None:
        """Evict a resident block from the prefix cache; account for every claim on it."""
        h = block.block_hash
        assert h is not None
        del self._cached[h]
        block.block_hash = None
        self.stats.evicted_blocks += 1
        claims = self._cover.get(h)
        if claims:
            self.stats.evicted_claimed_blocks += 1
            for claim in claims:
                self._lose(claim, h, request_id, cause="evicted")
        ended = self._ended_cover.pop(h, None)
        if ended:
            for claim in ended:
                if claim.mark(h, False):
                    self.stats.blocks_lost_after_release += 1
                    self._emit(
                        EventName.RESIDENT_CLAIM_BLOCK_LOST_AFTER_RELEASE,
                        claim=claim,
                        request_id=request_id,
                        position=claim.pos_of[h],
                        blocks=1,
                        state=claim.state.value,
                    )

    def _lose(self, claim: _Claim, h: BlockHash, request_id: str | None, cause: str) -> None:
        """A position of a live claim stopped surviving: harm if the predicate breaks."""
        before = claim.holds
        if not claim.mark(h, False):
            return
        self._emit(
            EventName.ALLOCATION_VICTIM_SELECTED,
            claim=claim,
            request_id=request_id,
            position=claim.pos_of[h],
            protection_mode=claim.mode.value,
        )
        if before and not claim.holds and claim.mode is not ProtectionMode.BEST_EFFORT:
            self.stats.true_harm += 1
            if claim.mode is ProtectionMode.HARD_PROTECTED:
                self.stats.true_harm_hard += 1
            self._end(
                claim,
                ClaimState.HARMED,
                EventName.RESIDENT_CLAIM_HARMED,
                request_id=request_id,
                reason=cause,
                cause=cause,
                predicate_before=True,
                predicate_after=False,
                position=claim.pos_of[h],
            )

    # ------------------------------------------------------------------ allocation
    def _evictable(self) -> int:
        return len(self.policy) + sum(len(self._tiers[t]) for t in _EVICTABLE_CLAIM_TIERS)

    def _allocate(self, request_id: str) -> Block:
        """One block for active use: free first, then victims tier by tier (caller checked
        that enough evictable blocks exist)."""
        while True:
            if self._free:
                return self._free.pop()
            victim = self.policy.pop_victim()
            if victim is not None:
                self._drop_hash(victim, request_id)
                return victim
            best_effort = self._tiers[BEST_EFFORT]
            if best_effort:
                victim = best_effort.popitem(last=False)[1]
                self._drop_hash(victim, request_id)
                return victim
            demotable = self._tiers[DEMOTABLE]
            if demotable:
                first = next(iter(demotable.values()))
                assert first.block_hash is not None
                for claim in list(self._cover[first.block_hash]):
                    if claim.mode is ProtectionMode.DEMOTABLE:
                        self._end(
                            claim,
                            ClaimState.DEMOTED,
                            EventName.RESIDENT_CLAIM_DEMOTED,
                            request_id=request_id,
                            reason="pressure",
                            action=ArbiterAction.RELAX_RESIDENT_CLAIM.value,
                        )
                continue  # its blocks moved to weaker tiers
            offloadable = self._tiers[OFFLOADABLE]
            if offloadable:
                first = next(iter(offloadable.values()))
                assert first.block_hash is not None
                for claim in [
                    c for c in self._cover[first.block_hash] if c.mode is ProtectionMode.OFFLOADABLE
                ]:
                    self._offload(claim, request_id)
                continue
            soft = self._tiers[SOFT]
            if soft:
                victim = soft.popitem(last=False)[1]
                self._drop_hash(victim, request_id)
                return victim
            raise AssertionError("allocation past the evictable pool: feasibility check missed")

    def _offload(self, claim: _Claim, request_id: str) -> None:
        """Move an offloadable claim's resident, unused blocks to the host tier."""
        moved = 0
        for h in claim.hashes:
            block = self._cached.get(h)
            if block is None or block.ref_cnt > 0 or block.tier != OFFLOADABLE:
                continue
            del self._tiers[OFFLOADABLE][block.block_id]
            del self._cached[h]
            block.block_hash = None
            self._free.append(block)
            self._host_put(h, request_id)
            moved += 1
        self._emit(
            EventName.RESIDENT_CLAIM_OFFLOADED,
            claim=claim,
            request_id=request_id,
            action=ArbiterAction.OFFLOAD_RESIDENT.value,
            blocks=moved,
            host_capacity=self.host_capacity,
        )

    def _host_put(self, h: BlockHash, request_id: str) -> None:
        if self.host_capacity == 0:
            self._host_lost(h, request_id)
            return
        while len(self._host) >= self.host_capacity:
            old, _ = self._host.popitem(last=False)
            self._host_lost(old, request_id)
        self._host[h] = None

    def _host_lost(self, h: BlockHash, request_id: str) -> None:
        for claim in list(self._cover.get(h, ())):
            before = claim.holds
            if claim.mark(h, False) and before and not claim.holds:
                self._emit(
                    EventName.RESIDENT_CLAIM_RESTORATION_FAILED,
                    claim=claim,
                    request_id=request_id,
                    position=claim.pos_of[h],
                    cause="host_tier_full",
                )
                self.stats.true_harm += 1
                self._end(
                    claim,
                    ClaimState.HARMED,
                    EventName.RESIDENT_CLAIM_HARMED,
                    request_id=request_id,
                    reason="restoration_failed",
                    cause="restoration_failed",
                    predicate_before=True,
                    predicate_after=False,
                )

    # ------------------------------------------------------------------ requests
    def begin(
        self,
        request_id: str,
        block_hashes: Sequence[BlockHash],
        *,
        prompt_blocks: int | None = None,
        extra_blocks: int = 0,
        admit: bool = True,
    ) -> ActiveOutcome:
        """Start an active request over the full blocks ``block_hashes`` (plus ``extra_blocks``
        unhashed ones: the partial tail and generated tokens). Only the first ``prompt_blocks``
        (default all) can be prefix-cache hits. ``admit=False`` denies future reuse of the new
        KV (write no-admit), which does not stop this request from evicting residents."""
        if not isinstance(request_id, str) or not request_id:
            raise UsageError("request_id", f"must be a non-empty string, got {request_id!r}")
        if request_id in self._requests:
            raise UsageError("request_id", f"request {request_id!r} is already active")
        if isinstance(extra_blocks, bool) or not isinstance(extra_blocks, int) or extra_blocks < 0:
            raise UsageError(
                "extra_blocks", f"must be a non-negative integer, got {extra_blocks!r}"
            )
        n = len(block_hashes)
        limit = n if prompt_blocks is None else prompt_blocks
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= n:
            raise UsageError("prompt_blocks", f"must be within 0..{n}, got {prompt_blocks!r}")
        self._expire_due(request_id)

        cached = self._cached
        host = self._host
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
        available = len(self._free) + self._evictable() - pinned_resident
        if needed > available:
            return self._refuse_or_defer(
                request_id, needed, available, pinned_protected, n + extra_blocks
            )

        evicted_before = self.stats.evicted_blocks
        blocks: list[Block] = []
        policy_remove = self.policy.remove
        for i in range(hits):
            block = cached[block_hashes[i]]
            if block.ref_cnt == 0:
                if block.tier == ORDINARY:  # the common case, inlined from _unpark
                    policy_remove(block)
                else:
                    self._unpark(block)
                self._active_blocks += 1
            block.ref_cnt += 1
            blocks.append(block)
        restored_claims: dict[str, _Claim] = {}
        cover, ended_cover, allocate = self._cover, self._ended_cover, self._allocate
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
                        self._emit(
                            EventName.RESIDENT_CLAIM_RESTORE_REQUIRED,
                            claim=claim,
                            request_id=request_id,
                        )
            elif not admit:
                continue
            block.block_hash = h
            cached[h] = block
            if h in cover or h in ended_cover:
                self._arrived(h)
        for _ in range(extra_blocks):
            block = allocate(request_id)
            block.ref_cnt = 1
            blocks.append(block)
        self._active_blocks += n - hits + extra_blocks
        for claim in restored_claims.values():
            self._emit(EventName.RESIDENT_CLAIM_RESTORED, claim=claim, request_id=request_id)
        self._requests[request_id] = (blocks, admit)

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

    def _arrived(self, h: BlockHash) -> None:
        """A block hash became present: claims on it may now materialize."""
        for claim in self._cover.get(h, ()):
            if claim.mark(h, True) and claim.holds and claim.state is ClaimState.ACCEPTED:
                self._transition(
                    claim, ClaimState.MATERIALIZED, EventName.RESIDENT_CLAIM_MATERIALIZED
                )
        ended = self._ended_cover.get(h)
        if ended:
            for claim in ended:
                claim.mark(h, True)

    def _refuse_or_defer(
        self, request_id: str, needed: int, available: int, pinned_protected: int, total: int
    ) -> ActiveOutcome:
        """Explain why ``needed`` new blocks (``total`` with the pinned hits) cannot be had now.

        A refusal by hard claims that all carry a TTL still names them and refuses, but hints
        when the first of them ends (``retry_after_s``)."""
        shortfall = needed - available
        blocking = self._blockers
        others_active = self._active_blocks
        expiring_only = len(self._tiers[EXPIRY_HELD])
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
        self._emit(
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
            blocking_claim_ids=tuple(ClaimId(i) for i in ids),
            shortfall_blocks=shortfall,
            retry_after_s=retry,
        )

    def _seconds_to_expiry(self, claims: Iterable[_Claim]) -> float | None:
        now = self.clock()
        waits = [(c.deadline_ns - now) / 1e9 for c in claims if c.deadline_ns is not None]
        return max(0.0, min(waits)) if waits else None

    def finish(self, request_id: str) -> None:
        """The request is done: its hashed blocks become resident (if admitted), the rest free.

        Blocks are released tail first, so under LRU a sequence's tail is evicted before its head
        (vLLM does the same), which keeps the reusable leading run as long as possible."""
        entry = self._requests.pop(request_id, None)
        if entry is None:
            raise UsageError("request_id", f"no active request {request_id!r}")
        blocks, admit = entry
        cover, free, insert = self._cover, self._free, self.policy.insert
        released = 0
        for block in reversed(blocks):
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                released += 1
                h = block.block_hash
                if h is None:
                    free.append(block)
                elif h in cover:  # claimed (protected hashes are covered too): find its tier
                    self._park(block)
                else:  # unclaimed: ordinary, inlined from _park
                    block.tier = ORDINARY
                    insert(block)
        self._active_blocks -= released
        self._emit(
            EventName.FUTURE_REUSE_ADMITTED if admit else EventName.FUTURE_REUSE_DENIED,
            request_id=request_id,
        )

    def active_requests(self) -> list[str]:
        return list(self._requests)

    # ------------------------------------------------------------------ claims
    def submit_claim(
        self, spec: ClaimSpec, block_hashes: Sequence[BlockHash] | None = None
    ) -> ClaimDecision:
        """Decide a residency claim. ``block_hashes`` are the claimed prefix's blocks; without
        them the engine resolves ``spec.object_id`` from the prefixes it has seen."""
        if not isinstance(spec, ClaimSpec):
            raise UsageError("spec", f"expected a ClaimSpec, got {type(spec).__name__}")
        if spec.claim_id in self._claims:
            raise UsageError("claim_id", f"claim {spec.claim_id!r} already exists")
        if block_hashes is None:
            block_hashes = self._prefixes.get(spec.object_id)
            if block_hashes is None:
                raise UsageError(
                    "object_id", f"unknown prefix {spec.object_id!r}; pass block_hashes"
                )
        hashes = tuple(block_hashes)
        if len(hashes) != spec.footprint_blocks:
            raise UsageError(
                "footprint_blocks",
                f"is {spec.footprint_blocks} but the prefix has {len(hashes)} blocks",
            )
        if len(set(hashes)) != len(hashes):
            raise UsageError("block_hashes", "a prefix's block hashes must be distinct")
        self._expire_due(None)
        claim = _Claim(spec, hashes)
        self._claims[spec.claim_id] = claim
        self._emit(
            EventName.RESIDENT_CLAIM_SUBMITTED,
            claim=claim,
            protection_mode=spec.protection_mode.value,
            owner_scope=spec.owner_scope,
            footprint_blocks=spec.footprint_blocks,
            materialization_predicate=spec.materialization_predicate.to_dict(),
            duration_steps=spec.duration_steps,
            ttl_s=spec.ttl_s,
        )
        reason = self._admission_problem(spec, hashes)
        if reason is not None:
            self.stats.claims_rejected += 1
            claim.state = ClaimState.REFUSED
            claim.end_reason = reason
            self._emit(
                EventName.RESIDENT_CLAIM_REJECTED,
                claim=claim,
                action=ArbiterAction.REFUSE_RESIDENCY_CLAIM.value,
                reason=reason,
                decision=Decision.REJECTED.value,
            )
            return ClaimDecision(
                ClaimId(spec.claim_id),
                Decision.REJECTED,
                ClaimState.REFUSED,
                ArbiterAction.REFUSE_RESIDENCY_CLAIM,
                reason,
            )

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
        claim.state = ClaimState.ACCEPTED
        self.stats.claims_accepted += 1
        self._set_deadline(claim, steps, ttl)
        if spec.protection_mode is not ProtectionMode.BEST_EFFORT:
            self._owner_blocks[spec.owner_scope] = self._owner_blocks.get(
                spec.owner_scope, 0
            ) + len(hashes)
        protects = TIER_OF_MODE[spec.protection_mode] == PROTECTED
        hard = spec.protection_mode is ProtectionMode.HARD_PROTECTED
        resident = self._detach(hashes)
        for h in hashes:
            self._cover.setdefault(h, []).append(claim)
            if protects:
                self._protect_ref[h] = self._protect_ref.get(h, 0) + 1
                if hard:
                    self._hard_ref[h] = self._hard_ref.get(h, 0) + 1
            if h in self._cached or h in self._host:
                claim.mark(h, True)
        self._attach(resident)
        self._emit(
            EventName.RESIDENT_CLAIM_ACCEPTED,
            claim=claim,
            decision=decision.value,
            protection_mode=spec.protection_mode.value,
            conditions=conditions,
            present_blocks=sum(claim.present),
        )
        if claim.holds:
            self._transition(claim, ClaimState.MATERIALIZED, EventName.RESIDENT_CLAIM_MATERIALIZED)
        return ClaimDecision(ClaimId(spec.claim_id), decision, claim.state, None, None, conditions)

    def _admission_problem(self, spec: ClaimSpec, hashes: tuple[BlockHash, ...]) -> str | None:
        ident = spec.cache_identity
        mine = self.cache_identity
        if (ident.block_size, ident.model_id, ident.tokenizer_id, ident.adapter_id) != (
            mine.block_size,
            mine.model_id,
            mine.tokenizer_id,
            mine.adapter_id,
        ):
            return "cache_identity_mismatch"
        if spec.footprint_blocks > self.num_blocks:
            return "exceeds_capacity"
        if (
            spec.protection_mode is not ProtectionMode.BEST_EFFORT
            and self.owner_cap_blocks is not None
        ):
            used = self._owner_blocks.get(spec.owner_scope, 0)
            if used + spec.footprint_blocks > self.owner_cap_blocks:
                return "owner_cap_exceeded"
        if TIER_OF_MODE[spec.protection_mode] == PROTECTED:
            new = sum(1 for h in hashes if h not in self._protect_ref)
            if len(self._protect_ref) + new > self.protected_cap_blocks:
                return "protected_capacity_exceeded"
        return None

    def _set_deadline(self, claim: _Claim, steps: int | None, ttl: float | None) -> None:
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
                claim = self._claims[cid]
                if claim.state.live and getattr(claim, attr) == due:
                    self._end(
                        claim,
                        ClaimState.EXPIRED,
                        EventName.RESIDENT_CLAIM_EXPIRED,
                        request_id=request_id,
                        reason="duration_ended" if attr == "deadline_step" else "ttl_ended",
                    )

    def _transition(self, claim: _Claim, target: ClaimState, name: EventName, **data: Any) -> None:
        claim.state = check_transition(claim.claim_id, claim.state, target)
        self._emit(name, claim=claim, state=target.value, **data)

    def _end(
        self,
        claim: _Claim,
        target: ClaimState,
        name: EventName,
        *,
        request_id: str | None = None,
        reason: str,
        **data: Any,
    ) -> None:
        """End a live claim: the transition is checked first, then its blocks are let go."""
        claim.state = check_transition(claim.claim_id, claim.state, target)
        claim.end_reason = reason
        spec = claim.spec
        if spec.protection_mode is not ProtectionMode.BEST_EFFORT:
            self._owner_blocks[spec.owner_scope] -= len(claim.hashes)
        protects = TIER_OF_MODE[spec.protection_mode] == PROTECTED
        refs = [self._protect_ref]
        if spec.protection_mode is ProtectionMode.HARD_PROTECTED:
            refs.append(self._hard_ref)
        resident = self._detach(claim.hashes)
        for h in claim.hashes:
            cover = self._cover[h]
            cover.remove(claim)
            if not cover:
                del self._cover[h]
            if protects:
                for ref in refs:
                    left = ref[h] - 1
                    if left:
                        ref[h] = left
                    else:
                        del ref[h]
            if h in self._cached and target is not ClaimState.HARMED:
                self._ended_cover.setdefault(h, []).append(claim)
        self._emit(
            name, claim=claim, request_id=request_id, state=target.value, reason=reason, **data
        )
        self._attach(resident)

    def _owned(self, claim_id: str, owner_scope: str) -> _Claim:
        claim = self._claims.get(claim_id)
        if claim is None:
            raise UnknownClaim(claim_id)
        if claim.spec.owner_scope != owner_scope:
            raise ScopeViolation(claim_id, owner_scope)
        return claim

    def get_claim(self, claim_id: str, owner_scope: str) -> ClaimView:
        claim = self._owned(claim_id, owner_scope)  # check the scope before anything changes
        self._expire_due(None)
        return self._view(claim)

    def live_owners(self) -> set[str]:
        """Owner scopes with a claim that has not ended (accepted, materialized or demoted)."""
        ended = (ClaimState.REFUSED, ClaimState.EXPIRED, ClaimState.HARMED)
        return {c.spec.owner_scope for c in self._claims.values() if c.state not in ended}

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
    ) -> ClaimView:
        """Extend a live claim's duration, counted from now."""
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
        if not claim.state.live:
            raise UsageError("claim_id", f"claim {claim_id!r} has ended ({claim.state.value})")
        if duration_steps is None and ttl_s is None:
            duration_steps, ttl_s = claim.spec.duration_steps, claim.spec.ttl_s
        if duration_steps is not None and self.max_duration_steps is not None:
            duration_steps = min(duration_steps, self.max_duration_steps)
        if ttl_s is not None and self.max_ttl_s is not None:
            ttl_s = min(ttl_s, self.max_ttl_s)
        self._set_deadline(claim, duration_steps, ttl_s)
        return self._view(claim)

    def release_claim(self, claim_id: str, owner_scope: str) -> ClaimView:
        """End a live claim now (it ends as ``expired``, reason ``released``)."""
        claim = self._owned(claim_id, owner_scope)
        self._expire_due(None)
        if claim.state.live:
            self._end(
                claim, ClaimState.EXPIRED, EventName.RESIDENT_CLAIM_EXPIRED, reason="released"
            )
        return self._view(claim)

    def step(self, n: int = 1) -> None:
        """Advance the engine's step counter (``duration_steps`` count these)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise UsageError("n", f"must be a positive integer, got {n!r}")
        self.step_count += n
        self._expire_due(None)

    def _view(self, claim: _Claim) -> ClaimView:
        return ClaimView(
            claim_id=ClaimId(claim.claim_id),
            owner_scope=OwnerScope(claim.spec.owner_scope),
            object_id=PrefixId(claim.spec.object_id),
            protection_mode=claim.mode,
            state=claim.state,
            footprint_blocks=claim.spec.footprint_blocks,
            present_blocks=sum(claim.present),
            predicate_holds=claim.holds and claim.state.live,
            expires_at_step=claim.deadline_step,
            expires_at_ns=claim.deadline_ns,
            end_reason=claim.end_reason,
        )
