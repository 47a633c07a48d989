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


def test_an_evicted_block_stored_again_within_the_window_is_a_regret() -> None:
    """``evicted_reused_p``: of the blocks evicted in the window at least one pool turnover
    ago, the share stored again since (each counted once); one stored after the window left
    it is not; a block evicted a moment ago is not counted yet (it has had no time to come
    back); under ``MIN_EVICTED`` such evictions nothing is said."""
    clock = Clock()
    churn = PoolChurn(10.0, clock=clock)
    churn.saw(range(8), ())
    clock.now += 2
    assert churn.reused_p(1.0) is None  # 8 evictions: too few to tell
    churn.saw(range(8, 40), range(4))  # 32 more evicted, 4 of the first 8 stored again
    churn.saw((), range(4))  # stored again twice: still 4 regrets
    assert churn.reused_blocks == 4
    assert churn.reused_p(1.0) is None  # the 32 are a moment old: not counted yet
    clock.now += 2
    assert churn.reused_p(1.0) == pytest.approx(0.1)  # 4 of the 40 evicted a turnover ago
    assert churn.reused_p(3.0) is None  # only the first 8 are 3 s old
    figures = churn.figures(4)
    assert figures["evicted_reused_p"] == churn.reused_p(figures["survival_s"])
    clock.now += 9  # everything left the window: nothing to tell
    assert churn.reused_p(1.0) is None
    churn.saw((), range(8, 40))  # stored after the window: no regret
    assert churn.reused_blocks == 4


@given(
    st.lists(
        st.tuples(
            st.floats(0.0, 5.0),
            st.lists(st.integers(0, 60), max_size=40),
            st.lists(st.integers(0, 60), max_size=40),
        ),
        max_size=30,
    )
)
def test_the_share_stored_again_is_a_share_of_what_was_evicted(
    steps: list[tuple[float, list[int], list[int]]],
) -> None:
    """Whatever the steps, the regrets never outnumber the evictions, and the share said is
    within [0, 1] (or unsaid)."""
    clock = Clock()
    churn = PoolChurn(10.0, clock=clock)
    for dt, removed, stored in steps:
        clock.now += dt
        churn.saw(removed, stored)
        assert churn.reused_blocks <= churn.evicted_blocks
        said = churn.reused_p(0.0)
        assert said is None or 0.0 <= said <= 1.0
