"""vLLM's pool in the replay: the LRU free queue, the connector's real ClaimBook, the rows."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentclaims.contract import ArbiterAction
from agentclaims.engine import BlockHash
from agentclaims.errors import UsageError
from agentclaims.replay import (
    AgentClaimsVllmPolicy,
    LruVllmPolicy,
    SessionScript,
    SubAgentGroup,
    Trace,
    TraceRequest,
    TraceSource,
    VllmPoolEngine,
    compare_policies,
    gap_closed,
    make_policy,
    resolve_policies,
    run_replay,
)
from agentclaims.replay.vllm_pool import max_model_len_for

TRACES = Path(
    os.environ.get(
        "AGENTCLAIMS_TRACES",
        Path(__file__).resolve().parents[2].parent / "shared" / "data" / "agentic-traces",
    )
)


class Clock:
    """The replay's virtual clock, in nanoseconds, moved by hand."""

    def __init__(self) -> None:
        self.s = 0.0

    def __call__(self) -> int:
        return int(self.s * 1e9)


def hashes(*ids: int) -> list[BlockHash]:
    return [BlockHash(i) for i in ids]


def run(engine: VllmPoolEngine, rid: str, ids: list[int], extra: int = 0, **kw: Any) -> None:
    """Begin and finish one request (it must be served)."""
    out = engine.begin(rid, hashes(*ids), extra_blocks=extra, **kw)
    assert out.served, out
    engine.finish(rid)


def cached(engine: VllmPoolEngine, *ids: int) -> list[bool]:
    return [BlockHash(i) in engine.pool.cached for i in ids]


def claims_engine(num_blocks: int, clock: Clock, **kw: Any) -> VllmPoolEngine:
    """A pool with the connector: ``max_model_len`` two blocks (reserve 3 blocks)."""
    return VllmPoolEngine(
        num_blocks, 4, clock=clock, claims=True, max_model_len=8, record_events=True, **kw
    )


# ---------------------------------------------------------------------------- the pool
def test_the_least_recently_freed_cached_blocks_are_evicted_first() -> None:
    """The free queue is LRU: a request's blocks freed earlier are taken before later ones."""
    engine = VllmPoolEngine(6, 4)
    run(engine, "a", [1, 2, 3])
    run(engine, "b", [11, 12, 13])
    run(engine, "c", [21, 22, 23])  # takes a's three blocks: a was freed first
    assert cached(engine, 1, 2, 3) == [False] * 3
    assert cached(engine, 11, 12, 13, 21, 22, 23) == [True] * 6
    assert engine.stats.evicted_blocks == 3
    engine.check_invariants()


def test_a_request_is_freed_tail_first() -> None:
    """Its last block is evicted first, so the reusable leading run is kept longest."""
    engine = VllmPoolEngine(4, 4)
    run(engine, "a", [1, 2, 3, 4])
    run(engine, "b", [11])
    assert cached(engine, 1, 2, 3, 4) == [True, True, True, False]
    run(engine, "c", [21, 22])
    assert cached(engine, 1, 2, 3, 4) == [True, False, False, False]


def test_uncached_blocks_are_reused_before_any_cached_one() -> None:
    """A request's partial tail and output (unhashed) go to the head of the free queue."""
    engine = VllmPoolEngine(5, 4)
    run(engine, "a", [1, 2, 3], extra=2)
    run(engine, "b", [11, 12])  # takes the two uncached blocks: nothing evicted
    assert engine.stats.evicted_blocks == 0
    assert cached(engine, 1, 2, 3, 11, 12) == [True] * 5


def test_a_hit_takes_its_blocks_out_of_the_free_queue() -> None:
    """A prefix hit adds a reference: the blocks leave the free queue and are not victims."""
    engine = VllmPoolEngine(6, 4)
    run(engine, "a", [1, 2, 3])
    assert engine.free_blocks == 6
    out = engine.begin("b", hashes(1, 2, 3, 4))
    assert out.hit_blocks == 3
    assert engine.free_blocks == 2
    run(engine, "c", [31, 32])  # pressure: only the free blocks are taken
    assert cached(engine, 1, 2, 3, 4) == [True] * 4
    engine.check_invariants()


def test_running_requests_blocks_are_never_victims() -> None:
    """A request that needs a running request's blocks waits instead (deferred)."""
    engine = VllmPoolEngine(6, 4)
    assert engine.begin("a", hashes(1, 2, 3, 4)).served
    out = engine.begin("b", hashes(11, 12, 13))
    assert out.action is ArbiterAction.DEFER_ACTIVE
    assert out.retry_after_s is None  # it fits once the running request finishes
    assert cached(engine, 1, 2, 3, 4) == [True] * 4
    engine.finish("a")
    assert engine.begin("b", hashes(11, 12, 13)).served
    engine.check_invariants()


