"""Replay policies on small hand-made traces whose right answer is known."""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentclaims.contract import ReuseHint
from agentclaims.engine import BlockHash, KVEngine
from agentclaims.replay import (
    POLICY_NAMES,
    AgentClaimsPolicy,
    ContinuumPolicy,
    ServiceModel,
    SessionScript,
    SessionState,
    SubAgentGroup,
    Trace,
    TraceRequest,
    TraceSource,
    make_policy,
    run_replay,
)
from agentclaims.session.workflow import WorkflowModel

BS = 4


def req(
    ids: list[int], ordinal: int, delay: float = 0.0, stop: str = "tool_use", out: int = 0
) -> TraceRequest:
    return TraceRequest(
        delay_s=delay,
        input_tokens=len(ids) * BS,
        output_tokens=out,
        block_hashes=tuple(((ordinal + 1) << 40) | h for h in ids),
        stop=stop,
    )


def trace(name: str, steps: list[TraceRequest | SubAgentGroup]) -> Trace:
    return Trace(name, BS, SessionScript(name, "main", tuple(steps)))


@st.composite
def small_traces(draw: st.DrawFn) -> tuple[list[Trace], int, int]:
    traces = []
    for ordinal in range(draw(st.integers(1, 4))):
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
                req(
                    list(ctx),
                    ordinal,
                    draw(st.sampled_from([0.0, 1.0, 5.0, 20.0])),
                    draw(st.sampled_from(["tool_use", "end_turn", ""])),
                    draw(st.integers(0, 8)),
                )
            )
            if draw(st.integers(0, 5)) == 0:
                sub = SessionScript(
                    f"t{ordinal}/s", "worker", (req([1, 2, 3 + len(steps)], ordinal),)
                )
                steps.append(SubAgentGroup((sub,), (0.5,)))
        traces.append(trace(f"t{ordinal}", steps))
    return traces, draw(st.integers(3, 14)), draw(st.integers(1, 3))


@settings(max_examples=60, deadline=None)
@given(small_traces())
def test_optimum_beats_or_equals_every_policy(case: tuple[list[Trace], int, int]) -> None:
    """Belady's optimum reaches at least every online policy's hit tokens on random traces."""
    traces, capacity, sessions = case
    kw = {"capacity_blocks": capacity, "sessions": sessions, "block_size": BS}
    lru = run_replay(traces, make_policy("lru"), record=True, **kw)
    opt = run_replay(traces, make_policy("opt", schedule=lru.schedule, block_size=BS), **kw)
    for name in POLICY_NAMES:
        if name != "opt":
            result = run_replay(traces, make_policy(name, block_size=BS), **kw)
            assert opt.hit_tokens >= result.hit_tokens, name


def reference_lru_hits(requests: list[tuple[int, ...]], capacity: int) -> int:
    """A straightforward prefix cache with LRU eviction, one request at a time."""
    cache: OrderedDict[int, None] = OrderedDict()  # least recent first
    total = 0
    for blocks in requests:
        hits = 0
        while hits < len(blocks) and blocks[hits] in cache:
            hits += 1
        for h in blocks[:hits]:
            del cache[h]
        free = capacity - len(cache) - hits
        admitted = []
        for h in blocks[hits:]:
            if free:
                free -= 1
            else:
                cache.popitem(last=False)
            if h not in cache:  # an orphan already cached stays where it is
                admitted.append(h)
        for h in reversed(list(blocks[:hits]) + admitted):  # tail released first
            cache[h] = None
        total += hits
    return total


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.lists(st.integers(1, 6), min_size=1, max_size=6), min_size=1, max_size=10),
    st.integers(6, 12),
)
def test_lru_matches_reference(chains: list[list[int]], capacity: int) -> None:
    """The replay's LRU gives the hits of a hand-written LRU prefix cache (one session)."""
    seqs = [tuple(dict.fromkeys(c)) for c in chains]
    steps: list[TraceRequest | SubAgentGroup] = [req(list(s), 0, delay=1.0) for s in seqs]
    result = run_replay(
        [trace("t", steps)], make_policy("lru"), capacity_blocks=capacity, sessions=1, block_size=BS
    )
    expected = reference_lru_hits(
        [r.block_hashes for r in steps if isinstance(r, TraceRequest)], capacity
    )
    assert result.hit_tokens == expected * BS


