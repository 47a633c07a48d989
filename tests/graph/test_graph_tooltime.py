"""Tool durations and Continuum's TTL rule."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentclaims.errors import UsageError
from agentclaims.graph import ToolTimeModel


def test_cold_start_uses_exponential_prior() -> None:
    """With <= 100 samples, tau* = mu * ln(B / mu) for B > mu."""
    m = ToolTimeModel()
    m.observe_many("search", [1.0, 2.0, 3.0])
    ttl = m.ttl("search", queue_delay_s=10.0, eta=0.5, reload_s=1.0)  # B = 6, mu = 2
    assert ttl == pytest.approx(2.0 * math.log(3.0))


def test_cold_start_gives_zero_when_benefit_below_mean() -> None:
    """With B <= mu the pin is not worth it."""
    m = ToolTimeModel()
    m.observe_many("search", [4.0, 6.0])
    assert m.ttl("search", queue_delay_s=1.0, eta=1.0, reload_s=1.0) == 0.0


def test_cold_start_without_samples_uses_prior_mean() -> None:
    """An unseen tool uses the configured prior mean."""
    m = ToolTimeModel(prior_mean_s=0.5)
    assert m.ttl("new", queue_delay_s=2.0) == pytest.approx(0.5 * math.log(4.0))


def test_argmax_over_observed_durations() -> None:
    """Past the cold start, tau* maximises F(tau) * B - tau over {0} and the samples."""
    m = ToolTimeModel()
    m.observe_many("run", [1.0] * 60 + [5.0] * 41)  # n = 101; B = 100
    # tau=1: 60/101*100 - 1 = 58.4; tau=5: 100 - 5 = 95; tau=0: 0
    assert m.ttl("run", queue_delay_s=100.0) == 5.0


def test_argmax_prefers_short_ttl_when_benefit_small() -> None:
    """A small benefit makes the short, likely duration the best pin."""
    m = ToolTimeModel()
    m.observe_many("run", [1.0] * 100 + [50.0])  # B = 10
    # tau=1: 100/101*10 - 1 = 8.9; tau=50: 10 - 50 < 0
    assert m.ttl("run", queue_delay_s=10.0) == 1.0


def test_argmax_may_choose_zero() -> None:
    """When every duration costs more than it saves, tau* = 0."""
    m = ToolTimeModel()
    m.observe_many("slow", [30.0 + i for i in range(101)])
    assert m.ttl("slow", queue_delay_s=5.0) == 0.0


def test_empirical_cdf() -> None:
    """F(x) is the fraction of samples <= x."""
    m = ToolTimeModel()
    m.observe_many("t", [1.0, 2.0, 2.0, 4.0])
    assert [m.cdf("t", x) for x in (0.5, 2.0, 3.0, 4.0)] == [0.0, 0.75, 0.75, 1.0]


def test_predict_median_and_mean() -> None:
    """predict gives the median by default, the mean on request."""
    m = ToolTimeModel()
    m.observe_many("t", [1.0, 2.0, 9.0])
    assert m.predict("t") == 2.0
    assert m.predict("t", statistic="mean") == 4.0


def test_history_is_bounded() -> None:
    """Only the last `history` durations are kept."""
    m = ToolTimeModel(history=3)
    m.observe_many("t", [1.0, 2.0, 3.0, 4.0])
    assert m.samples("t") == (2.0, 3.0, 4.0)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, "1"])
def test_bad_duration_rejected_and_nothing_recorded(bad: object) -> None:
    """Negative, NaN, infinite or non-numeric durations raise UsageError naming `seconds`."""
    m = ToolTimeModel()
    with pytest.raises(UsageError) as info:
        m.observe("t", bad)  # type: ignore[arg-type]
    assert info.value.field == "seconds"
    assert m.count("t") == 0


def test_observe_many_is_all_or_nothing() -> None:
    """One bad value in observe_many records none of them."""
    m = ToolTimeModel()
    with pytest.raises(UsageError, match="durations"):
        m.observe_many("t", [1.0, -2.0])
    assert m.count("t") == 0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0.0, 100.0, allow_nan=False), min_size=101, max_size=400),
    st.floats(0.1, 200.0),
    st.integers(101, 300),
)
def test_ttl_is_near_the_exact_argmax_and_history_stays_sorted(
    durations: list[float], benefit: float, history: int
) -> None:
    """Past the cold start ``ttl`` weighs at most 64 candidates: its value F(tau) * B - tau is
    within B / 64 of the exact optimum over the kept durations; the kept durations stay the
    last ``history`` ones, sorted for the CDF."""
    m = ToolTimeModel(history=history)
    m.cdf("t", 0.0)  # the sorted view exists before the samples arrive: kept up to date
    m.observe_many("t", durations)
    kept = sorted(durations[-history:])
    assert sorted(m.samples("t")) == kept
    assert m.cdf("t", kept[len(kept) // 2]) == sum(
        1 for d in kept if d <= kept[len(kept) // 2]
    ) / len(kept)

    def value(tau: float) -> float:
        return sum(1 for d in kept if d <= tau) / len(kept) * benefit - tau

    exact = max([0.0, *kept], key=value)
    tau = m.ttl("t", queue_delay_s=benefit)
    if len(kept) > 100:
        assert value(tau) >= value(exact) - benefit / 64 - 1e-9


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.floats(0.0, 50.0), max_size=40),
    st.integers(0, 10),
    st.floats(0.0, 20.0),
    st.floats(0.0, 5.0),
)
def test_forecast_is_predict_and_ttl_in_one_call(
    durations: list[float], cold: int, queue_delay: float, reload: float
) -> None:
    """``forecast`` answers exactly what ``predict`` and ``ttl`` answer, prior included."""
    model = ToolTimeModel(cold_start_samples=cold)
    model.observe_many("search", durations)
    assert model.forecast("search", queue_delay_s=queue_delay, reload_s=reload) == (
        model.predict("search"),
        model.ttl("search", queue_delay_s=queue_delay, reload_s=reload),
    )


def test_forecast_rejects_bad_input() -> None:
    model = ToolTimeModel()
    with pytest.raises(UsageError, match="queue_delay_s"):
        model.forecast("search", queue_delay_s=-1.0)
    with pytest.raises(UsageError, match="tool"):
        model.forecast("", queue_delay_s=1.0)


@given(
    st.lists(st.floats(0.0, 50.0), min_size=1, max_size=40),
    st.integers(0, 10),
    st.floats(0.0, 60.0),
    st.floats(0.0, 20.0),
)
def test_a_forecast_mid_wait_is_the_forecast_of_the_waits_that_lasted_as_long(
    durations: list[float], cold: int, waited: float, queue_delay: float
) -> None:
    """Having waited ``waited_s``, the forecast is that of a model that saw only the waits
    longer than it, each less it (the remaining time); past every observed wait, the prior."""
    model = ToolTimeModel(cold_start_samples=cold, prior_mean_s=0.7)
    model.observe_many("search", durations)
    # a wait not yet begun (0 s) is every wait, as the forecast without ``waited_s``
    remaining = [d - waited for d in durations if d > waited] if waited else durations
    given_as_much = ToolTimeModel(cold_start_samples=cold, prior_mean_s=0.7)
    given_as_much.observe_many("search", remaining)
    got = model.forecast("search", queue_delay_s=queue_delay, waited_s=waited)
    assert got == pytest.approx(given_as_much.forecast("search", queue_delay_s=queue_delay))
    if not remaining:
        assert got[0] == 0.7
    if waited == 0.0:
        assert got == model.forecast("search", queue_delay_s=queue_delay)


def test_a_wait_that_outlasted_the_short_ones_gets_the_long_ones_rest() -> None:
    """Waits of 1 s or 10 s: 2 s in, the wait is a 10 s one, so 8 s remain (not 1 s again)."""
    model = ToolTimeModel(cold_start_samples=0)
    model.observe_many("build", [1.0] * 50 + [10.0] * 50)
    assert model.forecast("build", queue_delay_s=30.0)[1] == 10.0
    wait, ttl = model.forecast("build", queue_delay_s=30.0, waited_s=2.0)
    assert (wait, ttl) == (8.0, 8.0)
    with pytest.raises(UsageError, match="waited_s"):
        model.forecast("build", queue_delay_s=1.0, waited_s=-1.0)
