"""What a graph learns of steps that hand over to another agent: do they come back?"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentclaims.errors import UsageError
from agentclaims.graph import AgentExecutionGraph

runs = st.lists(
    st.integers(0, 5).flatmap(lambda h: st.tuples(st.just(h), st.integers(0, h))), max_size=12
)


def _graph() -> AgentExecutionGraph:
    g = AgentExecutionGraph()
    g.add_node("worker")
    return g


def test_a_step_never_seen_to_hand_over_has_no_learned_comeback() -> None:
    g = _graph()
    assert g.comeback_probability("worker") is None
    g.observe_handoffs("worker", 0, 0)
    assert g.comeback_probability("worker") is None


@given(runs)
def test_the_comeback_probability_is_the_share_of_comebacks_with_a_light_prior(
    observed: list[tuple[int, int]],
) -> None:
    g = _graph()
    for handoffs, comebacks in observed:
        g.observe_handoffs("worker", handoffs, comebacks)
    total = sum(h for h, _ in observed)
    back = sum(c for _, c in observed)
    p = g.comeback_probability("worker")
    if total == 0:
        assert p is None
        return
    assert p is not None
    assert 0 < p < 1
    assert p == pytest.approx((back + 0.125) / (total + 0.25))
    assert AgentExecutionGraph.from_dict(g.to_dict()).comeback_probability("worker") == p
    g.observe_handoffs("worker", 1, 0)  # one more run where it did not come back
    assert g.comeback_probability("worker") < p  # type: ignore[operator]


@given(runs, st.sampled_from([(1, 2), (-1, 0), (1, -1), (True, 0), (1.0, 0)]))
def test_bad_counts_are_refused_and_change_nothing(
    observed: list[tuple[int, int]], bad: tuple[object, object]
) -> None:
    g = _graph()
    for handoffs, comebacks in observed:
        g.observe_handoffs("worker", handoffs, comebacks)
    before, version = g.comeback_probability("worker"), g.version
    with pytest.raises(UsageError):
        g.observe_handoffs("worker", *bad)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="unknown node"):
        g.observe_handoffs("nobody", 1, 0)
    assert (g.comeback_probability("worker"), g.version) == (before, version)


def test_a_first_run_without_a_comeback_is_not_yet_enough_to_give_up_on_a_step() -> None:
    """One run's handover gives 0.1, above the planner's 0.05 floor for a hold; three runs
    without a comeback take it below."""
    g = _graph()
    g.observe_handoffs("worker", 1, 0)
    assert g.comeback_probability("worker") == pytest.approx(0.1)
    g.observe_handoffs("worker", 2, 0)
    assert g.comeback_probability("worker") < 0.05  # type: ignore[operator]


@given(st.lists(st.sampled_from(["supervisor", "researcher", "writer"]), max_size=30))
def test_a_runs_handoffs_and_comebacks_are_counted_from_its_calls(calls: list[str]) -> None:
    """Whatever order the agents call in: each change of caller is one handover of the one
    before, and a comeback of the new one if it had handed over; the graph learns them only
    when the run completes."""
    from agentclaims.graph import ToolTimeModel
    from agentclaims.planner import ClaimPlanner
    from agentclaims.session.workflow import WorkflowModel

    graph = AgentExecutionGraph()
    model = WorkflowModel(
        graph,
        ClaimPlanner(),
        ToolTimeModel(),
        horizon=4,
        reload_s_per_block=0.01,
        queue_delay_s=0.05,
        clock=lambda: 0.0,
    )
    for step, node in enumerate(calls):  # one call a step: nothing runs beside another
        model.before_call(node, step)
        model.after_call(node, ())
    changes = [a for a, b in itertools.pairwise(calls) if a != b]
    assert all(graph.comeback_probability(n) is None for n in set(calls))  # not yet
    model.finish()
    for node in set(calls):
        handoffs = changes.count(node)
        # it came back after every handover but one that ended its part of the run
        comebacks = handoffs - (1 if handoffs and calls[-1] != node else 0)
        p = graph.comeback_probability(node)
        if handoffs == 0:
            assert p is None
        else:
            assert p == pytest.approx((comebacks + 0.125) / (handoffs + 0.25))
