"""The engine ranking resident blocks by predicted next use (``NextUsePolicy``) from the reuse
hints claims carry: dead blocks first, then the agent whose next use is farthest."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentclaims.contract import CacheIdentity, ClaimSpec, ProtectionMode, ReuseHint, hint_owner
from agentclaims.engine import BlockHash, KVEngine, NextUsePolicy, WaitModel
from agentclaims.errors import UnknownNameError, UsageError
from agentclaims.protocol import Renewal

IDENT = CacheIdentity("agentclaims-embedded", "scripted", "agentclaims-bytes", "default", 4)


class Clock:
    def __init__(self) -> None:
        self.s = 0.0

    def __call__(self) -> int:
        return int(self.s * 1e9)


def engine(blocks: int, waits: WaitModel | None = None) -> tuple[KVEngine, Clock]:
    clock = Clock()
    return KVEngine(blocks, 4, eviction_policy=NextUsePolicy(waits), clock=clock), clock


def chain(base: int, n: int) -> list[BlockHash]:
    return [BlockHash(base + i) for i in range(n)]


def serve(e: KVEngine, rid: str, hashes: list[BlockHash], owner: str) -> None:
    assert e.begin(rid, hashes, owner=owner).served
    e.finish(rid)


def hint_claim(e: KVEngine, cid: str, scope: str, hashes: list[BlockHash], hint: ReuseHint) -> None:
    spec = ClaimSpec(
        claim_id=cid,
        owner_scope=scope,
        object_id=f"p-{cid}",
        cache_identity=IDENT,
        footprint_blocks=len(hashes),
        protection_mode=ProtectionMode.BEST_EFFORT,
        reuse_hint=hint,
    )
    assert e.submit_claim(spec, hashes).accepted


def test_waits_are_conditioned_on_the_time_already_waited() -> None:
    """Waits of 1 s (mostly) and 100 s: a fresh wait is short, one past 1 s is long."""
    w = WaitModel(min_samples=1)
    for _ in range(8):
        w.observe("tool", 1.0)
    for _ in range(2):
        w.observe("tool", 100.0)
    assert w.remaining("tool", 0.0) == pytest.approx(1.0)
    assert w.remaining("tool", 2.0) == pytest.approx(98.0)
    assert w.remaining("tool", 200.0) == float("inf")  # past anything seen


def test_farther_predicted_use_is_evicted_before_a_more_recent_one() -> None:
    """Tool waits are short, user waits long: LRU would evict the older tool agent first; the
    ranking evicts the user agent, whose next use is predicted much later."""
    prior = {"tool": [2.0] * 40, "user": [300.0] * 40}
    e, clock = engine(8, WaitModel(prior=prior))
    a, b = chain(100, 4), chain(200, 4)
    serve(e, "r1", a, hint_owner("w", "tooler"))
    hint_claim(e, "c1", "w", a[:1], ReuseHint(agent="tooler", wait_class="tool"))
    clock.s = 1.0
    serve(e, "r2", b, hint_owner("w", "talker"))
    hint_claim(e, "c2", "w", b[:1], ReuseHint(agent="talker", wait_class="user"))
    clock.s = 1.5
    assert e.begin("r3", chain(300, 4), owner=hint_owner("w", "third")).served
    assert e.resident_run(a) == 4  # the tool agent kept its whole context
    assert e.resident_run(b) == 0
    assert e.stats.true_harm == 0


def test_closed_agent_and_rewritten_tail_go_first() -> None:
    e, clock = engine(12)
    a, b, c = chain(100, 4), chain(200, 4), chain(300, 4)
    serve(e, "r1", a, "w/a")
    serve(e, "r2", b, "w/b")
    serve(e, "r3", c, "w/c")
    hint_claim(e, "cb", "w", b[:2], ReuseHint(agent="b", wait_class="tool"))
    # b rewrites its context keeping 2 blocks; its next request frees the dead tail
    e.renew_claim("cb", "w", reuse_hint=ReuseHint(agent="b", keep_blocks=2))
    clock.s = 1.0
    serve(e, "r4", [*b[:2], BlockHash(250), BlockHash(251)], "w/b")
    hint_claim(e, "cc", "w", c[:1], ReuseHint(agent="c", session="closed"))
    clock.s = 2.0
    # r4 took b's 2 dead tail blocks (not a's, the oldest); r5 takes closed c's 4
    assert e.begin("r5", chain(400, 4), owner="w/d").served
    assert e.resident_run(a) == 4
    assert e.resident_run(c) == 0
    assert e.resident_run([*b[:2], BlockHash(250), BlockHash(251)]) == 4
    assert not any(e.is_cached(h) for h in b[2:])


def test_running_blocks_are_never_victims() -> None:
    """The pool holds a running request's blocks: nothing of it can be evicted."""
    e, _ = engine(6)
    a = chain(100, 4)
    assert e.begin("r1", a, owner="w/a").served
    out = e.begin("r2", chain(200, 4), owner="w/b")
    assert not out.served  # deferred, not served by evicting r1's blocks
    assert all(e.is_cached(h) for h in a)


def test_hint_rides_on_the_wire_and_is_checked() -> None:
    hint = ReuseHint(agent="n", wait_class="subagents", subagents=3)
    spec = ClaimSpec(
        claim_id="c",
        owner_scope="w",
        object_id="p",
        cache_identity=IDENT,
        footprint_blocks=1,
        protection_mode=ProtectionMode.BEST_EFFORT,
        reuse_hint=hint,
    )
    data = spec.to_dict()
    assert data["reuse_hint"] == {
        "agent": "n",
        "wait_class": "subagents",
        "subagents": 3,
        "session": "open",
    }
    assert ClaimSpec.from_dict(data) == spec
    assert "reuse_hint" not in ClaimSpec.from_dict({**data, "reuse_hint": None}).to_dict()
    assert Renewal.from_dict({"reuse_hint": {"session": "closed"}}).reuse_hint == ReuseHint(
        session="closed"
    )
    with pytest.raises(UnknownNameError):
        ReuseHint(wait_class="later")
    with pytest.raises(UsageError, match="keep_blocks"):
        ClaimSpec.from_dict({**data, "reuse_hint": {"keep_blocks": -1}})


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 5), st.integers(1, 6), st.sampled_from(["tool", "user", "closed"])
        ),
        min_size=1,
        max_size=30,
    ),
    st.integers(6, 20),
)
def test_ranking_keeps_the_pool_consistent(
    steps: list[tuple[int, int, str]], capacity: int
) -> None:
    """Whatever the hints, the pool's bookkeeping holds and best-effort claims never harm."""
    e, clock = engine(capacity, WaitModel(min_samples=2))
    contexts: dict[int, list[BlockHash]] = {}
    for i, (agent, grow, kind) in enumerate(steps):
        clock.s += 1.0
        ctx = contexts.setdefault(agent, [])
        ctx.extend(BlockHash(agent * 1000 + len(ctx) + j) for j in range(grow))
        del ctx[capacity - 1 :]
        out = e.begin(f"r{i}", ctx, owner=f"w/{agent}")
        if out.served:
            e.finish(f"r{i}")
            hint = ReuseHint(
                agent=str(agent),
                session="closed" if kind == "closed" else "open",
                wait_class="unknown" if kind == "closed" else kind,
            )
            hint_claim(e, f"c{i}", "w", ctx[:1], hint)
            e.release_claim(f"c{i}", "w")
        e.check_invariants()
    assert e.stats.true_harm == 0
