"""Reuse computed over the horizon's ball of nodes equals the whole-chain computation."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from agentclaims.graph import AgentExecutionGraph, SteTracker
from agentclaims.graph.reuse import _combine


@st.composite
def graphs(draw: st.DrawFn) -> tuple[AgentExecutionGraph, list[str], str, int]:
    n = draw(st.integers(2, 12))
    names = [f"n{i}" for i in range(n)]
    g = AgentExecutionGraph()
    for i, name in enumerate(names):
        g.add_node(name, "agent", prefixes=[f"p{i % 3}"])
    g.add_edge("__start__", names[0])
    for _ in range(draw(st.integers(1, 3 * n))):
        a, b = draw(st.sampled_from(names)), draw(st.sampled_from([*names, "__end__"]))
        kind = draw(st.sampled_from(["plain", "conditional"]))
        if not g.has_edge(a, b):
            g.add_edge(a, b, kind)
    for _ in range(draw(st.integers(0, 20))):
        a = draw(st.sampled_from(names))
        succ = list(g.successors(a))
        if succ:
            g.observe_transition(a, draw(st.sampled_from(succ)))
    return g, names, draw(st.sampled_from(["p0", "p1", "p2"])), draw(st.integers(0, 6))


@settings(max_examples=150, deadline=None)
@given(graphs(), st.data())
def test_ball_reuse_matches_whole_chain(case, data):
    """For any graph, frontier and horizon, the bounded computation gives the same answer."""
    g, names, prefix, horizon = case
    tracker = SteTracker(g, horizon=max(horizon, 1))
    tracker.advance([data.draw(st.sampled_from(names))])
    got = tracker.reuse(prefix, horizon)
    users = frozenset(tracker._c.structure.prefix_users.get(prefix, ()))
    if not tracker._frontier.isdisjoint(users):
        assert got.probability == 1.0
        return
    want = _combine(tracker._table(users, horizon), tracker._frontier, horizon)
    assert math.isclose(got.probability, want.probability, abs_tol=1e-12)
    assert got.expected_steps == want.expected_steps or math.isclose(
        got.expected_steps, want.expected_steps, abs_tol=1e-9
    )


@settings(max_examples=150, deadline=None)
@given(graphs(), st.data())
def test_bounded_ste_matches_the_snapshot(case, data):
    """STE answered without a snapshot equals the snapshot's value for every node."""
    g, names, _prefix, horizon = case
    node = data.draw(st.sampled_from(names))
    frontier = [data.draw(st.sampled_from(names))]
    lazy = SteTracker(g, horizon=max(horizon, 1))
    lazy.move(frontier)
    eager = SteTracker(g, horizon=max(horizon, 1))
    assert lazy.node_ste(node) == eager.advance(frontier).node(node)


def _react() -> AgentExecutionGraph:
    g = AgentExecutionGraph()
    g.add_node("agent", "agent", prefixes=["p"])
    g.add_node("tools", "tool")
    g.add_edge("__start__", "agent")
    g.add_edge("agent", "tools", "conditional")
    g.add_edge("agent", "__end__", "conditional")
    g.add_edge("tools", "agent")
    return g


def test_return_reuse_after_a_final_answer_is_zero():
    """With the tool step excluded, a ReAct agent's final answer is never reused."""
    tracker = SteTracker(_react(), horizon=4)
    assert tracker.return_reuse("agent", exclude=["tools"]).probability == 0.0
    assert tracker.frontier == frozenset({"__end__"})


def test_return_reuse_weights_the_choice_by_learned_counts():
    """agent -> tools 3 times, -> end once: back within 2 steps with (3+1)/(4+2)."""
    g = _react()
    g.observe_transition("agent", "tools", count=3)
    g.observe_transition("agent", "__end__", count=1)
    reuse = SteTracker(g, horizon=2).return_reuse("agent")
    assert math.isclose(reuse.probability, 4 / 6)
    assert reuse.expected_steps == 2.0


@settings(max_examples=150, deadline=None)
@given(graphs(), st.data())
def test_near_ste_is_exact_within_the_horizon(case, data):
    """near_ste equals STE up to the horizon, and says horizon + 1 only for farther nodes."""
    g, names, _prefix, horizon = case
    horizon = max(horizon, 1)
    node = data.draw(st.sampled_from(names))
    frontier = [data.draw(st.sampled_from(names))]
    lazy = SteTracker(g, horizon=horizon)
    lazy.move(frontier)
    exact = SteTracker(g, horizon=horizon).advance(frontier).node(node)
    near = lazy.near_ste(node)
    if exact <= horizon:
        assert near == exact
    else:
        assert near == horizon + 1
