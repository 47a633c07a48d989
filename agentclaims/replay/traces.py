"""Agentic traces as replayable sessions, loaded one file at a time.

A trace file (``trace_NNNN.json`` or ``.json.gz``, format in the data set's README) becomes a
:class:`Trace`: one root :class:`SessionScript` whose steps are :class:`TraceRequest` s and
:class:`SubAgentGroup` s. A group is a run of consecutive sub-agent entries: they start together
when the parent's previous response ends, each runs as its own session, and the parent resumes
once all of them finished. In the files a sub-agent's ``t`` is when it *ended* (start =
``t - duration_ms / 1000`` lines up with the parent's previous response), so::

    sub-agent start delay = max(0, (t - duration) - end of the parent's previous response)
    parent resume delay   = max(0, t of the next parent request - latest sub-agent end)

Block ids are namespaced per trace (``hash_id_scope: "local"``; sub-agents of a trace share ids
with each other and with their parent, which is real: they share system prompts), so two traces
never share a block. Synthetic workloads may use ``"global"`` ids (shared across workflows).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentclaims.errors import UnknownNameError, UsageError

__all__ = [
    "SPLITS",
    "MalformedTrace",
    "SessionScript",
    "SubAgentGroup",
    "Trace",
    "TraceRequest",
    "TraceSource",
    "parse_trace",
    "split_of",
]

log = logging.getLogger(__name__)

_NAMESPACE_SHIFT = 40
"""A trace's ordinal goes above bit 40 of its block ids (local ids are far below 2**40)."""


class MalformedTrace(UsageError):
    """A trace file that cannot be parsed; ``field`` names the file."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One LLM call of a session."""

    delay_s: float
    """Seconds from the previous step's end (previous response or sub-agents) to this request:
    the tool or human time. Only the harness reads it; online policies never see it ahead."""
    input_tokens: int
    output_tokens: int
    block_hashes: tuple[int, ...]
    """Namespaced chained block ids of the input's full blocks."""
    stop: str
    """``tool_use``, ``end_turn`` or ``""`` (unknown)."""
    input_kind: str = "text"
    """``tool_result`` when the input continues after a tool, else ``text``."""


@dataclass(frozen=True, slots=True)
class SubAgentGroup:
    """Sub-agents that start together; the parent waits for all of them."""

    agents: tuple[SessionScript, ...]
    start_delays_s: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class SessionScript:
    """A session's steps in order (a trace's root, or one sub-agent)."""

    name: str
    kind: str
    """``main`` for a trace's root, else the sub-agent's type."""
    steps: tuple[TraceRequest | SubAgentGroup, ...]
    system_tokens: int = 0
    """Tokens of the session's system prompt and tool definitions (its stable leading run)."""

    def requests(self) -> Iterator[TraceRequest]:
        """Every request of this session and its sub-agents, depth first."""
        for step in self.steps:
            if isinstance(step, TraceRequest):
                yield step
            else:
                for agent in step.agents:
                    yield from agent.requests()


@dataclass(frozen=True, slots=True)
class Trace:
    """One trace: its id, block size and root session."""

    trace_id: str
    block_size: int
    root: SessionScript
    source: str = ""

    def requests(self) -> Iterator[TraceRequest]:
        return self.root.requests()


def _req_fields(raw: Mapping[str, Any], ns: int, delay: float) -> TraceRequest:
    hashes = raw["hash_ids"]
    if not isinstance(hashes, list):
        raise TypeError("hash_ids must be a list")
    kinds = raw.get("input_types") or ()
    return TraceRequest(
        delay_s=max(0.0, float(delay)),
        input_tokens=int(raw["in"]),
        output_tokens=int(raw["out"]),
        block_hashes=tuple(ns | int(h) for h in hashes),
        stop=str(raw.get("stop") or ""),
        input_kind="tool_result" if "tool_result" in kinds else "text",
    )


def _system_tokens(raw: Mapping[str, Any]) -> int:
    total = 0
    for key in ("system_tokens", "tool_tokens"):
        value = raw.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            total += value
    return total


def _session(
    name: str, kind: str, entries: Sequence[Mapping[str, Any]], ns: int, system_tokens: int = 0
) -> SessionScript:
    steps: list[TraceRequest | SubAgentGroup] = []
    prev_end: float | None = None  # trace time the previous parent response ended
    group: list[Mapping[str, Any]] = []

    def close_group() -> float:
        base = prev_end if prev_end is not None else 0.0
        agents, delays, ends = [], [], []
        for sub in group:
            dur = float(sub["duration_ms"]) / 1000.0
            end = float(sub["t"])
            agents.append(
                _session(
                    f"{name}/{sub['agent_id']}",
                    str(sub["subagent_type"]),
                    sub["requests"],
                    ns,
                    _system_tokens(sub),
                )
            )
            delays.append(max(0.0, end - dur - base))
            ends.append(end)
        steps.append(SubAgentGroup(tuple(agents), tuple(delays)))
        group.clear()
        return max(ends)

    group_end: float | None = None
    for raw in entries:
        if raw["type"] == "subagent":
            group.append(raw)
            continue
        if group:
            group_end = close_group()
        t = float(raw["t"])
        if group_end is not None:
            delay = t - group_end
            group_end = None
        elif prev_end is None:
            delay = 0.0
        else:
            delay = float(raw.get("think_time") or 0.0)
        steps.append(_req_fields(raw, ns, delay))
        prev_end = t + float(raw.get("api_time") or 0.0)
    if group:
        close_group()
    return SessionScript(name, kind, tuple(steps), system_tokens)


