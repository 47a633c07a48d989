"""``agentclaims demo`` (what ``make demo`` runs): both modes in interleaved rounds on fresh
engines, medians per mode, every round's figures kept, and bad arguments refused by name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def _demo(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentclaims.cli.main", "demo", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=cwd,
    )


@pytest.mark.slow
def test_the_demo_runs_both_modes_in_interleaved_rounds(tmp_path: Path) -> None:
    done = _demo("--workflows", "2", "--rounds", "2", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    rounds = result["rounds"]
    assert len(rounds["claims"]) == len(rounds["lru"]) == 2
    for mode in ("claims", "lru"):
        calls = {r["llm_calls"] for r in rounds[mode]}
        assert calls == {result[mode]["llm_calls"]}  # the same workflows every round
        assert all(r["true_harm"] == 0 for r in rounds[mode])
        completions = sorted(r["completion_s"] for r in rounds[mode])
        assert result[mode]["completion_s"] == pytest.approx(sum(completions) / 2, abs=1e-3)
    assert result["lru"]["claims"] == 0  # stock LRU makes no claim
    assert result["claims"]["claims"] > 0
    assert list((tmp_path / "agentclaims-logs" / "claims").glob("*.jsonl"))
    assert list((tmp_path / "agentclaims-logs" / ".rounds" / "2" / "lru").glob("*.jsonl"))


@pytest.mark.parametrize(("flag", "value"), [("--rounds", "0"), ("--workflows", "0")])
def test_bad_demo_arguments_are_refused_by_name(tmp_path: Path, flag: str, value: str) -> None:
    done = _demo(flag, value, cwd=tmp_path)
    assert done.returncode == 2
    assert flag.removeprefix("--") in done.stderr
    assert not (tmp_path / "agentclaims-logs").exists()


def test_each_timed_run_starts_on_a_settled_heap_and_leaves_it_unfrozen(tmp_path: Path) -> None:
    """Every mode's run starts after the earlier runs' garbage is collected, with what lives
    then frozen (the collector charges neither mode for the other's garbage); after the demo
    nothing stays frozen."""
    import asyncio
    import gc

    from agentclaims.cli import demo

    frozen_during: list[int] = []
    one_mode = demo._one_mode

    async def watched(*args: object) -> dict[str, object]:
        frozen_during.append(gc.get_freeze_count())
        return await one_mode(*args)  # type: ignore[arg-type]

    before = gc.get_freeze_count()
    demo._one_mode = watched  # type: ignore[assignment]
    try:
        asyncio.run(demo.run_demo(workflows=2, rounds=1, logs=tmp_path / "logs"))
    finally:
        demo._one_mode = one_mode  # type: ignore[assignment]
    assert gc.get_freeze_count() == before
    _warmup, *timed = frozen_during
    assert len(timed) == 2
    assert all(n > before for n in timed)


def test_a_second_run_replaces_the_first_runs_logs_and_nothing_else(tmp_path: Path) -> None:
    """The demo's workflows have the same ids every run and a log appends: the second run's
    logs must not read as one workflow of both runs' calls. A file of the user's own in the
    same folder stays."""
    import asyncio

    from agentclaims.cli import demo

    logs = tmp_path / "logs"
    (logs / "claims").mkdir(parents=True)
    mine = logs / "claims" / "mine.jsonl"
    mine.write_text('{"kept": true}\n')
    sizes = []
    for _ in range(2):
        result = asyncio.run(demo.run_demo(workflows=2, rounds=1, logs=logs))
        files = sorted((logs / "claims").glob("claims-wf*.jsonl"))
        assert [f.name for f in files] == ["claims-wf00.jsonl", "claims-wf01.jsonl"]
        calls = sum(f.read_text().count('"event": "llm_call"') for f in files)
        sizes.append(calls)
    assert sizes[0] == sizes[1] == result["claims"]["llm_calls"] > 0
    assert mine.read_text() == '{"kept": true}\n'