def test_evictable_hits_count_against_the_free_queue() -> None:
    """Hits waiting in the free queue leave it when taken (vLLM counts them): a request whose
    new blocks fit, but not with its hits, waits."""
    engine = VllmPoolEngine(6, 4)
    run(engine, "a", [1, 2, 3, 4])
    assert engine.begin("x", hashes(21)).served  # one block running: 5 free, 4 of them a's
    out = engine.begin("b", hashes(1, 2, 3, 4, 5, 6))
    assert out.action is ArbiterAction.DEFER_ACTIVE  # 2 new + 4 hits > 5
    engine.finish("x")
    assert engine.begin("b", hashes(1, 2, 3, 4, 5, 6)).hit_blocks == 4


def test_only_an_lru_policy_runs_on_the_pool() -> None:
    """vLLM's free queue is LRU: the engine refuses any other eviction policy."""
    with pytest.raises(UsageError, match="eviction_policy"):
        VllmPoolEngine(4, 4, eviction_policy=make_policy("kvflow"))  # type: ignore[arg-type]
    VllmPoolEngine(4, 4, eviction_policy=make_policy("lru"))  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- the holds
def test_a_hold_keeps_its_blocks_through_pressure() -> None:
    """A held prefix survives pressure that evicts the same prefix unheld."""
    for held in (False, True):
        clock = Clock()
        engine = claims_engine(10, clock)
        assert engine.begin("a", hashes(1, 2, 3), owner="t0/main").served
        if held:
            assert engine.book is not None
            decision = engine.hold("t0/main", "c1", "t0", "demotable", next_use_s=5.0)
            assert decision["decision"] == "accepted"
        engine.finish("a")
        clock.s = 1.0
        run(engine, "b", [11, 12, 13, 14, 15, 16, 17])  # the free blocks
        run(engine, "c", [21, 22, 23])  # the oldest cached: a's, unless held (then b's)
        assert cached(engine, 1, 2, 3) == [held] * 3
        assert cached(engine, 15, 16, 17) == [not held] * 3  # b's tail went first
        engine.check_invariants()
    assert engine.protected_resident_blocks == 3
    assert engine.stats.true_harm == 0


def test_a_shed_hold_returns_its_blocks_tail_first_with_a_demotion_event() -> None:
    """A request that only fits without a soft hold sheds it: a demotion event, its blocks
    back in the free queue (cached, tail first), and the request served."""
    clock = Clock()
    engine = claims_engine(10, clock)
    assert engine.begin("a", hashes(1, 2, 3), owner="t0/main").served
    engine.hold("t0/main", "c1", "t0", "demotable", next_use_s=5.0)
    engine.finish("a")
    assert engine.free_blocks == 7
    assert engine.begin("b", hashes(11, 12, 13, 14, 15, 16, 17, 18)).served
    assert engine.protected_resident_blocks == 0
    assert engine.claim_events["resident_claim_demoted"] == 1
    assert engine.event_log is not None
    demoted = [e for e in engine.event_log if e["event"] == "resident_claim_demoted"]
    assert demoted[0]["claim_id"] == "c1"
    assert demoted[0]["reason"] == "memory_pressure"
    # one block was taken from the shed hold: its tail (3), the head kept longest
    assert cached(engine, 1, 2, 3) == [True, True, False]
    engine.check_invariants()


def test_a_hard_hold_defers_the_request_that_needs_its_blocks() -> None:
    """Where only a hard hold's blocks would make room, the request is deferred (retry when
    its TTL ends), naming the claim; after the TTL it is served."""
    clock = Clock()
    engine = claims_engine(10, clock)
    assert engine.begin("a", hashes(1, 2, 3), owner="t0/main").served
    engine.hold("t0/main", "c1", "t0", "hard_protected", ttl_s=4.0)
    engine.finish("a")
    out = engine.begin("b", hashes(*range(11, 19)))
    assert out.action is ArbiterAction.DEFER_ACTIVE
    assert out.blocking_claim_ids == ("c1",)
    assert out.retry_after_s == pytest.approx(4.0)
    clock.s = 4.0
    assert engine.begin("b", hashes(*range(11, 19))).served
    assert engine.claim_events["resident_claim_expired"] == 1


