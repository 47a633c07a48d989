"""Engine costs learned from answered calls: the per-block recompute time the TTL rule needs."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from agentclaims.errors import UsageError
from agentclaims.graph import EngineCosts


@given(
    st.floats(0.0, 0.05),
    st.floats(0.0, 0.02),
    st.floats(0.0, 0.5),
    st.lists(st.tuples(st.integers(0, 200), st.integers(0, 300)), min_size=8, max_size=64),
)
def test_calls_on_a_line_give_back_its_costs(
    per_block: float, per_token: float, overhead: float, calls: list[tuple[int, int]]
) -> None:
    """Calls that cost exactly ``overhead + per_block * blocks + per_token * tokens`` are fitted
    to those costs (no pull toward the prior); with blocks all alike, the prior stands."""
    costs = EngineCosts(0.123, prior_weight=0.0)
    for blocks, tokens in calls:
        costs.observe(overhead + per_block * blocks + per_token * tokens, blocks, tokens)
    if len({b for b, _ in calls}) == 1:
        assert not costs.learned
        assert costs.reload_s_per_block == 0.123
        return
    n = len(calls)  # the blocks and tokens must not move together, or the split is unknown
    sb, st_, sbt = (
        sum(b for b, _ in calls),
        sum(t for _, t in calls),
        sum(b * t for b, t in calls),
    )
    sbb, stt = sum(b * b for b, _ in calls), sum(t * t for _, t in calls)
    assume((n * sbb - sb * sb) * (n * stt - st_ * st_) - (n * sbt - sb * st_) ** 2 > 0)
    assert costs.learned
    assert costs.reload_s_per_block == pytest.approx(per_block, rel=1e-6, abs=1e-9)


def test_the_prior_pulls_a_few_noisy_calls_and_fades() -> None:
    """Two calls' worth of prior: with 8 calls the fit sits between the prior and the calls'
    cost; with 64 it is the calls'."""
    truth = 0.01

    def fed(n: int) -> EngineCosts:
        costs = EngineCosts(0.001)
        for i in range(n):
            blocks = 10 + 10 * (i % 5)
            costs.observe(0.05 + truth * blocks + 0.002 * 20, blocks, 20)
        return costs

    few, many = fed(8), fed(64)
    assert 0.001 < few.reload_s_per_block < truth
    assert many.reload_s_per_block == pytest.approx(truth, rel=0.05)
    assert few.reload_s_per_block < many.reload_s_per_block
    assert many.decode_s_per_token == 0.0  # every call generated as many tokens: unknown


def test_too_few_calls_keep_the_prior_and_costs_never_go_negative() -> None:
    costs = EngineCosts(0.002)
    for blocks in range(7):
        costs.observe(1.0 - 0.1 * blocks, blocks, 5)  # faster with more blocks: noise
    assert (costs.learned, costs.reload_s_per_block, costs.decode_s_per_token) == (
        False,
        0.002,
        None,
    )
    costs.observe(0.1, 7, 5)
    assert costs.learned
    assert costs.reload_s_per_block == 0.0
    assert costs.calls == 8


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda c: c.observe(-1.0, 1, 1), "seconds"),
        (lambda c: c.observe(float("nan"), 1, 1), "seconds"),
        (lambda c: c.observe(1.0, -1, 1), "computed_blocks"),
        (lambda c: c.observe(1.0, True, 1), "computed_blocks"),
        (lambda c: c.observe(1.0, 1, 2.5), "completion_tokens"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(call, field) -> None:  # type: ignore[no-untyped-def]
    costs = EngineCosts(0.002)
    with pytest.raises(UsageError) as info:
        call(costs)
    assert info.value.field == field
    assert costs.calls == 0
    with pytest.raises(UsageError, match="window"):
        EngineCosts(0.002, window=1)
    with pytest.raises(UsageError, match="prior_reload_s_per_block"):
        EngineCosts(-0.002)


@given(
    st.lists(
        st.tuples(st.floats(0.0, 2.0), st.integers(0, 400), st.integers(0, 300)),
        min_size=8,
        max_size=300,
    ),
    st.integers(8, 64),
)
def test_the_window_the_fit_reads_is_its_last_calls_however_many_came_before(
    calls: list[tuple[float, int, int]], window: int
) -> None:
    """The sums kept as calls come and go fit what a fresh learner given only the window's
    last ``window`` calls fits: the calls that left the window leave no trace."""
    long = EngineCosts(0.002, window=window)
    for call in calls:
        long.observe(*call)
    fresh = EngineCosts(0.002, window=window)
    for call in calls[-window:]:
        fresh.observe(*call)
    assert long.calls == fresh.calls
    assert long.learned == fresh.learned
    assert long.reload_s_per_block == pytest.approx(fresh.reload_s_per_block, rel=1e-6, abs=1e-9)
    if fresh.decode_s_per_token is None:
        assert long.decode_s_per_token is None
    else:
        assert long.decode_s_per_token == pytest.approx(
            fresh.decode_s_per_token, rel=1e-6, abs=1e-9
        )
