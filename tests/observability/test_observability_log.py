"""WorkflowLog: the line schema, sinks, context variables, bad input, failures, concurrency."""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import structlog
from sinks import StalledSink

from agentclaims.contract import ClaimEvent, ClaimSpec, EventName, ProtectionMode
from agentclaims.engine import KVEngine
from agentclaims.engine.blocks import BlockHash
from agentclaims.errors import UnknownNameError, UsageError
from agentclaims.observability import WorkflowLog


def _lines(path: Path) -> list[dict[str, Any]]:
    def no_constants(name: str) -> None:
        raise AssertionError(f"non-standard JSON constant {name}")

    with path.open() as f:
        return [json.loads(line, parse_constant=no_constants) for line in f]


def _refusal_events() -> list[ClaimEvent]:
    """A hard claim on 4 of 6 blocks, then a 4-block request it refuses."""
    engine = KVEngine(6, 4, clock=itertools.count(7).__next__, run_id="run-x")
    held = [BlockHash(i) for i in range(1, 5)]
    engine.begin("warm", held)
    engine.finish("warm")
    spec = ClaimSpec(
        "c-hard",
        "wf",
        engine.register_prefix(held),
        engine.cache_identity,
        4,
        ProtectionMode.HARD_PROTECTED,
    )
    engine.submit_claim(spec, held)
    engine.begin("big", [BlockHash(i) for i in range(10, 14)])
    return engine.take_events()


def test_line_envelope_from_injected_clocks(tmp_path: Path) -> None:
    """Each line has workflow_id, session_id, event, an ISO UTC timestamp and the monotonic ns."""
    with WorkflowLog(
        "wf-1",
        "sess-1",
        directory=tmp_path,
        clock=lambda: 1_700_000_000_123_456_789,
        monotonic=lambda: 42,
    ) as log:
        log.session("session_started", agent="react")
    [line] = _lines(tmp_path / "wf-1.jsonl")
    assert line == {
        "workflow_id": "wf-1",
        "session_id": "sess-1",
        "event": "session_started",
        "timestamp": "2023-11-14T22:13:20.123457Z",
        "ts_ns": 42,
        "agent": "react",
    }
    raw = (tmp_path / "wf-1.jsonl").read_text()
    assert raw.index('"agent"') < raw.index('"event"') < raw.index('"workflow_id"')  # sorted


def test_claim_event_carries_every_field(tmp_path: Path) -> None:
    """A refusal is logged under its contract name with ids, sequence, action and blockers."""
    events = _refusal_events()
    with WorkflowLog("wf", "s", directory=tmp_path) as log:
        for ev in events:
            log.claim_event(ev, node="agent")
    lines = _lines(tmp_path / "wf.jsonl")
    assert [line["event"] for line in lines] == [ev.event.value for ev in events]
    refused = lines[-1]
    assert refused["event"] == EventName.ACTIVE_REQUEST_REFUSED.value
    assert refused["blocking_claim_ids"] == ["c-hard"]
    assert refused["action"] == "refuse_active"
    assert refused["feasibility"] == "infeasible_preserve_resident_and_active"
    for line, ev in zip(lines, events, strict=True):
        expected = ev.to_dict()
        assert {k: line[k] for k in expected} == expected
        assert line["node"] == "agent"
    submitted = next(line for line in lines if line["event"] == "resident_claim_submitted")
    assert submitted["protection_mode"] == "hard_protected"
    assert submitted["prefix_id"].startswith("pfx-")


def test_claim_event_accepts_its_dict_form(tmp_path: Path) -> None:
    """Logging ``ev.to_dict()`` writes the same line as logging the event itself."""
    ev = _refusal_events()[-1]
    stream = io.StringIO()
    with WorkflowLog("wf", "s", stream=stream, clock=lambda: 0, monotonic=lambda: 0) as log:
        log.claim_event(ev)
        log.claim_event(ev.to_dict())
    first, second = stream.getvalue().splitlines()
    assert first == second


def test_contextvars_are_merged_but_the_logs_ids_win() -> None:
    """Ids bound with bound_contextvars land in lines; the log's own workflow_id is kept."""
    stream = io.StringIO()
    with WorkflowLog("wf-mine", "s", stream=stream) as log:
        with structlog.contextvars.bound_contextvars(node="planner", workflow_id="wf-other"):
            log.tool_call("search", 0.5, predicted_s=0.4, ttl_s=1.0, claim_ids=["c1"])
        log.tool_call("search", 0.5)
    inside, outside = (json.loads(s) for s in stream.getvalue().splitlines())
    assert inside["node"] == "planner"
    assert inside["workflow_id"] == "wf-mine"
    assert inside["claim_ids"] == ["c1"]
    assert "node" not in outside