def parse_trace(data: Mapping[str, Any], ordinal: int, source: str = "") -> Trace:
    """Build a :class:`Trace` from a decoded trace object; ``ordinal`` namespaces its ids."""
    scope = data.get("hash_id_scope", "local")
    ns = (ordinal + 1) << _NAMESPACE_SHIFT if scope == "local" else 0
    trace_id = str(data["id"])
    root = _session(trace_id, "main", data["requests"], ns, _system_tokens(data))
    return Trace(trace_id, int(data["block_size"]), root, source)


SPLITS = ("tune", "check")
"""The two halves of a folder of traces: one to tune on, one to check on."""


def _what_is_wrong(exc: BaseException) -> str:
    """A malformed trace file's fault, in words."""
    if isinstance(exc, KeyError):
        return f"missing field {exc.args[0]!r}"
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text"
    if isinstance(exc, gzip.BadGzipFile | EOFError | zlib.error):
        return "not a whole gzip file"
    if isinstance(exc, OSError):
        return f"cannot be read ({exc.strerror or exc})"
    return f"a field of the wrong type or value ({exc})"


def split_of(name: str) -> str:
    """Which half the trace file ``name`` falls in: by a hash of its name, so the halves are
    fixed, about equal, and independent of the folder's order or of files added later."""
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return SPLITS[digest[0] & 1]


@dataclass
class TraceSource:
    """The trace files of a folder in file-name order, each read only when asked for.

    ``load(i)`` returns the ``i``-th trace, or ``None`` (with a warning and the file's name added
    to ``skipped``) when the file is malformed.
    """

    paths: list[Path]
    skipped: list[str] = field(default_factory=list)

    @classmethod
    def from_dir(
        cls, folder: str | Path, limit: int | None = None, split: str | None = None
    ) -> TraceSource:
        """The folder's traces; ``split``: only the ``tune`` or the ``check`` half
        (``split_of``), so what the planner is tuned on is never what it is checked on;
        ``limit``: the first K (after the split)."""
        root = Path(folder)
        if not root.is_dir():
            raise UsageError("traces", f"no such folder: {str(root)!r}")
        if limit is not None and limit < 1:
            raise UsageError("limit", f"must be >= 1, got {limit}")
        if split is not None and split not in SPLITS:
            raise UnknownNameError("split", split, list(SPLITS))
        paths = sorted(
            p for p in root.iterdir() if p.name.endswith((".json", ".json.gz")) and p.is_file()
        )
        if not paths:
            raise UsageError("traces", f"no .json or .json.gz trace files in {str(root)!r}")
        if split is not None:
            paths = [p for p in paths if split_of(p.name) == split]
        return cls(paths[:limit] if limit else paths)

    def __len__(self) -> int:
        return len(self.paths)

    def load(self, index: int) -> Trace | None:
        trace = self._read(index)
        if isinstance(trace, str):
            log.warning("skipping malformed trace file %s: %s", self.paths[index].name, trace)
            self.skipped.append(self.paths[index].name)
            return None
        return trace

    def readable(self, warn: Callable[[str], None]) -> TraceSource:
        """The same folder without its malformed files, each read once and named once to
        ``warn`` with what is wrong in it: what a replay checks before it runs."""
        good, skipped = [], list(self.skipped)
        for i, path in enumerate(self.paths):
            trace = self._read(i)
            if isinstance(trace, str):
                warn(f"skipping malformed trace file {path.name}: {trace}")
                skipped.append(path.name)
            else:
                good.append(path)
        return self if len(good) == len(self.paths) else TraceSource(good, skipped)

    def _read(self, index: int) -> Trace | str:
        """The ``index``-th trace, or what is wrong in its file, in words."""
        path = self.paths[index]
        try:
            opener = gzip.open if path.name.endswith(".gz") else open
            with opener(path, "rt", encoding="utf-8") as fh:
                data = json.load(fh)
            if not isinstance(data, dict):
                return f"not a JSON object but a JSON {type(data).__name__}"
            return parse_trace(data, index, path.name)
        except (
            OSError,
            ValueError,
            KeyError,
            TypeError,
            AttributeError,
            EOFError,
            zlib.error,
        ) as exc:
            return _what_is_wrong(exc)

    def __iter__(self) -> Iterator[Trace]:
        """Every well-formed trace, one file in memory at a time."""
        for i in range(len(self.paths)):
            trace = self.load(i)
            if trace is not None:
                yield trace
