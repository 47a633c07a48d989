"""vLLM's block pool, for the replay's rows ``lru-vllm`` and ``agentclaims-vllm``.

The reference engine ranks every resident block by the eviction policy's rule; vLLM cannot.
Its pool (``vllm/v1/core/block_pool.py``) keeps one free queue, least recently freed first,
and the agentclaims connector (``integrations/vllm``) can only hold claimed prefixes (a
reference on each block, so the block leaves the free queue) and shed or refuse holds. This
module models that pool as the replay needs it::

    ref_cnt > 0     out of the free queue: a running request's blocks, and held blocks;
                    never a victim
    ref_cnt == 0    in the free queue: a hit takes a block out of it (ref up); new blocks
                    are taken from its head, and a cached block taken there is evicted from
                    the prefix cache; a request's freed blocks go back in reverse order (its
                    last block first): the cached ones appended at the tail, so the least
                    recently freed cached block is the next victim and a request's tail goes
                    before its head; the uncached ones (its partial tail and output here)
                    prepended at the head, reused first (vLLM 0.32's ``free_blocks``)

A request that cannot allocate its new blocks, plus its cached hits that sit in the free queue
(taking them out shrinks it: vLLM's ``get_num_blocks_to_allocate``), waits.

With claims on, the connector's own :class:`agentclaims_vllm.claims.ClaimBook` (its real code,
the standard library only) takes, sheds and refuses the holds over :class:`VllmBlockPool` (its
``PoolPort``): ``admit`` each request before it is scheduled, for what it takes from the free
queue (its new blocks and its hits there; the connector's hook today asks for the new blocks
only: ``admit_evictable_hits``), to serve it, or shed soft holds farthest expected next use
first, or defer/refuse it while hard holds are in the way;
``hold`` on the leading cached blocks of a request as it finishes (before its blocks are
freed, as ``request_finished`` does), ``release``, ``expire_due`` as the replay's virtual time
advances, ``forget`` when a request finishes. ``reserve_blocks`` is one ``max_model_len``
request plus a watermark block, as the connector sets it.

The rows that replay on it are in :mod:`agentclaims.replay.vllm_rows`.
"""

from __future__ import annotations

import math
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentclaims.contract import ArbiterAction, Feasibility
from agentclaims.contract.ids import RequestId
from agentclaims.engine import Block, BlockHash, EngineStats, EvictionPolicy, LRUPolicy
from agentclaims.engine.engine import check_begin
from agentclaims.errors import UsageError
from agentclaims.protocol.types import ActiveOutcome

if TYPE_CHECKING:
    from agentclaims_vllm.claims import ClaimBook, Verdict

__all__ = [
    "DEFAULT_MAX_MODEL_LEN",
    "VllmBlockPool",
    "VllmPoolEngine",
    "max_model_len_for",
]

DEFAULT_MAX_MODEL_LEN = 200_000
"""Tokens of the longest request the modelled server takes (the traces' models' context
window): the connector keeps room for one such request, never held. A pool smaller than twice
that is modelled with ``max_model_len`` half the pool (:func:`max_model_len_for`): vLLM needs
room for one such request, and a server is sized to run more than one."""
WATERMARK_BLOCKS = 1
"""The connector's watermark above one max-length request (``connector._WATERMARK_BLOCKS``)."""
NEVER_S = 1e9
"""``next_use_s`` of a closed agent's hold (``agentclaims.vllm.kv._NEVER_S``)."""
_EVENT_BUFFER = 65_536
"""Book events kept between two reads (each claim operation reads them all)."""


