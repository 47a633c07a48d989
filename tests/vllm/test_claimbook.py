"""``ClaimBook``, the connector's claim book, without vLLM: over a fake block pool (ref counts
and a free list) and a fake clock. Holds and their limits, expiry, admission (serve, shed,
defer, refuse), the event stream, and a stateful test of its invariants under random
operations."""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from agentclaims_vllm.claims import HELD_MODES, ClaimBook
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

HARD = ("hard_protected", "expiring")
SOFT = ("soft_priority", "demotable")
END_EVENTS = ("resident_claim_expired", "resident_claim_demoted")


# ---------------------------------------------------------------------- fakes
class Block:
    """One pool block: an id and a reference count (like vLLM's ``KVCacheBlock``)."""

    __slots__ = ("block_id", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0

    def __repr__(self) -> str:
        return f"Block({self.block_id}, ref={self.ref_cnt})"


class FakePool:
    """``PoolPort`` over a model of vLLM's pool: blocks with ref counts and a free list that
    is evicted from its head (the first block freed is the first evicted)."""

    def __init__(self, total: int) -> None:
        self.blocks = [Block(i) for i in range(total)]
        self.free: deque[Block] = deque(self.blocks)
        self.freed: list[int] = []
        """Block ids in the order ``unhold`` returned them to the free list."""

    def hold(self, blocks: Sequence[Any]) -> None:
        for block in blocks:
            if block.ref_cnt == 0:
                self.free.remove(block)
            block.ref_cnt += 1

    def unhold(self, blocks: Sequence[Any], *, evict_first: bool = False) -> None:
        freed = []
        for block in reversed(blocks):  # head first in, tail first freed
            assert block.ref_cnt > 0, f"double free of {block!r}"
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                freed.append(block)
                self.freed.append(block.block_id)
        if evict_first:  # the next victims: the tail first
            self.free.extendleft(reversed(freed))
        else:
            self.free.extend(freed)

    def num_free(self) -> int:
        return len(self.free)

    def allocate(self, n: int) -> list[Block]:
        """Active work: ``n`` blocks taken from the head of the free list."""
        out = [self.free.popleft() for _ in range(n)]
        for block in out:
            block.ref_cnt += 1
        return out

    def run(self, start: int, n: int) -> list[Block]:
        """Blocks ``start .. start + n - 1``, head first (a prefix's leading full blocks)."""
        return self.blocks[start : start + n]


class Clock:
    """A monotonic clock that moves only when a test advances it."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def ns(self) -> int:
        return int(self.now * 1e9)

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make(total: int = 20, reserve: int = 2, **kw: Any) -> tuple[ClaimBook, FakePool, Clock]:
    pool, clock = FakePool(total), Clock()
    book = ClaimBook(pool, total, reserve, clock=clock, wall_ns=clock.ns, **kw)
    return book, pool, clock


def names(book: ClaimBook, since: int = 0) -> list[str]:
    return [e["event"] for e in book.events_since(since)]


def refs(pool: FakePool) -> list[int]:
    return [b.ref_cnt for b in pool.blocks]


# ---------------------------------------------------------------------- holds
def test_a_hold_is_accepted_and_materialized_with_both_events() -> None:
    """A hard hold is accepted and materialized, with one event for each, in that order."""
    book, pool, _ = make()
    result = book.hold("c1", "t1", "hard_protected", pool.run(0, 5), ttl_s=30, request_id="r1")
    assert result == {
        "claim_id": "c1",
        "decision": "accepted",
        "state": "materialized",
        "blocks": 5,
        "ttl_s": 30.0,
    }
    accepted, materialized = book.events_since(0)
    assert accepted["event"] == "resident_claim_accepted"
    assert (accepted["claim_id"], accepted["mode"], accepted["blocks"]) == (
        "c1",
        "hard_protected",
        5,
    )
    assert (accepted["ttl_s"], accepted["request_id"]) == (30.0, "r1")
    assert materialized["event"] == "resident_claim_materialized"
    assert (materialized["claim_id"], materialized["blocks"]) == ("c1", 5)
    assert [accepted["seq"], materialized["seq"]] == [1, 2]


def test_held_blocks_leave_the_free_count() -> None:
    """Each held block gets one reference and leaves the free list."""
    book, pool, _ = make()
    book.hold("c1", "t1", "soft_priority", pool.run(3, 4), ttl_s=30)
    assert pool.num_free() == 16
    assert book.held_blocks == 4
    assert refs(pool)[3:7] == [1, 1, 1, 1]
    assert sum(refs(pool)) == 4


def test_release_hands_the_blocks_back_tail_first() -> None:
    """Release frees the tail block first (so it is evicted first) and emits expired/released."""
    book, pool, _ = make()
    book.hold("c1", "t1", "hard_protected", pool.run(3, 5), ttl_s=30)
    seq = book.seq
    assert book.release("c1", "t1") == {
        "claim_id": "c1",
        "op": "release",
        "ok": True,
        "state": "expired",
    }
    assert pool.freed == [7, 6, 5, 4, 3]
    assert [b.block_id for b in list(pool.free)[-5:]] == [7, 6, 5, 4, 3]
    [event] = book.events_since(seq)
    assert (event["event"], event["claim_id"], event["reason"], event["blocks"]) == (
        "resident_claim_expired",
        "c1",
        "released",
        5,
    )
    assert (pool.num_free(), book.held_blocks, book.holds) == (20, 0, {})


def test_releasing_an_unknown_or_another_tenants_claim_changes_nothing() -> None:
    """Release of an unknown claim, or of another tenant's, is refused: no event, no block freed."""
    book, pool, _ = make()
    book.hold("c1", "t1", "hard_protected", pool.run(0, 3), ttl_s=30)
    seq, before = book.seq, refs(pool)
    for claim_id, tenant in (("nobody", "t1"), ("c1", "t2")):
        result = book.release(claim_id, tenant)
        assert result["ok"] is False
        assert result["reason"] == "no such held claim"
    assert book.renew("c1", "t2", 10)["ok"] is False
    assert (book.seq, refs(pool), pool.freed) == (seq, before, [])
    assert list(book.holds) == ["c1"]


def test_renew_moves_the_expiry_to_ttl_from_now() -> None:
    """Renew sets the expiry to ``ttl_s`` from now (with an event); past the maximum it fails."""
    book, pool, clock = make(max_ttl_s=60)
    book.hold("c1", "t1", "expiring", pool.run(0, 2), ttl_s=10)
    clock.advance(8)
    assert book.renew("c1", "t1", 10)["ok"] is True
    assert book.holds["c1"].expires_at == clock.now + 10
    assert names(book)[-1] == "resident_claim_renewed"
    assert book.renew("c1", "t1", 61)["ok"] is False
    clock.advance(9)
    book.expire_due()
    assert "c1" in book.holds


def test_a_hold_past_the_cap_is_rejected() -> None:
    """Distinct held blocks may reach ``total - reserve`` but not pass it."""
    book, pool, _ = make(total=10, reserve=4)
    assert book.cap_blocks == 6
    assert book.hold("c1", "t1", "hard_protected", pool.run(0, 4), ttl_s=30)["state"] == (
        "materialized"
    )
    before = refs(pool)
    over = book.hold("c2", "t2", "hard_protected", pool.run(4, 3), ttl_s=30)
    assert over["decision"] == "rejected"
    assert "over the cap" in over["reason"]
    assert book.events_since(0)[-1]["event"] == "resident_claim_rejected"
    assert (refs(pool), book.held_blocks) == (before, 4)
    assert book.hold("c3", "t1", "hard_protected", pool.run(4, 2), ttl_s=30)["decision"] == (
        "accepted"
    )
    assert book.held_blocks == 6


def test_at_the_cap_a_nearer_use_sheds_soft_holds_farthest_first() -> None:
    """At the cap, a soft hold with a nearer next use takes the blocks of soft holds whose next
    use is farther (farthest first, each a demotion), as memory pressure would shed them; a
    hard hold may shed any soft one; a hold that shedding cannot fit sheds nothing."""
    book, pool, clock = make(total=10, reserve=4)  # cap 6
    book.hold("far", "t1", "demotable", pool.run(0, 3), ttl_s=30, next_use_s=50)
    book.hold("mid", "t1", "demotable", pool.run(3, 3), ttl_s=30, next_use_s=20)
    nearer = book.hold("near", "t1", "demotable", pool.run(6, 3), ttl_s=30, next_use_s=5)
    assert nearer["decision"] == "accepted"
    assert set(book.holds) == {"mid", "near"}  # only the farthest went
    demoted = [e for e in book.events_since(0) if e["event"] == "resident_claim_demoted"]
    assert [e["claim_id"] for e in demoted] == ["far"]
    assert demoted[0]["reason"].startswith("held_cap")
    # a soft hold whose use is farther than every held one's takes nothing: refused
    farther = book.hold("later", "t1", "demotable", pool.run(0, 3), ttl_s=30, next_use_s=90)
    assert farther["decision"] == "rejected"
    assert set(book.holds) == {"mid", "near"}
    # time counts: 18 s on, "mid" is due in 2 s, while "near" is 13 s late for its use:
    # waits are heavy-tailed, so it is expected to wait about as long again as it has (18 s),
    # the farthest, and it goes for a new hold due in 1 s
    clock.advance(18)
    assert book.holds["near"].expected_wait(clock.now) == 18
    assert book.holds["mid"].expected_wait(clock.now) == 2
    soon = book.hold("soon", "t1", "demotable", pool.run(0, 3), ttl_s=30, next_use_s=1)
    assert soon["decision"] == "accepted"
    assert set(book.holds) == {"mid", "soon"}
    # a hard hold sheds soft holds whatever their next use (farthest first), no more than it
    # needs: "mid" (due in 2 s) before "soon" (due in 1 s)
    hard = book.hold("pin", "t1", "hard_protected", pool.run(6, 3), ttl_s=30)
    assert hard["decision"] == "accepted"
    assert set(book.holds) == {"soon", "pin"}
    assert book.held_blocks == book.cap_blocks
    # too big to fit even with every soft hold shed: nothing is shed
    before = set(book.holds)
    huge = book.hold("huge", "t1", "hard_protected", pool.run(0, 7), ttl_s=30)
    assert huge["decision"] == "rejected"
    assert set(book.holds) == before


def test_claims_sharing_blocks_count_them_once_against_the_cap() -> None:
    """Two claims on a shared head count its blocks once; each block carries one ref per hold."""
    book, pool, _ = make(total=10, reserve=4)
    assert book.hold("c1", "t1", "hard_protected", pool.run(0, 5), ttl_s=30)["decision"] == (
        "accepted"
    )
    assert book.hold("c2", "t2", "hard_protected", pool.run(0, 6), ttl_s=30)["decision"] == (
        "accepted"
    )
    assert book.held_blocks == 6
    assert refs(pool) == [2, 2, 2, 2, 2, 1, 0, 0, 0, 0]
    assert pool.num_free() == 4
    book.release("c1", "t1")
    assert pool.freed == []  # c2 still holds them
    assert (book.held_blocks, pool.num_free()) == (6, 4)
    book.release("c2", "t2")
    assert pool.freed == [5, 4, 3, 2, 1, 0]


def test_a_tenant_cannot_hold_past_its_quota() -> None:
    """A tenant's holds stop at its quota; another tenant (quota: the cap) is not affected."""
    book, pool, _ = make(tenant_quota_blocks={"t1": 5})
    assert book.hold("c1", "t1", "hard_protected", pool.run(0, 4), ttl_s=30)["decision"] == (
        "accepted"
    )
    over = book.hold("c2", "t1", "hard_protected", pool.run(4, 2), ttl_s=30)
    assert over["decision"] == "rejected"
    assert "over its quota of 5" in over["reason"]
    assert book.hold("c3", "t2", "hard_protected", pool.run(4, 2), ttl_s=30)["decision"] == (
        "accepted"
    )
    book.release("c1", "t1")
    assert book.hold("c2", "t1", "hard_protected", pool.run(6, 5), ttl_s=30)["decision"] == (
        "accepted"
    )


@pytest.mark.parametrize("ttl", [61, 0, -1, math.inf, math.nan, "10"])
def test_a_ttl_outside_zero_to_the_maximum_is_refused(ttl: Any) -> None:
    """A TTL past the maximum (or not a positive number) is refused and holds nothing."""
    book, pool, _ = make(max_ttl_s=60)
    result = book.hold("c1", "t1", "hard_protected", pool.run(0, 2), ttl_s=ttl)
    assert result["decision"] == "rejected"
    assert "ttl_s must be within" in result["reason"]
    assert (book.held_blocks, pool.num_free()) == (0, 20)


def test_a_claim_without_a_ttl_gets_the_maximum() -> None:
    """Nothing is held for ever: a hold without a TTL expires at the maximum TTL."""
    book, pool, clock = make(max_ttl_s=60)
    assert book.hold("c1", "t1", "hard_protected", pool.run(0, 2))["ttl_s"] == 60.0
    assert book.holds["c1"].expires_at == clock.now + 60
    assert book.hold("c2", "t1", "expiring", pool.run(2, 2), ttl_s=60)["decision"] == "accepted"


def test_an_expiring_claim_without_a_ttl_is_refused() -> None:
    """``expiring`` needs its TTL."""
    book, pool, _ = make()
    result = book.hold("c1", "t1", "expiring", pool.run(0, 2))
    assert result["decision"] == "rejected"
    assert result["reason"] == "an expiring claim needs ttl_s"
    assert book.held_blocks == 0


def test_offloadable_is_refused() -> None:
    """``offloadable`` has no restore-or-fail path on vLLM: refused, nothing held."""
    book, pool, _ = make()
    result = book.hold("c1", "t1", "offloadable", pool.run(0, 2), ttl_s=10)
    assert result["decision"] == "rejected"
    assert "not lowered" in result["reason"]
    assert (book.held_blocks, names(book)) == (0, ["resident_claim_rejected"])


@pytest.mark.parametrize("next_use", ["soon", math.nan, [1]])
def test_a_next_use_that_is_not_a_number_is_refused(next_use: Any) -> None:
    """A malformed ``next_use_s`` is a refusal with an event, not an exception (which would
    reach vLLM's scheduler from ``request_finished``), and NaN cannot scramble the shed order."""
    book, pool, _ = make()
    result = book.hold("c1", "t1", "soft_priority", pool.run(0, 2), ttl_s=10, next_use_s=next_use)
    assert result["decision"] == "rejected"
    assert "next_use_s must be a number" in result["reason"]
    assert (book.held_blocks, names(book)) == (0, ["resident_claim_rejected"])


def test_an_unknown_mode_is_refused() -> None:
    """A mode outside the contract is refused, naming it."""
    book, pool, _ = make()
    result = book.hold("c1", "t1", "forever", pool.run(0, 2))
    assert result["reason"] == "unknown protection mode 'forever'"


def test_best_effort_holds_nothing() -> None:
    """``best_effort`` is accepted with zero blocks: plain prefix caching, nothing to release."""
    book, pool, _ = make()
    result = book.hold("c1", "t1", "best_effort", pool.run(0, 3))
    assert (result["decision"], result["blocks"]) == ("accepted", 0)
    [event] = book.events_since(0)
    assert (event["event"], event["blocks"]) == ("resident_claim_accepted", 0)
    assert (book.held_blocks, pool.num_free(), refs(pool), book.holds) == (0, 20, [0] * 20, {})
    assert book.release("c1", "t1")["ok"] is False


def test_a_duplicate_claim_id_is_refused_and_the_first_hold_kept() -> None:
    """A second hold under a held claim id is refused; the first keeps its blocks."""
    book, pool, _ = make()
    book.hold("c1", "t1", "hard_protected", pool.run(0, 3), ttl_s=30)
    before = refs(pool)
    result = book.hold("c1", "t1", "hard_protected", pool.run(5, 3), ttl_s=30)
    assert result["decision"] == "rejected"
    assert "already holds" in result["reason"]
    assert refs(pool) == before
    assert [b.block_id for b in book.holds["c1"].blocks] == [0, 1, 2]


def test_fewer_resident_blocks_than_wanted_are_refused() -> None:
    """A claim on 5 blocks with only 3 resident is refused: its predicate would not hold."""
    book, pool, _ = make()
    result = book.hold("c1", "t1", "hard_protected", pool.run(0, 3), wanted_blocks=5, ttl_s=30)
    assert result["decision"] == "rejected"
    assert result["reason"] == "only 3 of 5 blocks are resident"
    assert book.held_blocks == 0
    empty = book.hold("c2", "t1", "hard_protected", [], ttl_s=30)
    assert empty["reason"] == "the prefix has no full block to claim"


def test_a_claim_on_fewer_blocks_than_resident_holds_the_head() -> None:
    """``wanted_blocks`` below the resident run holds that many from the head."""
    book, pool, _ = make()
    book.hold("c1", "t1", "hard_protected", pool.run(0, 6), wanted_blocks=2, ttl_s=30)
    assert [b.block_id for b in book.holds["c1"].blocks] == [0, 1]
    assert book.held_blocks == 2


def test_revoke_all_ends_every_hold_with_an_event_and_counts_them() -> None:
    """Revoking all ends each hold with the reason given and returns how many it ended."""
    book, pool, _ = make()
    book.hold("c1", "t1", "hard_protected", pool.run(0, 3), ttl_s=30)
    book.hold("c2", "t2", "soft_priority", pool.run(0, 4), ttl_s=30)
    seq = book.seq
    assert book.revoke_all("engine_shutdown") == 2
    assert [(e["claim_id"], e["reason"]) for e in book.events_since(seq)] == [
        ("c1", "engine_shutdown"),
        ("c2", "engine_shutdown"),
    ]
    assert (book.held_blocks, pool.num_free(), refs(pool)) == (0, 20, [0] * 20)


def test_expire_due_ends_a_hold_at_its_ttl() -> None:
    """A hold ends when its TTL does (not before), reason ttl_ended, blocks back tail first."""
    book, pool, clock = make()
    book.hold("c1", "t1", "expiring", pool.run(0, 3), ttl_s=10)
    book.hold("c2", "t1", "hard_protected", pool.run(5, 2), ttl_s=20)
    clock.advance(9.999)
    seq = book.seq
    book.expire_due()
    assert book.seq == seq
    clock.advance(0.001)
    book.expire_due()
    [event] = book.events_since(seq)
    assert (event["event"], event["claim_id"], event["reason"], event["blocks"]) == (
        "resident_claim_expired",
        "c1",
        "ttl_ended",
        3,
    )
    assert pool.freed == [2, 1, 0]
    assert list(book.holds) == ["c2"]
    book.expire_due()
    assert book.seq == seq + 1


# ---------------------------------------------------------------------- admission
def test_a_request_that_fits_is_served() -> None:
    """A request that needs no more than the free blocks is served, with no event."""
    book, pool, _ = make()
    book.hold("c1", "t1", "hard_protected", pool.run(0, 4), ttl_s=30)
    seq = book.seq
    verdict = book.admit("r1", 16)
    assert (verdict.action, verdict.blocking_claim_ids, verdict.retry_after_s) == (
        "serve",
        (),
        None,
    )
    assert book.seq == seq
    assert "c1" in book.holds


def test_soft_holds_are_shed_farthest_next_use_first_until_it_fits() -> None:
    """Soft holds give way farthest predicted next use first, each a demotion, and only until
    the request fits: the last one gives only the blocks still needed, its deepest, and keeps
    its head (its claim demoted) until released; those blocks go to the free queue's head."""
    book, pool, _ = make(total=20, reserve=2)
    book.hold("near", "t1", "soft_priority", pool.run(0, 4), ttl_s=30, next_use_s=1)
    book.hold("far", "t1", "soft_priority", pool.run(4, 4), ttl_s=30, next_use_s=5)
    book.hold("never", "t1", "demotable", pool.run(8, 4), ttl_s=30)  # no next use: farthest
    book.hold("mid", "t2", "demotable", pool.run(12, 4), ttl_s=30, next_use_s=3)
    assert pool.num_free() == 4
    seq = book.seq
    verdict = book.admit("r1", 11)
    assert verdict.action == "serve"
    demoted = book.events_since(seq)
    assert [(e["event"], e["claim_id"]) for e in demoted] == [
        ("resident_claim_demoted", "never"),
        ("resident_claim_demoted", "far"),
    ]
    assert all(e["reason"] == "memory_pressure" and e["request_id"] == "r1" for e in demoted)
    assert [e["blocks"] for e in demoted] == [4, 4]
    assert sorted(h for h in book.holds if not book.holds[h].demoted) == ["mid", "near"]
    far = book.holds["far"]  # 11 needed, 4 free, 4 from "never": 3 of its 4, tail first
    assert far.demoted
    assert [b.block_id for b in far.blocks] == [4]
    assert [b.block_id for b in list(pool.free)[:7]] == [7, 6, 5, 11, 10, 9, 8]
    assert pool.num_free() == 11
    assert book.claimed_blocks == 8
    assert book.held_blocks == 9
    assert book.renew("far", "t1", 10)["ok"] is False  # its claim ended: nothing to renew
    seq = book.seq
    assert book.release("far", "t1") == {
        "claim_id": "far",
        "op": "release",
        "ok": True,
        "state": "demoted",
    }
    assert book.seq == seq  # no second end: the demotion was its end
    assert "far" not in book.holds
    assert pool.num_free() == 12


def test_hard_holds_are_never_shed_and_soft_ones_not_in_vain() -> None:
    """Hard holds stay when a request needs their blocks; a soft hold whose shedding could
    not make the request fit is kept (no demotion for nothing)."""
    book, pool, _ = make(total=20, reserve=2, max_defer_s=30)
    book.hold("hard", "t1", "hard_protected", pool.run(0, 8), ttl_s=10)
    book.hold("soft", "t1", "soft_priority", pool.run(8, 4), ttl_s=30)
    seq = book.seq
    verdict = book.admit("r1", 16)
    assert verdict.action == "defer"
    assert list(book.holds) == ["hard", "soft"]
    assert verdict.blocking_claim_ids == ("hard",)
    assert [e["event"] for e in book.events_since(seq)] == ["active_request_deferred"]


def test_a_request_blocked_by_hard_holds_ending_soon_is_deferred_naming_them() -> None:
    """Hard holds in the way whose earliest TTL ends within max_defer_s defer the request,
    naming them, with the shortfall and when to retry; once one ends it is served."""
    book, pool, clock = make(total=20, reserve=2, max_defer_s=30)
    book.hold("h1", "t1", "hard_protected", pool.run(0, 8), ttl_s=20)
    book.hold("h2", "t2", "expiring", pool.run(8, 6), ttl_s=5)
    seq = book.seq
    verdict = book.admit("r1", 10)
    assert verdict.action == "defer"
    assert verdict.blocking_claim_ids == ("h1", "h2")
    assert verdict.shortfall_blocks == 4
    assert verdict.retry_after_s == 5.0
    [event] = book.events_since(seq)
    assert event["event"] == "active_request_deferred"
    assert event["claim_id"] is None
    assert event["request_id"] == "r1"
    assert event["blocking_claim_ids"] == ["h1", "h2"]
    assert (event["shortfall_blocks"], event["retry_after_s"]) == (4, 5.0)
    assert event["feasibility"] == "feasible_after_claim_expiry"
    clock.advance(5)
    seq = book.seq
    assert book.admit("r1", 10).action == "serve"
    [expired] = book.events_since(seq)
    assert (expired["claim_id"], expired["reason"]) == ("h2", "ttl_ended")


def test_forget_says_how_long_held_claims_kept_a_request_waiting() -> None:
    """A deferred request, once it leaves, reports the seconds from its first deferral to the
    moment it could run (what the gateway returns as ``deferred_s``), not its run time; one
    never deferred reports nothing."""
    book, pool, clock = make(total=20, reserve=2, max_defer_s=30)
    book.hold("h1", "t1", "expiring", pool.run(0, 14), ttl_s=5)
    assert book.admit("r1", 10).action == "defer"
    clock.advance(2)
    assert book.admit("r1", 10).action == "defer"  # asked again: the wait runs from the first
    clock.advance(3)
    assert book.admit("r1", 10).action == "serve"
    assert book.admit("r2", 1).action == "serve"
    clock.advance(1)  # it runs: not a wait
    assert book.forget("r1") == pytest.approx(5.0)
    assert book.forget("r1") is None  # once
    assert book.forget("r2") is None


def test_a_request_blocked_past_max_defer_is_refused_naming_the_holds() -> None:
    """Hard holds that outlast max_defer_s turn the wait into a refusal naming them."""
    book, pool, _ = make(total=20, reserve=2, max_defer_s=30)
    book.hold("h1", "t1", "hard_protected", pool.run(0, 14), ttl_s=100)
    seq = book.seq
    verdict = book.admit("r1", 10)
    assert (verdict.action, verdict.blocking_claim_ids) == ("refuse", ("h1",))
    assert (verdict.shortfall_blocks, verdict.retry_after_s) == (4, 100.0)
    [event] = book.events_since(seq)
    assert event["event"] == "active_request_refused"
    assert event["feasibility"] == "infeasible_preserve_resident_and_active"
    assert event["blocking_claim_ids"] == ["h1"]
    assert "h1" in book.holds


def test_one_event_per_request_per_verdict() -> None:
    """Asking again with the same verdict repeats no event; a changed verdict emits one."""
    book, pool, clock = make(total=20, reserve=2, max_defer_s=30)
    book.hold("h1", "t1", "hard_protected", pool.run(0, 14), ttl_s=40)
    seq = book.seq
    assert book.admit("r1", 10).action == "refuse"
    assert book.admit("r1", 10).action == "refuse"
    clock.advance(15)  # 25 s left: within max_defer_s
    assert book.admit("r1", 10).action == "defer"
    assert book.admit("r1", 10).action == "defer"
    assert book.admit("r2", 10).action == "defer"  # another request: its own event
    assert [(e["event"], e["request_id"]) for e in book.events_since(seq)] == [
        ("active_request_refused", "r1"),
        ("active_request_deferred", "r1"),
        ("active_request_deferred", "r2"),
    ]
    book.forget("r1")
    assert book.admit("r1", 10).action == "defer"
    assert names(book, seq)[-1] == "active_request_deferred"
    assert book.seq == seq + 4


def test_a_deferral_after_the_request_was_served_is_reported_again() -> None:
    """A serve verdict ends a deferral episode, also when the request is too big for the
    moment: the next deferral is a new verdict, with its own event."""
    book, pool, _ = make(total=20, reserve=2, max_defer_s=30)
    book.hold("h1", "t1", "hard_protected", pool.run(0, 14), ttl_s=10)
    assert book.admit("r1", 10).action == "defer"
    book.release("h1", "t1")
    active = pool.allocate(15)  # active work: 5 free, nothing held
    assert book.admit("r1", 10).action == "serve"  # left to the scheduler
    pool.unhold(active)
    book.hold("h2", "t1", "hard_protected", pool.run(0, 14), ttl_s=10)
    seq = book.seq
    verdict = book.admit("r1", 10)
    assert (verdict.action, verdict.blocking_claim_ids) == ("defer", ("h2",))
    [event] = book.events_since(seq)
    assert (event["event"], event["blocking_claim_ids"]) == ("active_request_deferred", ["h2"])


def test_a_request_too_big_even_without_the_holds_is_left_to_the_scheduler() -> None:
    """When active work, not the holds, keeps a request out, it is served (the scheduler
    queues it) with no event, and the hard holds stay."""
    book, pool, _ = make(total=20, reserve=2, max_defer_s=30)
    book.hold("h1", "t1", "hard_protected", pool.run(0, 4), ttl_s=10)
    pool.allocate(12)  # 4 free
    seq = book.seq
    verdict = book.admit("r1", 9)  # > 4 free + 4 held
    assert verdict.action == "serve"
    assert book.seq == seq
    assert "h1" in book.holds
    assert book.admit("r2", 50).action == "serve"


# ---------------------------------------------------------------------- events
def test_events_since_returns_exactly_the_events_after_a_seq() -> None:
    """``events_since(seq)`` returns the events numbered above ``seq``, in order, at most
    ``limit``."""
    book, _, _ = make()
    for i in range(10):
        book.emit("e", f"c{i}")
    assert [e["seq"] for e in book.events_since(0)] == list(range(1, 11))
    assert [e["seq"] for e in book.events_since(-5)] == list(range(1, 11))
    assert [e["seq"] for e in book.events_since(4)] == [5, 6, 7, 8, 9, 10]
    assert [e["seq"] for e in book.events_since(4, limit=3)] == [5, 6, 7]
    assert book.events_since(4, limit=0) == []
    assert book.events_since(10) == []
    assert book.events_since(99) == []
    assert [e["claim_id"] for e in book.events_since(8)] == ["c8", "c9"]


def test_events_page_through_the_whole_stream() -> None:
    """Paging by the last seq seen reads every event once, in order."""
    book, _, _ = make()
    for i in range(23):
        book.emit("e", f"c{i}")
    seen: list[int] = []
    while page := book.events_since(seen[-1] if seen else 0, limit=5):
        assert len(page) <= 5
        seen.extend(e["seq"] for e in page)
    assert seen == list(range(1, 24))


def test_events_since_after_the_buffer_dropped_old_events() -> None:
    """A bounded buffer keeps the newest events; ``events_since`` pages over what is left."""
    book, _, _ = make(event_buffer=5)
    for i in range(12):
        book.emit("e", f"c{i}")
    assert book.seq == 12
    assert [e["seq"] for e in book.events_since(0)] == [8, 9, 10, 11, 12]
    assert [e["seq"] for e in book.events_since(7)] == [8, 9, 10, 11, 12]
    assert [e["seq"] for e in book.events_since(9)] == [10, 11, 12]
    assert [e["seq"] for e in book.events_since(9, limit=2)] == [10, 11]
    assert [e["seq"] for e in book.events_since(3, limit=2)] == [8, 9]
    assert book.events_since(12) == []


def test_an_event_carries_its_seq_name_claim_and_wall_time() -> None:
    """Every event record has seq, event, claim_id and timestamp_ns, plus its data."""
    book, _, clock = make()
    record = book.emit("x", "c1", extra=3)
    assert record == {
        "seq": 1,
        "event": "x",
        "claim_id": "c1",
        "timestamp_ns": clock.ns(),
        "extra": 3,
    }


# ---------------------------------------------------------------------- stateful
TOTAL, RESERVE, SOFT_RESERVE, MAX_DEFER_S = 12, 4, 1, 40.0
QUOTAS = {"t1": 5}
TENANTS = ("t1", "t2")
CLAIMS = tuple(f"c{i}" for i in range(6))
REQUESTS = ("r1", "r2", "r3")
MODES = st.sampled_from((*HELD_MODES * 3, "best_effort", "offloadable", "bogus"))
TTLS = st.one_of(st.sampled_from([None, 0, 1, 5, 10, 30, 60, 61]), st.floats(1, 45))


class ClaimBookMachine(RuleBasedStateMachine):
    """Random holds, releases, renewals, expiries, admissions and clock moves on one book."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.pool = FakePool(TOTAL)
        self.book = ClaimBook(
            self.pool,
            TOTAL,
            RESERVE,
            max_ttl_s=60,
            tenant_quota_blocks=QUOTAS,
            clock=self.clock,
            wall_ns=self.clock.ns,
            max_defer_s=MAX_DEFER_S,
            soft_reserve_blocks=SOFT_RESERVE,
        )
        self.log: list[dict[str, Any]] = []

    def _quota(self, tenant: str) -> int:
        return QUOTAS.get(tenant, self.book.cap_blocks)

    def _snapshot(self) -> tuple[list[int], dict[str, list[int]]]:
        return refs(self.pool), {
            c: [b.block_id for b in h.blocks] for c, h in self.book.holds.items()
        }

    @rule(
        claim=st.sampled_from(CLAIMS),
        tenant=st.sampled_from(TENANTS),
        mode=MODES,
        ids=st.lists(st.integers(0, TOTAL - 1), unique=True, min_size=1, max_size=5),
        wanted=st.one_of(st.none(), st.integers(0, 5)),
        ttl=TTLS,
        next_use=st.one_of(st.none(), st.floats(0, 100)),
    )
    def hold(
        self,
        claim: str,
        tenant: str,
        mode: str,
        ids: list[int],
        wanted: int | None,
        ttl: float | None,
        next_use: float | None,
    ) -> None:
        before = self._snapshot()
        # what a refusal may change: holds whose TTL has already passed end first (the book
        # expires them before deciding, as at admission); nothing else
        due = [h for h in self.book.holds.values() if h.expires_at <= self.clock.now]
        after_expiry = (
            [
                r - sum(b.block_id == i for h in due for b in h.blocks)
                for i, r in enumerate(before[0])
            ],
            {c: ids_ for c, ids_ in before[1].items() if c not in {h.claim_id for h in due}},
        )
        blocks = [self.pool.blocks[i] for i in ids]
        result = self.book.hold(
            claim, tenant, mode, blocks, wanted_blocks=wanted, ttl_s=ttl, next_use_s=next_use
        )
        if result["decision"] == "accepted" and mode in HELD_MODES:
            hold = self.book.holds[claim]
            assert hold.blocks == blocks[: len(hold.blocks)]
            assert len(hold.blocks) == (len(blocks) if wanted is None else wanted)
            assert hold.expires_at == self.clock.now + (60 if ttl is None else ttl)
        else:
            assert self._snapshot() in (before, after_expiry)

    @rule(
        claim=st.sampled_from(CLAIMS),
        tenant=st.sampled_from(TENANTS),
        mode=st.sampled_from(HELD_MODES),
        n=st.integers(1, 5),
        ttl=st.sampled_from([1, 5, 10, 30]),
        next_use=st.one_of(st.none(), st.floats(0, 100)),
    )
    def hold_fresh(
        self, claim: str, tenant: str, mode: str, n: int, ttl: float, next_use: float | None
    ) -> None:
        """A hold on blocks not held yet (a finished request's own), pushing toward the cap."""
        ids = [b.block_id for b in list(self.pool.free)[:n]]
        self.hold(claim, tenant, mode, ids, None, ttl, next_use)

    @rule(claim=st.sampled_from(CLAIMS), tenant=st.sampled_from(TENANTS), done=st.booleans())
    def release(self, claim: str, tenant: str, done: bool) -> None:
        held = self.book.holds.get(claim)
        owned = held is not None and held.tenant == tenant
        before = self._snapshot()
        free_before = list(self.pool.free)
        assert self.book.release(claim, tenant, evict_first=done)["ok"] is owned
        if owned:
            assert held is not None
            assert claim not in self.book.holds
            # the blocks no other hold keeps join the free list: at its tail, or at its head
            # (the next victims, the tail first) for a finished agent's
            freed = [b for b in reversed(held.blocks) if b.ref_cnt == 0]
            expected = freed + free_before if done else free_before + freed
            assert list(self.pool.free) == expected
        else:
            assert self._snapshot() == before

    @rule(claim=st.sampled_from(CLAIMS), tenant=st.sampled_from(TENANTS), ttl=TTLS)
    def renew(self, claim: str, tenant: str, ttl: float | None) -> None:
        held = self.book.holds.get(claim)
        result = self.book.renew(claim, tenant, ttl)  # type: ignore[arg-type]
        live = held is not None and held.tenant == tenant and not held.demoted
        ok = live and ttl is not None and 0 < ttl <= 60
        assert result["ok"] is ok
        if ok:
            assert held is not None
            assert held.expires_at == self.clock.now + ttl

    @rule()
    def expire(self) -> None:
        self.book.expire_due()
        assert all(h.expires_at > self.clock.now for h in self.book.holds.values())

    @rule(seconds=st.one_of(st.sampled_from([0.5, 1.0, 5.0, 10.0, 30.0]), st.floats(0, 45)))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(request=st.sampled_from(REQUESTS), needed=st.integers(0, TOTAL + 2))
    def fits(self, request: str, needed: int) -> None:
        """The admission hook's query changes nothing (vLLM asks it again each step), and
        where it says a request fits, ``admit`` serves it without an event."""
        before = (self._snapshot(), self.book.seq, self.book.held_blocks, self.pool.num_free())
        fits = self.book.fits(needed)
        assert (self._snapshot(), self.book.seq, self.book.held_blocks, self.pool.num_free()) == (
            before
        )
        if fits and all(h.expires_at > self.clock.now for h in self.book.holds.values()):
            seq = self.book.seq
            assert self.book.admit(request, needed).action == "serve"
            assert self.book.seq == seq

    @rule(min_free=st.integers(0, TOTAL + 2))
    def relieve(self, min_free: int) -> None:
        """Before a step: soft holds shed, farthest expected use first, until ``min_free``
        blocks are free, no more; hard holds never."""
        self._sheds_farthest_first(lambda: self.book.relieve(min_free))
        left = [c for c, h in self.book.holds.items() if h.mode in SOFT]
        assert self.pool.num_free() >= min_free or not left

    def _sheds_farthest_first(self, act: Callable[[], object]) -> list[str]:
        """Run ``act``; what pressure took: soft holds only, each live claim it touched
        demoted once (an event), every hold it did not touch nearer than every one it did,
        the last one touched alone kept a head. Returns the claims demoted, in order."""
        now = self.clock.now
        before = {  # the holds pressure may take (those past their TTL end first, as such)
            c: (h.expected_wait(now), len(h.blocks), h.demoted, h.mode)
            for c, h in self.book.holds.items()
            if h.expires_at > now
        }
        seq = self.book.seq
        act()
        events = self.book.events_since(seq)
        demoted = [e["claim_id"] for e in events if e["event"] == "resident_claim_demoted"]
        after = {c: len(h.blocks) for c, h in self.book.holds.items()}
        touched = [c for c, b in before.items() if after.get(c, 0) < b[1]]
        if touched or demoted:
            assert not [c for c in touched if before[c][3] in HARD]
            assert sorted(demoted) == sorted(c for c in touched if not before[c][2])
            assert len(demoted) == len(set(demoted))
            kept = [c for c in touched if c in after]
            assert len(kept) <= 1
            if touched:
                nearest = min(before[c][0] for c in touched)
                untouched = [c for c, b in before.items() if b[3] in SOFT and c not in touched]
                assert all(before[c][0] <= nearest for c in untouched)
                if kept:
                    assert before[kept[0]][0] == nearest
                    assert self.book.holds[kept[0]].demoted
        return demoted

    @rule(request=st.sampled_from(REQUESTS), needed=st.integers(0, TOTAL + 2))
    def admit(self, request: str, needed: int) -> None:
        verdicts = []
        self._sheds_farthest_first(lambda: verdicts.append(self.book.admit(request, needed)))
        verdict = verdicts[0]
        assert all(h.expires_at > self.clock.now for h in self.book.holds.values())
        free = self.pool.num_free()
        hard = sorted(c for c, h in self.book.holds.items() if h.mode in HARD)
        if verdict.action == "serve":
            assert needed <= free or not hard or needed > free + self.book.held_blocks
        else:
            # soft holds remain only where shedding them could not have made it fit
            holds = self.book.holds.values()
            soft_only = {id(b) for h in holds if h.mode in SOFT for b in h.blocks} - {
                id(b) for h in holds if h.mode not in SOFT for b in h.blocks
            }
            assert not soft_only or needed > free + len(soft_only)
            assert free < needed <= free + self.book.held_blocks
            assert verdict.blocking_claim_ids == tuple(hard)
            assert verdict.shortfall_blocks == needed - free
            assert verdict.retry_after_s is not None
            assert (verdict.action == "defer") is (verdict.retry_after_s <= MAX_DEFER_S)

    @rule(request=st.sampled_from(REQUESTS), extra=st.integers(1, 8))
    def admit_under_pressure(self, request: str, extra: int) -> None:
        """A request needing just past the free blocks: shed, defer or refuse."""
        self.admit(request, self.pool.num_free() + extra)

    @rule(request=st.sampled_from(REQUESTS))
    def forget(self, request: str) -> None:
        self.book.forget(request)

    @rule()
    def revoke_all(self) -> None:
        n = sum(not h.demoted for h in self.book.holds.values())  # live claims: each an end
        assert self.book.revoke_all("reset") == n
        assert not self.book.holds

    # -------------------------------------------------------------- invariants
    @invariant()
    def read_events(self) -> None:
        new = self.book.events_since(self.log[-1]["seq"] if self.log else 0, limit=10_000)
        self.log.extend(new)
        assert [e["seq"] for e in self.log] == list(range(1, self.book.seq + 1))

    @invariant()
    def held_blocks_within_the_cap(self) -> None:
        distinct = {id(b) for h in self.book.holds.values() for b in h.blocks}
        assert self.book.held_blocks == len(distinct) <= self.book.cap_blocks
        assert self.book.cap_blocks == TOTAL - SOFT_RESERVE

    @invariant()
    def hard_holds_leave_a_max_length_request_room(self) -> None:
        hard = {id(b) for h in self.book.holds.values() if h.mode in HARD for b in h.blocks}
        assert len(hard) <= self.book.hard_cap_blocks == TOTAL - RESERVE

    @invariant()
    def every_ref_is_a_hold(self) -> None:
        per_block = Counter(b.block_id for h in self.book.holds.values() for b in h.blocks)
        assert refs(self.pool) == [per_block[i] for i in range(TOTAL)]
        free = [b.block_id for b in self.pool.free]
        assert len(free) == len(set(free))
        assert set(free) == {b.block_id for b in self.pool.blocks if b.ref_cnt == 0}

    @invariant()
    def tenants_within_their_quota(self) -> None:
        for tenant in TENANTS:
            mine = [h for h in self.book.holds.values() if h.tenant == tenant and not h.demoted]
            assert len({id(b) for h in mine for b in h.blocks}) <= self._quota(tenant)
            assert sum(len(h.blocks) for h in mine) <= self._quota(tenant)

    @invariant()
    def free_and_held_make_the_pool(self) -> None:
        assert self.pool.num_free() + self.book.held_blocks == TOTAL

    @invariant()
    def the_event_stream_tells_which_claims_are_held(self) -> None:
        held: set[str] = set()
        for e in self.log:
            claim = e["claim_id"]
            if e["event"] == "resident_claim_accepted" and e["mode"] in HELD_MODES:
                assert claim not in held, f"{claim} accepted twice without an end: {e}"
                held.add(claim)
            elif e["event"] == "resident_claim_materialized":
                assert claim in held
            elif e["event"] in END_EVENTS:
                assert claim in held, f"{claim} ended while not held: {e}"
                held.remove(claim)
        assert held == {c for c, h in self.book.holds.items() if not h.demoted}


TestClaimBookMachine = ClaimBookMachine.TestCase
TestClaimBookMachine.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_at_the_cap_a_hold_with_no_prediction_sheds_older_ones_with_none() -> None:
    """Two soft holds with no predicted next use: the newer one takes the older one's blocks at
    the cap (LRU's order, where nothing better is known); it never takes those of a hold whose
    next use is predicted."""
    book, pool, clock = make(total=10, reserve=4)  # cap 6
    book.hold("old", "t1", "demotable", pool.run(0, 3), ttl_s=30)
    clock.advance(1)
    book.hold("known", "t1", "demotable", pool.run(3, 3), ttl_s=30, next_use_s=20)
    clock.advance(1)
    new = book.hold("new", "t1", "demotable", pool.run(6, 3), ttl_s=30)
    assert new["decision"] == "accepted"
    assert set(book.holds) == {"known", "new"}
    # with nothing older and unpredicted left to shed, the next one is refused
    clock.advance(1)
    newer = book.hold("newer", "t1", "demotable", pool.run(0, 4), ttl_s=30)
    assert newer["decision"] == "rejected"


def test_a_hold_whose_ttl_has_passed_leaves_room_at_the_cap() -> None:
    """Holds whose TTL ended between scheduler steps no longer count against the cap: a new
    hold ends them (each with its ``resident_claim_expired``) before it is judged."""
    book, pool, clock = make(total=10, reserve=4)  # cap 6
    book.hold("old", "t1", "hard_protected", pool.run(0, 6), ttl_s=5)
    clock.advance(6)
    new = book.hold("new", "t2", "hard_protected", pool.run(6, 4), ttl_s=5)
    assert new["decision"] == "accepted"
    assert set(book.holds) == {"new"}
    expired = [e for e in book.events_since(0) if e["event"] == "resident_claim_expired"]
    assert [e["claim_id"] for e in expired] == ["old"]
