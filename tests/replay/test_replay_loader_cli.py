"""Trace loading (real files where present), synthetic workloads, determinism, and the CLI."""

from __future__ import annotations

import gzip
import json
import logging
import os
from pathlib import Path

import pytest
from trace_files import write_trace

from agentclaims.cli.main import main
from agentclaims.errors import UnknownNameError, UsageError
from agentclaims.replay import (
    SubAgentGroup,
    TraceSource,
    compare_policies,
    make_policy,
    run_replay,
    working_set_blocks,
)
from agentclaims.replay.synthetic import synthetic_workload

TRACES = Path(
    os.environ.get(
        "AGENTCLAIMS_TRACES",
        Path(__file__).resolve().parents[2].parent / "shared" / "data" / "agentic-traces",
    )
)


def real_traces() -> Path:
    if not TRACES.is_dir():
        pytest.skip(f"agentic traces not found at {TRACES}")
    return TRACES


def replay_cli(folder: Path, *args: str) -> int:
    """Run `agentclaims bench replay` on ``folder`` with two sessions."""
    return main(["bench", "replay", "--traces", str(folder), "--sessions", "2", *args])


@pytest.mark.traces
def test_real_trace_with_subagents_loads_as_groups() -> None:
    """trace_0010 has sub-agents: they load as groups, and request counts match the file."""
    folder = real_traces()
    path = folder / "trace_0010.json.gz"
    if not path.exists():
        pytest.skip("trace_0010 not in this split")
    source = TraceSource([path])
    trace = source.load(0)
    assert trace is not None
    assert trace.trace_id == "trace_0010"
    raw = json.loads(gzip.decompress(path.read_bytes()))
    expected = sum(len(r["requests"]) if r["type"] == "subagent" else 1 for r in raw["requests"])
    assert sum(1 for _ in trace.requests()) == expected
    groups = [s for s in trace.root.steps if isinstance(s, SubAgentGroup)]
    assert [len(g.agents) for g in groups][:2] == [1, 3]
    # the three sub-agents of the second group start together when the parent's response ends
    assert max(groups[1].start_delays_s) < 2.0


@pytest.mark.traces
def test_real_traces_are_namespaced_per_trace() -> None:
    """Two real traces never share a block id, though their local ids overlap."""
    source = TraceSource.from_dir(real_traces(), limit=2)
    first, second = (source.load(0), source.load(1))
    assert first is not None
    assert second is not None
    ids_a = {h for r in first.requests() for h in r.block_hashes}
    ids_b = {h for r in second.requests() for h in r.block_hashes}
    assert not ids_a & ids_b
    assert {h & 0xFFFFFFFF for h in ids_a} & {h & 0xFFFFFFFF for h in ids_b}


