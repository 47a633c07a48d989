"""The connector's claim book: which blocks are held for which claim, and what that means for
the next request. Standard library only, so it is tested without vLLM.

A hold is a reference on each of a claimed prefix's full blocks (vLLM's ``BlockPool.touch``):
a block with a reference is never in the free queue, so it is never evicted. Releasing hands
the references back tail first, so the tail is evicted before the head. The book keeps the
contract's rules around that one primitive::

    hard_protected, expiring   held until released, revoked or their TTL ends; a request that
                               cannot fit without their blocks is deferred (one of them ends by
                               TTL) or refused, naming them
    soft_priority, demotable   held too, but shed under pressure, farthest expected next use
                               first, each only of the blocks still needed, deepest first;
                               every shed is a demotion event first, never silent (the
                               demoted claim's head stays held, ranked above unheld blocks,
                               until released, its TTL or more pressure)
    best_effort                not held: plain prefix caching
    offloadable                refused: no honest restore-or-fail path is lowered

Hard holds never take more than ``total - reserve`` blocks (``reserve``: one max-length
request and a watermark), so a request of any allowed length always fits once active work
drains. Soft holds may take more, up to ``total - soft_reserve``: a request that needs their
room sheds them as it is admitted, and running requests that need more blocks shed them before
each step (``relieve``). A hold a finished agent leaves (``release(evict_first=True)``) goes
back to the head of the free queue, the next victims. Each tenant has a quota, every TTL a
maximum (a claim without one gets the maximum: nothing is held for ever).
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["HELD_MODES", "ClaimBook", "Hold", "PoolPort", "Verdict"]

HELD_MODES = ("hard_protected", "expiring", "soft_priority", "demotable")
HARD_MODES = ("hard_protected", "expiring")
SOFT_MODES = ("soft_priority", "demotable")
KNOWN_MODES = (*HELD_MODES, "best_effort", "offloadable")


class PoolPort(Protocol):
    """What the book needs from the block pool (vLLM's, or a test's)."""

    def hold(self, blocks: Sequence[Any]) -> None:
        """Add one reference to each block (they leave the free queue)."""

    def unhold(self, blocks: Sequence[Any], *, evict_first: bool = False) -> None:
        """Drop one reference from each block; ``blocks`` is head first, freed tail first:
        those left without a reference join the free queue at its tail (evicted last), or at
        its head with ``evict_first`` (the next victims, the tail first of them)."""

    def num_free(self) -> int:
        """Blocks an allocation may take now (free or evictable)."""


@dataclass(slots=True)
class Hold:
    """One claim's hold on the leading full blocks of a prefix."""

    claim_id: str
    tenant: str
    mode: str
    blocks: list[Any]
    expires_at: float
    next_use_s: float
    """Predicted seconds to the prefix's next use when held: soft holds whose next use is
    expected farthest *now* (``expected_wait``) go first."""
    request_id: str | None = None
    since: float = 0.0
    """When the hold was taken (the book's clock)."""
    demoted: bool = False
    """The claim was demoted (its event sent): pressure took its deepest blocks, and these
    are its head blocks, kept only to rank them above unheld ones (a shorter prefix still
    saves its tokens) until the claim is released, its TTL ends or pressure takes them too.
    No claim covers them any more: they are neither counted as claimed nor reported."""

    def expected_wait(self, now: float) -> float:
        """Seconds still expected until the next use, at ``now``: the prediction less the
        time held, and once that has passed, the time held so far (``inf``: no prediction).
        Agents' waits are heavy-tailed: one late for its predicted use is likely waiting on a
        long tool or a person, and is expected to wait about as long again, not to come
        back at once."""
        held = now - self.since
        left = self.next_use_s - held
        return left if left > 0 else held


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether a request that needs ``needed`` more blocks may be scheduled now."""

    action: str  # "serve", "defer", "refuse"
    blocking_claim_ids: tuple[str, ...] = ()
    shortfall_blocks: int = 0
    retry_after_s: float | None = None


_SERVE = Verdict("serve")


@dataclass(slots=True)
class _Tenant:
    quota_blocks: int
    held_blocks: int = 0


class ClaimBook:
    """Holds, their limits, and the ordered event stream of one engine core's claims."""

    def __init__(
        self,
        pool: PoolPort,
        total_blocks: int,
        reserve_blocks: int,
        *,
        max_ttl_s: float = 600.0,
        tenant_quota_blocks: Mapping[str, int] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_ns: Callable[[], int] = time.time_ns,
        event_buffer: int = 100_000,
        max_defer_s: float = 30.0,
        soft_reserve_blocks: int | None = None,
    ) -> None:
        soft_reserve = reserve_blocks if soft_reserve_blocks is None else soft_reserve_blocks
        if total_blocks < 1 or not 0 <= soft_reserve <= reserve_blocks:
            raise ValueError(
                f"bad pool size: total {total_blocks}, reserve {reserve_blocks}, "
                f"soft reserve {soft_reserve} (0 <= soft reserve <= reserve)"
            )
        self.pool = pool
        self.total_blocks = total_blocks
        self.hard_cap_blocks = max(0, total_blocks - reserve_blocks)
        """The most blocks hard holds may take, so that one max-length request always fits."""
        self.cap_blocks = max(0, total_blocks - soft_reserve)
        """The most blocks all holds may take (soft ones are shed for a request that needs
        their room); ``hard_cap_blocks`` where no ``soft_reserve_blocks`` is given."""
        self.max_ttl_s = max_ttl_s
        self.max_defer_s = max_defer_s
        """A request blocked longer than this (until the first blocking TTL ends) is refused."""
        self.clock = clock
        self.wall_ns = wall_ns
        self.holds: dict[str, Hold] = {}
        self._quotas = dict(tenant_quota_blocks or {})
        self._tenants: dict[str, _Tenant] = {}
        self._refs: dict[int, int] = {}  # id(block) -> holds on it (the distinct-block cap)
        self._live: dict[int, int] = {}  # id(block) -> live claims' holds on it (not heads)
        self.events: deque[dict[str, Any]] = deque(maxlen=event_buffer)
        self.seq = 0
        self._judged: dict[str, str] = {}  # request id -> last verdict action reported
        self._held_back: dict[str, tuple[float, float | None]] = {}
        """request id -> (when held claims first stood in its way, when it was let run)."""

    # ------------------------------------------------------------------ accounting
    @property
    def held_blocks(self) -> int:
        """Distinct blocks under at least one hold (demoted claims' heads too)."""
        return len(self._refs)

    @property
    def claimed_blocks(self) -> int:
        """Distinct blocks under at least one live claim (what the book reports as held)."""
        return len(self._live)

    def _tenant(self, name: str) -> _Tenant:
        t = self._tenants.get(name)
        if t is None:
            t = self._tenants[name] = _Tenant(self._quotas.get(name, self.cap_blocks))
        return t

    def _new_blocks(self, blocks: Iterable[Any]) -> int:
        return sum(1 for b in blocks if id(b) not in self._refs)

    @staticmethod
    def _count(refs: dict[int, int], blocks: Iterable[Any], step: int) -> None:
        """One reference more (``step`` 1) or less (-1) on each block in ``refs``."""
        for b in blocks:
            n = refs.get(id(b), 0) + step
            if n:
                refs[id(b)] = n
            else:
                del refs[id(b)]

    def _take(self, hold: Hold) -> None:
        self.pool.hold(hold.blocks)
        self._count(self._refs, hold.blocks, 1)
        self._count(self._live, hold.blocks, 1)
        self._tenant(hold.tenant).held_blocks += len(hold.blocks)
        self.holds[hold.claim_id] = hold

    def _give_back(self, hold: Hold, *, evict_first: bool = False) -> None:
        del self.holds[hold.claim_id]
        if not hold.demoted:  # a demoted claim's head left the claims' counts already
            self._count(self._live, hold.blocks, -1)
            self._tenant(hold.tenant).held_blocks -= len(hold.blocks)
        self._unhold(hold.blocks, evict_first=evict_first)

    def _unhold(self, blocks: list[Any], *, evict_first: bool = False) -> None:
        self._count(self._refs, blocks, -1)
        self.pool.unhold(blocks, evict_first=evict_first)

    def _end(self, hold: Hold, reason: str) -> bool:
        """End a hold (TTL, revocation): its blocks back, and its claim's expiry event unless
        it was a demoted claim's head (its demotion was its end). Whether a claim ended."""
        self._give_back(hold)
        if hold.demoted:
            return False
        self.emit("resident_claim_expired", hold.claim_id, reason=reason, blocks=len(hold.blocks))
        return True

    # ------------------------------------------------------------------ events
    def emit(self, event: str, claim_id: str | None = None, **data: Any) -> dict[str, Any]:
        self.seq += 1
        record = {
            "seq": self.seq,
            "event": event,
            "claim_id": claim_id,
            "timestamp_ns": self.wall_ns(),
        }
        record.update(data)
        self.events.append(record)
        return record

    def events_since(self, seq: int, limit: int = 1_000) -> list[dict[str, Any]]:
        """Buffered events with ``seq`` greater than ``seq`` (at most ``limit``), in order."""
        if not self.events or seq >= self.seq:
            return []
        first = self.events[0]["seq"]
        start = max(0, seq - first + 1)
        return [self.events[i] for i in range(start, min(len(self.events), start + limit))]

    # ------------------------------------------------------------------ claims
    def hold(
        self,
        claim_id: str,
        tenant: str,
        mode: str,
        blocks: Sequence[Any],
        *,
        wanted_blocks: int | None = None,
        ttl_s: float | None = None,
        next_use_s: float | None = None,
        request_id: str | None = None,
    ) -> dict[str, Any]:
        """Hold ``blocks`` (a prefix's resident leading full blocks, head first) for a claim.

        ``wanted_blocks``: the claim's footprint; fewer resident blocks than that is refused
        (the predicate would not hold). Returns the decision; every outcome is an event."""

        def refuse(reason: str) -> dict[str, Any]:
            self.emit("resident_claim_rejected", claim_id, reason=reason, request_id=request_id)
            return {
                "claim_id": claim_id,
                "decision": "rejected",
                "state": "refused",
                "reason": reason,
            }

        old = self.holds.get(claim_id) if isinstance(claim_id, str) else None
        problem = _hold_problem(claim_id, mode, old, ttl_s, self.max_ttl_s, next_use_s)
        if problem is not None:
            return refuse(problem)
        run = list(blocks)
        footprint = len(run) if wanted_blocks is None else wanted_blocks
        if footprint <= 0:
            return refuse("the prefix has no full block to claim")
        if len(run) < footprint:
            return refuse(f"only {len(run)} of {footprint} blocks are resident")
        run = run[:footprint]
        if mode == "best_effort":
            self.emit(
                "resident_claim_accepted", claim_id, mode=mode, blocks=0, request_id=request_id
            )
            return {
                "claim_id": claim_id,
                "decision": "accepted",
                "state": "accepted",
                "blocks": 0,
                "reason": "best effort: plain prefix caching",
            }
        self.expire_due()  # a hold whose TTL has passed holds nothing, here as at admission
        nearest = math.inf if next_use_s is None else float(next_use_s)
        shed = _to_shed(self, run, mode, nearest)  # soft holds to demote for room under the cap
        if shed is None:
            new = self._new_blocks(run)
            return refuse(
                f"held blocks would reach {self.held_blocks + new}, over the cap of "
                f"{self.cap_blocks} (one max-length request must always fit)"
            )
        tenant_state = self._tenant(tenant)
        kept = tenant_state.held_blocks - sum(
            len(h.blocks) for h in shed if h.tenant == tenant and not h.demoted
        )
        if kept + len(run) > tenant_state.quota_blocks:
            return refuse(
                f"tenant {tenant!r} would hold {kept + len(run)} blocks, "
                f"over its quota of {tenant_state.quota_blocks}"
            )
        for victim in shed:  # every check passed: only now does anything change
            self._demote(
                victim, "held_cap: a claim with a nearer next use took its blocks", request_id
            )
        if old is not None and self.holds.get(claim_id) is old:
            self._give_back(old)  # the id's demoted head: the new hold replaces it
        ttl = self.max_ttl_s if ttl_s is None else float(ttl_s)
        hold = Hold(
            claim_id,
            tenant,
            mode,
            run,
            self.clock() + ttl,
            nearest,
            request_id,
            self.clock(),
        )
        self._take(hold)
        self.emit(
            "resident_claim_accepted",
            claim_id,
            mode=mode,
            blocks=len(run),
            ttl_s=ttl,
            request_id=request_id,
        )
        self.emit("resident_claim_materialized", claim_id, blocks=len(run))
        return {
            "claim_id": claim_id,
            "decision": "accepted",
            "state": "materialized",
            "blocks": len(run),
            "ttl_s": ttl,
        }

    def _demote(self, hold: Hold, reason: str, request_id: str | None) -> None:
        """Shed a whole soft hold: its demotion event first (a demoted claim's head goes
        without one: its claim ended already), its blocks to the head of the free queue."""
        _shed(self, hold, len(hold.blocks), reason, request_id)

    def _owned(self, claim_id: str, tenant: str) -> Hold | None:
        """The live claim ``claim_id`` of ``tenant`` (not a demoted one's head)."""
        hold = self.holds.get(claim_id)
        return hold if hold is not None and hold.tenant == tenant and not hold.demoted else None

    def release(self, claim_id: str, tenant: str, *, evict_first: bool = False) -> dict[str, Any]:
        """Hand a claim's blocks back (tail first); an unknown claim changes nothing.
        ``evict_first``: its agent is done, nothing will use the prefix again: the blocks go
        to the head of the free queue (the next victims), not its tail."""
        hold = self.holds.get(claim_id)
        if hold is not None and hold.tenant == tenant and hold.demoted:
            self._give_back(hold, evict_first=evict_first)  # its head: no event, it ended
            return {"claim_id": claim_id, "op": "release", "ok": True, "state": "demoted"}
        hold = self._owned(claim_id, tenant)
        if hold is None:
            return {
                "claim_id": claim_id,
                "op": "release",
                "ok": False,
                "reason": "no such held claim",
            }
        self._give_back(hold, evict_first=evict_first)
        self.emit("resident_claim_expired", claim_id, reason="released", blocks=len(hold.blocks))
        return {"claim_id": claim_id, "op": "release", "ok": True, "state": "expired"}

    def renew(self, claim_id: str, tenant: str, ttl_s: float | None) -> dict[str, Any]:
        """Extend a held claim to ``ttl_s`` from now (at most the maximum TTL)."""
        hold = self._owned(claim_id, tenant)
        if hold is None:
            return {
                "claim_id": claim_id,
                "op": "renew",
                "ok": False,
                "reason": "no such held claim",
            }
        if not (isinstance(ttl_s, int | float) and 0 < ttl_s <= self.max_ttl_s):
            return {
                "claim_id": claim_id,
                "op": "renew",
                "ok": False,
                "reason": f"ttl_s must be within (0, {self.max_ttl_s}]",
            }
        hold.expires_at = self.clock() + float(ttl_s)
        self.emit("resident_claim_renewed", claim_id, ttl_s=float(ttl_s))
        return {"claim_id": claim_id, "op": "renew", "ok": True, "ttl_s": float(ttl_s)}

    def revoke_all(self, reason: str) -> int:
        """End every hold (shutdown, reset): each live claim with an event; how many."""
        return sum(self._end(hold, reason) for hold in list(self.holds.values()))

    def expire_due(self) -> None:
        """End the holds whose TTL has passed, each with its event."""
        if not self.holds:
            return  # every scheduler step asks: nothing held costs nothing
        now = self.clock()
        for hold in [h for h in self.holds.values() if h.expires_at <= now]:
            self._end(hold, "ttl_ended")

    # ------------------------------------------------------------------ admission
    def fits(self, needed_blocks: int) -> bool:
        """Whether a request that needs ``needed_blocks`` more blocks may run as things stand:
        a pure query (vLLM asks its admission hook again and again). False only where held
        blocks are in its way; ``admit`` then sheds, defers or refuses."""
        if not self.holds:
            return True
        free = self.pool.num_free()
        return needed_blocks <= free or needed_blocks > free + self.held_blocks

    def admitted(self, request_id: str) -> None:
        """The request got its blocks: its verdict ends, and so does its wait."""
        self._serve(request_id)

    def admit(self, request_id: str, needed_blocks: int) -> Verdict:
        """May a request that needs ``needed_blocks`` more blocks run now? Soft holds are shed
        (demoted, farthest next use first) until it fits; if hard holds are still in the way,
        it is deferred (one of them ends by TTL first) or refused, naming them. A request that
        does not fit for other reasons (active work) is left to the scheduler."""
        if not self.holds:
            return self._serve(request_id)  # asked for every waiting request: nothing held
        self.expire_due()
        if self.fits(needed_blocks):
            return self._serve(request_id)
        free = self.pool.num_free()
        soft = [h for h in self.holds.values() if h.mode in SOFT_MODES]
        # shed only where shedding can make it fit: blocks only soft holds keep come free
        only_soft = {id(b) for h in soft for b in h.blocks} - {
            id(b) for h in self.holds.values() if h.mode not in SOFT_MODES for b in h.blocks
        }
        if needed_blocks > free + len(only_soft):
            soft = []
        if self._shed_until(needed_blocks, soft, request_id):
            free = self.pool.num_free()
            if needed_blocks <= free:
                return self._serve(request_id)
        blocking = [h for h in self.holds.values() if h.mode in HARD_MODES]
        if not blocking or needed_blocks > free + self.held_blocks:
            return self._serve(request_id)  # not the claims' doing: the scheduler queues it
        ids = tuple(sorted(h.claim_id for h in blocking))
        shortfall = needed_blocks - free
        retry = max(0.0, min(h.expires_at for h in blocking) - self.clock())
        action = "defer" if retry <= self.max_defer_s else "refuse"
        self._held_back.setdefault(request_id, (self.clock(), None))
        if self._judged.get(request_id) != action:
            self._judged[request_id] = action
            self.emit(
                "active_request_deferred" if action == "defer" else "active_request_refused",
                None,
                request_id=request_id,
                blocking_claim_ids=list(ids),
                shortfall_blocks=shortfall,
                retry_after_s=round(retry, 3),
                feasibility="feasible_after_claim_expiry"
                if action == "defer"
                else "infeasible_preserve_resident_and_active",
            )
        return Verdict(action, ids, shortfall, retry)

    def relieve(self, min_free: int) -> int:
        """Before a scheduler step: shed soft holds (farthest expected next use first, each a
        demotion event) until at least ``min_free`` blocks are free or evictable, so that the
        running requests' next blocks never wait on a soft hold. Returns how many it shed."""
        if not self.holds or self.pool.num_free() >= min_free:
            return 0
        self.expire_due()  # a hold past its TTL holds nothing, here as at admission
        soft = [h for h in self.holds.values() if h.mode in SOFT_MODES]
        return self._shed_until(min_free, soft, None)

    def _shed_until(self, min_free: int, soft: Iterable[Hold], request_id: str | None) -> int:
        """Shed ``soft`` holds, farthest expected next use first and each only of the blocks
        still needed, until ``min_free`` blocks are free or evictable; how many it shed."""
        now = self.clock()
        shed = 0
        for hold in sorted(soft, key=lambda h: -h.expected_wait(now)):
            short = min_free - self.pool.num_free()
            if short <= 0:
                break
            _shed(self, hold, short, "memory_pressure", request_id)
            shed += 1
        return shed

    def _serve(self, request_id: str) -> Verdict:
        """The request may run: its verdict ends, and so does its wait, if claims held it back."""
        self._judged.pop(request_id, None)
        held = self._held_back.get(request_id)
        if held is not None and held[1] is None:
            self._held_back[request_id] = (held[0], self.clock())
        return _SERVE

    def forget(self, request_id: str) -> float | None:
        """The request left the engine: stop tracking its verdict. Returns the seconds held
        claims kept it waiting (deferred) before it could run, if they did."""
        self._judged.pop(request_id, None)
        held = self._held_back.pop(request_id, None)
        if held is None:
            return None
        since, until = held
        return max(0.0, (self.clock() if until is None else until) - since)


