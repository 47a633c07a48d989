"""Every Python snippet of the README runs as written (each in a fresh interpreter, in an
empty folder, a deprecation warning an error), and the quick start shows claims at work."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def snippets() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def test_the_readme_has_snippets() -> None:
    assert len(snippets()) >= 3


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(snippets())))
def test_readme_snippet_runs_as_written(index: int, tmp_path: Path) -> None:
    code = snippets()[index]
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "PYTHONPATH": str(ROOT),
            "PATH": "/usr/bin:/bin",
            "PYTHONWARNINGS": "error::DeprecationWarning",
        },
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    if index == 0:  # the quick start: a claim held across the tool, the prefix reused
        assert "Three papers found." in out
        assert "claims accepted: 2, tool calls: 1" in out  # one rides on each call
        cached = re.search(r"prompt tokens from the cache: (\d+) of (\d+)", out)
        assert cached is not None
        assert int(cached[1]) > 0
        assert list(tmp_path.glob("agentclaims-logs/*.jsonl"))
    if index == 1:  # the same agent wrapped: claims planned on create_agent's own graph
        assert "Three papers found. 2 claim(s)" in out
    assert "Deprecat" not in done.stderr
