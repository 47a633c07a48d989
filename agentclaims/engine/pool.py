"""``BlockPool``: the paged KV pool, its prefix cache, the tiers resident blocks wait in, and the
host tier of offloadable claims.

Where blocks wait::

    ref_cnt > 0                         active live KV (held by running requests)
    ref_cnt == 0, no hash               free
    ref_cnt == 0, hashed                resident reusable KV, in one tier:
        ORDINARY     unclaimed / released claims: the pluggable EvictionPolicy (LRU by default)
        BEST_EFFORT  hint only, evicted next; losses are ordinary (with a ranking policy,
                     ``ranked``, these wait in ORDINARY, ranked by their hints)
        DEMOTABLE    the claim is demoted (event first), then its blocks become ORDINARY
        OFFLOADABLE  the claim moves to the host tier (bounded), restored on reuse
        SOFT         evicted last; a loss that breaks the predicate is true harm
        EXPIRY_HELD  held by expiring claims only: never a victim, free once they end
        PROTECTED    held by a hard_protected claim: never a victim

A block's tier follows from the claims covering its hash (``cover``: the strongest mode wins;
``protect_ref``/``hard_ref`` count the hard/expiring ones), so the pool keeps that index too,
and ``blockers``, the hard/expiring claims that hold blocks in EXPIRY_HELD/PROTECTED now.

``allocate`` takes free blocks first, then victims tier by tier in that order. What a victim
means for its claims (harm, demotion, offload, a restoration that can no longer happen) is the
arbiter's to decide: the pool calls the hooks it was built with and carries on.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

from agentclaims.contract import ProtectionMode
from agentclaims.contract.ids import BlockHash
from agentclaims.engine.blocks import Block
from agentclaims.engine.eviction import EvictionPolicy
from agentclaims.engine.record import ClaimRecord
from agentclaims.engine.stats import EngineStats

__all__ = [
    "BEST_EFFORT",
    "DEMOTABLE",
    "EXPIRY_HELD",
    "FREE",
    "OFFLOADABLE",
    "ORDINARY",
    "PROTECTED",
    "SOFT",
    "TIER_OF_MODE",
    "BlockPool",
    "HashHook",
]

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

HashHook = Callable[[BlockHash, str], None]
"""``hook(block_hash, request_id)``: the pool tells the arbiter what happened to a hash."""
EVICTED_REMEMBERED = 1 << 16
"""Evicted hashes the pool remembers, to tell a block computed again (a regretted eviction)."""


class BlockPool:
    """``num_blocks`` device blocks, the prefix cache over them, and ``host_capacity`` host slots.

    The hooks: ``on_lost`` (a claimed hash, or one an ended claim still counts, was evicted),
    ``on_demote`` / ``on_offload`` (the first block of the DEMOTABLE / OFFLOADABLE tier is next:
    act on the claims covering it) and ``on_host_lost`` (a hash fell out of the host tier).
    """

    __slots__ = (
        "_on_demote",
        "_on_host_lost",
        "_on_lost",
        "_on_offload",
        "active",
        "blockers",
        "blocks",
        "cached",
        "cover",
        "ended_cover",
        "evicted_lately",
        "free",
        "hard_ref",
        "host",
        "host_capacity",
        "num_blocks",
        "policy",
        "protect_ref",
        "ranked",
        "stats",
        "tiers",
    )

    def __init__(
        self,
        num_blocks: int,
        policy: EvictionPolicy,
        host_capacity: int,
        stats: EngineStats,
        *,
        on_lost: HashHook,
        on_demote: HashHook,
        on_offload: HashHook,
        on_host_lost: HashHook,
    ) -> None:
        self.num_blocks = num_blocks
        self.policy = policy
        self.host_capacity = host_capacity
        self.stats = stats
        self._on_lost = on_lost
        self._on_demote = on_demote
        self._on_offload = on_offload
        self._on_host_lost = on_host_lost

        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: list[Block] = self.blocks[::-1]  # pop() hands out block 0 first
        self.cached: dict[BlockHash, Block] = {}
        self.evicted_lately: OrderedDict[BlockHash, None] = OrderedDict()
        """The hashes of the blocks evicted last (at most ``EVICTED_REMEMBERED``): one stored
        again is a regretted eviction (``EngineStats.recomputed_blocks``)."""
        self.tiers: dict[int, OrderedDict[int, Block]] = {
            t: OrderedDict() for t in (*_EVICTABLE_CLAIM_TIERS, *_HELD_TIERS)
        }
        self.active = 0
        """Blocks with ``ref_cnt > 0`` (active live KV)."""
        self.host: OrderedDict[BlockHash, None] = OrderedDict()

        self.cover: dict[BlockHash, list[ClaimRecord]] = {}  # live claims by block hash
        self.ended_cover: dict[BlockHash, list[ClaimRecord]] = {}  # ended claims still resident
        self.protect_ref: dict[BlockHash, int] = {}  # hard/expiring claims per hash
        self.hard_ref: dict[BlockHash, int] = {}  # hard_protected claims per hash
        self.blockers: dict[str, ClaimRecord] = {}  # hard/expiring claims with held blocks
        self.ranked = False
        """The policy ranks by reuse hints: best-effort claimed blocks wait in it too."""

    # ------------------------------------------------------------------ accounting
    @property
    def resident(self) -> int:
        return len(self.policy) + sum(len(q) for q in self.tiers.values())

    @property
    def protected_resident(self) -> int:
        return len(self.tiers[PROTECTED]) + len(self.tiers[EXPIRY_HELD])

    def evictable(self) -> int:
        return len(self.policy) + sum(len(self.tiers[t]) for t in _EVICTABLE_CLAIM_TIERS)

    def resident_run(self, block_hashes: Sequence[BlockHash]) -> int:
        """How many leading blocks of ``block_hashes`` are in the device prefix cache now."""
        n = 0
        cached = self.cached
        for h in block_hashes:
            if h not in cached:
                break
            n += 1
        return n

    def check_invariants(self) -> None:
        """Assert the bookkeeping (for tests): blocks are conserved, maps agree."""
        assert len(self.free) + self.resident + self.active == self.num_blocks
        assert all(b.block_hash == h for h, b in self.cached.items())
        assert sum(1 for b in self.blocks if b.ref_cnt > 0) == self.active
        assert len(self.host) <= self.host_capacity
        held = {
            c.claim_id
            for t in _HELD_TIERS
            for b in self.tiers[t].values()
            for c in self.cover[b.block_hash]  # type: ignore[index]
            if TIER_OF_MODE[c.mode] == PROTECTED
        }
        assert held == set(self.blockers), "blocking claims out of step with held blocks"

    # ------------------------------------------------------------------ parking
    def tier_for(self, h: BlockHash) -> int:
        if h in self.protect_ref:
            return PROTECTED if h in self.hard_ref else EXPIRY_HELD
        claims = self.cover.get(h)
        if not claims:
            return ORDINARY
        if len(claims) == 1:
            tier = TIER_OF_MODE[claims[0].mode]
        else:
            tier = max(TIER_OF_MODE[c.mode] for c in claims)
        return ORDINARY if tier == BEST_EFFORT and self.ranked else tier

    def park(self, block: Block, insert: Callable[[Block], None] | None = None) -> None:
        """A hashed block lost its last active user: it becomes resident in its tier
        (``insert``: how one that waits in the policy goes in; default its ``insert``)."""
        assert block.block_hash is not None
        tier = self.tier_for(block.block_hash)
        block.tier = tier
        if tier == ORDINARY:
            (insert or self.policy.insert)(block)
        else:
            self.tiers[tier][block.block_id] = block
            if tier >= EXPIRY_HELD:
                self._count_held(block.block_hash, 1)

    def unpark(self, block: Block) -> None:
        """A resident block leaves its tier (it is reused, or its claims change)."""
        tier = block.tier
        if tier == ORDINARY:
            self.policy.remove(block)
        else:
            del self.tiers[tier][block.block_id]
            if tier >= EXPIRY_HELD:
                assert block.block_hash is not None
                self._count_held(block.block_hash, -1)

    def _count_held(self, h: BlockHash, delta: int) -> None:
        """Keep each protecting claim's count of held blocks, and the set of blockers."""
        for claim in self.cover[h]:
            if TIER_OF_MODE[claim.mode] == PROTECTED:
                claim.held += delta
                if claim.held == 0:
                    del self.blockers[claim.claim_id]
                elif claim.held == 1 and delta == 1:
                    self.blockers[claim.claim_id] = claim

    def detach(self, hashes: Iterable[BlockHash]) -> list[Block]:
        """Unpark the resident blocks of ``hashes`` before their claims change (see attach)."""
        cached = self.cached
        out = []
        for h in hashes:
            block = cached.get(h)
            if block is not None and block.ref_cnt == 0:
                self.unpark(block)
                out.append(block)
        return out

    def attach(self, blocks: Sequence[Block], *, first: bool = False) -> None:
        """Park detached blocks again, in the tiers their claims now give them.

        Tail first, as ``finish`` does: under LRU the prefix's head becomes the most recently
        used, so a released prefix loses its tail before its reusable leading run. ``first``:
        those that wait in the policy go ahead of every other (its ``insert_first``, where it
        has one), tail first still: a prefix nothing will use again."""
        insert_first = getattr(self.policy, "insert_first", None) if first else None
        if insert_first is None:
            for block in reversed(blocks):
                self.park(block)
        else:
            for block in blocks:  # each goes in front: the tail ends up first
                self.park(block, insert_first)

    def cover_claim(self, claim: ClaimRecord, *, protects: bool, hard: bool) -> None:
        """Index a new claim on its blocks (``cover``, and ``protect_ref`` / ``hard_ref`` for
        a protecting / hard one) and mark which are cached or on the host now. Between
        ``detach`` and ``attach``: the tiers follow from this index."""
        cover, cached, host = self.cover, self.cached, self.host
        protect_ref, hard_ref = self.protect_ref, self.hard_ref
        present, lo, hi = claim.present, claim.span_start, claim.span_end
        found = 0  # ``claim.mark(h, True)`` for each present block, written out
        for pos, h in enumerate(claim.hashes):
            covering = cover.get(h)
            if covering is None:
                cover[h] = [claim]
            else:
                covering.append(claim)
            if protects:
                protect_ref[h] = protect_ref.get(h, 0) + 1
                if hard:
                    hard_ref[h] = hard_ref.get(h, 0) + 1
            if h in cached or h in host:
                present[pos] = 1
                if lo <= pos < hi:
                    found += 1
        claim.missing_in_span -= found

    def uncover_claim(
        self, claim: ClaimRecord, refs: Sequence[dict[BlockHash, int]], *, track: bool
    ) -> None:
        """Drop an ended claim from the index (``refs``: the counts it was in) and, with
        ``track``, remember it on its cached blocks (``ended_cover``: a later loss of one is
        ``lost_after_release``). Between ``detach`` and ``attach``, as ``cover_claim``."""
        cover, cached, ended_cover = self.cover, self.cached, self.ended_cover
        for h in claim.hashes:
            covering = cover[h]
            if len(covering) == 1:  # this claim's alone (the usual case)
                del cover[h]
            else:
                covering.remove(claim)
            for ref in refs:
                left = ref[h] - 1
                if left:
                    ref[h] = left
                else:
                    del ref[h]
            if track and h in cached:
                ended = ended_cover.get(h)
                if ended is None:
                    ended_cover[h] = [claim]
                else:
                    ended.append(claim)

    # ------------------------------------------------------------------ allocation
    def _evict(self, block: Block, request_id: str) -> None:
        """Drop a resident block's hash from the prefix cache; the arbiter hears of claimed ones."""
        h = block.block_hash
        assert h is not None
        del self.cached[h]
        block.block_hash = None
        self.stats.evicted_blocks += 1
        lately = self.evicted_lately
        lately[h] = None
        if len(lately) > EVICTED_REMEMBERED:
            lately.popitem(last=False)
        if h in self.cover or h in self.ended_cover:
            self._on_lost(h, request_id)

    def allocate(self, request_id: str) -> Block:
        """One block for active use: free first, then victims tier by tier (caller checked
        that enough evictable blocks exist)."""
        while True:
            if self.free:
                return self.free.pop()
            victim = self.policy.pop_victim()
            if victim is not None:
                self._evict(victim, request_id)
                return victim
            best_effort = self.tiers[BEST_EFFORT]
            if best_effort:
                victim = best_effort.popitem(last=False)[1]
                self._evict(victim, request_id)
                return victim
            demotable = self.tiers[DEMOTABLE]
            if demotable:
                first = next(iter(demotable.values()))
                assert first.block_hash is not None
                self._on_demote(first.block_hash, request_id)
                continue  # its blocks moved to weaker tiers
            offloadable = self.tiers[OFFLOADABLE]
            if offloadable:
                first = next(iter(offloadable.values()))
                assert first.block_hash is not None
                self._on_offload(first.block_hash, request_id)
                continue
            soft = self.tiers[SOFT]
            if soft:
                victim = soft.popitem(last=False)[1]
                self._evict(victim, request_id)
                return victim
            raise AssertionError("allocation past the evictable pool: feasibility check missed")

    # ------------------------------------------------------------------ host tier
    def offload(self, hashes: Iterable[BlockHash], request_id: str) -> int:
        """Move the resident, unused OFFLOADABLE blocks of ``hashes`` to the host tier; return
        how many moved (their device blocks become free)."""
        moved = 0
        for h in hashes:
            block = self.cached.get(h)
            if block is None or block.ref_cnt > 0 or block.tier != OFFLOADABLE:
                continue
            del self.tiers[OFFLOADABLE][block.block_id]
            del self.cached[h]
            block.block_hash = None
            self.free.append(block)
            self._host_put(h, request_id)
            moved += 1
        return moved

    def _host_put(self, h: BlockHash, request_id: str) -> None:
        if self.host_capacity == 0:
            self._on_host_lost(h, request_id)
            return
        while len(self.host) >= self.host_capacity:
            old, _ = self.host.popitem(last=False)
            self._on_host_lost(old, request_id)
        self.host[h] = None
