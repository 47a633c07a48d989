"""`agentclaims bench replay` on bad input, through the real CLI on real files: a typed error
naming the flag as typed, exit status 2, no traceback, and nothing run or written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trace_files import write_trace

from agentclaims.cli.main import main


def replay(folder: Path, *args: str) -> int:
    return main(["bench", "replay", "--traces", str(folder), "--policies", "lru", *args])


def refused(capsys: pytest.CaptureFixture[str], code: int, flag: str) -> str:
    """Exit 2 with ``flag: ...`` on stderr, no traceback, nothing on stdout, nothing run."""
    out, err = capsys.readouterr()
    assert code == 2
    assert f"agentclaims bench replay: {flag}: " in err
    assert "Traceback" not in err
    assert "[#" not in err  # no progress bar: the replay never started
    assert out == ""
    return err


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_a_folder_of_only_malformed_traces_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str]
) -> None:
    """Every file malformed: exit 2 naming --traces (it crashed in the table, or printed
    ``traces: 0`` with --json and exit 0); each file's warning says what is missing, once."""
    (tmp_path / "trace_0001.json").write_text('{"x": 1}')
    err = refused(capsys, replay(tmp_path, *extra), "--traces")
    assert "no readable trace" in err
    warning = "skipping malformed trace file trace_0001.json: missing field 'id'"
    assert err.count(warning) == 1


def test_malformed_files_beside_good_ones_are_named_once_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The good traces replay; each malformed file is warned about and listed once, with
    what is wrong in it (it was warned about and listed once per pass over the traces)."""
    write_trace(tmp_path / "trace_0000.json", "trace_0000")
    (tmp_path / "trace_0001.json").write_text('{"id": "a"}')
    (tmp_path / "trace_0002.json").write_text("[1, 2]")
    (tmp_path / "trace_0003.json.gz").write_bytes(b"not gzip at all")
    assert replay(tmp_path, "--sessions", "2", "--json") == 0
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert data["skipped"] == ["trace_0001.json", "trace_0002.json", "trace_0003.json.gz"]
    assert data["policies"]["lru"]["traces"] == 1
    for name, reason in (
        ("trace_0001.json", "missing field 'requests'"),
        ("trace_0002.json", "not a JSON object"),
        ("trace_0003.json.gz", "not a whole gzip file"),
    ):
        assert err.count(f"skipping malformed trace file {name}: {reason}") == 1


@pytest.mark.parametrize("value", ["0", "-0.5", "nan", "10.5"])
def test_capacity_frac_out_of_range_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """--capacity-frac 0 is refused like -0.5 (it ran at 10% silently), naming the flag."""
    write_trace(tmp_path / "trace_0000.json", "trace_0000")
    err = refused(capsys, replay(tmp_path, "--capacity-frac", value), "--capacity-frac")
    assert "must be in (0, 10]" in err


@pytest.mark.parametrize(
    ("where", "words"),
    [
        ("missing/p.png", "no such folder"),
        ("p.nope", "cannot draw a .nope file"),
        ("", "is a folder"),
    ],
)
def test_a_plot_file_that_cannot_be_written_is_refused_before_the_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str, words: str
) -> None:
    """--plot into a missing folder (it replayed everything, then FileNotFoundError), in an
    unknown format or onto a folder: exit 2 naming --plot, before anything runs."""
    traces = tmp_path / "traces"
    traces.mkdir()
    write_trace(traces / "trace_0000.json", "trace_0000")
    err = refused(capsys, replay(traces, "--plot", str(tmp_path / where)), "--plot")
    assert words in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["traces"]


def test_seed_is_no_longer_a_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--seed was accepted and never read (nothing in a trace replay is random): it is gone."""
    write_trace(tmp_path / "trace_0000.json", "trace_0000")
    with pytest.raises(SystemExit) as exit_:
        replay(tmp_path, "--seed", "3")
    assert exit_.value.code == 2
    assert "unrecognized arguments: --seed" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--sessions", "0"], "--sessions"),
        (["--capacity-blocks", "0"], "--capacity-blocks"),
        (["--limit", "0"], "--limit"),
        (["--policies", "nope"], "--policies"),
    ],
)
def test_usage_errors_name_the_flag_as_typed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], flag: str
) -> None:
    """Errors named the fields (``sessions:``, ``capacity_blocks:``); now the flags."""
    write_trace(tmp_path / "trace_0000.json", "trace_0000")
    code = main(["bench", "replay", "--traces", str(tmp_path), *args])
    refused(capsys, code, flag)


def test_traces_without_a_request_are_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Readable traces that make no request leave nothing to replay (an empty working set)."""
    (tmp_path / "trace_0000.json").write_text('{"id": "e", "block_size": 64, "requests": []}')
    err = refused(capsys, replay(tmp_path), "--traces")
    assert "make no request" in err
