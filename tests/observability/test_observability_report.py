"""Outcome logs from a real engine run, summarised: the report agrees with the engine."""

from __future__ import annotations

import itertools
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentclaims.cli.main import main
from agentclaims.contract import ClaimSpec, ClaimState, EventName, ProtectionMode, parse_mode
from agentclaims.engine import KVEngine
from agentclaims.engine.blocks import BlockHash
from agentclaims.errors import UsageError
from agentclaims.observability import WorkflowLog, summarise


def _blocks(tag: str, n: int) -> list[BlockHash]:
    return [BlockHash(hash((tag, i)) & (2**63 - 1)) for i in range(n)]


class _Router:
    """Sends each engine event to the log of the workflow that owns its claim or request."""

    def __init__(self, engine: KVEngine, logs: dict[str, WorkflowLog]) -> None:
        self.engine = engine
        self.logs = logs
        self.owner: dict[str, str] = {}

    def request(self, wf: str, rid: str, blocks: list[BlockHash]) -> Any:
        self.owner[rid] = wf
        out = self.engine.begin(rid, blocks)
        self.drain()
        return out

    def claim(self, wf: str, cid: str, blocks: list[BlockHash], mode: str) -> Any:
        self.owner[cid] = wf
        spec = ClaimSpec(
            cid,
            wf,
            self.engine.register_prefix(blocks),
            self.engine.cache_identity,
            len(blocks),
            parse_mode(mode),
        )
        out = self.engine.submit_claim(spec, blocks)
        self.drain()
        return out

    def drain(self) -> None:
        for ev in self.engine.take_events():
            key = ev.claim_id if ev.claim_id is not None else ev.request_id
            self.logs[self.owner[str(key)]].claim_event(ev)


def _run_scenario(logs: dict[str, WorkflowLog]) -> KVEngine:
    """wf-a holds a hard and a soft claim; wf-b is refused by the hard one, harms the soft one,
    and has a claim rejected. Each workflow also logs LLM calls, a tool call and reactions."""
    ticks = itertools.count(1_000_000_000, 1_000_000)
    engine = KVEngine(10, 4, clock=lambda: next(ticks), run_id="run-1")
    r = _Router(engine, logs)
    a, b = logs["wf-a"], logs["wf-b"]
    for log in (a, b):
        log.session("session_started", workflow="supervisor")
    pa, pc = _blocks("a", 4), _blocks("c", 3)
    r.request("wf-a", "a-r1", pa)
    engine.finish("a-r1")
    a.llm_call("agent", "a-r1", "embedded", 64, 0, 64, 0.02, step=1, ste=0.0)
    r.request("wf-a", "a-r2", pc)
    engine.finish("a-r2")
    a.llm_call("agent", "a-r2", "embedded", 48, 0, 48, 0.01, step=2, ste=0.0)
    a.claim_planned("a-hard", engine.register_prefix(pa), "hard_protected", 3.0, 1.0, 0.9, "near")
    r.claim("wf-a", "a-hard", pa, "hard_protected")
    r.claim("wf-a", "a-soft", pc, "soft_priority")
    a.tool_call("search", 1.5, predicted_s=2.0, ttl_s=3.0, claim_ids=["a-hard"])
    r.request("wf-b", "b-r3", _blocks("b", 8))
    b.reaction("defer", request_id="b-r3", outcome="refuse_active", delay_s=0.25, attempt=1)
    b.reaction(
        "reroute", request_id="b-r3", outcome="refuse_active", from_backend="e0", to_backend="e1"
    )
    r.request("wf-b", "b-r4", _blocks("d", 5))
    engine.finish("b-r4")
    b.llm_call("worker", "b-r4", "embedded", 80, 0, 80, 0.03, step=1, ste=0.0)
    r.claim("wf-b", "b-big", _blocks("e", 11), "hard_protected")
    b.reaction(
        "relax",
        claim_id="b-big",
        outcome="resident_claim_rejected",
        from_mode="hard_protected",
        to_mode="expiring",
    )
    r.request("wf-a", "a-r5", pa)
    engine.finish("a-r5")
    a.llm_call("agent", "a-r5", "embedded", 70, 64, 6, 0.004, step=3, ste=0.0)
    for log in (a, b):
        log.session("session_ended", status="ok")
    return engine