def nearer_agent_case() -> list[Trace]:
    """A (tool call, returns soon) finishes first, B (hands the turn to a human) later, then C
    needs room for three blocks while both wait."""
    a = trace("a", [req([1, 2, 3], 0), req([1, 2, 3, 4], 0, delay=100.0)])
    b = trace("b", [req([1, 2, 3], 1, delay=1.0, stop="end_turn")])
    c = trace("c", [req([1, 2, 3], 2, delay=50.0, stop="end_turn")])
    return [a, b, c]


def test_kvflow_keeps_the_nearer_agent() -> None:
    """STE priority evicts the human-waiting agent and keeps the tool-calling one; LRU does not."""
    kw = {"capacity_blocks": 6, "sessions": 3, "block_size": BS}
    kvflow = run_replay(nearer_agent_case(), make_policy("kvflow"), **kw)
    lru = run_replay(nearer_agent_case(), make_policy("lru"), **kw)
    assert lru.hit_tokens == 0
    assert kvflow.hit_tokens == 3 * BS


def _pinned_session(policy: ContinuumPolicy, engine: KVEngine) -> SessionState:
    script = SessionScript("a", "main", ())
    s = SessionState(1, "a", "main", 0, None, script)
    r = req([1, 2, 3], 0)
    engine.begin("r1", [BlockHash(h) for h in r.block_hashes])
    s.turn, s.last_stop, s.hashes, s.last_finish = 1, "tool_use", r.block_hashes, 0.0
    policy.on_finish(s, r, 0.0, 1)
    engine.finish("r1")
    return s


def _continuum() -> tuple[ContinuumPolicy, KVEngine]:
    policy = ContinuumPolicy(ServiceModel(prefill_tokens_per_s=10.0), block_size=BS)
    policy.tools.observe_many("main", [0.5] * 5)  # past tool calls took 0.5 s
    return policy, KVEngine(8, BS, eviction_policy=policy)


def test_continuum_pins_across_a_short_tool_call() -> None:
    """Within tau* the program stays pinned, and an unpinned program is evicted before it."""
    policy, engine = _continuum()
    s = _pinned_session(policy, engine)
    tau = policy.ttl(s)
    assert 0.3 < tau < 5.0
    b = SessionState(2, "b", "main", 1, None, SessionScript("b", "main", ()))
    rb = req([1, 2], 1, stop="end_turn")
    engine.begin("rb", [BlockHash(h) for h in rb.block_hashes])
    policy.on_finish(b, rb, 0.1, 2)  # b hands the turn to a human: no pin
    engine.finish("rb")
    policy.advance(0.3)
    assert policy.protected_blocks == 3
    other = [BlockHash((9 << 40) | h) for h in (1, 2, 3, 4, 5)]
    engine.begin("rc", other)  # 3 free + 2 victims: b's blocks go, the pinned a's stay
    assert all(engine.is_cached(BlockHash((1 << 40) | h)) for h in (1, 2, 3))
    assert not engine.is_cached(BlockHash((2 << 40) | 1))


def test_continuum_releases_the_pin_after_a_long_tool_call() -> None:
    """Past the deadline (the next turn has not arrived) the pin is released."""
    policy, engine = _continuum()
    s = _pinned_session(policy, engine)
    policy.advance(policy.ttl(s) + 5.0)
    assert policy.protected_blocks == 0
    assert len(policy) == 3


