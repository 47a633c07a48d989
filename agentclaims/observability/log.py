"""Per-workflow outcome logs: one JSON object per line, written through a private structlog logger.

Every line carries the same envelope, then the event's own fields::

    {"event": ..., "session_id": ..., "timestamp": "2026-...Z", "ts_ns": ..., "workflow_id": ...}

``timestamp`` is wall-clock UTC (ISO 8601), ``ts_ns`` a monotonic clock in nanoseconds (for
durations within one process). Keys are sorted. docs/logs.md lists every event and its fields.

The library never calls ``structlog.configure``: each ``WorkflowLog`` wraps its own writer with
``structlog.wrap_logger`` and a fixed processor chain (``merge_contextvars`` first, so ids bound
with ``structlog.contextvars.bound_contextvars`` land in every line; the log's own
``workflow_id``/``session_id`` win over context variables of the same name).

Listeners (``listeners=``, ``add_listener``) receive every finished record, the event dict
with its envelope (``timestamp``, ``ts_ns``, ...), as it is written; a log may have listeners
and no sink at all (``agentclaims.observability.otel`` builds OpenTelemetry spans this way).

Failures: opening a sink that cannot be opened raises ``UsageError`` naming it. After that,
logging never raises on I/O: a line a sink could not take is counted in ``write_errors`` and
the first such failure per log emits a ``RuntimeWarning``; a listener that raises is counted in
``listener_errors`` the same way. Misuse (bad arguments, logging after ``close()``) raises
``UsageError`` before anything is written.
"""

from __future__ import annotations

import atexit
import math
import os
import queue
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, TextIO

import structlog
from structlog.typing import EventDict, WrappedLogger

from agentclaims.contract import ClaimEvent, ProtectionMode, parse_mode
from agentclaims.errors import UnknownNameError, UsageError

__all__ = [
    "ENVELOPE_FIELDS",
    "REACTION_KINDS",
    "SESSION_EVENTS",
    "Listener",
    "ReactionKind",
    "WorkflowLog",
    "flush_background",
]

ReactionKind = Literal[
    "defer", "reroute", "relax", "fail", "refuse", "renew", "replan", "drop", "failover"
]
#: The session's reactions to an outcome or event; each is logged as ``reaction_<kind>``.
REACTION_KINDS: Final[tuple[str, ...]] = (
    "defer",
    "reroute",
    "relax",
    "fail",
    "refuse",
    "renew",
    "replan",
    "drop",
    "failover",
)
SESSION_EVENTS: Final[tuple[str, ...]] = ("session_started", "session_ended")
Listener = Callable[[dict[str, Any]], None]
"""Takes one finished record of a ``WorkflowLog`` (a dict of its own: the line's fields)."""
#: Fields the log itself writes on every line; callers may not pass them.
ENVELOPE_FIELDS: Final[frozenset[str]] = frozenset(
    {"event", "session_id", "thread_id", "timestamp", "ts_ns", "workflow_id"}
)

# One lock for every sink: lines of workflows sharing a stream never interleave, and a line is
# written and flushed before the next one starts (logging calls contain no await point, so an
# asyncio cancellation cannot cut a line either).
_WRITE_LOCK = threading.Lock()


class _Timestamper:
    """Adds ``timestamp`` (ISO 8601, UTC, microseconds) and ``ts_ns`` (monotonic)."""

    __slots__ = ("_monotonic_ns", "_wall_ns")

    def __init__(self, wall_ns: Callable[[], int], monotonic_ns: Callable[[], int]) -> None:
        self._wall_ns = wall_ns
        self._monotonic_ns = monotonic_ns

    def __call__(self, _logger: WrappedLogger, _name: str, event_dict: EventDict) -> EventDict:
        wall = datetime.fromtimestamp(self._wall_ns() / 1e9, tz=UTC)
        event_dict["timestamp"] = wall.isoformat(timespec="microseconds").replace("+00:00", "Z")
        event_dict["ts_ns"] = self._monotonic_ns()
        return event_dict


_PLAIN = frozenset({str, int, bool, type(None)})
"""Types written as they are (checked by exact type: most of a line's values, and cheap)."""


