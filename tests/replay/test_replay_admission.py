"""The replay behind the SDK's AIMD admission window: every trace still runs to its end, no more
traces run at once than the window allows, waits count in completion times, and the comparison
adds the ``agentclaims+aimd`` row next to ``agentclaims``."""

from __future__ import annotations

import pytest

from agentclaims.backends.admission import AdmissionWindow
from agentclaims.errors import UnknownNameError
from agentclaims.replay import compare_policies
from agentclaims.replay.bench import ADMITTED_ROW
from agentclaims.replay.harness import ReplayResult, run_replay, working_set_blocks
from agentclaims.replay.policies import make_policy
from agentclaims.replay.synthetic import synthetic_workload

TRACES = synthetic_workload(12, seed=3, block_size=16)


def _run(window: AdmissionWindow | None, capacity: int) -> ReplayResult:
    return run_replay(
        TRACES,
        make_policy("agentclaims", block_size=16),
        capacity_blocks=capacity,
        sessions=6,
        block_size=16,
        admission=window,
    )


def test_a_window_of_two_runs_every_trace_two_at_a_time():
    """Window fixed at 2 (min = max): all 12 traces complete; those that waited for a slot
    make the mean completion longer than with 6 at once."""
    cap = working_set_blocks(TRACES, 6)
    free = _run(None, cap)
    window = AdmissionWindow(initial=2, min_window=2, max_window=2)
    held = _run(window, cap)
    assert held.traces == free.traces == len(TRACES)
    assert held.requests == free.requests
    assert held.admission_deferred == window.stats.deferred > 0
    assert held.admission_window == (2, 2, 2)
    assert held.admission_wait_s > 0
    assert held.completion_s_mean > free.completion_s_mean
    assert (window.active, window.waiting) == (0, 0)
    assert free.admission_window is None
    assert free.admission_deferred == 0


def test_pressure_shrinks_the_window_within_its_bounds():
    """At a tenth of the working set, requests wait for memory: the window halves from 6,
    never below its floor of 2, and every trace still completes with no harm."""
    cap = max(8, working_set_blocks(TRACES, 6) // 10)
    window = AdmissionWindow(initial=6, min_window=2, max_window=6, period_calls=4)
    res = _run(window, cap)
    assert res.traces == len(TRACES)
    low, high, final = res.admission_window
    assert 2 <= low < high == 6
    assert 2 <= final <= 6
    assert window.stats.decreases >= 1
    assert res.true_harm == 0


def test_comparison_adds_the_admitted_row():
    comp = compare_policies(
        TRACES,
        ["lru"],
        sessions=6,
        capacity_frac=0.2,
        block_size=16,
        admission="aimd",
    )
    assert list(comp.results) == ["lru", "agentclaims", ADMITTED_ROW, "opt"]
    row = comp.to_dict()["policies"][ADMITTED_ROW]
    assert row["policy"] == ADMITTED_ROW
    assert row["uses_future"] is False
    assert row["admission_window"][1] == 6
    assert comp.results["agentclaims"].admission_window is None
    with pytest.raises(UnknownNameError, match="admission"):
        compare_policies(TRACES, ["lru"], sessions=6, capacity_frac=0.2, admission="tcp")