@pytest.fixture
def logs(tmp_path: Path) -> Iterator[dict[str, WorkflowLog]]:
    ticks = itertools.count(0, 500_000_000)
    opened = {
        wf: WorkflowLog(
            wf,
            f"s-{wf}",
            directory=tmp_path / "logs",
            stream=tmp_path / "all.jsonl",
            monotonic=lambda: next(ticks),
        )
        for wf in ("wf-a", "wf-b")
    }
    yield opened
    for log in opened.values():
        log.close()


def _states(engine: KVEngine, wf: str) -> dict[str, int]:
    states: dict[str, int] = {}
    for view in engine.claims_of(wf):
        states[view.state.value] = states.get(view.state.value, 0) + 1
    return dict(sorted(states.items()))


def test_report_counts_match_engine_stats(logs: dict[str, WorkflowLog], tmp_path: Path) -> None:
    """Harm, refusals, rejections and final claim states in the report equal the engine's."""
    engine = _run_scenario(logs)
    report = summarise([tmp_path / "logs"])
    wf = report["workflows"]
    totals = report["totals"]
    assert report["malformed_lines"] == 0
    assert totals["true_harm"] == engine.stats.true_harm == 1
    assert totals["requests_refused"] == engine.stats.requests_refused == 1
    assert totals["claims_rejected"] == engine.stats.claims_rejected == 1
    assert totals["refusals"] == engine.stats.requests_refused + engine.stats.claims_rejected
    assert wf["wf-a"]["true_harm"] == 1
    assert wf["wf-b"]["true_harm"] == 0
    for name in ("wf-a", "wf-b"):
        assert wf[name]["claims_by_state"] == _states(engine, name)
        assert wf[name]["claim_problems"] == []
    assert wf["wf-a"]["claims_by_mode"] == {"hard_protected": 1, "soft_priority": 1}
    assert wf["wf-a"]["claims_by_state"] == {
        ClaimState.HARMED.value: 1,
        ClaimState.MATERIALIZED.value: 1,
    }
    assert wf["wf-b"]["claims_by_state"] == {ClaimState.REFUSED.value: 1}


def test_report_sums_reactions_tokens_and_durations(
    logs: dict[str, WorkflowLog], tmp_path: Path
) -> None:
    """Deferrals with their time, reroutes, relaxations, tokens, hit ratio and durations add up."""
    _run_scenario(logs)
    wf = summarise([tmp_path / "logs"])["workflows"]
    a, b = wf["wf-a"], wf["wf-b"]
    assert (b["deferrals"], b["deferral_s"], b["reroutes"], b["relaxations"], b["fails"]) == (
        1,
        0.25,
        1,
        1,
        0,
    )
    assert (a["llm_calls"], a["prompt_tokens"], a["cached_tokens"]) == (3, 182, 64)
    assert a["hit_ratio"] == pytest.approx(64 / 182)
    assert a["recomputed_tokens"] == 64 + 48 + 6
    assert (a["tool_calls"], a["tool_s"], a["claims_planned"]) == (1, 1.5, 1)
    assert b["hit_ratio"] == 0.0
    for s in (a, b):
        assert s["duration_s"] is not None
        assert s["duration_s"] > 0
        assert s["session_ids"] == [f"s-{name}" for name, v in wf.items() if v is s]


def test_shared_stream_splits_workflows_like_per_workflow_files(
    logs: dict[str, WorkflowLog], tmp_path: Path
) -> None:
    """The shared stream holds both workflows and summarises to the same counts as the files."""
    _run_scenario(logs)
    shared = summarise([tmp_path / "all.jsonl"])
    per_file = summarise([tmp_path / "logs"])
    assert sorted(shared["workflows"]) == ["wf-a", "wf-b"]
    for wf, s in per_file["workflows"].items():
        assert s["files"] == [str(tmp_path / "logs" / f"{wf}.jsonl")]
        assert {k: v for k, v in shared["workflows"][wf].items() if k != "files"} == {
            k: v for k, v in s.items() if k != "files"
        }
    total_lines = sum(1 for _ in (tmp_path / "all.jsonl").open())
    assert shared["totals"]["lines"] == total_lines