@pytest.mark.traces
def test_real_replay_is_deterministic_and_opt_is_the_ceiling() -> None:
    """A replay of real traces gives the same figures twice; OPT >= LRU on them."""
    source = TraceSource.from_dir(real_traces(), limit=6)
    ws = working_set_blocks(source, 3)
    cap = max(1, ws // 4)
    one = run_replay(source, make_policy("lru"), capacity_blocks=cap, sessions=3, record=True)
    two = run_replay(source, make_policy("lru"), capacity_blocks=cap, sessions=3)
    opt = run_replay(
        source, make_policy("opt", schedule=one.schedule), capacity_blocks=cap, sessions=3
    )
    assert (one.hit_tokens, one.requests, one.deferrals) == (
        two.hit_tokens,
        two.requests,
        two.deferrals,
    )
    assert opt.hit_tokens >= one.hit_tokens > 0


def test_malformed_file_is_skipped_by_name(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A broken file is logged and listed by name; the other traces still load."""
    write_trace(tmp_path / "trace_0001.json", "trace_0001")
    (tmp_path / "trace_0002.json.gz").write_bytes(b"not gzip at all")
    write_trace(tmp_path / "trace_0003.json.gz", "trace_0003")
    source = TraceSource.from_dir(tmp_path)
    with caplog.at_level(logging.WARNING):
        loaded = [t.trace_id for t in source]
    assert loaded == ["trace_0001", "trace_0003"]
    assert source.skipped == ["trace_0002.json.gz"]
    assert "trace_0002.json.gz" in caplog.text


def test_missing_folder_is_a_usage_error(tmp_path: Path) -> None:
    """A traces folder that does not exist is a UsageError naming the field."""
    with pytest.raises(UsageError, match="traces"):
        TraceSource.from_dir(tmp_path / "absent")


def test_synthetic_workload_is_seeded() -> None:
    """Same seed, same workload and same replay figures; another seed differs."""
    a, b = synthetic_workload(20, seed=3), synthetic_workload(20, seed=3)
    assert a == b
    assert synthetic_workload(20, seed=4) != a
    ra = compare_policies(a, ["lru", "saga"], sessions=8, capacity_frac=0.25)
    rb = compare_policies(b, ["lru", "saga"], sessions=8, capacity_frac=0.25)
    figures = [
        {k: v for k, v in r.to_dict().items() if k not in ("wall_s", "cpu_s")}
        for c in (ra, rb)
        for r in c.results.values()
    ]
    assert figures[:3] == figures[3:]
    assert ra.results["opt"].hit_ratio >= ra.results["lru"].hit_ratio > 0


def test_synthetic_workflows_share_system_prompts() -> None:
    """Workflows of one shape start with the same system-prompt blocks (global ids)."""
    traces = synthetic_workload(30, seed=1)
    firsts = [next(t.requests()).block_hashes[:24] for t in traces]
    assert len(set(firsts)) < len(firsts)


def test_unknown_policy_name() -> None:
    """An unknown policy name raises UnknownNameError listing the known ones."""
    with pytest.raises(UnknownNameError, match="belady"):
        make_policy("belady")


def test_cli_json_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`bench replay --json` prints one JSON object with every policy's figures."""
    for i in range(4):
        write_trace(tmp_path / f"trace_{i:04d}.json.gz", f"trace_{i:04d}", n=3 + i)
    code = replay_cli(tmp_path, "--capacity-blocks", "6", "--limit", "3", "--json")
    assert code == 0
    out = capsys.readouterr().out
    data = json.loads(out)
    assert set(data["policies"]) == {
        "lru",
        "kvflow",
        "continuum",
        "saga",
        "reuseprob",
        "agentclaims",
        "opt",
    }
    assert data["policies"]["lru"]["traces"] == 3
    for row in data["policies"].values():
        assert 0.0 <= row["hit_ratio"] <= 1.0
    assert data["policies"]["opt"]["hit_ratio"] >= data["policies"]["lru"]["hit_ratio"]
    # only the optimum reads the future; every row says what it cost
    assert {n for n, r in data["policies"].items() if r["uses_future"]} == {"opt"}
    assert all(r["wall_s"] > 0 and r["cpu_s"] > 0 for r in data["policies"].values())


def test_cli_table_marks_the_future_and_reports_wall_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for i in range(3):
        write_trace(tmp_path / f"trace_{i:04d}.json.gz", f"trace_{i:04d}", n=3 + i)
    assert replay_cli(tmp_path, "--capacity-blocks", "6", "--policies", "agentclaims") == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("policy"))
    assert header.split()[-2:] == ["wall_s", "cpu_s"]
    rows = {
        line.split()[0]: line
        for line in lines
        if line.split()[:1] in (["lru"], ["opt*"], ["agentclaims"])
    }
    assert set(rows) == {"lru", "agentclaims", "opt*"}
    assert any("uses information from the future" in line for line in lines)


def test_cli_unknown_policy_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown policy name is exit 2 with the name in the message."""
    write_trace(tmp_path / "trace_0000.json", "trace_0000")
    code = main(["bench", "replay", "--traces", str(tmp_path), "--policies", "nope"])
    assert code == 2
    assert "nope" in capsys.readouterr().err


def test_cli_missing_folder_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A missing traces folder is a clear error and exit 2."""
    code = main(["bench", "replay", "--traces", str(tmp_path / "none")])
    assert code == 2
    assert "no such folder" in capsys.readouterr().err


def test_cli_plot_writes_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--plot writes a PNG of hit ratio against capacity."""
    for i in range(3):
        write_trace(tmp_path / f"trace_{i:04d}.json", f"trace_{i:04d}", n=4)
    png = tmp_path / "plot.png"
    code = replay_cli(tmp_path, "--policies", "lru", "--plot", str(png))
    assert code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