def max_model_len_for(capacity_blocks: int, block_size: int) -> int:
    """The ``max_model_len`` a replay's server of ``capacity_blocks`` has:
    :data:`DEFAULT_MAX_MODEL_LEN`, at most half the pool's tokens."""
    return max(1, min(DEFAULT_MAX_MODEL_LEN, capacity_blocks * block_size // 2))


class VllmBlockPool:
    """vLLM v1's ``BlockPool`` as the replay needs it (module doc), and the connector's
    ``PoolPort`` over it: ``hold`` is vLLM's ``touch``, ``unhold`` its ``free_blocks`` in
    reverse (the first freed is evicted first: tail first), ``num_free`` the free queue's
    length. ``OrderedDict`` is the free queue: O(1) removal from the middle, pop at the head,
    append at the tail (vLLM threads a linked list through its blocks for the same)."""

    __slots__ = ("blocks", "cached", "free", "held", "stats")

    def __init__(self, num_blocks: int, stats: EngineStats | None = None) -> None:
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: OrderedDict[int, Block] = OrderedDict((b.block_id, b) for b in self.blocks)
        """The free queue, head (next victim) first: every block with ``ref_cnt == 0``."""
        self.cached: dict[BlockHash, Block] = {}
        """The prefix cache: hash -> the block holding it (in the free queue or not)."""
        self.held: Counter[int] = Counter()
        """block id -> holds on it (the references ``hold`` added)."""
        self.stats = stats if stats is not None else EngineStats()

    # ------------------------------------------------------------------ vLLM's BlockPool
    def num_free(self) -> int:
        """Blocks an allocation may take now (free or evictable): the free queue's length."""
        return len(self.free)

    def touch(self, blocks: Iterable[Block]) -> None:
        """One more reference on each block; a block with none leaves the free queue."""
        free = self.free
        for block in blocks:
            if block.ref_cnt == 0:
                del free[block.block_id]
            block.ref_cnt += 1

    def free_blocks(self, ordered: Iterable[Block]) -> None:
        """One reference less on each block, ``ordered`` first victim first (vLLM frees a
        request's blocks reversed: tail first). Those left with none join the free queue:
        cached ones at its tail, in that order (LRU); uncached ones at its head, the first
        given first (reused at once: nothing can hit them)."""
        free = self.free
        uncached = []
        for block in ordered:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.block_hash is None:
                    uncached.append(block)
                else:
                    free[block.block_id] = block
        for block in reversed(uncached):
            free[block.block_id] = block
            free.move_to_end(block.block_id, last=False)

    def get_new_blocks(self, n: int) -> list[Block]:
        """``n`` blocks from the free queue's head, each with one reference; a cached one
        leaves the prefix cache (evicted). The caller checked ``n <= num_free()``."""
        free, cached, held = self.free, self.cached, self.held
        out = []
        for _ in range(n):
            block = free.popitem(last=False)[1]
            h = block.block_hash
            if h is not None:
                del cached[h]
                block.block_hash = None
                self.stats.evicted_blocks += 1
                if held[block.block_id]:  # a held block has a reference: never in the queue
                    self.stats.true_harm += 1
            block.ref_cnt = 1
            out.append(block)
        return out

    # ------------------------------------------------------------------ PoolPort
    def hold(self, blocks: Sequence[Any]) -> None:
        """The connector's hold: a reference on each block (``touch``)."""
        self.touch(blocks)
        for block in blocks:
            self.held[block.block_id] += 1

    def unhold(self, blocks: Sequence[Any], *, evict_first: bool = False) -> None:
        """The connector's release: ``blocks`` head first, freed tail first, to the free
        queue's tail; with ``evict_first`` (a finished agent's) the cached ones go to its
        head instead, the tail first (the connector moves them there after ``free_blocks``)."""
        held = self.held
        for block in blocks:
            held[block.block_id] -= 1
            if not held[block.block_id]:
                del held[block.block_id]
        self.free_blocks(reversed(blocks))
        if evict_first:
            free = self.free
            for block in blocks:  # head first: the last moved to the head is the first victim
                if block.ref_cnt == 0 and block.block_hash is not None:
                    free.move_to_end(block.block_id, last=False)

    # ------------------------------------------------------------------ checks
    def check_invariants(self, request_refs: Mapping[int, int] | None = None) -> None:
        """Assert the bookkeeping (for tests): the free queue is exactly the blocks without a
        reference, the cache maps agree, and each block's references are its running
        requests' (``request_refs``: block id -> requests using it) plus its holds."""
        assert all(b.ref_cnt == 0 for b in self.free.values())
        assert sum(1 for b in self.blocks if b.ref_cnt == 0) == len(self.free)
        assert all(b.block_hash == h for h, b in self.cached.items())
        assert all(b.block_hash is None or self.cached[b.block_hash] is b for b in self.blocks)
        if request_refs is not None:
            for b in self.blocks:
                assert b.ref_cnt == request_refs.get(b.block_id, 0) + self.held[b.block_id], b


class VllmPoolEngine:
    """vLLM's pool (:class:`VllmBlockPool`) behind the harness's engine surface
    (:class:`~agentclaims.replay.model.ReplayEngine`), with the connector's claim book when
    ``claims`` is set (module doc). Called as :class:`~agentclaims.engine.KVEngine` is by the
    harness; ``eviction_policy`` may only be LRU (vLLM's free queue is one)."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        *,
        eviction_policy: EvictionPolicy | None = None,
        clock: Callable[[], int] = time.time_ns,
        policy_name: str | None = None,
        event_buffer: int = _EVENT_BUFFER,
        claims: bool = False,
        max_model_len: int = DEFAULT_MAX_MODEL_LEN,
        max_ttl_s: float = 600.0,
        max_defer_s: float = 30.0,
        tenant_quota_blocks: Mapping[str, int] | None = None,
        admit_evictable_hits: bool = True,
        record_events: bool = False,
    ) -> None:
        for name, value in (
            ("num_blocks", num_blocks),
            ("block_size", block_size),
            ("max_model_len", max_model_len),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(name, f"must be an integer >= 1, got {value!r}")
        if eviction_policy is not None and not isinstance(eviction_policy, LRUPolicy):
            raise UsageError(
                "eviction_policy", "vLLM's free queue is LRU: no other eviction policy runs on it"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.clock = clock
        self.policy_name = policy_name or ("agentclaims-vllm" if claims else "lru-vllm")
        self.stats = EngineStats()
        self.pool = VllmBlockPool(num_blocks, self.stats)
        self.reserve_blocks = min(
            num_blocks, math.ceil(max_model_len / block_size) + WATERMARK_BLOCKS
        )
        """Never held: one ``max_model_len`` request and the watermark (the connector's)."""
        self.book: ClaimBook | None = None
        if claims:
            from agentclaims_vllm.claims import ClaimBook

            self.book = ClaimBook(
                self.pool,
                num_blocks,
                self.reserve_blocks,
                max_ttl_s=max_ttl_s,
                tenant_quota_blocks=tenant_quota_blocks,
                clock=self._now_s,
                wall_ns=clock,
                event_buffer=max(event_buffer, _EVENT_BUFFER),
                max_defer_s=max_defer_s,
                soft_reserve_blocks=min(self.reserve_blocks, WATERMARK_BLOCKS),
            )
        self.admit_evictable_hits = admit_evictable_hits
        """Ask the book's ``admit`` for what the request takes from the free queue: its new
        blocks plus its cached hits that wait there (vLLM's ``get_num_blocks_to_allocate``
        counts both). ``False`` asks for the new blocks alone, as the connector's
        ``get_num_new_matched_tokens`` does today: a request whose new blocks fit but not with
        its hits is then served by the book, shedding nothing, and cannot be allocated; with
        nothing running it waits, and every request behind it, until a hold's TTL ends
        (``waited_on_hits`` counts them)."""
        self.claim_events: Counter[str] = Counter()
        """The book's events so far, by name (``resident_claim_demoted``: a shed hold)."""
        self.event_log: list[dict[str, Any]] | None = [] if record_events else None
        """Every event of the book, in order (``record_events``; for tests)."""
        self._seen = 0
        self._requests: dict[str, list[Block]] = {}
        self._running: dict[str, str] = {}  # owner -> its running request
        self._owner_of: dict[str, str] = {}
        self._active = 0
        self.waited_on_hits = 0
        """Requests whose new blocks fit in the free queue but not with their hits there (the
        connector as shipped lets them run, shedding nothing; see ``admit_evictable_hits``):
        they wait for running requests or a hold's end."""

    def _now_s(self) -> float:
        return self.clock() / 1e9

    # ------------------------------------------------------------------ accounting
    @property
    def active_blocks(self) -> int:
        """Blocks of running requests (a block two of them share counts twice)."""
        return min(self._active, self.num_blocks)

    @property
    def protected_resident_blocks(self) -> int:
        """Distinct blocks under at least one hold."""
        return 0 if self.book is None else self.book.claimed_blocks

    @property
    def free_blocks(self) -> int:
        """The free queue's length (free and evictable blocks)."""
        return self.pool.num_free()

    def resident_run(self, block_hashes: Sequence[BlockHash]) -> int:
        """How many leading blocks of ``block_hashes`` are in the prefix cache now."""
        n = 0
        cached = self.pool.cached
        for h in block_hashes:
            if h not in cached:
                break
            n += 1
        return n

    def claim_event_counts(self) -> dict[str, int]:
        """The connector's events so far, by name (empty without claims)."""
        return dict(self.claim_events)

    def check_invariants(self) -> None:
        """Assert the pool's bookkeeping against the running requests and the holds."""
        refs: Counter[int] = Counter()
        for blocks in self._requests.values():
            refs.update(b.block_id for b in blocks)
        self.pool.check_invariants(refs)
        if self.book is not None:
            assert self.book.held_blocks == len(self.pool.held)
            assert self.book.held_blocks <= self.book.cap_blocks

    def _take_events(self) -> None:
        book = self.book
        if book is None or book.seq == self._seen:
            return
        taken = book.events_since(self._seen, limit=book.seq - self._seen)
        assert len(taken) == book.seq - self._seen, "claim events lost between two reads"
        self.claim_events.update(e["event"] for e in taken)
        if self.event_log is not None:
            self.event_log.extend(taken)
        self._seen = book.seq

    # ------------------------------------------------------------------ requests
    def step(self) -> None:
        """A scheduler step: the holds whose TTL has passed end (``build_connector_meta``)."""
        if self.book is not None and self.book.holds:
            self.book.expire_due()
            self._take_events()

    def begin(
        self,
        request_id: str,
        block_hashes: Sequence[BlockHash],
        *,
        extra_blocks: int = 0,
        owner: str | None = None,
    ) -> ActiveOutcome:
        """Schedule a request over the full blocks ``block_hashes`` (plus ``extra_blocks``
        unhashed ones: its partial tail and output): the connector admits it (or sheds soft
        holds, or defers/refuses it for hard ones), then vLLM allocates it if its new blocks
        and its evictable hits fit in the free queue; else it waits."""
        check_begin(request_id, extra_blocks, self._requests)
        pool, book = self.pool, self.book
        cached = pool.cached
        n = len(block_hashes)
        hits = 0
        while hits < n and block_hashes[hits] in cached:
            hits += 1
        hit_blocks = [cached[block_hashes[i]] for i in range(hits)]
        needed = n - hits + extra_blocks
        evictable_hits = sum(1 for b in hit_blocks if b.ref_cnt == 0)
        if book is not None:
            self.step()
            asked = needed + evictable_hits if self.admit_evictable_hits else needed
            verdict = book.admit(request_id, asked)  # the connector's admission hook
            self._take_events()
            if verdict.action != "serve":
                return self._held_back(request_id, verdict)
            # a shed hold may have covered the hits: they wait in the free queue now
            evictable_hits = sum(1 for b in hit_blocks if b.ref_cnt == 0)
        if needed + evictable_hits > pool.num_free():
            return self._wait(request_id, needed, evictable_hits)
        pool.touch(hit_blocks)
        fresh = pool.get_new_blocks(needed)
        for i in range(hits, n):
            h = block_hashes[i]
            if h not in cached:  # else an orphan of a chain whose head was evicted: unhashed
                block = fresh[i - hits]
                block.block_hash = h
                cached[h] = block
        blocks = hit_blocks + fresh
        self._requests[request_id] = blocks
        self._active += len(blocks)
        if owner is not None:
            self._running[owner] = request_id
            self._owner_of[request_id] = owner
        stats = self.stats
        stats.requests_served += 1
        stats.hit_blocks += hits
        stats.computed_blocks += n - hits
        return ActiveOutcome(
            RequestId(request_id),
            ArbiterAction.SERVE_ACTIVE_PRESERVE_RESIDENT,
            Feasibility.FEASIBLE,
            hit_blocks=hits,
            computed_blocks=n - hits,
        )

    def _held_back(self, request_id: str, verdict: Verdict) -> ActiveOutcome:
        """The connector deferred or refused the request: hard holds are in the way."""
        if verdict.action == "defer":
            self.stats.requests_deferred += 1
            action, feasibility = (
                ArbiterAction.DEFER_ACTIVE,
                Feasibility.FEASIBLE_AFTER_CLAIM_EXPIRY,
            )
        else:
            self.stats.requests_refused += 1
            action = ArbiterAction.REFUSE_ACTIVE
            feasibility = Feasibility.INFEASIBLE_PRESERVE_RESIDENT_AND_ACTIVE
        return ActiveOutcome(
            RequestId(request_id),
            action,
            feasibility,
            blocking_claim_ids=verdict.blocking_claim_ids,  # type: ignore[arg-type]
            shortfall_blocks=verdict.shortfall_blocks,
            retry_after_s=verdict.retry_after_s,
        )

    def _wait(self, request_id: str, needed: int, evictable_hits: int) -> ActiveOutcome:
        """vLLM cannot allocate the request now (``allocate_slots`` returns ``None``): it waits
        for running requests to finish, or, with none running, for the first hold to end."""
        self.stats.requests_deferred += 1
        book = self.book
        retry: float | None = None
        feasibility = Feasibility.FEASIBLE_AFTER_ACTIVE_DRAIN
        if book is not None and needed <= self.pool.num_free():
            self.waited_on_hits += 1
        if not self._requests and book is not None and book.holds:
            feasibility = Feasibility.FEASIBLE_AFTER_CLAIM_EXPIRY
            first = min(h.expires_at for h in book.holds.values())
            retry = max(0.0, first - self._now_s())
        return ActiveOutcome(
            RequestId(request_id),
            ArbiterAction.DEFER_ACTIVE,
            feasibility,
            shortfall_blocks=needed + evictable_hits - self.pool.num_free(),
            retry_after_s=retry,
        )

    def finish(self, request_id: str) -> None:
        """The request is done: the connector forgets it, and its blocks are freed tail
        first (the hashed ones stay cached in the free queue until taken from its head)."""
        blocks = self._requests.pop(request_id, None)
        if blocks is None:
            raise UsageError("request_id", f"no active request {request_id!r}")
        self._active -= len(blocks)
        owner = self._owner_of.pop(request_id, None)
        if owner is not None and self._running.get(owner) == request_id:
            del self._running[owner]
        if self.book is not None:
            self.book.forget(request_id)
        self.pool.free_blocks(reversed(blocks))

    # ------------------------------------------------------------------ the connector's ops
    def hold(
        self,
        owner: str,
        claim_id: str,
        tenant: str,
        mode: str,
        *,
        blocks: int | None = None,
        ttl_s: float | None = None,
        next_use_s: float | None = None,
    ) -> dict[str, Any]:
        """The ``hold`` operation ``owner``'s running request carries, applied as it
        finishes (call it before :meth:`finish`): on the request's leading cached blocks, the
        first ``blocks`` of them (``None``: all, what a ``@sequence`` claim holds). Returns
        the book's decision."""
        book = self.book
        if book is None:
            raise UsageError("claims", "this pool runs without the connector: nothing is held")
        rid = self._running.get(owner)
        if rid is None:  # served without the engine: no request carried the operation here
            self.stats.claims_rejected += 1
            return {"claim_id": claim_id, "decision": "rejected", "reason": "no request"}
        run = []
        for block in self._requests[rid]:
            if block.block_hash is None:
                break
            run.append(block)
        decision = book.hold(
            claim_id,
            tenant,
            mode,
            run,
            wanted_blocks=blocks,
            ttl_s=ttl_s,
            next_use_s=next_use_s,
            request_id=rid,
        )
        self._take_events()
        if decision["decision"] == "accepted":
            self.stats.claims_accepted += 1
        else:
            self.stats.claims_rejected += 1
        return decision

    def release(self, claim_id: str, tenant: str, *, evict_first: bool = False) -> bool:
        """Release a hold (its blocks back to the free queue, tail first; to its head with
        ``evict_first``: its agent is done); ``False``: the claim had ended (shed, its head
        let go now if the book still kept it, or expired meanwhile)."""
        if self.book is None:
            return False
        result = self.book.release(claim_id, tenant, evict_first=evict_first)
        ok = bool(result["ok"]) and result.get("state") != "demoted"  # a demoted claim's head
        self._take_events()
        return ok