def test_holds_are_capped_below_one_max_length_request() -> None:
    """Hard holds never take the reserve: one past their cap is refused (an event, nothing
    held); soft ones may take all but the watermark block, as the connector's default
    ``soft_reserve_blocks`` lets them."""
    clock = Clock()
    engine = claims_engine(10, clock)  # reserve 3: at most 7 held hard
    assert engine.book is not None
    assert engine.book.hard_cap_blocks == 7
    assert engine.book.cap_blocks == 9
    assert engine.begin("a", hashes(*range(1, 9)), owner="o").served
    decision = engine.hold("o", "c1", "t0", "hard_protected", ttl_s=5.0)
    assert decision["decision"] == "rejected"
    assert engine.claim_events["resident_claim_rejected"] == 1
    assert engine.protected_resident_blocks == 0


def test_a_released_hold_joins_the_free_queue_tail() -> None:
    """Releasing a hold frees its blocks at the tail: they go after older cached blocks."""
    clock = Clock()
    engine = claims_engine(10, clock)
    assert engine.begin("a", hashes(1, 2), owner="o").served
    engine.hold("o", "c1", "t0", "demotable", next_use_s=1.0)
    engine.finish("a")
    run(engine, "b", [11, 12])
    assert engine.release("c1", "t0")
    assert not engine.release("c1", "t0")  # gone: nothing to release twice
    run(engine, "c", [21, 22, 23, 24, 25, 26, 27])  # 6 free first, then b's tail
    assert cached(engine, 1, 2, 11, 12) == [True, True, True, False]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["begin", "finish", "hold", "release", "tick"]),
            st.integers(0, 3),
            st.integers(1, 6),
        ),
        max_size=40,
    )
)
def test_the_bookkeeping_holds_under_any_sequence(ops: list[tuple[str, int, int]]) -> None:
    """Random requests, holds, releases and time: the free queue is exactly the unreferenced
    blocks, references are requests' plus holds', holds stay under the cap, nothing held is
    ever evicted (no harm)."""
    clock = Clock()
    engine = claims_engine(12, clock)
    running: dict[int, str] = {}
    count = 0
    for op, who, size in ops:
        owner = f"a{who}"
        if op == "begin" and who not in running:
            count += 1
            rid = f"r{count}"
            chain = [who * 100 + i for i in range(size)]
            if engine.begin(rid, hashes(*chain), extra_blocks=size % 2, owner=owner).served:
                running[who] = rid
        elif op == "finish" and who in running:
            engine.finish(running.pop(who))
        elif op == "hold" and who in running:
            mode = ("demotable", "expiring", "hard_protected")[size % 3]
            engine.hold(owner, f"c{count}-{size}", "t", mode, ttl_s=float(size), next_use_s=2.0)
        elif op == "release":
            engine.release(f"c{size}-{size}", "t")
        elif op == "tick":
            clock.s += size
            engine.step()
        engine.check_invariants()
    assert engine.stats.true_harm == 0


# ---------------------------------------------------------------------------- the rows
BS = 4


@st.composite
def small_traces(draw: st.DrawFn) -> tuple[list[Trace], int, int]:
    """A few traces of growing (sometimes rewritten) contexts, with an occasional sub-agent;
    a capacity and a number of sessions."""
    traces = []
    for ordinal in range(draw(st.integers(1, 4))):
        ns = (ordinal + 1) << 40
        ctx: list[int] = []
        fresh = 100
        steps: list[TraceRequest | SubAgentGroup] = []
        for _ in range(draw(st.integers(1, 5))):
            if ctx and draw(st.booleans()) and draw(st.booleans()):
                ctx = ctx[: draw(st.integers(0, len(ctx)))]
            for _ in range(draw(st.integers(0 if ctx else 1, 3))):
                fresh += 1
                ctx.append(fresh)
            steps.append(
                TraceRequest(
                    delay_s=draw(st.sampled_from([0.0, 1.0, 5.0, 20.0])),
                    input_tokens=len(ctx) * BS,
                    output_tokens=draw(st.integers(0, 8)),
                    block_hashes=tuple(ns | h for h in ctx),
                    stop=draw(st.sampled_from(["tool_use", "end_turn", ""])),
                )
            )
            if draw(st.integers(0, 5)) == 0:
                sub = TraceRequest(0.0, 3 * BS, 1, (ns | 1, ns | 2, ns | (3 + len(steps))), "")
                script = SessionScript(f"t{ordinal}/s", "worker", (sub,))
                steps.append(SubAgentGroup((script,), (0.5,)))
        main = SessionScript(f"t{ordinal}", "main", tuple(steps))
        traces.append(Trace(f"t{ordinal}", BS, main))
    return traces, draw(st.integers(3, 14)), draw(st.integers(1, 3))


