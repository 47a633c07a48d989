"""The engine benchmark measures what it says it measures (figures are printed, not asserted)."""

from __future__ import annotations

import argparse
import json

import pytest

from agentclaims.cli import bench_engine


def test_block_ops_are_the_sum_of_what_is_counted() -> None:
    """ops = reused + allocated + evicted + released; the mix really hits, misses and evicts."""
    result = bench_engine.bench_block_ops(400, seed=3)
    assert result.ops == result.reused + result.allocated + result.evicted + result.released
    assert result.released == result.reused + result.allocated
    assert min(result.reused, result.allocated, result.evicted) > 0
    assert result.ops_per_s > 0
    assert result.ops_per_cpu_s > 0


def test_decisions_time_each_path() -> None:
    """Each decision kind gets one wall and one CPU sample per call, on the intended path."""
    results = bench_engine.bench_decisions(pool_blocks=2_000, live_claims=20, samples=12)
    assert [r.name for r in results] == ["submit_claim", "begin: refuse/defer", "begin: serve"]
    for r in results:
        assert len(r.wall) == len(r.cpu) == 12
        stats = r.summary()
        assert 0 < stats["median_us"] <= stats["p99_us"]
        assert 0 < stats["cpu_median_us"] <= stats["cpu_p99_us"]


def test_cli_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    """`agentclaims bench engine --quick --json` prints one JSON object with both measurements."""
    assert bench_engine.run(argparse.Namespace(json=True, quick=True)) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["block_ops"]["counted"].startswith("blocks reused")
    assert out["block_ops"]["median_ops_per_cpu_s"] in out["block_ops"]["all_ops_per_cpu_s"]
    kinds = {"submit_claim", "begin: refuse/defer", "begin: serve"}
    assert kinds <= set(out["decisions"])
    assert all(out["decisions"][k]["p99_us"] >= out["decisions"][k]["median_us"] for k in kinds)
