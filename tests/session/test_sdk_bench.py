"""`agentclaims bench sdk` times the same deterministic walk several times (figures are
printed, not asserted)."""

from __future__ import annotations

import argparse
import json
import statistics

import pytest

from agentclaims.cli import bench_sdk
from agentclaims.errors import UsageError


def test_runs_repeat_the_same_calls_and_each_call_takes_its_median() -> None:
    """Every run plans the same claims (the virtual clock), one figure per call survives
    into the per-call medians, and they lie within what the runs measured."""
    result = bench_sdk.bench_sdk(nodes=80, calls=600, seed=4, runs=3)
    assert result["runs"] == 3
    assert len(result["per_run"]) == 3
    assert sum(result["plans"].values()) == 600
    assert result["plans"].get("none", 0) < 600  # claims were built and serialised too
    assert 0 < result["cpu_median_us"] <= result["cpu_p99_us"]
    lowest = min(r["cpu_median_us"] for r in result["per_run"])
    highest = max(r["cpu_median_us"] for r in result["per_run"])
    assert lowest * 0.5 <= result["cpu_median_us"] <= highest * 1.5
    assert result["meets_goal"] == (result["cpu_p99_us"] <= bench_sdk.GOAL_P99_US)


def test_a_bad_run_count_is_refused() -> None:
    with pytest.raises(UsageError, match="runs"):
        bench_sdk.bench_sdk(nodes=20, calls=10, runs=0)


def test_cli_prints_json_and_refuses_bad_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_sdk.run(argparse.Namespace(json=True, runs=1)) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["graph_nodes"] >= 1_000
    assert out["calls"] == 20_000
    assert out["per_run_cpu_p99_median_us"] == out["per_run"][0]["cpu_p99_us"]
    assert bench_sdk.run(argparse.Namespace(json=False, runs=0)) == 2
    assert "runs: must be an integer >= 1" in capsys.readouterr().err


@pytest.mark.slow
def test_the_whole_path_runs_a_real_agent_loop_with_and_without_the_session() -> None:
    """A small run of the whole-path bench on the embedded default: both modes ran the same
    loop; without the session no request goes beyond the completions, with it at most one per
    session, at its end (the last claim's release, whose answer brings the events; none where
    the last claim ended by itself first), since claims ride on the calls and events on the
    answers."""
    from agentclaims.cli.bench_path import bench_path, table

    calls, sessions = 4, 3
    result = bench_path(backends=("embedded",), sessions=(sessions,), calls=calls, rounds=1)
    [row] = result["rows"]
    assert (row["backend"], row["sessions"], row["llm_calls"]) == ("embedded", 3, 12)
    assert row["without"]["extra_requests_per_call"] == 0
    assert row["hooks"]["extra_requests_per_call"] == 0  # a middleware doing nothing asks nothing
    [w], [h], [wo] = (row["rounds"][mode] for mode in ("with", "hooks", "without"))
    cpu = "cpu_ms_per_call"  # one round: each figure is that round's difference
    assert row["session_cpu_ms_per_call"] == pytest.approx(w[cpu] - wo[cpu])
    assert row["hooks_cpu_ms_per_call"] == pytest.approx(h[cpu] - wo[cpu])
    assert row["own_cpu_ms_per_call"] == pytest.approx(w[cpu] - h[cpu])
    # one round: its difference is the whole interval
    assert row["session_cpu_ms_interval"] == pytest.approx((w[cpu] - wo[cpu],) * 2)
    assert row["own_cpu_ms_interval"] == pytest.approx((w[cpu] - h[cpu],) * 2)
    assert 0 <= w["gc_ms_per_call"] < w[cpu]
    assert row["gc_ms_per_call_added"] == pytest.approx(w["gc_ms_per_call"] - wo["gc_ms_per_call"])
    assert 0 <= row["with"]["extra_requests_per_call"] <= 1 / calls
    assert row["with"]["cpu_ms_per_call"] > 0
    assert "embedded" in table(result)
    assert "hooks" in table(result)
    assert "tools waiting 10 ms" in table(result)
    assert "90% intervals" in table(result)
    with pytest.raises(UsageError, match="sessions"):
        bench_path(sessions=(0,))
    for tool_s in (-1.0, float("nan"), True, "1"):
        with pytest.raises(UsageError, match="tool_s"):
            bench_path(sessions=(1,), tool_s=tool_s)  # type: ignore[arg-type]


