"""Steps-to-execution (KVFlow) and reuse probabilities."""

from __future__ import annotations

import math

import pytest

from agentclaims.errors import UsageError
from agentclaims.graph import (
    END,
    START,
    AgentExecutionGraph,
    SteTracker,
    kvflow_priority,
    prefix_reuse,
    prefix_steps_to_execution,
    reuse_within,
    steps_to_execution,
)


def _graph(*nodes: str) -> AgentExecutionGraph:
    g = AgentExecutionGraph()
    for n in nodes:
        g.add_node(n)
    return g


def _and_or() -> AgentExecutionGraph:
    """b, c -> j (AND-join) and b, c -> o (OR), with a -> c."""
    g = _graph("a", "b", "c", "j", "o", "lonely")
    g.add_edge("a", "c")
    g.add_join(["b", "c"], "j")
    g.add_edge("b", "o")
    g.add_edge("c", "o")
    return g


def test_frontier_nodes_have_ste_zero() -> None:
    """Every frontier node is at 0."""
    ste = steps_to_execution(_and_or(), ["a", "b"])
    assert (ste["a"], ste["b"]) == (0, 0)


def test_and_join_takes_max_over_predecessors() -> None:
    """An AND-join is 1 + max of its group's STE."""
    assert steps_to_execution(_and_or(), ["a", "b"])["j"] == 2  # 1 + max(b = 0, c = 1)


def test_or_node_takes_min_over_predecessors() -> None:
    """An OR node is 1 + min of its predecessors' STE."""
    assert steps_to_execution(_and_or(), ["a", "b"])["o"] == 1


def test_unreachable_is_infinite() -> None:
    """A node no path reaches is at infinity."""
    ste = steps_to_execution(_and_or(), ["a", "b"])
    assert ste["lonely"] == math.inf
    assert ste[START] == math.inf


def test_and_join_with_unreachable_member_is_infinite() -> None:
    """A join whose member cannot run (and has not run) never runs."""
    assert steps_to_execution(_and_or(), ["a"])["j"] == math.inf


def test_satisfied_join_member_no_longer_delays() -> None:
    """A member that already finished is not waited for."""
    ste = steps_to_execution(_and_or(), ["a"], satisfied={"j": ["b"]})
    assert ste["j"] == 2


def test_react_loop_distances() -> None:
    """Cycles converge: agent <-> tools, agent -> END."""
    g = _graph("agent")
    g.add_node("tools", "tool")
    g.add_edge(START, "agent")
    g.add_edge("agent", "tools", "conditional")
    g.add_edge("agent", END, "conditional")
    g.add_edge("tools", "agent")
    assert steps_to_execution(g, ["tools"]) == {
        START: math.inf,
        END: 2,
        "agent": 1,
        "tools": 0,
    }


def test_join_on_a_cycle_waits_for_both_sides() -> None:
    """A join fed by a loop body takes the slower side."""
    g = _graph("x", "y", "z", "j")
    g.add_edge("x", "y")
    g.add_edge("y", "z")
    g.add_edge("z", "x")
    g.add_join(["x", "z"], "j")
    assert steps_to_execution(g, ["x"])["j"] == 3


def test_prefix_ste_is_min_over_users() -> None:
    """A shared prefix is as urgent as its most urgent user."""
    g = _graph("a", "b")
    g.add_node("c", prefixes=["sys"])
    g.add_node("d", prefixes=["sys", "doc"])
    g.add_edge("a", "b")
    g.add_edge("b", "c")
    g.add_edge("a", "d")
    assert prefix_steps_to_execution(g, ["a"]) == {"doc": 1, "sys": 1}
    assert prefix_steps_to_execution(g, ["b"]) == {"doc": math.inf, "sys": 1}


def test_unknown_targets_are_conservative() -> None:
    """A router with unknown targets may reach any node in one step."""
    g = _graph("router", "x", "y")
    g.mark_targets_unknown("router")
    ste = steps_to_execution(g, ["router"])
    assert (ste["x"], ste["y"], ste[END], ste[START]) == (1, 1, 1, math.inf)


def test_unknown_frontier_node_is_usage_error() -> None:
    """A frontier naming an unknown node raises UsageError('frontier')."""
    with pytest.raises(UsageError, match="frontier"):
        steps_to_execution(_graph("a"), ["ghost"])


def test_kvflow_priority_caps_at_levels_plus_one() -> None:
    """prio = min(H + 1, STE)."""
    assert [kvflow_priority(s, 3) for s in (0, 2, 5, math.inf)] == [0, 2, 4, 4]


