"""The session's workflow model forecasts a wait already under way from its remaining time."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from agentclaims.graph import AgentExecutionGraph, ToolTimeModel
from agentclaims.planner import ClaimPlanner
from agentclaims.session.workflow import QUIET_WINDOW_S, WorkflowModel


def _model(clock: list[float]) -> WorkflowModel:
    times = ToolTimeModel(cold_start_samples=0)
    return WorkflowModel(
        AgentExecutionGraph(),
        ClaimPlanner(),
        times,
        horizon=8,
        reload_s_per_block=0.01,
        queue_delay_s=30.0,
        clock=lambda: clock[0],
    )


def test_a_wait_under_way_is_forecast_from_what_remains_of_it() -> None:
    """An agent whose ``build`` tool took 1 s or 10 s, half and half: right after its reply
    the wait is forecast whole; 2 s into it, only the 10 s waits are possible, and 8 s remain,
    with a TTL for those 8 s (a claim renewed then is not given the whole wait again)."""
    clock = [100.0]
    model = _model(clock)
    for took in [1.0] * 50 + [10.0] * 50:  # learned the way a session learns: call to call
        model.before_call("agent")
        model.after_call("agent", ["build"])
        clock[0] += took
    model.before_call("agent")
    model.after_call("agent", ["build"])
    fresh = model.context("agent", "pfx-0123456789abcdef-4", ["build"])
    assert (fresh.expected_wait_s, fresh.ttl_s) == (5.5, 10.0)
    clock[0] += 2.0
    mid = model.context("agent", "pfx-0123456789abcdef-4", (), mid_wait=True)
    assert (mid.expected_wait_s, mid.ttl_s, mid.waiting_on) == (8.0, 8.0, "tool")
    # without mid_wait it is the next call's context, as before (no tools: not a tool wait)
    assert model.context("agent", "pfx-0123456789abcdef-4", ()).waiting_on != "tool"


def test_the_next_calls_way_to_its_prefix_is_the_recent_call_latency() -> None:
    """What a busy engine's queue adds before a call reaches its prefix: the calls' latency,
    smoothed (``admission_s``, which the pool-keeps rule adds to the wait)."""
    model = _model([0.0])
    model.before_call("agent")
    model.after_call("agent", ["build"])
    assert model.context("agent", "pfx-0123456789abcdef-4", ["build"]).admission_s == 0.0
    model.note_call(retried=False, latency_s=2.0)
    model.note_call(retried=False, latency_s=4.0)
    model.note_call(retried=False, latency_s=float("nan"))  # no figure: nothing learned
    assert model.context("agent", "pfx-0123456789abcdef-4", ["build"]).admission_s == 2.6


@settings(max_examples=200, deadline=None)
@given(
    window=st.floats(min_value=0.0, max_value=1e6),
    free=st.integers(min_value=0, max_value=10_000),
    wait=st.floats(min_value=0.1, max_value=100.0),
)
def test_a_quiet_pool_vouches_for_its_window_and_no_longer(
    window: float, free: int, wait: float
) -> None:
    """A pool that evicted nothing over its window kept every block that long, no longer (an
    engine that idled through it says nothing of the next tenant): its survival is the
    window, and the pool-keeps rule skips a claim only for a wait a quarter of it covers. A
    window shorter than ``QUIET_WINDOW_S`` (an engine that just started) vouches for nothing.
    A churning pool's own ``survival_s`` stands; a figure that is no duration is unknown."""
    model = _model([0.0])
    model.before_call("agent")
    model.after_call("agent", ["build"])
    model.note_pool({"free_blocks": free, "evicted_per_s": 0.0, "window_s": window})
    assert model.pool_survival_s == (window if window >= QUIET_WINDOW_S else None)
    ctx = model.context("agent", "pfx-0123456789abcdef-4", ())
    keeps = replace(ctx, expected_wait_s=wait, wait_learned=True).pool_keeps(4.0)
    assert keeps == (window >= QUIET_WINDOW_S and window >= 4.0 * wait)
    model.note_pool({"evicted_per_s": 2.0, "survival_s": free / 2.0, "window_s": window})
    assert model.pool_survival_s == free / 2.0
    for bad in (None, True, -1.0, float("nan"), float("inf"), "30"):
        model.note_pool({"evicted_per_s": 0.0, "window_s": bad})
        assert model.pool_survival_s is None
        model.note_pool({"evicted_per_s": 1.0, "survival_s": bad})
        assert model.pool_survival_s is None


def test_a_first_call_expects_the_tool_its_step_stands_for() -> None:
    """A tool called outside a tool node gets a step of its own (``tool:search``); the next
    run's first call of that agent, before any reply, expects that tool, and its wait is the
    one learned under the tool's name (10 s), not an unknown tool's prior."""
    clock = [0.0]
    first = _model(clock)
    for _ in range(3):
        first.before_call("agent")
        first.after_call("agent", [])
        first.tool_started("search", "agent")
        clock[0] += 10.0
        first.tool_finished("search", "agent", 10.0)
    assert "tool:search" in first.graph
    again = WorkflowModel(
        first.graph,
        ClaimPlanner(),
        first.tool_times,
        horizon=8,
        reload_s_per_block=0.01,
        queue_delay_s=30.0,
        clock=lambda: clock[0],
    )
    again.before_call("agent")
    assert again.expected_tools("agent") == ("search",)
    ctx = again.context("agent", "pfx-0123456789abcdef-4", again.expected_tools("agent"))
    assert ctx.waiting_on == "tool"
    assert ctx.expected_wait_s == 10.0
    assert not replace(ctx, pool_survival_s=30.0).pool_keeps(4.0)  # a quiet pool: held