@settings(max_examples=60, deadline=None)
@given(small_traces())
def test_lru_on_vllms_pool_is_the_reference_engines_lru(
    case: tuple[list[Trace], int, int],
) -> None:
    """On random traces vLLM's pool without claims serves exactly what the reference engine's
    LRU serves (the same hits, deferrals and evictions), and OPT bounds it."""
    traces, capacity, sessions = case
    kw: dict[str, Any] = {"capacity_blocks": capacity, "sessions": sessions, "block_size": BS}
    lru = run_replay(traces, make_policy("lru"), record=True, **kw)
    vllm = run_replay(traces, make_policy("lru-vllm"), **kw)
    opt = run_replay(traces, make_policy("opt", schedule=lru.schedule, block_size=BS), **kw)
    assert (vllm.hit_tokens, vllm.deferrals, vllm.oversize) == (
        lru.hit_tokens,
        lru.deferrals,
        lru.oversize,
    )
    assert opt.hit_tokens >= vllm.hit_tokens


@settings(max_examples=40, deadline=None)
@given(small_traces())
def test_agentclaims_on_vllms_pool_never_harms_on_random_traces(
    case: tuple[list[Trace], int, int],
) -> None:
    """On random traces the SDK's holds leave no harm and nothing held at the end."""
    traces, capacity, sessions = case
    engines: list[VllmPoolEngine] = []

    class Kept(AgentClaimsVllmPolicy):
        def make_engine(self, capacity_blocks: int, block_size: int, clock: Any) -> Any:
            engine = super().make_engine(capacity_blocks, block_size, clock)
            assert isinstance(engine, VllmPoolEngine)
            engines.append(engine)
            return engine

    kw: dict[str, Any] = {"capacity_blocks": capacity, "sessions": sessions, "block_size": BS}
    result = run_replay(traces, Kept(block_size=BS), **kw)
    assert result.true_harm == 0
    engine = engines[0]
    engine.check_invariants()
    assert engine.book is not None
    assert not engine.book.holds


def test_the_rows_name_their_engine_and_join_their_baseline() -> None:
    """``-vllm`` rows run on vLLM's pool, and asking for one brings in ``lru-vllm``."""
    assert isinstance(LruVllmPolicy().make_engine(8, 4, Clock()), VllmPoolEngine)
    engine = AgentClaimsVllmPolicy(block_size=4).make_engine(100, 4, Clock())
    assert isinstance(engine, VllmPoolEngine)
    assert engine.book is not None
    assert engine.reserve_blocks == 51  # max_model_len half the pool: 200 tokens, + watermark
    assert max_model_len_for(10_000, 64) == 200_000
    names = resolve_policies(["agentclaims-vllm"])
    assert names.index("lru-vllm") < names.index("agentclaims-vllm")
    assert "lru-vllm" not in resolve_policies(None)  # run when named


@pytest.mark.traces
def test_agentclaims_on_vllms_pool_replays_real_traces() -> None:
    """A few real traces (skipped without the data set) under pressure: the SDK's holds do no
    harm, the row reaches at least vLLM's LRU, and every hold that ended without the SDK's
    release ended by its TTL or was shed with a demotion event."""
    if not TRACES.is_dir():
        pytest.skip(f"agentic traces not found at {TRACES}")
    source = TraceSource.from_dir(TRACES, 6)
    engines: list[VllmPoolEngine] = []

    class Recording(AgentClaimsVllmPolicy):
        def make_engine(self, capacity_blocks: int, block_size: int, clock: Any) -> Any:
            engine = VllmPoolEngine(
                capacity_blocks,
                block_size,
                clock=clock,
                claims=True,
                max_model_len=max_model_len_for(capacity_blocks, block_size),
                record_events=True,
            )
            engines.append(engine)
            return engine

    kw: dict[str, Any] = {"capacity_blocks": 1500, "sessions": 3}
    policy = Recording()
    result = run_replay(source, policy, **kw)
    lru = run_replay(source, make_policy("lru-vllm"), **kw)
    assert result.true_harm == 0
    assert result.hit_ratio >= lru.hit_ratio
    engine = engines[0]
    assert engine.book is not None
    assert not engine.book.holds  # every trace ended: the SDK released what it held
    log = engine.event_log
    assert log is not None
    held = {e["claim_id"] for e in log if e["event"] == "resident_claim_materialized"}
    ends: dict[str, list[dict[str, Any]]] = {}
    for e in log:
        if e["event"] in ("resident_claim_demoted", "resident_claim_expired"):
            ends.setdefault(e["claim_id"], []).append(e)
    assert set(ends) == held  # each hold ended once, each end an event
    assert all(len(v) == 1 for v in ends.values())
    lost = [v[0] for v in ends.values() if v[0].get("reason") != "released"]
    # a hold the SDK did not release was shed (a demotion event) or ended by its TTL; the
    # SDK's own release of it later found nothing
    assert all(
        e["event"] == "resident_claim_demoted" or e.get("reason") == "ttl_ended" for e in lost
    )
    assert len(lost) == policy.released_gone
    assert sum(1 for e in lost if e["event"] == "resident_claim_demoted") == (
        result.claim_events or {}
    ).get("resident_claim_demoted", 0)
    assert len(held) > 0


