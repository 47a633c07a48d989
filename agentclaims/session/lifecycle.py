"""``SessionLifecycle``: a session entered and ended, once.

Entering takes the pool's admission, opens the outcome log and the tracing (when asked for),
and makes the session the current one (``current_session``: a context variable, task-local).
Ending, also on an exception or a cancellation, releases every claim (shielded), logs
``session_ended`` with how the run ended, and closes the log and the trace.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import Iterator
from contextvars import ContextVar, Token
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentclaims.errors import (
    BackendUnavailable,
    ClaimHarmed,
    ClaimOutcomeError,
    UnknownNameError,
    UsageError,
)

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import TracerProvider

    from agentclaims.session.options import CheckedOptions, LogStream
    from agentclaims.session.state import SessionState

__all__ = ["END_REASONS", "SessionLifecycle", "current"]

END_REASONS = ("completed", "error", "cancelled", "closed")
"""How a session's run ended (``ClaimedSession.end_reason``, ``session_ended.reason``)."""

_current: ContextVar[Any] = ContextVar("agentclaims_session", default=None)
"""The session of the running workflow (``agentclaims.current_session``), task-local."""


def current() -> Any:
    """The session the running workflow entered or activated, if any."""
    return _current.get()


class SessionLifecycle:
    """How ``session`` is entered and ended; what ending releases."""

    def __init__(self, session: SessionState, options: CheckedOptions, face: object) -> None:
        self._s = session
        self._face = face
        """What ``current_session()`` returns while the run is current (the facade)."""
        self.log_dir: Path | None = options.log_dir
        self._log_stream: LogStream | None = options.log_stream
        self._tracing = options.tracing
        self._tracer_provider: TracerProvider | None = options.tracer_provider
        self._trace_token: Token[Context] | None = None
        self._token: Any = None
        self._started = 0.0
        self._closed = False
        self._ending: str | None = None

    @property
    def entered(self) -> bool:
        """Entered and not ended yet."""
        return self._token is not None and not self._closed

    async def enter(self) -> None:
        """Admission, then the outcome log and tracing; the session becomes the current one."""
        s = self._s
        if self._token is not None or self._closed:
            raise UsageError("session", "a ClaimedSession can be entered once")
        _take_workflow_id(s.workflow_id)
        try:
            await s.route.admit()  # a pool with an admission window may make it wait
        except BaseException:
            _free_workflow_id(s.workflow_id)
            raise
        try:
            if self._tracing_on():
                from agentclaims.observability.otel import SessionTracer

                s.tracer = SessionTracer(self._tracer_provider)
            if self.log_dir is not None or self._log_stream is not None or s.tracer is not None:
                from agentclaims.observability import WorkflowLog

                s.log = WorkflowLog(
                    s.workflow_id,
                    s.session_id,
                    directory=self.log_dir,
                    stream=self._log_stream,
                    thread_id=s.thread_id,
                    listeners=() if s.tracer is None else (s.tracer,),
                    background=True,  # log writes never block the agents' loop
                )
            self._started = s.clock()
        except BaseException as exc:
            if s.log is not None:
                s.log.close()
                s.log = None
            s.tracer = None
            s.route.leave()  # not entered after all: its slot goes to the next one
            _free_workflow_id(s.workflow_id)
            if isinstance(exc, UsageError) and exc.field in _SINK_OPTIONS:
                raise UsageError(_SINK_OPTIONS[exc.field], exc.message) from exc
            raise
        s.loop = asyncio.get_running_loop()
        self._token = _current.set(self._face)
        self._log_session("session_started", backend=s.backend.name)
        if s.tracer is not None:  # spans the workflow starts nest in the session's
            self._trace_token = s.tracer.activate()

    def _tracing_on(self) -> bool:
        """Whether this run is traced: ``tracing`` as given, or (``None``) when a tracer
        provider was given or the application set a global one. Nothing is imported to find
        out: without ``opentelemetry.trace`` loaded, no provider can have been set."""
        if self._tracing is not None:
            return self._tracing
        if self._tracer_provider is not None:
            return True
        if "opentelemetry.trace" not in sys.modules:
            return False
        from agentclaims.observability.otel import provider_is_configured

        return provider_is_configured()

    def ending(self, reason: str) -> None:
        """Why the run is about to end (``ClaimedSession.ending``)."""
        if reason not in END_REASONS:
            raise UnknownNameError("reason", reason, END_REASONS)
        self._ending = reason

    async def exit(self, exc: BaseException | None) -> None:
        """End the run (once): release every claim, log ``session_ended``, close the log and
        the trace; a claim error raised below the OpenAI client is raised unwrapped."""
        s = self._s
        if self._closed:
            return  # ended once already
        self._closed = True
        if exc is None:
            reason = "completed"
        elif isinstance(exc, GeneratorExit):
            reason = "closed"
        elif isinstance(exc, asyncio.CancelledError):
            reason = self._ending or "cancelled"
        else:
            reason = self._ending if self._ending == "closed" else "error"
        s.end_reason = reason
        if reason == "completed":
            s.workflow.finish()  # what the graph learns from a whole run
        try:
            # release even when the workflow was cancelled: shield the cleanup
            await asyncio.shield(self.release_all())
        finally:
            with contextlib.suppress(ValueError):
                # a stream closed later runs this in another context (the token is not its
                # own there): nothing is set in that context, so nothing needs resetting
                _current.reset(self._token)
            s.route.leave()  # its affinity no longer counts as load
            if self._token is not None:  # entered: the id is this session's to free
                _free_workflow_id(s.workflow_id)
            if s.workflow.share is not None:  # its holds and its admission slot go
                s.workflow.share.leave(s.session_id)
            if s.tracer is not None and exc is not None and reason == "error":
                s.tracer.record_exception(exc)
            self._log_session(
                "session_ended",
                reason=reason,
                duration_s=round(s.clock() - self._started, 6),
                error=None if exc is None or reason == "closed" else type(exc).__name__,
                hit_ratio=round(s.stats.hit_ratio, 6),
                llm_calls=s.stats.llm_calls,
                tool_calls=s.stats.tool_calls,
                claims_submitted=s.stats.claims_submitted,
            )
            if s.tracer is not None:
                s.tracer.close()  # ended with session_ended already; anything left now
                s.tracer.deactivate(self._trace_token)
                self._trace_token = None
            if s.log is not None:
                # closing writes the log's lines first, waiting on the log thread (behind every
                # session's lines): in a thread, not on the loop; a cancellation here leaves it
                # to finish there
                await asyncio.shield(asyncio.to_thread(s.log.close))
        cause = _claim_error_in(exc)
        if cause is not None and cause is not exc:
            raise cause from exc

    async def release_all(self, reason: str = "session_end") -> None:
        """Release every claim (``ClaimedSession.release_all``)."""
        s, io = self._s, self._s.io
        harmed: ClaimHarmed | None = None
        try:
            await s.tools.cancel_deferrals()
            await s.calls.settle()
        finally:
            # with claims to let go where their releases' answers bring the events (the
            # releases' own too), no poll before them; with none held since the last complete
            # read, nothing is left to hear
            releasing = bool(io.held or io.releasing)
            backends = s.route.backends()
            try:
                if releasing:
                    poll = None in [await io.release_with_events(b) for b in backends]
                else:
                    poll = not io.events.quiet()
                taken = await io.events.take(backends, poll=poll)
                await s.outcomes.react(taken, lapses=False)
            except ClaimHarmed as exc:
                harmed = exc
            except BackendUnavailable:
                pass  # a backend gone away tells no events; its claims are still let go below
            finally:
                ends = [(claim, reason) for claim in io.held.values()]
                io.held.clear()
                waiting, io.releasing = io.releasing, []
                # no call of this session will carry them now
                ends += [(claim, claim.end_reason or reason) for claim in waiting]
                # asked for at once: a backend sends them in one or two requests, not one each
                # (``ReleaseQueue``); each still logs its own end, in this order
                results = await asyncio.gather(
                    *(io.release(s.route.named(c.backend), c, why) for c, why in ends),
                    return_exceptions=True,
                )
                for result in results:
                    if isinstance(result, BaseException):
                        raise result
                if releasing:  # what they bring, polled only where a release brought nothing
                    try:
                        taken = await io.events.take(backends)
                        await s.outcomes.react(taken, lapses=False)
                    except ClaimHarmed as exc:
                        harmed = harmed or exc
                    except BackendUnavailable:
                        pass
        if harmed is not None:
            raise harmed

    @contextlib.contextmanager
    def activated(self) -> Iterator[None]:
        """The session current inside the block (``ClaimedSession.activated``)."""
        if not self.entered:
            raise UsageError("session", "only an entered session that has not ended is activated")
        token = _current.set(self._face)
        tracer = self._s.tracer
        # the session span is the current span inside too: spans started in the node or the
        # tool (by the application or an instrumentation) nest in it, as under claimed_session
        traced = None if tracer is None else tracer.activate()
        try:
            yield
        finally:
            if tracer is not None:
                tracer.deactivate(traced)
            _current.reset(token)

    def _log_session(self, event: str, **fields: Any) -> None:
        if self._s.log is not None:
            self._s.log.session(event, **fields)


_running: set[str] = set()
"""The workflow ids of the sessions entered and not ended in this process."""
_running_lock = threading.Lock()
_SINK_OPTIONS = {"directory": "log_dir", "stream": "log_stream"}
"""``WorkflowLog``'s name of a sink that cannot be opened -> the session's option."""


def _take_workflow_id(workflow_id: str) -> None:
    """Take ``workflow_id`` for a session entering; ``UsageError`` while another running
    session of this process has it (their log lines, log file and owner scope would mix)."""
    with _running_lock:
        if workflow_id in _running:
            raise UsageError(
                "workflow_id",
                f"{workflow_id!r} names a session that is still running in this process: give "
                "each run at once its own workflow_id (or leave it out for a fresh one)",
            )
        _running.add(workflow_id)


def _free_workflow_id(workflow_id: str) -> None:
    with _running_lock:
        _running.discard(workflow_id)


def _claim_error_in(exc: BaseException | None) -> ClaimOutcomeError | BackendUnavailable | None:
    """A ClaimOutcomeError or BackendUnavailable raised below the OpenAI client arrives
    wrapped: find it."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, ClaimOutcomeError | BackendUnavailable):
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None
