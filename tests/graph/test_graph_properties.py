"""Property tests of steps-to-execution on random graphs."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from agentclaims.graph import (
    START,
    AgentExecutionGraph,
    prefix_steps_to_execution,
    steps_to_execution,
)

KINDS = ("plain", "conditional", "send", "goto")


@st.composite
def graphs(draw: st.DrawFn) -> tuple[AgentExecutionGraph, list[str]]:
    """A random AEG with joins, prefixes and unknown routers, plus a non-empty frontier."""
    n = draw(st.integers(2, 9))
    names = [f"n{i}" for i in range(n)]
    g = AgentExecutionGraph()
    for name in names:
        prefixes = draw(st.sets(st.sampled_from(["p", "q", "r"]), max_size=2))
        g.add_node(name, prefixes=prefixes)
    nodes = [START, *names, "__end__"]
    for _ in range(draw(st.integers(0, 3 * n))):
        u = draw(st.sampled_from([START, *names]))
        v = draw(st.sampled_from([*names, "__end__"]))
        g.add_edge(u, v, draw(st.sampled_from(KINDS)))
    for _ in range(draw(st.integers(0, 2))):
        target = draw(st.sampled_from(names))
        members = draw(st.sets(st.sampled_from([START, *names]), min_size=2, max_size=3))
        g.add_join(sorted(members), target)
    if draw(st.booleans()):
        g.mark_targets_unknown(draw(st.sampled_from(names)))
    frontier = draw(st.sets(st.sampled_from(nodes), min_size=1, max_size=3))
    return g, sorted(frontier)


def _reference(g: AgentExecutionGraph, frontier: list[str]) -> dict[str, float]:
    """Bellman-style iteration of the KVFlow equations from infinity."""
    ste = {n: (0.0 if n in frontier else math.inf) for n in g.nodes}
    for _ in range(len(g) + 2):
        new = dict(ste)
        for v in g.nodes:
            if v in frontier:
                continue
            cands = [1 + ste[u] for u in g.predecessors(v) if not g.is_join_edge(u, v)]
            cands += [1 + max(ste[m] for m in grp) for grp in g.join_groups(v)]
            if v != START:
                cands += [1 + ste[u] for u in g.nodes if g.targets_unknown(u)]
            new[v] = min(cands, default=math.inf)
        ste = new
    return ste


@settings(max_examples=200, deadline=None)
@given(graphs())
def test_ste_nonnegative_and_zero_iff_frontier(case: tuple[AgentExecutionGraph, list[str]]) -> None:
    """STE >= 0 everywhere, and 0 exactly on the frontier."""
    g, frontier = case
    for node, value in steps_to_execution(g, frontier).items():
        assert value >= 0
        assert (value == 0) == (node in frontier)


@settings(max_examples=200, deadline=None)
@given(graphs())
def test_ste_matches_fixed_point_reference(case: tuple[AgentExecutionGraph, list[str]]) -> None:
    """The relaxation equals a brute-force fixed-point iteration of the equations."""
    g, frontier = case
    assert steps_to_execution(g, frontier) == _reference(g, frontier)


@settings(max_examples=200, deadline=None)
@given(graphs(), st.data())
def test_adding_an_edge_never_increases_ste(
    case: tuple[AgentExecutionGraph, list[str]], data: st.DataObject
) -> None:
    """Monotone: a new transition can only bring nodes closer."""
    g, frontier = case
    before = steps_to_execution(g, frontier)
    u = data.draw(st.sampled_from([n for n in g.nodes if n != "__end__"]))
    v = data.draw(st.sampled_from([n for n in g.nodes if n != START]))
    g.add_edge(u, v, data.draw(st.sampled_from(KINDS)))
    after = steps_to_execution(g, frontier)
    assert all(after[n] <= before[n] for n in before)


@settings(max_examples=200, deadline=None)
@given(graphs())
def test_prefix_ste_is_min_over_users(case: tuple[AgentExecutionGraph, list[str]]) -> None:
    """Each prefix's STE is the smallest STE of the nodes that use it."""
    g, frontier = case
    ste = steps_to_execution(g, frontier)
    expected = {p: min(ste[u] for u in users) for p, users in g.prefix_users().items()}
    assert prefix_steps_to_execution(g, frontier) == expected