def _finite(value: Any) -> Any:
    """JSON has no infinity or NaN: write them as ``null`` (an STE of ``null`` = unreachable)."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is float:
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    if isinstance(value, float):  # a float subclass
        return value if math.isfinite(value) else None
    return value


def _only_finite(_logger: WrappedLogger, _name: str, event_dict: EventDict) -> EventDict:
    if all(type(v) in _PLAIN for v in event_dict.values()):
        return event_dict  # nothing to rewrite (the usual line)
    return {k: _finite(v) for k, v in event_dict.items()}


class _Deliver:
    """Hands each finished record (stamped, JSON-safe) to the log's listeners, a dict of its
    own each; a log without a sink drops the line after that (nothing to render)."""

    __slots__ = ("_log",)

    def __init__(self, log: WorkflowLog) -> None:
        self._log = log

    def __call__(self, _logger: WrappedLogger, _name: str, event_dict: EventDict) -> EventDict:
        log = self._log
        for listener in tuple(log._listeners):
            try:
                listener(dict(event_dict))
            except Exception as exc:  # a listener never breaks the agent's run
                log._listener_failed(listener, exc)
        if not log._writer.sinks:
            raise structlog.DropEvent
        return event_dict


class _Sink:
    __slots__ = ("name", "owned", "stream")

    def __init__(self, name: str, stream: TextIO, owned: bool) -> None:
        self.name = name
        self.stream = stream
        self.owned = owned


class _LineWriter:
    """The structlog "logger" at the end of the chain: writes each rendered line to every sink
    and flushes it, or hands it to the log thread (``background``). Not
    ``structlog.WriteLogger``: one line goes to up to two sinks under one lock, and a failing
    sink is counted instead of raising into the agent."""

    def __init__(
        self,
        sinks: Sequence[_Sink],
        on_error: Callable[[_Sink, Exception], None],
        background: bool = False,
    ):
        self.sinks = tuple(sinks)
        self._on_error = on_error
        self.background = background

    def msg(self, message: str) -> None:
        if self.background:
            _BACKGROUND.put(self, message + "\n")
        else:
            self.write(message + "\n")

    info = msg

    def write(self, line: str) -> None:
        with _WRITE_LOCK:
            for sink in self.sinks:
                try:
                    sink.stream.write(line)
                    sink.stream.flush()
                except (OSError, ValueError) as exc:  # ValueError: the stream was closed
                    self._on_error(sink, exc)


class _Background:
    """The one thread that writes the lines of background logs (a session's), in the order
    they were handed over: the agents' event loop hands a line over and goes on, and a slow
    disk or a full pipe holds up this thread, not the agents. Started on first use (again in
    a forked child); what is pending at interpreter exit is written first (``atexit``)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[_LineWriter, str] | threading.Event] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        self._starting = threading.Lock()

    def put(self, writer: _LineWriter, line: str) -> None:
        thread = self._thread
        if thread is None or not thread.is_alive():
            self._start()
        self._queue.put((writer, line))

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until the lines handed over before this call are written (``False`` if
        ``timeout`` seconds passed first)."""
        thread = self._thread
        if thread is None or not thread.is_alive() or thread is threading.current_thread():
            return True
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)

    def _start(self) -> None:
        with self._starting:
            thread = self._thread
            if thread is None or not thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="agentclaims-log", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if isinstance(item, threading.Event):
                item.set()
            else:
                item[0].write(item[1])


_BACKGROUND = _Background()
atexit.register(_BACKGROUND.drain, 10.0)


def flush_background(timeout: float | None = None) -> bool:
    """Wait until every line a background log (a session's) was handed so far is written, in
    every such log (``False`` if ``timeout`` seconds passed first): for a reader of a running
    session's sink, as ``agentclaims.testing.OutcomeLog`` is."""
    return _BACKGROUND.drain(timeout)


def _check_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UsageError(name, f"must be a non-negative integer, got {value!r}")
    return value


def _check_seconds(name: str, value: object, *, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise UsageError(name, f"must be a non-negative number of seconds, got {value!r}")
    return float(value)


def _check_name(name: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise UsageError(name, f"must be a non-empty string, got {value!r}")
    return value


class WorkflowLog:
    """The outcome log of one workflow run.

    ``directory``: write ``<directory>/<workflow_id>.jsonl`` (created if missing, appended to).
    ``stream``: also (or only) write to a shared stream, a path or an open text stream, where
    many workflows may write; every line carries ``workflow_id``. A stream given as an object is
    not closed by ``close()``; files this log opened are.

    ``listeners``: callables that each receive every finished record (a dict of its own: the
    line's fields, envelope included) as it is written; more with ``add_listener``. A log may
    have listeners and no sink. A listener that raises is counted in ``listener_errors``.

    Safe to share between threads and tasks; each line is flushed as soon as it is written.
    ``background``: lines are handed to one writer thread instead, in order, so logging never
    waits on a sink (a session's log: its event loop goes on); ``flush`` waits for them and
    ``close`` writes them first. ``clock`` (wall ns) and ``monotonic`` (ns) are injectable.
    """

    def __init__(
        self,
        workflow_id: str,
        session_id: str,
        *,
        directory: str | os.PathLike[str] | None = None,
        stream: TextIO | str | os.PathLike[str] | None = None,
        clock: Callable[[], int] = time.time_ns,
        monotonic: Callable[[], int] = time.monotonic_ns,
        thread_id: str | None = None,
        listeners: Sequence[Listener] = (),
        background: bool = False,
    ) -> None:
        _check_name("workflow_id", workflow_id)
        _check_name("session_id", session_id)
        if thread_id is not None:
            _check_name("thread_id", thread_id)
        if not all(callable(f) for f in listeners):
            raise UsageError("listeners", f"expected a sequence of callables, got {listeners!r}")
        if directory is None and stream is None and not listeners:
            raise UsageError("directory", "give a directory, a stream, listeners, or several")
        if directory is not None and (
            workflow_id in (".", "..") or any(c in workflow_id for c in ("/", "\\", "\0"))
        ):
            raise UsageError("workflow_id", f"{workflow_id!r} cannot name a file in directory")
        self.workflow_id = workflow_id
        self.session_id = session_id
        self.write_errors = 0
        """Lines (per sink) that could not be written after the log was opened."""
        self.path: Path | None = None
        """The per-workflow file, when ``directory`` was given."""
        self.listener_errors = 0
        """Records a listener raised on (each listener counts)."""
        self._listeners: list[Listener] = list(listeners)
        self._closed = False
        self._warned = False
        self._listener_warned = False
        sinks: list[_Sink] = []
        try:
            if directory is not None:
                self.path = Path(directory) / f"{workflow_id}.jsonl"
                sinks.append(_Sink(str(self.path), self._open("directory", self.path), True))
            if isinstance(stream, str | os.PathLike):
                sinks.append(_Sink(os.fspath(stream), self._open("stream", Path(stream)), True))
            elif stream is not None:
                if not callable(getattr(stream, "write", None)):
                    raise UsageError("stream", f"expected a path or a text stream, got {stream!r}")
                sinks.append(_Sink(getattr(stream, "name", repr(stream)), stream, False))
        except BaseException:
            for sink in sinks:
                if sink.owned:
                    sink.stream.close()
            raise
        if not isinstance(background, bool):
            raise UsageError("background", f"must be True or False, got {background!r}")
        self._writer = _LineWriter(sinks, self._write_failed, background)
        self._logger = structlog.wrap_logger(
            self._writer,
            processors=[
                structlog.contextvars.merge_contextvars,
                _Timestamper(clock, monotonic),
                _only_finite,
                _Deliver(self),
                structlog.processors.JSONRenderer(sort_keys=True),
            ],
            wrapper_class=structlog.BoundLogger,
            context_class=dict,
            cache_logger_on_first_use=False,
        ).bind(workflow_id=workflow_id, session_id=session_id)
        if thread_id is not None:
            self._logger = self._logger.bind(thread_id=thread_id)
        self.thread_id = thread_id

    @staticmethod
    def _open(field: str, path: Path) -> TextIO:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            return path.open("a", encoding="utf-8", buffering=1)
        except OSError as exc:
            raise UsageError(field, f"cannot open {str(path)!r} for appending: {exc}") from exc

    def _write_failed(self, sink: _Sink, exc: Exception) -> None:
        self.write_errors += 1
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"workflow log {self.workflow_id!r}: cannot write to {sink.name}: {exc}; "
                "further failures are only counted (WorkflowLog.write_errors)",
                RuntimeWarning,
                stacklevel=6,  # the caller of the public logging method
            )

    def _listener_failed(self, listener: Listener, exc: Exception) -> None:
        self.listener_errors += 1
        if not self._listener_warned:
            self._listener_warned = True
            warnings.warn(
                f"workflow log {self.workflow_id!r}: listener {listener!r} raised "
                f"{type(exc).__name__}: {exc}; further failures are only counted "
                "(WorkflowLog.listener_errors)",
                RuntimeWarning,
                stacklevel=2,
            )

    def add_listener(self, listener: Listener) -> None:
        """Deliver every record written from now on to ``listener`` too."""
        if not callable(listener):
            raise UsageError("listener", f"expected a callable, got {listener!r}")
        self._listeners.append(listener)

    # ------------------------------------------------------------------ events
    def _write(self, event: str, fields: Mapping[str, Any]) -> None:
        if self._closed:
            raise UsageError("workflow_log", f"log of {self.workflow_id!r} is closed")
        clash = ENVELOPE_FIELDS.intersection(fields)
        if clash:
            raise UsageError(sorted(clash)[0], "is written by the log itself; use another name")
        self._logger.info(event, **fields)

    def claim_event(self, ev: ClaimEvent | Mapping[str, Any], **extra: Any) -> None:
        """Log a contract event with all its fields (a dict must parse as a ``ClaimEvent``)."""
        if not isinstance(ev, ClaimEvent):
            if not isinstance(ev, Mapping):
                raise UsageError("ev", f"expected a ClaimEvent or a dict, got {ev!r}")
            ev = ClaimEvent.from_dict(ev)
        fields = ev.to_dict()
        del fields["event"]
        clash = set(fields).intersection(extra)
        if clash:
            raise UsageError(sorted(clash)[0], "is already a field of the claim event")
        self._write(ev.event.value, {**fields, **extra})

    def reaction(
        self,
        kind: ReactionKind | str,
        claim_id: str | None = None,
        request_id: str | None = None,
        outcome: str | None = None,
        **fields: Any,
    ) -> None:
        """Log the session's reaction to an outcome as ``reaction_<kind>``.

        Typical fields: defer ``delay_s``, ``attempt``; reroute ``from_backend``,
        ``to_backend``; relax ``from_mode``, ``to_mode``; refuse (a claim refused locally)
        ``mode``, ``lowering_class``, ``reason``; fail ``error``.
        """
        if kind not in REACTION_KINDS:
            raise UnknownNameError("kind", kind, REACTION_KINDS)
        if "delay_s" in fields:
            _check_seconds("delay_s", fields["delay_s"])
        self._write(
            f"reaction_{kind}",
            {"claim_id": claim_id, "request_id": request_id, "outcome": outcome, **fields},
        )

    def llm_call(
        self,
        node: str,
        request_id: str | None,
        backend: str,
        prompt_tokens: int,
        cached_tokens: int,
        recomputed_tokens: int,
        latency_s: float,
        step: int | None = None,
        ste: float | None = None,
        **fields: Any,
    ) -> None:
        """Log one LLM call: its node and relative step, prompt tokens served from the prefix
        cache (``cached_tokens``) and recomputed, its latency and the node's STE.
        A missing ``request_id`` (``None`` or ``""``) is written as ``null``."""
        if request_id is not None and not isinstance(request_id, str):
            raise UsageError("request_id", f"must be a string or None, got {request_id!r}")
        prompt = _check_count("prompt_tokens", prompt_tokens)
        for name, value in (
            ("cached_tokens", cached_tokens),
            ("recomputed_tokens", recomputed_tokens),
        ):
            if _check_count(name, value) > prompt:
                raise UsageError(name, f"{value} exceeds prompt_tokens {prompt}")
        self._write(
            "llm_call",
            {
                "node": _check_name("node", node),
                "request_id": request_id or None,
                "backend": _check_name("backend", backend),
                "prompt_tokens": prompt,
                "cached_tokens": cached_tokens,
                "recomputed_tokens": recomputed_tokens,
                "latency_s": _check_seconds("latency_s", latency_s),
                "step": None if step is None else _check_count("step", step),
                "ste": ste,
                **fields,
            },
        )

    def tool_call(
        self,
        tool: str,
        duration_s: float,
        predicted_s: float | None = None,
        ttl_s: float | None = None,
        claim_ids: Sequence[str] = (),
        **fields: Any,
    ) -> None:
        """Log one tool call: its real and predicted duration and the claims held across it."""
        if isinstance(claim_ids, str):
            raise UsageError("claim_ids", "expected a sequence of claim ids, got a string")
        self._write(
            "tool_call",
            {
                "tool": _check_name("tool", tool),
                "duration_s": _check_seconds("duration_s", duration_s),
                "predicted_s": _check_seconds("predicted_s", predicted_s, optional=True),
                "ttl_s": _check_seconds("ttl_s", ttl_s, optional=True),
                "claim_ids": list(claim_ids),
                **fields,
            },
        )

    def claim_planned(
        self,
        claim_id: str | None,
        prefix_id: str,
        mode: ProtectionMode | str | None,
        ttl_s: float | None = None,
        ste: float | None = None,
        reuse_probability: float | None = None,
        reason: str = "",
        **fields: Any,
    ) -> None:
        """Log the planner's decision for a prefix (``mode=None``: no claim)."""
        if reuse_probability is not None and not 0.0 <= reuse_probability <= 1.0:
            raise UsageError("reuse_probability", f"must be within 0..1, got {reuse_probability!r}")
        self._write(
            "claim_planned",
            {
                "claim_id": claim_id,
                "prefix_id": _check_name("prefix_id", prefix_id),
                "mode": None if mode is None else parse_mode(mode, "mode").value,
                "ttl_s": _check_seconds("ttl_s", ttl_s, optional=True),
                "ste": ste,
                "reuse_probability": reuse_probability,
                "reason": reason,
                **fields,
            },
        )

    def claim_ended(
        self,
        claim_id: str,
        node: str,
        prefix_id: str,
        mode: str | None,
        state: str,
        reason: str,
        held_s: float,
        **fields: Any,
    ) -> None:
        """Log that the session let a claim go: why (``superseded``, ``session_end``, ...),
        the state the backend reported at release, and how long it was held."""
        self._write(
            "claim_ended",
            {
                "claim_id": _check_name("claim_id", claim_id),
                "node": node,
                "prefix_id": prefix_id,
                "mode": mode,
                "state": state,
                "reason": _check_name("reason", reason),
                "held_s": _check_seconds("held_s", held_s),
                **fields,
            },
        )

    def session(
        self, event: Literal["session_started", "session_ended"] | str, **fields: Any
    ) -> None:
        """Log the start or the end of the workflow's claimed session."""
        if event not in SESSION_EVENTS:
            raise UnknownNameError("event", event, SESSION_EVENTS)
        self._write(event, fields)

    # ------------------------------------------------------------------ lifetime
    @property
    def closed(self) -> bool:
        return self._closed

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every line logged so far is written (at once unless ``background``);
        ``False`` if ``timeout`` seconds passed first. Call it from a thread to keep an event
        loop going: ``await asyncio.to_thread(log.flush)``."""
        return _BACKGROUND.drain(timeout) if self._writer.background else True

    def close(self) -> None:
        """Close the files this log opened (streams given as objects stay open), after every
        line logged before is written. Idempotent."""
        self.flush()
        with _WRITE_LOCK:
            if self._closed:
                return
            self._closed = True
            for sink in self._writer.sinks:
                if sink.owned:
                    try:
                        sink.stream.close()
                    except OSError as exc:
                        self._write_failed(sink, exc)

    def __enter__(self) -> WorkflowLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
