"""The Agent Execution Graph: building, validation, learning, serialisation."""

from __future__ import annotations

import pytest

from agentclaims.errors import UsageError
from agentclaims.graph import END, START, AgentExecutionGraph


def _react() -> AgentExecutionGraph:
    g = AgentExecutionGraph()
    g.add_node("agent", prefixes=["sys"])
    g.add_node("tools", "tool")
    g.add_edge(START, "agent")
    g.add_edge("agent", "tools", "conditional")
    g.add_edge("agent", END, "conditional")
    g.add_edge("tools", "agent")
    return g


def test_new_graph_has_sentinels() -> None:
    """A fresh graph holds only __start__ and __end__, with their kinds."""
    g = AgentExecutionGraph()
    assert g.nodes == [START, END]
    assert (g.node_kind(START), g.node_kind(END)) == ("start", "end")


def test_nodes_keep_kind_and_prefixes() -> None:
    """add_node records the kind and the prefix ids; prefix_users inverts them."""
    g = _react()
    g.add_node("writer", prefixes=["sys", "style"])
    assert g.node_kind("tools") == "tool"
    assert g.prefixes_of("writer") == {"sys", "style"}
    assert g.prefix_users() == {"style": {"writer"}, "sys": {"agent", "writer"}}


def test_unobserved_conditional_edges_split_uniformly() -> None:
    """With no observations, the choice edges of a node share probability equally."""
    assert _react().transition_probabilities("agent") == {"tools": 0.5, END: 0.5}


def test_plain_edges_have_probability_one() -> None:
    """A plain edge is always taken."""
    assert _react().transition_probabilities("tools") == {"agent": 1.0}


def test_laplace_smoothing_uses_observed_counts() -> None:
    """Probabilities are (count + 1) / (total + n_choices)."""
    g = _react()
    g.observe_transition("agent", "tools", count=3)
    assert g.transition_probabilities("agent") == pytest.approx({"tools": 0.8, END: 0.2})


def test_observe_transition_adds_unseen_edge_and_node() -> None:
    """An unseen transition becomes a conditional edge; an unknown node an agent."""
    g = _react()
    g.observe_transition("tools", "critic")
    assert g.edge_kind("tools", "critic") == "conditional"
    assert g.edge_count("tools", "critic") == 1
    assert g.node_kind("critic") == "agent"


def test_observe_run_brackets_with_sentinels() -> None:
    """observe_run learns entry and exit transitions too."""
    g = _react()
    g.observe_run(["agent", "tools", "agent"])
    assert g.edge_count(START, "agent") == 1
    assert g.edge_count("agent", "tools") == 1
    assert g.edge_count("agent", END) == 1


def test_observe_transition_clears_targets_unknown() -> None:
    """The first observed transition of an unknown router replaces the guess."""
    g = _react()
    g.add_node("router", targets_unknown=True)
    g.observe_transition("router", "tools")
    assert not g.targets_unknown("router")


def test_add_join_marks_and_join() -> None:
    """add_join makes the target an AND-join over the sources, with join edges."""
    g = AgentExecutionGraph()
    for n in ("a", "b", "c"):
        g.add_node(n)
    g.add_join(["a", "b"], "c")
    assert g.is_and_join("c")
    assert g.join_groups("c") == (frozenset({"a", "b"}),)
    assert g.is_join_edge("a", "c")


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda g: g.add_node(""), "name"),
        (lambda g: g.add_node("x", "robot"), "kind"),
        (lambda g: g.add_node(START), "name"),
        (lambda g: g.add_node("t", "tool", prefixes=["p"]), "prefixes"),
        (lambda g: g.add_edge("agent", "nowhere"), "target"),
        (lambda g: g.add_edge("agent", "tools", "teleport"), "kind"),
        (lambda g: g.add_edge("agent", "tools", count=-1), "count"),
        (lambda g: g.add_edge(END, "agent"), "source"),
        (lambda g: g.observe_transition("agent", ""), "target"),
        (lambda g: g.observe_run(["agent", "", "tools"]), "path"),
        (lambda g: g.observe_run(["agent", START]), "path"),
        (lambda g: g.add_join(["agent"], "tools"), "sources"),
        (lambda g: g.transition_probabilities("ghost"), "node"),
    ],
)
def test_bad_input_names_field_and_changes_nothing(call: object, field: str) -> None:
    """Bad input raises UsageError naming the field, leaving the graph untouched."""
    g = _react()
    before = g.to_dict()
    with pytest.raises(UsageError) as info:
        call(g)  # type: ignore[operator]
    assert info.value.field == field
    assert g.to_dict() == before


def test_counts_do_not_change_structure_version() -> None:
    """Observing a known edge bumps version but not structure_version."""
    g = _react()
    structure, version = g.structure_version, g.version
    g.observe_transition("agent", "tools")
    assert (g.structure_version, g.version) == (structure, version + 1)


def test_round_trip_through_dict() -> None:
    """from_dict(to_dict()) rebuilds the same graph, joins and warnings included."""
    g = _react()
    g.add_node("c")
    g.add_join(["agent", "tools"], "c")
    g.observe_transition("agent", "tools", count=2)
    g.add_warning("targets-unknown", "agent", "example")
    assert AgentExecutionGraph.from_dict(g.to_dict()).to_dict() == g.to_dict()


def test_copy_is_independent() -> None:
    """Changing a copy leaves the original alone."""
    g = _react()
    other = g.copy()
    other.observe_transition("agent", "tools")
    assert g.edge_count("agent", "tools") == 0


def test_count_version_moves_with_counts_not_with_structure() -> None:
    """A known transition counted again moves its source's count version (a cache of its
    probabilities is stale); a new edge changes the structure instead."""
    g = AgentExecutionGraph()
    g.add_node("a", "agent")
    g.add_node("b", "agent")
    g.add_edge("a", "b", "conditional")
    before, structure = g.count_version("a"), g.structure_version
    g.observe_transition("a", "b")
    assert g.count_version("a") == before + 1
    assert g.count_version("b") == 0
    assert g.structure_version == structure
    g.observe_transition("a", "c")  # a new edge and node: structure, not counts
    assert g.count_version("a") == before + 1
    assert g.structure_version > structure
    with pytest.raises(UsageError, match="unknown node"):
        g.count_version("nope")