def test_malformed_lines_are_counted_with_their_position(
    logs: dict[str, WorkflowLog], tmp_path: Path
) -> None:
    """Bad lines (not JSON, not an object, no workflow id, broken contract event) are listed."""
    _run_scenario(logs)
    path = tmp_path / "logs" / "wf-b.jsonl"
    good = summarise([path])["workflows"]["wf-b"]
    n = sum(1 for _ in path.open())
    broken_event = {"workflow_id": "wf-b", "event": EventName.RESIDENT_CLAIM_HARMED.value}
    with path.open("a") as f:
        f.write("{not json\n[1, 2]\n\n")
        f.write(json.dumps({"event": "llm_call"}) + "\n")
        f.write(json.dumps(broken_event) + "\n")
        f.write('{"workflow_id": "wf-b", "event": "llm_ca')  # cut off by a crash
    report = summarise([path])
    assert report["malformed_lines"] == 5
    assert [m["line"] for m in report["malformed"]] == [n + 1, n + 2, n + 4, n + 5, n + 6]
    assert all(m["file"] == str(path) for m in report["malformed"])
    assert "workflow_id" in report["malformed"][2]["error"]
    assert "resident_claim_harmed" in report["malformed"][3]["error"]
    assert report["workflows"]["wf-b"] == good


def test_claim_history_that_is_not_legal_is_reported_not_fatal(tmp_path: Path) -> None:
    """A claim whose log starts mid-life is counted as invalid, the rest is still summarised."""
    engine = KVEngine(8, 4)
    blocks = _blocks("x", 2)
    engine.begin("r", blocks)
    engine.finish("r")
    spec = ClaimSpec(
        "c1",
        "wf",
        engine.register_prefix(blocks),
        engine.cache_identity,
        2,
        ProtectionMode.SOFT_PRIORITY,
    )
    engine.submit_claim(spec, blocks)
    events = engine.take_events()
    with WorkflowLog("wf", "s", directory=tmp_path) as log:
        for ev in events:
            if ev.event is not EventName.RESIDENT_CLAIM_ACCEPTED:
                log.claim_event(ev)
    s = summarise([tmp_path])["workflows"]["wf"]
    assert s["claims_by_state"] == {"invalid": 1}
    assert s["claims_by_mode"] == {"soft_priority": 1}
    assert s["claim_problems"]
    assert s["claim_problems"][0].startswith("c1:")


def test_a_claims_mode_comes_from_its_plan_where_the_engines_events_omit_it(
    tmp_path: Path,
) -> None:
    """Behind vLLM the connector's events do not repeat a claim's mode: the report reads it
    from the session's ``claim_planned`` line, never ``unknown`` when the log says it."""
    engine = KVEngine(8, 4)
    blocks = _blocks("v", 2)
    engine.begin("r", blocks)
    engine.finish("r")
    prefix = engine.register_prefix(blocks)
    spec = ClaimSpec("c1", "wf", prefix, engine.cache_identity, 2, ProtectionMode.DEMOTABLE)
    engine.submit_claim(spec, blocks)
    with WorkflowLog("wf", "s", directory=tmp_path) as log:
        log.claim_planned("c1", prefix, ProtectionMode.DEMOTABLE, ttl_s=30.0, node="agent")
        for ev in engine.take_events():
            wire = ev.to_dict()
            wire.pop("protection_mode", None)
            log.claim_event(wire)
    s = summarise([tmp_path])["workflows"]["wf"]
    assert s["claims_by_mode"] == {"demotable": 1}
    assert s["claims_by_state"] == {"materialized": 1}


def test_missing_path_is_a_usage_error(tmp_path: Path) -> None:
    """A log path that does not exist raises UsageError naming ``logs``."""
    with pytest.raises(UsageError, match="logs"):
        summarise([tmp_path / "nope.jsonl"])


