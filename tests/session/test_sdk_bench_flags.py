"""`agentclaims bench sdk` with a bad flag, through the real CLI: exit 2 naming the flag as
typed, before either bench runs."""

from __future__ import annotations

import time

import pytest

from agentclaims.cli.main import main


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--runs", "0"], "--runs"),
        (["--sessions", "0"], "--sessions"),
        (["--sessions", "6", "-1"], "--sessions"),
        (["--rounds", "0"], "--rounds"),
        (["--tool-s", "-1"], "--tool-s"),
        (["--tool-s", "61"], "--tool-s"),
    ],
)
def test_a_bad_flag_names_the_flag_before_anything_runs(
    capsys: pytest.CaptureFixture[str], args: list[str], flag: str
) -> None:
    """Errors named the fields (``sessions:``, ``tool_s:``), and only after the planner's
    bench had run in full; now the flag, at once."""
    started = time.monotonic()
    code = main(["bench", "sdk", *args])
    elapsed = time.monotonic() - started
    out, err = capsys.readouterr()
    assert code == 2
    assert err.startswith(f"agentclaims bench sdk: {flag}: ")
    assert "Traceback" not in err
    assert out == ""
    assert elapsed < 2.0  # the 20,000-call planner bench never ran