def test_the_whole_path_figures_are_medians_of_each_rounds_differences() -> None:
    """A round whose every mode ran slow (the machine busy) moves no figure: the bench takes
    the difference within each round, then the median, where the difference of the modes'
    medians would mix rounds."""
    from agentclaims.cli.bench_path import _paired

    with_ = [{"cpu": 1.0}, {"cpu": 10.0}, {"cpu": 5.0}]
    without = [{"cpu": 0.0}, {"cpu": 2.0}, {"cpu": 6.0}]
    assert _paired(with_, without, "cpu") == 1.0  # rounds' differences 1, 8, -1
    assert statistics.median([5.0, 10.0, 1.0]) - statistics.median([0.0, 2.0, 6.0]) == 3.0
    with pytest.raises(ValueError):
        _paired(with_, without[:2], "cpu")  # rounds that do not pair up


def test_the_whole_path_interval_brackets_the_median_and_narrows_with_agreeing_rounds() -> None:
    """The 90% interval of the rounds' median difference holds the median; rounds that agree
    give a narrow one, rounds that wander a wide one; the same rounds, the same interval."""
    from agentclaims.cli.bench_path import _interval, _paired

    base = [{"cpu": 10.0}] * 9
    steady = [{"cpu": 10.5 + 0.01 * i} for i in range(9)]
    wander = [{"cpu": 10.5 + (-1.0) ** i * i * 0.3} for i in range(9)]
    for rounds in (steady, wander):
        lo, hi = _interval(rounds, base, "cpu")
        assert lo <= _paired(rounds, base, "cpu") <= hi
        assert _interval(rounds, base, "cpu") == (lo, hi)
    narrow, wide = _interval(steady, base, "cpu"), _interval(wander, base, "cpu")
    assert narrow[1] - narrow[0] < 0.1 < wide[1] - wide[0]


@pytest.mark.slow
def test_the_whole_path_counts_the_python_calls_the_session_adds() -> None:
    """``--profile``: one more run of each mode, counted by cProfile, gives each mode's Python
    function calls per LLM call and what the session adds; the session's own functions
    (agentclaims') are named, most calls first. The session does work of its own: the loop
    with it calls more than the no-op middleware's, which calls more than none."""
    from agentclaims.cli.bench_path import BUSIEST, bench_path, table
    from agentclaims.cli.main import build_parser

    result = bench_path(backends=("embedded",), sessions=(2,), calls=3, rounds=1, profile=True)
    [row] = result["rows"]
    per = row["python_calls_per_call"]
    assert per["with"] > per["hooks"] > per["without"] > 0
    assert row["session_python_calls_per_call"] == pytest.approx(per["with"] - per["without"])
    assert row["own_python_calls_per_call"] == pytest.approx(per["with"] - per["hooks"])
    busiest = row["busiest"]
    assert 0 < len(busiest) <= BUSIEST
    assert all(b["function"].startswith("agentclaims/") for b in busiest)
    counts = [b["calls_per_call"] for b in busiest]
    assert counts == sorted(counts, reverse=True)
    assert counts[0] > 0
    assert "Python calls per LLM call, embedded x 2" in table(result)
    # the timed rounds are not profiled: their figures carry no call counts
    assert all("python_calls_per_call" not in r for r in row["rounds"]["with"])
    assert build_parser().parse_args(["bench", "sdk", "--profile"]).profile is True
    assert build_parser().parse_args(["bench", "sdk"]).profile is False