def test_typed_events_and_their_fields() -> None:
    """reaction, llm_call and claim_planned write their names and fields; inf STE is null."""
    stream = io.StringIO()
    with WorkflowLog("wf", "s", stream=stream) as log:
        log.reaction(
            "relax",
            claim_id="c1",
            outcome="refuse_active",
            from_mode="hard_protected",
            to_mode="expiring",
        )
        log.llm_call("agent", "r1", "embedded", 100, 64, 36, 0.01, step=2, ste=0.0)
        log.llm_call("agent", "", "embedded", 1, 0, 1, 0.0)
        log.claim_planned(
            None, "pfx-1", None, ste=float("inf"), reuse_probability=0.0, reason="unreachable"
        )
    relax, llm, no_request, planned = (json.loads(s) for s in stream.getvalue().splitlines())
    assert no_request["request_id"] is None
    assert relax["event"] == "reaction_relax"
    assert (relax["claim_id"], relax["from_mode"], relax["to_mode"]) == (
        "c1",
        "hard_protected",
        "expiring",
    )
    assert (llm["event"], llm["cached_tokens"], llm["step"], llm["ste"]) == ("llm_call", 64, 2, 0.0)
    assert (planned["event"], planned["mode"], planned["ste"]) == ("claim_planned", None, None)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda log: log.reaction("retry"), "kind"),
        (lambda log: log.reaction("defer", delay_s=-1.0), "delay_s"),
        (lambda log: log.llm_call("n", "r", "b", 10, 11, 0, 0.1), "cached_tokens"),
        (lambda log: log.llm_call("n", "r", "b", -1, 0, 0, 0.1), "prompt_tokens"),
        (lambda log: log.llm_call("", "r", "b", 1, 0, 1, 0.1), "node"),
        (lambda log: log.llm_call("n", 7, "b", 1, 0, 1, 0.1), "request_id"),
        (lambda log: log.tool_call("t", float("nan")), "duration_s"),
        (lambda log: log.tool_call("t", 1.0, claim_ids="c1"), "claim_ids"),
        (lambda log: log.claim_planned("c", "p", "rock_solid"), "mode"),
        (lambda log: log.claim_planned("c", "p", None, reuse_probability=2.0), "reuse_probability"),
        (lambda log: log.session("session_paused"), "event"),
        (lambda log: log.session("session_started", ts_ns=1), "ts_ns"),
        (lambda log: log.claim_event({"event": "resident_claim_harmed"}), "event.seq"),
        (lambda log: log.claim_event(_refusal_events()[-1], claim_id="x"), "claim_id"),
    ],
)
def test_bad_input_raises_and_writes_nothing(call: Any, field: str) -> None:
    """Each bad argument raises UsageError naming its field, and no line is written."""
    stream = io.StringIO()
    log = WorkflowLog("wf", "s", stream=stream)
    with pytest.raises(UsageError) as info:
        call(log)
    assert info.value.field == field
    assert stream.getvalue() == ""


def test_unknown_reaction_kind_lists_the_known_ones() -> None:
    """An unknown kind is an UnknownNameError that names the four reactions."""
    log = WorkflowLog("wf", "s", stream=io.StringIO())
    with pytest.raises(UnknownNameError, match="defer, reroute, relax, fail"):
        log.reaction("retry")


@pytest.mark.parametrize(
    ("args", "kwargs", "field"),
    [
        (("", "s"), {"stream": io.StringIO()}, "workflow_id"),
        (("wf", " "), {"stream": io.StringIO()}, "session_id"),
        (("wf", "s"), {}, "directory"),
        (("../up", "s"), {"directory": "unused"}, "workflow_id"),
        (("wf", "s"), {"stream": 42}, "stream"),
    ],
)
def test_bad_construction(
    args: tuple[str, str], kwargs: dict[str, Any], field: str, tmp_path: Path
) -> None:
    """Empty ids, no sink, an id that is not a file name, a non-stream: UsageError, no file."""
    if "directory" in kwargs:
        kwargs["directory"] = tmp_path / kwargs["directory"]
    with pytest.raises(UsageError) as info:
        WorkflowLog(*args, **kwargs)
    assert info.value.field == field
    assert list(tmp_path.iterdir()) == []


def _open_fds_to(path: Path) -> int:
    fds = Path("/proc/self/fd")
    return sum(1 for fd in fds.iterdir() if os.path.realpath(fd) == str(path.resolve()))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_unopenable_sink_raises_and_leaves_no_file_open(tmp_path: Path) -> None:
    """A stream path under a file: UsageError naming ``stream``; the workflow file is closed."""
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    with pytest.raises(UsageError) as info:
        WorkflowLog("wf", "s", directory=tmp_path, stream=blocker / "all.jsonl")
    assert info.value.field == "stream"
    assert _open_fds_to(tmp_path / "wf.jsonl") == 0
    with pytest.raises(UsageError) as info:
        WorkflowLog("wf", "s", directory=blocker / "sub")
    assert info.value.field == "directory"


