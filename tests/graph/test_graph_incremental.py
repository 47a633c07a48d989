"""The tracker's and the tool-time model's cached, incremental answers equal a recompute from
scratch after any sequence of updates (counts learned, edges added, frontier moves, durations
observed past the history bound)."""

from __future__ import annotations

import bisect
import math
import statistics

from hypothesis import given, settings
from hypothesis import strategies as st

from agentclaims.graph import AgentExecutionGraph, Reuse, SteTracker, ToolTimeModel
from agentclaims.graph._structure import INF, _compile_structure
from agentclaims.graph.reuse import _combine, _compile_chain, _hit_table, _step_reuse

NAMES = [f"n{i}" for i in range(8)]


def _graph(edges: list[tuple[int, int, bool]]) -> AgentExecutionGraph:
    g = AgentExecutionGraph()
    for i, name in enumerate(NAMES):
        g.add_node(name, "agent" if i % 3 else "tool", prefixes=[f"p{i % 3}"] if i % 3 else [])
    g.add_edge("__start__", NAMES[0])
    for a, b, plain in edges:
        target = "__end__" if b == len(NAMES) else NAMES[b]
        if a != b and not g.has_edge(NAMES[a], target):
            g.add_edge(NAMES[a], target, "plain" if plain else "conditional")
    return g


def _from_scratch_return(
    g: AgentExecutionGraph, node: str, exclude: list[str], horizon: int
) -> Reuse:
    """``SteTracker.return_reuse`` by the definition: the whole chain's hit table, no ball, no
    shortcut, no cache."""
    s = _compile_structure(g)
    u, skip = s.index[node], {s.index[n] for n in exclude}
    plain_names, probs = g.split_transitions(node)
    plain = tuple(s.index[v] for v in plain_names if s.index[v] not in skip)
    kept = [(s.index[v], q) for v, q in probs.items() if s.index[v] not in skip]
    total = sum(q for _, q in kept)
    kept = [(v, q / total) for v, q in kept] if total > 0 else []
    if horizon == 0 or not (plain or kept):
        return Reuse(0.0, INF, horizon)
    table = _hit_table(_compile_chain(g, s), frozenset((u,)), horizon - 1)
    return _step_reuse(plain, kept, table, horizon)


def _from_scratch_node(g: AgentExecutionGraph, frontier: set[str], node: str, h: int) -> Reuse:
    s = _compile_structure(g)
    front = frozenset(s.index[f] for f in frontier)
    if s.index[node] in front:
        return Reuse(1.0, 0.0, h)
    table = _hit_table(_compile_chain(g, s), frozenset((s.index[node],)), h)
    return _combine(table, front, h)


def _same(got: Reuse, want: Reuse) -> bool:
    return math.isclose(got.probability, want.probability, abs_tol=1e-12) and (
        got.expected_steps == want.expected_steps
        or math.isclose(got.expected_steps, want.expected_steps, abs_tol=1e-9)
    )


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("again"), st.integers(0, 7), st.integers(0, 8)),
        st.tuples(st.just("again"), st.integers(0, 7), st.integers(0, 8)),
        st.tuples(st.just("new"), st.integers(0, 7), st.integers(0, 8)),
        st.tuples(st.just("query"), st.integers(0, 7), st.integers(0, 7)),
    ),
    min_size=6,
    max_size=40,
)


@settings(max_examples=120, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 7), st.integers(0, 8), st.booleans()), min_size=6, max_size=24
    ),
    _OPS,
    st.integers(1, 6),
)
def test_tracker_answers_equal_a_recompute_after_random_updates(edges, ops, horizon):
    """One long-lived tracker (its rows, backward searches and tables cached and invalidated
    as counts and edges change) answers return_reuse, node_reuse, near_ste and prefix reuse as
    a fresh tracker and the whole-chain definition do."""
    g = _graph(edges)
    tracker = SteTracker(g, horizon=horizon)
    for op, a, b in ops:
        source = NAMES[a]
        if op == "again":  # a known transition counted again (no structure change)
            succ = g.successors(source)
            if succ:
                g.observe_transition(source, succ[b % len(succ)], count=1 + b)
            continue
        if op == "new":  # maybe a new edge: the structure changes
            target = "__end__" if b == len(NAMES) else NAMES[b]
            if target != source:
                g.observe_transition(source, target)
            continue
        for other in (*NAMES[a:], *NAMES[:a]):  # every node, the one just counted first
            tools = [v for v in g.successors(other) if g.node_kind(v) == "tool"][: b % 2]
            want = _from_scratch_return(g, other, tools, horizon)
            assert _same(tracker.return_reuse(other, exclude=tools), want), other
        tracker.move([source])
        fresh = SteTracker(g, horizon=horizon)
        fresh.move([source])
        for node in NAMES:
            assert _same(tracker.node_reuse(node), _from_scratch_node(g, {source}, node, horizon))
            assert tracker.near_ste(node) == fresh.near_ste(node)
            deeper = horizon + 2
            want = _from_scratch_node(g, {source}, node, deeper)
            assert _same(tracker.node_reuse(node, deeper), want)
        assert _same(tracker.reuse("p1"), fresh.reuse("p1"))


def _ttl_by_definition(kept: list[float], benefit: float) -> float:
    """Continuum's tau* over the same candidates as ``ToolTimeModel.ttl``, tried shortest
    first with a strict improvement (ties to the shortest), each F by bisection."""
    ordered = sorted(kept)
    n = len(ordered)
    best_tau, best = 0.0, bisect.bisect_right(ordered, 0.0) / n * benefit
    step = max(1, n // 64)
    for i in range(step - 1, n, step):
        tau = ordered[i]
        value = bisect.bisect_right(ordered, tau) / n * benefit - tau
        if value > best:
            best, best_tau = value, tau
    return best_tau


_DURATION = st.one_of(
    st.integers(0, 4).map(float),  # many equal durations
    st.floats(0.0, 50.0, allow_nan=False),
    st.floats(0.0, 1e-3, allow_nan=False),
)


@settings(max_examples=120, deadline=None)
@given(
    st.lists(st.tuples(_DURATION, st.booleans()), min_size=1, max_size=500),
    st.integers(1, 300),
    st.integers(0, 120),
    st.floats(0.0, 100.0),
    st.floats(0.0, 10.0),
)
def test_tool_time_answers_equal_a_recompute_after_random_updates(
    steps, history, cold_start, queue_delay, reload_s
):
    """After every observation (the oldest dropping past ``history``) the kept sorted view,
    the median and the TTL (searched longest first, stopping early) equal a recompute from
    the kept durations."""
    m = ToolTimeModel(history=history, cold_start_samples=cold_start)
    kept: list[float] = []
    for duration, ask in steps:
        m.observe("t", duration)
        kept = [*kept, duration][-history:]
        if not ask:
            continue
        assert m.predict("t") == statistics.median(kept)
        got = m.ttl("t", queue_delay_s=queue_delay, reload_s=reload_s)
        if len(kept) > cold_start:
            assert got == _ttl_by_definition(kept, queue_delay + reload_s)


def test_equal_ttl_values_go_to_the_shortest():
    """F(1) * 4 - 1 == F(3) * 4 - 3 == 1 > F(0) * 4: the search from the longest candidate
    still answers the shorter one."""
    m = ToolTimeModel(cold_start_samples=0)
    m.observe_many("t", [1.0, 3.0])
    assert m.ttl("t", queue_delay_s=4.0) == 1.0
    assert m.ttl("t", queue_delay_s=2.0) == 0.0  # 0.5 * 2 - 1 == 0 == F(0) * 2: zero wins