@pytest.mark.traces
def test_the_vllm_rows_compare_from_vllms_own_lru() -> None:
    """In a comparison the ``-vllm`` rows measure their gap from ``lru-vllm``."""
    if not TRACES.is_dir():
        pytest.skip(f"agentic traces not found at {TRACES}")
    source = TraceSource.from_dir(TRACES, 4)
    comp = compare_policies(source, ["agentclaims-vllm"], sessions=2, capacity_blocks=2000)
    data = comp.to_dict()["policies"]
    assert list(data) == ["lru", "lru-vllm", "agentclaims-vllm", "opt"]
    assert data["agentclaims-vllm"]["gap_baseline"] == "lru-vllm"
    assert data["agentclaims-vllm"]["label"] == "agentclaims on vLLM's pool"
    assert data["lru-vllm"]["gap_closed"] == 0.0
    hits = {name: row["hit_ratio"] for name, row in data.items()}
    assert data["agentclaims-vllm"]["gap_closed"] == gap_closed(
        hits["agentclaims-vllm"], hits["lru-vllm"], hits["opt"]
    )


def test_the_connectors_admission_must_count_the_hits_it_takes_from_the_free_queue() -> None:
    """A request whose own context waits in the free queue (its hold released as it arrived)
    takes those blocks out of it too. Asked for its new blocks alone (the connector's hook
    today), the book sheds nothing and vLLM cannot allocate it: with nothing running it waits
    until a hold's TTL ends. Asked for both, the book sheds the soft hold and it runs."""
    for counts in (False, True):
        clock = Clock()
        engine = claims_engine(12, clock, admit_evictable_hits=counts)
        assert engine.begin("a", hashes(1, 2, 3, 4, 5), owner="o1").served
        engine.hold("o1", "c1", "t", "demotable", next_use_s=5.0)
        engine.finish("a")
        assert engine.begin("b", hashes(11, 12, 13, 14), owner="o2").served
        engine.hold("o2", "c2", "t", "demotable", next_use_s=1.0)
        engine.finish("b")
        assert engine.release("c1", "t")  # a's next call supersedes its hold as it arrives
        out = engine.begin("a2", hashes(1, 2, 3, 4, 5, 6, 7, 8, 9))  # 4 new + 5 evictable hits
        if counts:
            assert out.served
            assert engine.claim_events["resident_claim_demoted"] == 1  # b's hold, shed
        else:
            assert out.action is ArbiterAction.DEFER_ACTIVE
            assert out.retry_after_s == pytest.approx(600.0)  # the hold's TTL: the maximum
            assert engine.waited_on_hits == 1
            assert engine.claim_events["resident_claim_demoted"] == 0


def test_hits_a_shed_hold_covered_count_as_evictable() -> None:
    """The book sheds the hold on the request's own prefix: its hits then wait in the free
    queue too, and the request is allocated only if they fit with its new blocks."""
    for counts in (False, True):
        clock = Clock()
        engine = claims_engine(12, clock, admit_evictable_hits=counts)
        assert engine.begin("a", hashes(1, 2, 3, 4, 5, 6), owner="o1").served
        engine.hold("o1", "c1", "t", "demotable", next_use_s=5.0)
        engine.finish("a")
        assert engine.begin("x", hashes(21, 22, 23, 24)).served  # running: 2 free
        out = engine.begin("b", hashes(1, 2, 3, 4, 5, 6, 7, 8, 9))  # sheds c1: 6 hits free
        assert not out.served  # 3 new + 6 evictable hits > 8 free
        assert engine.claim_events["resident_claim_demoted"] == 1
        engine.check_invariants()
        engine.finish("x")
        assert engine.begin("b", hashes(1, 2, 3, 4, 5, 6, 7, 8, 9)).hit_blocks == 6
