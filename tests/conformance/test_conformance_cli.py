"""``agentclaims conformance``: the table, the JSON object and the exit status."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from servers import free_port, gateway_process

from agentclaims.cli.main import main
from agentclaims.conformance import LEVELS

REPO = Path(__file__).resolve().parents[2]


def _check_shape(doc: dict[str, object], backend: str) -> dict[str, dict[str, object]]:
    assert set(doc) == {"backend", "target", "levels"}
    assert doc["backend"] == backend
    levels = doc["levels"]
    assert isinstance(levels, dict)
    assert list(levels) == list(LEVELS)
    for entry in levels.values():
        assert set(entry) == {"status", "evidence", "detail"}
        assert isinstance(entry["detail"], str)
        for item in entry["evidence"]:
            assert set(item) == {"seq", "event"}
    return levels


def test_json_reports_every_level_passing(capsys: pytest.CaptureFixture[str]) -> None:
    """--json prints exactly one object, every level passes, exit status 0."""
    assert main(["conformance", "--backend", "embedded", "--json"]) == 0
    out = capsys.readouterr().out
    levels = _check_shape(json.loads(out), "embedded")
    assert {entry["status"] for entry in levels.values()} == {"pass"}
    refused = {e["event"] for e in levels["L3"]["evidence"]}  # type: ignore[union-attr]
    assert "active_request_refused" in refused


def test_table_lists_levels_with_status_and_evidence(capsys: pytest.CaptureFixture[str]) -> None:
    """The default output is a table with one row per level and a summary line."""
    assert main(["conformance"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line[:2] in LEVELS}
    assert set(rows) == set(LEVELS)
    assert "pass" in rows["L3"]
    assert re.search(r"#\d+ active_request_refused", rows["L3"])
    assert out.rstrip().endswith("8/8 levels pass")


def test_unknown_backend_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown backend name is a clear error on stderr and exit status 2."""
    assert main(["conformance", "--backend", "nonsense", "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "backend: unknown value 'nonsense'" in captured.err


@pytest.mark.parametrize("url", ["http://", "https://:8000"])
def test_a_url_without_a_host_is_a_usage_error(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A URL that names no host is bad input (exit 2, naming ``--backend``), not a gateway
    that did not answer (``not_evaluated``, exit 1)."""
    assert main(["conformance", "--backend", url, "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "--backend: must be an http(s) URL with a host" in captured.err


def test_unreachable_gateway_is_not_evaluated_and_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A gateway URL nobody answers: every level not_evaluated, naming why, exit status 1."""
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["conformance", "--backend", url, "--json"]) == 1
    levels = _check_shape(json.loads(capsys.readouterr().out), url)
    assert {entry["status"] for entry in levels.values()} == {"not_evaluated"}
    assert "unreachable" in str(levels["L1"]["detail"])


def test_conformance_over_http_against_a_real_gateway_process() -> None:
    """`agentclaims conformance --backend http://...` against `agentclaims serve` (both real
    processes on loopback) passes every level, as the embedded run does."""
    exe = Path(sys.executable).with_name("agentclaims")
    with gateway_process() as url:
        done = subprocess.run(
            [str(exe), "conformance", "--backend", url, "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 0, done.stdout + done.stderr
    levels = _check_shape(json.loads(done.stdout), url)
    assert {entry["status"] for entry in levels.values()} == {"pass"}


def test_installed_command_prints_one_json_object() -> None:
    """The installed `agentclaims conformance --json` exits 0 with one JSON object."""
    exe = Path(sys.executable).parent / "agentclaims"
    done = subprocess.run(
        [str(exe), "conformance", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.strip().splitlines()) == 1
    _check_shape(json.loads(done.stdout), "embedded")


def test_installed_command_unknown_backend_exits_2() -> None:
    """The installed command exits 2 on an unknown backend, with the error on stderr."""
    exe = Path(sys.executable).parent / "agentclaims"
    done = subprocess.run(
        [str(exe), "conformance", "--backend", "vllm-but-misspelt"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert "unknown value 'vllm-but-misspelt'" in done.stderr
    assert done.stdout == ""