def _chain() -> AgentExecutionGraph:
    """a -> {b (observed once), c}; b -> d (uses p); c -> END; b, c use q."""
    g = _graph("a", "b", "c")
    g.add_node("d", prefixes=["p"])
    g.add_node("b", prefixes=["q"])
    g.add_node("c", prefixes=["q"])
    g.add_edge("a", "b", "conditional", count=1)
    g.add_edge("a", "c", "conditional")
    g.add_edge("b", "d")
    g.add_edge("c", END)
    g.add_edge("d", END)
    return g


def test_reuse_probability_hand_computed() -> None:
    """P(d within 2 steps of a) = q(b) = (1 + 1) / (1 + 2) = 2/3, reached in exactly 2 steps."""
    reuse = prefix_reuse(_chain(), ["a"], "p", horizon=2)
    assert reuse.probability == pytest.approx(2 / 3)
    assert reuse.expected_steps == pytest.approx(2.0)


def test_reuse_beyond_horizon_is_zero() -> None:
    """A target two steps away is not reused within one step."""
    reuse = prefix_reuse(_chain(), ["a"], "p", horizon=1)
    assert (reuse.probability, reuse.expected_steps) == (0.0, math.inf)


def test_prefix_reuse_is_hitting_probability_of_user_set() -> None:
    """A prefix used on both branches is certainly reused next step."""
    reuse = prefix_reuse(_chain(), ["a"], "q", horizon=1)
    assert reuse.probability == pytest.approx(1.0)
    assert reuse.expected_steps == pytest.approx(1.0)


def test_plain_fan_out_reaches_every_branch() -> None:
    """Plain successors all run: each is reached with probability 1."""
    g = _graph("a", "b", "c")
    g.add_edge("a", "b")
    g.add_edge("a", "c")
    assert reuse_within(g, ["a"], ["c"], horizon=1).probability == 1.0


def test_loop_reuse_accumulates_over_horizon() -> None:
    """agent -> {tools, END} 50/50, tools -> agent: P(tools within 3 of agent) = 1/2."""
    g = _graph("agent")
    g.add_node("tools", "tool")
    g.add_edge("agent", "tools", "conditional")
    g.add_edge("agent", END, "conditional")
    g.add_edge("tools", "agent")
    assert reuse_within(g, ["tools"], ["agent"], horizon=1).probability == 1.0
    assert reuse_within(g, ["agent"], ["tools"], horizon=3).probability == pytest.approx(0.5)


def test_tracker_caches_per_frontier() -> None:
    """The same frontier returns the same cached snapshot."""
    tracker = SteTracker(_and_or(), ["a"])
    first = tracker.advance(["b"])
    assert tracker.advance(["b"]) is first


def test_tracker_invalidates_on_structure_change() -> None:
    """A new edge is seen by the next query."""
    g = _and_or()
    tracker = SteTracker(g, ["a"])
    assert tracker.node_ste("lonely") == math.inf
    g.add_edge("a", "lonely")
    assert tracker.node_ste("lonely") == 1


def test_tracker_remembers_finished_join_members() -> None:
    """After b leaves the frontier, the join only waits for the other side."""
    g = _graph("a", "a2", "b", "c")
    g.add_edge("a", "a2")
    g.add_join(["a2", "b"], "c")
    tracker = SteTracker(g, ["a", "b"])
    assert tracker.node_ste("c") == 2
    assert tracker.advance(["a2"]).node("c") == 1
    assert tracker.advance(["c"]).node("c") == 0


def test_tracker_reuse_matches_function() -> None:
    """Tracker reuse equals the one-shot computation, and frontier users give 1."""
    g = _chain()
    tracker = SteTracker(g, ["a"], horizon=2)
    assert tracker.reuse("p") == prefix_reuse(g, ["a"], "p", horizon=2)
    tracker.advance(["d"])
    assert tracker.reuse("p").probability == 1.0


def test_tracker_reuse_follows_new_counts() -> None:
    """Observations change the learned probabilities the tracker reports."""
    g = _chain()
    tracker = SteTracker(g, ["a"], horizon=2)
    before = tracker.reuse("p").probability
    g.observe_transition("a", "b", count=10)
    assert tracker.reuse("p").probability > before


def test_tracker_precompute_fills_single_node_frontiers() -> None:
    """precompute warms one snapshot per node not cached yet."""
    g = _chain()
    tracker = SteTracker(g, ["a"])
    assert tracker.snapshot.node("a") == 0  # the current frontier's snapshot is now cached
    assert tracker.precompute() == len(g) - 1