def test_cli_table(
    logs: dict[str, WorkflowLog], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The table has a row per workflow and totals, with the counts of the summary."""
    _run_scenario(logs)
    assert main(["report", str(tmp_path / "logs")]) == 0
    out = capsys.readouterr().out
    rows: dict[str, list[str]] = {}
    for line in out.splitlines():
        if line.strip():
            rows.setdefault(line.split()[0], line.split())
    head = rows["workflow"]
    assert head[:4] == ["workflow", "claims", "harm", "refusals"]
    assert rows["wf-a"][1:4] == ["2", "1", "0"]
    assert rows["wf-b"][1:6] == ["1", "0", "2", "1", "(0.25s)"]
    assert rows["total"][1:4] == ["3", "1", "2"]
    assert "hard_protected=1 soft_priority=1 | harmed=1 materialized=1" in out


def test_cli_json(
    logs: dict[str, WorkflowLog], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--json prints exactly one object with workflows, totals and malformed_lines."""
    _run_scenario(logs)
    with (tmp_path / "logs" / "wf-a.jsonl").open("a") as f:
        f.write("oops\n")
    assert main(["report", str(tmp_path / "logs"), "--json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert set(data) == {"workflows", "threads", "totals", "malformed_lines"}
    assert data["malformed_lines"] == 1
    assert data["totals"]["workflows"] == 2
    assert data["totals"]["true_harm"] == 1
    assert "wf-a.jsonl:" in captured.err


def test_cli_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A missing log file: exit status 2, the path on stderr, nothing on stdout."""
    missing = tmp_path / "missing.jsonl"
    assert main(["report", str(missing)]) == 2
    captured = capsys.readouterr()
    assert str(missing) in captured.err
    assert captured.out == ""


def test_cli_plot_that_cannot_be_written_names_plot_and_exits_2(
    logs: dict[str, WorkflowLog], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--plot into a folder that does not exist: a typed error naming --plot, exit status 2,
    nothing on stdout, no file."""
    pytest.importorskip("matplotlib")
    _run_scenario(logs)
    png = tmp_path / "no-such-folder" / "claims.png"
    assert main(["report", str(tmp_path / "logs"), "--plot", str(png)]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"agentclaims report: --plot: cannot write {png}: "), captured
    assert "Traceback" not in captured.err
    assert captured.out == ""
    assert not png.parent.exists()


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_cli_folder_without_logs_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], json_flag: list[str]
) -> None:
    """A folder with no *.jsonl (only a log in a subfolder, which is not read): it says no
    workflow logs were found there, exit status 2, nothing on stdout."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "wf.jsonl").write_text('{"workflow_id": "wf", "event": "x"}\n')
    (tmp_path / "notes.txt").write_text("not a log\n")
    assert main(["report", str(tmp_path), *json_flag]) == 2
    captured = capsys.readouterr()
    assert f"no workflow logs found in {tmp_path}" in captured.err
    assert captured.out == ""


_CALLS = st.lists(
    st.one_of(
        st.tuples(st.just("defer"), st.floats(0, 10, allow_nan=False)),
        st.tuples(st.sampled_from(["reroute", "relax", "fail"]), st.just(0.0)),
        st.tuples(st.just("llm"), st.tuples(st.integers(0, 500), st.integers(0, 500))),
    ),
    max_size=30,
)


@settings(max_examples=40, deadline=None)
@given(calls=_CALLS)
def test_report_totals_equal_what_was_logged(calls: list[tuple[str, Any]]) -> None:
    """Property: counts, deferral time and token sums in the report equal the logged inputs."""
    prompt = cached = 0
    with tempfile.TemporaryDirectory() as folder:
        with WorkflowLog("wf", "s", directory=folder) as log:
            log.session("session_started")
            for kind, arg in calls:
                if kind == "llm":
                    p, c = max(arg), min(arg)
                    log.llm_call("n", "r", "b", p, c, p - c, 0.0)
                    prompt, cached = prompt + p, cached + c
                elif kind == "defer":
                    log.reaction("defer", delay_s=arg)
                else:
                    log.reaction(kind)
        s = summarise([folder])["workflows"]["wf"]
    assert s["lines"] == len(calls) + 1
    assert s["deferrals"] == sum(1 for k, _ in calls if k == "defer")
    assert s["deferral_s"] == pytest.approx(sum(a for k, a in calls if k == "defer"))
    for kind, key in (("reroute", "reroutes"), ("relax", "relaxations"), ("fail", "fails")):
        assert s[key] == sum(1 for k, _ in calls if k == kind)
    assert (s["prompt_tokens"], s["cached_tokens"]) == (prompt, cached)
    assert s["hit_ratio"] == (cached / prompt if prompt else None)
    assert s["duration_s"] is None  # started, never ended


def test_local_refusals_are_counted_as_refusals(tmp_path: Path) -> None:
    """A claim the session refused itself (``reaction_refuse``: its backend does not honour
    the mode) counts in ``local_refusals`` and in ``refusals``."""
    with WorkflowLog("wf", "s", directory=tmp_path) as log:
        log.reaction("refuse", outcome="refuse_residency_claim", mode="hard_protected")
        log.reaction("refuse", outcome="refuse_residency_claim", mode="expiring")
    s = summarise([tmp_path])["workflows"]["wf"]
    assert (s["local_refusals"], s["refusals"]) == (2, 2)
