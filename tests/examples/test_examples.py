"""Every example runs as a user runs it (`python examples/NAME.py`, in a fresh interpreter, in
an empty folder, on the embedded default), with deprecation warnings as errors, and shows what
its docstring promises."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.py"))


def run_example(name: str, cwd: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", str(ROOT / "examples" / name), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert "Deprecat" not in done.stderr, done.stderr
    return done.stdout


def test_the_examples_are_all_here() -> None:
    assert {"agent_middleware.py", "create_agent.py", "supervisor.py", "tool_loop.py"} <= set(
        EXAMPLES
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs(name: str, tmp_path: Path) -> None:
    out = run_example(name, tmp_path)
    assert out.strip(), f"{name} printed nothing"
    if name == "agent_middleware.py":
        turns = re.findall(r"(\d+)/(\d+) prompt tokens cached, claims (\d+) accepted", out)
        assert len(turns) == 3
        assert all(int(accepted) >= 1 for _, _, accepted in turns)
        # every later turn finds the conversation's prefix that the claim kept
        assert all(int(cached) > 0 for cached, _, _ in turns[1:])
        assert "open sessions: 0" in out
    if name == "create_agent.py":
        assert "done: see the papers" in out
        assert "tool_calls=3" in out
    if name == "tool_loop.py":
        [log] = tmp_path.glob("agentclaims-logs/*.jsonl")
        accepted = int(re.findall(r"claims_accepted=(\d+)", out)[0])
        # the stats it prints agree with its log: every claim the engine accepted
        assert accepted == log.read_text().count('"event": "resident_claim_accepted"') > 0
