"""``PoolChurn``, the connector's eviction meter, on a fake clock: the rate over its sliding
window, what an answer says, and unknown churn never reported as none."""

from __future__ import annotations

import pytest
from agentclaims_vllm.churn import PoolChurn
from hypothesis import given
from hypothesis import strategies as st


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_rate_counts_evictions_over_the_window_then_forgets_them() -> None:
    clock = Clock()
    churn = PoolChurn(10.0, clock=clock)
    clock.now += 5
    churn.evicted(20)  # 20 blocks in the 5 s measured so far
    assert churn.rate() == pytest.approx(4.0)
    clock.now += 5
    churn.evicted(10)
    assert churn.rate() == pytest.approx(3.0)  # 30 over the full 10 s window
    clock.now += 6  # the first 20 left the window
    assert churn.rate() == pytest.approx(1.0)
    clock.now += 10
    assert churn.rate() == 0.0
    assert churn.evicted_blocks == 30


def test_figures_give_the_survival_of_a_block_freed_now() -> None:
    clock = Clock()
    churn = PoolChurn(10.0, clock=clock)
    clock.now += 10
    assert churn.figures(12)["survival_s"] is None  # nothing evicted: no end in sight
    churn.evicted(40)  # 4 blocks/s: the 12 free blocks ahead go in 3 s
    figures = churn.figures(12)
    assert figures["evicted_per_s"] == 4.0
    assert figures["survival_s"] == 3.0
    assert figures["free_blocks"] == 12
    assert figures["evicted_blocks"] == 40


def test_nothing_evicted_counts_as_nothing_and_a_bad_window_is_refused() -> None:
    churn = PoolChurn(clock=Clock())
    churn.evicted(0)
    churn.evicted(-3)
    assert churn.evicted_blocks == 0
    with pytest.raises(ValueError, match="window_s"):
        PoolChurn(0.0)


@given(st.lists(st.tuples(st.floats(0, 20), st.integers(0, 50)), max_size=40))
def test_the_rate_is_what_the_window_holds(steps: list[tuple[float, int]]) -> None:
    """Property: the rate is the blocks evicted within the last window over the time measured
    (the window, or less at first); the total counts every eviction."""
    clock = Clock()
    start = clock.now
    churn = PoolChurn(10.0, clock=clock)
    seen: list[tuple[float, int]] = []
    for dt, n in steps:
        clock.now += dt
        churn.evicted(n)
        if n > 0:
            seen.append((clock.now, n))
    span = min(10.0, clock.now - start)
    in_window = sum(n for t, n in seen if t >= clock.now - 10.0)
    expected = in_window / span if span > 0 else 0.0
    assert churn.rate() == pytest.approx(expected)
    assert churn.evicted_blocks == sum(n for _, n in seen)
