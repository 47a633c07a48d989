"""Summarise outcome logs (JSON lines written by ``WorkflowLog``) per workflow, plus totals.

Reading streams line by line and is tolerant: a line that is not a JSON object, has no
``workflow_id`` or ``event``, or is a contract event that does not parse, is counted as
malformed with its file and line number, and the rest is still summarised.

Claims are rebuilt from the logged contract events with ``rebuild_claims``, one claim at a time:
a claim whose logged history is not a legal lifecycle (say the log starts in the middle of it)
is counted under the state ``invalid`` and explained in ``claim_problems``.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentclaims.contract import ClaimEvent, EventName, rebuild_claims
from agentclaims.errors import AgentClaimsError, UsageError
from agentclaims.observability.log import ENVELOPE_FIELDS

__all__ = ["MAX_MALFORMED_LISTED", "iter_log_files", "summarise"]

#: Malformed lines listed by position (all of them are counted).
MAX_MALFORMED_LISTED = 100

#: Envelope fields the log adds to a contract event (``event`` is the contract's own).
_LOG_ONLY = ENVELOPE_FIELDS - {"event"}
_CONTRACT_EVENTS = frozenset(e.value for e in EventName)
_REACTION_COUNTERS = {
    "reaction_defer": "deferrals",
    "reaction_reroute": "reroutes",
    "reaction_relax": "relaxations",
    "reaction_refuse": "local_refusals",
    "reaction_fail": "fails",
    "reaction_renew": "renewals",
    "reaction_replan": "replans",
    "reaction_drop": "drops",
}
_EVENT_COUNTERS = {
    EventName.RESIDENT_CLAIM_HARMED.value: "true_harm",
    EventName.ACTIVE_REQUEST_REFUSED.value: "requests_refused",
    EventName.RESIDENT_CLAIM_REJECTED.value: "claims_rejected",
    EventName.ACTIVE_REQUEST_DEFERRED.value: "requests_deferred",
    "llm_call": "llm_calls",
    "tool_call": "tool_calls",
    "claim_planned": "claims_planned",
    "claim_ended": "claims_ended",
    EventName.RESIDENT_CLAIM_DEMOTED.value: "claims_demoted",
    EventName.RESIDENT_CLAIM_EXPIRED.value: "claims_expired",
    **_REACTION_COUNTERS,
}
#: Token and time sums, by the line field they add up.
_SUMS = {
    "llm_call": ("prompt_tokens", "cached_tokens", "recomputed_tokens"),
    "tool_call": ("duration_s",),
    "reaction_defer": ("delay_s",),
}
_SUM_NAMES = {"duration_s": "tool_s", "delay_s": "deferral_s"}
_COUNTS = (
    "lines",
    *dict.fromkeys(_EVENT_COUNTERS.values()),
    "prompt_tokens",
    "cached_tokens",
    "recomputed_tokens",
)
_SECONDS = ("deferral_s", "tool_s")
#: What a claim's timeline keeps of each line about it.
_TIMELINE_FIELDS = (
    "node",
    "mode",
    "protection_mode",
    "state",
    "reason",
    "ttl_s",
    "tool",
    "duration_s",
    "held_s",
    "outcome",
    "cause",
)


@dataclass
class _Workflow:
    """What the reader has gathered for one workflow so far."""

    counts: Counter[str] = field(default_factory=Counter)
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(_SECONDS, 0.0))
    session_ids: dict[str, None] = field(default_factory=dict)
    files: dict[str, None] = field(default_factory=dict)
    claim_events: dict[str, list[ClaimEvent]] = field(default_factory=dict)
    started_ns: int | None = None
    ended_ns: int | None = None
    status: str | None = None
    error: str | None = None
    thread_id: str | None = None
    timelines: dict[str, list[tuple[int | None, str, dict[str, Any]]]] = field(default_factory=dict)

    def add(self, line: dict[str, Any], ev: ClaimEvent | None, path: str) -> None:
        event = line["event"]
        self.counts["lines"] += 1
        self.files[path] = None
        self.session_ids[str(line.get("session_id"))] = None
        if isinstance(line.get("thread_id"), str):
            self.thread_id = line["thread_id"]
        if ev is not None and ev.claim_id is not None:
            self.claim_events.setdefault(ev.claim_id, []).append(ev)
        self._timeline(line)
        if event == "session_ended":
            reason = line.get("reason")
            error = line.get("error")
            self.status = reason if isinstance(reason, str) else ("error" if error else "completed")
            self.error = error if isinstance(error, str) else None
        counter = _EVENT_COUNTERS.get(event)
        if counter is not None:
            self.counts[counter] += 1
        for name in _SUMS.get(event, ()):
            value = line.get(name)
            if isinstance(value, int | float) and not isinstance(value, bool):
                if name in _SUM_NAMES:
                    self.seconds[_SUM_NAMES[name]] += value
                else:
                    self.counts[name] += int(value)
        ts = line.get("ts_ns")
        if isinstance(ts, int):
            if event == "session_started" and self.started_ns is None:
                self.started_ns = ts
            elif event == "session_ended":
                self.ended_ns = ts

    def _timeline(self, line: dict[str, Any]) -> None:
        """Add ``line`` to the timeline of each claim it names."""
        event = line["event"]
        ids = [line["claim_id"]] if isinstance(line.get("claim_id"), str) else []
        if event == "tool_call" and isinstance(line.get("claim_ids"), list):
            ids = [c for c in line["claim_ids"] if isinstance(c, str)]
        ts = line.get("ts_ns") if isinstance(line.get("ts_ns"), int) else None
        detail = {k: line[k] for k in _TIMELINE_FIELDS if line.get(k) is not None}
        for claim_id in ids:
            self.timelines.setdefault(claim_id, []).append((ts, event, detail))

    def _planned_mode(self, claim_id: str) -> str | None:
        """The mode the session planned the claim in (its ``claim_planned`` line): what a
        claim's mode is where the engine's events do not repeat it (vLLM's connector)."""
        for _, event, detail in self.timelines.get(claim_id, ()):
            if event == "claim_planned" and isinstance(detail.get("mode"), str):
                mode: str = detail["mode"]
                return mode
        return None

    def claim_timelines(self) -> dict[str, dict[str, Any]]:
        """Per claim: its node and mode, each line about it (seconds after the session
        started, in log order) and how it ended."""
        origin = self.started_ns
        out: dict[str, dict[str, Any]] = {}
        for claim_id, entries in self.timelines.items():
            steps = []
            node = mode = end = None
            for ts, event, detail in entries:
                at = None if ts is None or origin is None else round((ts - origin) / 1e9, 6)
                steps.append({"t_s": at, "event": event, **detail})
                node = node or detail.get("node")
                mode = detail.get("mode") or detail.get("protection_mode") or mode
                if event == "claim_ended":
                    end = detail.get("reason")
            out[claim_id] = {"node": node, "mode": mode, "end_reason": end, "events": steps}
        return out

    def summary(self) -> dict[str, Any]:
        by_mode: Counter[str] = Counter()
        by_state: Counter[str] = Counter()
        problems: list[str] = []
        for claim_id, events in self.claim_events.items():
            try:
                hist = rebuild_claims(events)[claim_id]
            except (AgentClaimsError, ValueError) as exc:  # ValueError: an unknown mode name
                by_state["invalid"] += 1
                problems.append(f"{claim_id}: {exc}")
                mode = next(
                    (e.data["protection_mode"] for e in events if "protection_mode" in e.data), None
                )
                by_mode[str(mode or self._planned_mode(claim_id) or "unknown")] += 1
                continue
            mode = hist.mode.value if hist.mode else self._planned_mode(claim_id)
            by_mode[mode or "unknown"] += 1
            by_state[hist.state.value] += 1
        duration = None
        if self.started_ns is not None and self.ended_ns is not None:
            duration = (self.ended_ns - self.started_ns) / 1e9
        out = _totals(self.counts, self.seconds)
        out.update(
            claims=len(self.claim_events),
            claims_by_mode=dict(sorted(by_mode.items())),
            claims_by_state=dict(sorted(by_state.items())),
            claim_problems=problems,
            duration_s=duration,
            session_ids=list(self.session_ids),
            files=list(self.files),
            status=self.status,
            error=self.error,
            thread_id=self.thread_id,
            claim_timelines=self.claim_timelines(),
        )
        return out


def _totals(counts: Counter[str], seconds: dict[str, float]) -> dict[str, Any]:
    out: dict[str, Any] = {name: counts[name] for name in _COUNTS}
    out.update({name: seconds[name] for name in _SECONDS})
    out["refusals"] = (
        counts["requests_refused"] + counts["claims_rejected"] + counts["local_refusals"]
    )
    prompt = counts["prompt_tokens"]
    out["hit_ratio"] = counts["cached_tokens"] / prompt if prompt else None
    return out


def iter_log_files(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The files to read: each file as given, each folder's ``*.jsonl`` (sorted, not recursive).

    Every path is checked before anything is read: a missing one raises ``UsageError``.
    """
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files.extend(sorted(p for p in path.glob("*.jsonl") if p.is_file()))
        elif path.is_file():
            files.append(path)
        else:
            raise UsageError("logs", f"no such file or folder: {os.fspath(raw)!r}")
    return files


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            yield from enumerate(f, 1)
    except OSError as exc:
        raise UsageError("logs", f"cannot read {str(path)!r}: {exc}") from exc


def _parse(text: str) -> tuple[dict[str, Any], ClaimEvent | None]:
    """One line as a dict with a workflow id and an event (and its ``ClaimEvent`` when it is a
    contract event), or ``UsageError`` saying why not."""
    try:
        line = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError("line", f"not JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(line, dict):
        raise UsageError("line", f"expected a JSON object, got {type(line).__name__}")
    for name in ("workflow_id", "event"):
        value = line.get(name)
        if not isinstance(value, str) or not value:
            raise UsageError(name, "missing or not a non-empty string")
    if line["event"] not in _CONTRACT_EVENTS:
        return line, None
    try:
        return line, ClaimEvent.from_dict({k: v for k, v in line.items() if k not in _LOG_ONLY})
    except (UsageError, ValueError, TypeError) as exc:
        raise UsageError("line", f"bad {line['event']} event: {exc}") from None


def summarise(paths: Iterable[str | os.PathLike[str]]) -> dict[str, Any]:
    """Read outcome logs (files, or folders of ``*.jsonl``) and summarise them.

    Returns ``{"workflows": {workflow_id: {...}}, "totals": {...}, "malformed_lines": N,
    "malformed": [{"file", "line", "error"}, ...]}`` (at most ``MAX_MALFORMED_LISTED`` listed).
    Totals add up the workflows' counts; their ``hit_ratio`` is over all tokens, and
    ``max_duration_s`` / ``mean_duration_s`` replace ``duration_s``.
    """
    workflows: dict[str, _Workflow] = {}
    malformed = 0
    listed: list[dict[str, Any]] = []
    for path in iter_log_files(paths):
        name = str(path)
        for lineno, text in _lines(path):
            if not text.strip():
                continue
            try:
                line, ev = _parse(text)
            except UsageError as exc:
                malformed += 1
                if len(listed) < MAX_MALFORMED_LISTED:
                    listed.append({"file": name, "line": lineno, "error": str(exc)})
                continue
            workflow = workflows.get(line["workflow_id"])
            if workflow is None:
                workflow = workflows[line["workflow_id"]] = _Workflow()
            workflow.add(line, ev, name)
    summaries = {wf: workflows[wf].summary() for wf in sorted(workflows)}
    threads: dict[str, list[str]] = {}
    for wf in sorted(summaries, key=lambda wf: (workflows[wf].started_ns or 0, wf)):
        thread = summaries[wf]["thread_id"]
        if thread is not None:
            threads.setdefault(thread, []).append(wf)
    return {
        "workflows": summaries,
        "threads": threads,
        "totals": _grand_totals(summaries),
        "malformed_lines": malformed,
        "malformed": listed,
    }


def _grand_totals(summaries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    counts: Counter[str] = Counter()
    seconds = dict.fromkeys(_SECONDS, 0.0)
    by_mode: Counter[str] = Counter()
    by_state: Counter[str] = Counter()
    durations: list[float] = []
    for s in summaries.values():
        counts.update({name: s[name] for name in _COUNTS})
        for name in _SECONDS:
            seconds[name] += s[name]
        by_mode.update(s["claims_by_mode"])
        by_state.update(s["claims_by_state"])
        counts["claims"] += s["claims"]
        if s["duration_s"] is not None:
            durations.append(s["duration_s"])
    out = _totals(counts, seconds)
    out.update(
        workflows=len(summaries),
        claims=counts["claims"],
        claims_by_mode=dict(sorted(by_mode.items())),
        claims_by_state=dict(sorted(by_state.items())),
        not_completed={
            status: sum(1 for s in summaries.values() if s["status"] == status)
            for status in ("error", "cancelled", "closed")
        },
        max_duration_s=max(durations) if durations else None,
        mean_duration_s=sum(durations) / len(durations) if durations else None,
    )
    return out