class RecordingAgentClaims(AgentClaimsPolicy):
    """The real ``agentclaims`` row, keeping what it told the engine and each workflow's model
    (for the assertions; nothing it does is replaced)."""

    def __init__(self) -> None:
        super().__init__(ServiceModel(), BS)
        self.hints: list[tuple[str, ReuseHint, float]] = []
        self.models: dict[int, WorkflowModel] = {}
        ranking = self.ranking
        note_hint = ranking.note_hint

        def recorded(owner: str, hint: ReuseHint, now_s: float) -> None:
            self.hints.append((owner, hint, now_s))  # what reached the engine's policy
            note_hint(owner, hint, now_s)

        ranking.note_hint = recorded  # type: ignore[method-assign]

    def on_trace(self, trace: Trace, ordinal: int) -> None:
        super().on_trace(trace, ordinal)
        self.models[ordinal] = self._workflows[ordinal].model


def test_agentclaims_plans_from_the_sdk_graph_and_tool_times() -> None:
    """Each trace session runs the SDK's WorkflowModel on the virtual clock: tool gaps are
    learned by its ToolTimeModel, sub-agent launches land in its graph, and every claim's hint
    is what that model predicted at the time."""
    sub = SessionScript("t0/s1", "worker", (req([1, 2, 7], 0), req([1, 2, 7, 8], 0, delay=3.0)))
    traces = [
        trace(
            "t0",
            [
                req([1, 2, 3], 0),
                req([1, 2, 3, 4], 0, delay=2.0),
                req([1, 2, 3, 4, 5], 0, delay=4.0),
                SubAgentGroup((sub,), (0.5,)),
                req([1, 2, 3, 4, 5, 6], 0, delay=1.0, stop="end_turn"),
            ],
        )
    ]
    policy = RecordingAgentClaims()
    result = run_replay(traces, policy, capacity_blocks=12, sessions=1, block_size=BS)
    assert result.true_harm == 0
    assert result.requests == 6
    # the SDK's tool-time model learned the tool gaps on the virtual clock: main 2 s, 4 s, then
    # the sub-agent round (0.5 s start + 3 s + 1 s resume, plus service times); worker 3 s
    assert policy.tool_times.samples("main") == pytest.approx((2.0, 4.0, 4.5), abs=0.01)
    assert policy.tool_times.samples("worker") == pytest.approx((3.0,), abs=0.01)
    graph = policy.models[0].graph
    assert "main" in graph
    assert "sub:t0/s1" in graph
    assert graph.has_edge("main", "sub:t0/s1")  # learned from the calls, not given
    main = [(h, t) for o, h, t in policy.hints if o == "t0/main"]
    tool = [h for h, _ in main if h.wait_class == "tool"]
    # hints carry the model's prediction when the claim was planned: the prior, then 2 s, 3 s
    assert [h.expected_s for h in tool] == pytest.approx([10.0, 2.0, 3.0], abs=0.01)
    assert all(h.tool == "main" for h in tool)
    assert any(h.wait_class == "subagents" and h.subagents == 1 for h, _ in main)
    assert main[-1][0].closed  # the trace ended: the session is closed
    worker = [h for o, h, _ in policy.hints if o == "t0/sub:t0/s1"]
    assert worker[-1].closed  # the sub-agent returned
    assert policy.plans["best_effort"] >= 2
    assert policy.plans["renewed"] >= 3


def test_agentclaims_row_on_real_traces_plans_through_the_session_pipeline() -> None:
    """A few real traces (skipped without the data set): claims planned and renewed by the
    session pipeline, no harm, and at least LRU's hits."""
    default = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "agentic-traces"
    folder = Path(os.environ.get("AGENTCLAIMS_TRACES", default))
    if not folder.is_dir():
        pytest.skip(f"agentic traces not found at {folder}")
    source = TraceSource.from_dir(folder, 6)
    kw = {"capacity_blocks": 1500, "sessions": 3}
    policy = RecordingAgentClaims()
    policy.block_size = 64
    result = run_replay(source, policy, **kw)
    lru = run_replay(source, make_policy("lru"), **kw)
    assert result.true_harm == 0
    assert result.hit_ratio >= lru.hit_ratio
    assert policy.tool_times.count("main") > 0
    assert all(model.graph.nodes for model in policy.models.values())
    assert policy.plans["renewed"] > policy.plans["best_effort"] > 0