def test_write_failure_is_counted_and_warned_once(tmp_path: Path) -> None:
    """A sink that fails after opening is counted; the other sink still gets every line."""
    shared = (tmp_path / "shared.jsonl").open("a")
    log = WorkflowLog("wf", "s", directory=tmp_path / "d", stream=shared)
    log.session("session_started")
    shared.close()
    with pytest.warns(RuntimeWarning, match="cannot write"):
        log.reaction("defer", delay_s=0.1)
    log.reaction("defer", delay_s=0.2)
    log.close()
    assert log.write_errors == 2
    assert [line["event"] for line in _lines(tmp_path / "d" / "wf.jsonl")] == [
        "session_started",
        "reaction_defer",
        "reaction_defer",
    ]
    assert len(_lines(tmp_path / "shared.jsonl")) == 1


def test_close_keeps_given_streams_open_and_refuses_more_lines(tmp_path: Path) -> None:
    """close() closes the files the log opened, not the caller's stream; later lines raise."""
    stream = io.StringIO()
    log = WorkflowLog("wf", "s", directory=tmp_path, stream=stream)
    log.close()
    log.close()
    assert log.closed
    assert not stream.closed
    with pytest.raises(UsageError, match="closed"):
        log.session("session_ended")
    assert stream.getvalue() == ""


def test_threads_sharing_a_stream_never_interleave_lines(tmp_path: Path) -> None:
    """Eight threads over two workflows on one shared file: every line whole and attributed."""
    path = tmp_path / "shared.jsonl"
    logs = [WorkflowLog(f"wf-{i}", "s", stream=path) for i in range(2)]

    def work(n: int) -> None:
        log = logs[n % 2]
        for i in range(100):
            log.tool_call(f"tool-{n}", 0.001 * i, claim_ids=[f"c-{n}-{i}"] * 5)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for log in logs:
        log.close()
    lines = _lines(path)
    assert len(lines) == 800
    for wf in ("wf-0", "wf-1"):
        assert sum(1 for line in lines if line["workflow_id"] == wf) == 400
    assert all(int(line["tool"][5:]) % 2 == int(line["workflow_id"][3:]) for line in lines)


async def test_cancellation_loses_no_completed_line(tmp_path: Path) -> None:
    """A task cancelled mid-run: every line it finished is already on disk, none is partial."""
    log = WorkflowLog("wf", "s", directory=tmp_path)
    done: list[int] = []

    async def agent() -> None:
        for i in itertools.count():
            log.llm_call("agent", f"r{i}", "embedded", 10, 5, 5, 0.0, step=i)
            done.append(i)
            await asyncio.sleep(0)

    task = asyncio.create_task(agent())
    for _ in range(25):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    lines = _lines(tmp_path / "wf.jsonl")  # read before close: flushed line by line
    assert done
    assert [line["step"] for line in lines] == done
    log.close()


def test_a_background_log_never_waits_on_its_sink_and_writes_every_line_in_order() -> None:
    """``background=True``: logging returns while the sink is stalled (the lines wait in the
    log thread, not in the caller); ``flush`` then sees every line written, in order, and
    ``close`` writes the ones logged after it before it returns."""
    sink = StalledSink()
    log = WorkflowLog("wf-bg", "s-bg", stream=sink, background=True)
    for i in range(50):
        log.reaction("defer", attempt=i)
    assert not sink.go.is_set()  # 50 calls returned with the sink stalled
    assert not log.flush(timeout=0.05)  # still stalled: not all written
    sink.go.set()
    assert log.flush(timeout=10)
    attempts = [json.loads(line)["attempt"] for line in sink.getvalue().splitlines()]
    assert attempts == list(range(50))
    assert sink.writer_threads == {"agentclaims-log"}
    for i in range(50, 60):
        log.reaction("defer", attempt=i)
    log.close()
    attempts = [json.loads(line)["attempt"] for line in sink.getvalue().splitlines()]
    assert attempts == list(range(60))
    with pytest.raises(UsageError, match="closed"):
        log.reaction("defer")
    with pytest.raises(UsageError, match="background"):
        WorkflowLog("wf", "s", stream=io.StringIO(), background="yes")  # type: ignore[arg-type]


def test_a_foreground_log_writes_in_the_callers_thread() -> None:
    """Without ``background`` each line is written before the call returns, by its caller."""
    sink = StalledSink()
    sink.go.set()
    log = WorkflowLog("wf-fg", "s-fg", stream=sink)
    log.reaction("defer", attempt=1)
    assert json.loads(sink.getvalue())["attempt"] == 1
    assert sink.writer_threads == {threading.current_thread().name}
    assert log.flush(timeout=0)