def _hold_problem(
    claim_id: object,
    mode: str,
    old: Hold | None,
    ttl_s: object,
    max_ttl_s: float,
    next_use_s: object,
) -> str | None:
    """Why a hold's arguments are refused before anything changes (``None``: they are fine)."""
    if not claim_id or not isinstance(claim_id, str):
        return "claim_id must be a non-empty string"
    if mode not in KNOWN_MODES:
        return f"unknown protection mode {mode!r}"
    if old is not None and not old.demoted:
        return f"claim {claim_id} already holds blocks"
    if mode == "offloadable":
        return "offloadable is not lowered on vLLM: no restore-or-fail per claim"
    if ttl_s is not None and not (
        isinstance(ttl_s, int | float) and not isinstance(ttl_s, bool) and 0 < ttl_s <= max_ttl_s
    ):
        return f"ttl_s must be within (0, {max_ttl_s}], got {ttl_s!r}"
    if mode == "expiring" and ttl_s is None:
        return "an expiring claim needs ttl_s"
    if next_use_s is not None and not (
        isinstance(next_use_s, int | float) and not math.isnan(next_use_s)
    ):
        return f"next_use_s must be a number of seconds, got {next_use_s!r}"
    return None


def _to_shed(
    book: ClaimBook, run: Sequence[Any], mode: str, next_use_s: float
) -> list[Hold] | None:
    """The soft holds to shed (demote) so that a hold on ``run`` fits under the cap, as
    memory pressure sheds them: farthest expected next use first (an unknown one
    farthest, the oldest of those first), no more than it needs. A soft hold makes room
    only with holds whose next use is farther than its own (with its own unknown: older
    ones whose next use is unknown too, as LRU would); a hard one with any soft hold, and
    only within the hard holds' own cap. ``[]``: it fits as it is; ``None``: no shedding
    makes it fit. Counts from the book's block references: O(the blocks it sheds)."""
    refs = book._refs
    wanted = {id(b) for b in run}
    if mode in HARD_MODES:
        hard = {id(b) for h in book.holds.values() if h.mode in HARD_MODES for b in h.blocks}
        if len(hard | wanted) > book.hard_cap_blocks:
            return None
    over = len(refs) + len(wanted - refs.keys()) - book.cap_blocks
    if over <= 0:
        return []
    now = book.clock()
    soft = [
        h
        for h in book.holds.values()
        if h.mode in SOFT_MODES
        and (
            mode in HARD_MODES
            or h.expected_wait(now) > next_use_s
            or h.expected_wait(now) == next_use_s == math.inf  # both unknown: LRU
        )
    ]
    shed: list[Hold] = []
    dropped: Counter[int] = Counter()
    for hold in sorted(soft, key=lambda h: (-h.expected_wait(now), h.since)):
        shed.append(hold)
        for b in hold.blocks:
            dropped[id(b)] += 1
            if dropped[id(b)] == refs[id(b)] and id(b) not in wanted:
                over -= 1  # no hold keeps it, and the new one does not want it
        if over <= 0:
            return shed
    return None


def _shed(book: ClaimBook, hold: Hold, blocks: int, reason: str, request_id: str | None) -> None:
    """Pressure takes a soft hold's deepest blocks until ``blocks`` of them come free
    (blocks another hold keeps too do not), all of them at most: the claim is demoted
    first (its event, once), its head kept (``Hold.demoted``); the blocks taken go to the
    head of the free queue, the victims of the allocation that needs them."""
    if blocks <= 0:
        return
    if not hold.demoted:
        book.emit(
            "resident_claim_demoted",
            hold.claim_id,
            reason=reason,
            request_id=request_id,
            blocks=len(hold.blocks),
        )
        hold.demoted = True
        book._count(book._live, hold.blocks, -1)
        book._tenant(hold.tenant).held_blocks -= len(hold.blocks)
    keep, freed = len(hold.blocks), 0
    while keep and freed < blocks:
        keep -= 1
        freed += book._refs[id(hold.blocks[keep])] == 1
    if not keep:
        book._give_back(hold, evict_first=True)
        return
    cut = hold.blocks[keep:]
    del hold.blocks[keep:]
    book._unhold(cut, evict_first=True)
