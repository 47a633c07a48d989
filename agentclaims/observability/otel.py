"""OpenTelemetry traces of a claimed session, built from its outcome log's records.

``SessionTracer`` is a ``WorkflowLog`` listener: every record the session writes (docs/logs.md)
arrives here as it is written, and becomes a span, a span event or an attribute:

- the session is a span (``agentclaims.session``, from ``session_started`` to
  ``session_ended``), a child of whatever span was current when the session was entered;
- each LLM call is a ``chat <model>`` span (client kind, GenAI semantic-convention attributes
  plus ``agentclaims.*``), placed at its true extent: it ends at its ``llm_call`` record and
  starts ``latency_s`` before; deferrals, reroutes and failovers met during the call are its
  events;
- each claim is a ``claim <mode>`` span from its ``claim_planned`` record to its end: the
  later of ``claim_ended`` and the terminal contract event (``resident_claim_expired``,
  ``_rejected``, ``_demoted``, ``_harmed``) that closes it; its contract events and reactions
  are its events, harm sets ``agentclaims.claim.harmed`` and an error status;
- each tool call is an ``execute_tool <tool>`` span (``duration_s`` before its ``tool_call``
  record), with the reactions of the session's tool holds as events;
- any other record is an event of the session span.

Spans left open when the session ends are ended with it (a claim never ended by the session
gets ``agentclaims.claim.open_at_session_end``). Only the OpenTelemetry API is used: the
application's SDK and exporter decide where spans go. This module imports ``opentelemetry``;
the session imports it only when tracing is on (``ClaimedSession(tracing=...)``).
"""

from __future__ import annotations

import calendar
import contextlib
import contextvars
import json
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import metadata
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.util.types import AttributeValue

__all__ = ["PROVIDER_NAME", "SESSION_SPAN", "SessionTracer", "provider_is_configured"]

SESSION_SPAN: Final = "agentclaims.session"
"""The name of a session's span."""
PROVIDER_NAME: Final = "agentclaims"
"""``gen_ai.provider.name`` (and ``gen_ai.system``) of the LLM call spans."""

_ENVELOPE: Final = frozenset(
    {"event", "session_id", "thread_id", "timestamp", "ts_ns", "workflow_id"}
)
_CALL_REACTIONS: Final = frozenset(
    {"reaction_defer", "reaction_reroute", "reaction_failover", "reaction_fail"}
)
"""Reactions that, without a claim or a tool, happen while an LLM call is in flight."""
_TERMINAL: Final = {
    "resident_claim_rejected": "refused",
    "resident_claim_demoted": "demoted",
    "resident_claim_expired": "expired",
    "resident_claim_harmed": "harmed",
}
"""Contract events that end a claim's lifecycle, and the state each leaves it in."""
_STATES: Final = {
    "resident_claim_submitted": "submitted",
    "resident_claim_accepted": "accepted",
    "resident_claim_materialized": "materialized",
    **_TERMINAL,
}


def provider_is_configured() -> bool:
    """Whether the application set a global tracer provider (not OpenTelemetry's default
    proxy or no-op one)."""
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def _version() -> str:
    try:
        return metadata.version("agentclaims")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "0"


def _wall_ns(record: Mapping[str, Any]) -> int:
    """The record's wall-clock time (its ``timestamp``) in ns since the epoch."""
    stamp = record.get("timestamp")
    if isinstance(stamp, str):
        try:
            when = datetime.fromisoformat(stamp)
        except ValueError:
            pass
        else:
            seconds = calendar.timegm(when.utctimetuple())
            return (seconds * 1_000_000 + when.microsecond) * 1_000
    return time.time_ns()


def _seconds_ns(value: object) -> int:
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return int(value * 1e9)
    return 0


def _value(value: object) -> AttributeValue | None:
    """``value`` as an attribute value: a scalar or a homogeneous list as it is, ``None``
    left out, anything else (a dict, a mixed list) as JSON."""
    if value is None:
        return None
    if isinstance(value, bool | str | int | float):
        return value
    if isinstance(value, list | tuple):
        items = list(value)
        for kind in (bool, str):
            if all(isinstance(v, kind) for v in items):
                return items
        if all(isinstance(v, int) and not isinstance(v, bool) for v in items):
            return items
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in items):
            return [float(v) for v in items]
    return json.dumps(value, sort_keys=True, default=str)


def _attributes(pairs: Mapping[str, object]) -> dict[str, AttributeValue]:
    out: dict[str, AttributeValue] = {}
    for key, raw in pairs.items():
        value = _value(raw)
        if value is not None:
            out[key] = value
    return out


def _fields(record: Mapping[str, Any]) -> dict[str, AttributeValue]:
    """A record's own fields (not its envelope), as span event attributes."""
    return _attributes({k: v for k, v in record.items() if k not in _ENVELOPE})


@dataclass(slots=True)
class _Claim:
    span: Span
    state: str = "planned"
    closed_by_event: bool = False
    """A terminal contract event was seen: ``claim_ended`` ends the span."""
    ended_ns: int | None = None
    """When the session let the claim go (``claim_ended``), if it has."""


class SessionTracer:
    """Builds one session's spans from its outcome-log records: pass it as a ``WorkflowLog``
    listener (``WorkflowLog(..., listeners=[tracer])``).

    ``tracer_provider``: where the spans go (default: the global provider). ``parent``: the
    context the session span is a child of (default: the current one when the first record
    arrives). Never raises into the session for a record it cannot read: unknown events
    become session span events.
    """

    def __init__(
        self, tracer_provider: TracerProvider | None = None, *, parent: Context | None = None
    ) -> None:
        provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        self._tracer = provider.get_tracer("agentclaims", _version())
        self._parent = parent
        self._lock = threading.RLock()
        self._session: Span | None = None
        self._context: Context | None = None
        self._thread_id: str | None = None
        self._claims: dict[str, _Claim] = {}
        self._pending_calls: list[dict[str, Any]] = []
        """Call reactions not yet placed on their LLM call's span."""
        self._pending_tools: list[dict[str, Any]] = []
        """Tool-hold reactions waiting for their tool call's span."""
        self._closed = False

    # ------------------------------------------------------------------ views
    @property
    def session_span(self) -> Span | None:
        """The session's span, once its first record arrived."""
        return self._session

    @property
    def open_claims(self) -> list[str]:
        """Ids of the claims whose span is still open."""
        return list(self._claims)

    # ------------------------------------------------------------------ the session's context
    def activate(self) -> contextvars.Token[Context] | None:
        """Make the session span the current span (spans the workflow starts nest in it);
        the token for ``deactivate``, or ``None`` before the session span exists."""
        if self._session is None:
            return None
        return otel_context.attach(trace.set_span_in_context(self._session))

    def record_exception(self, exc: BaseException) -> None:
        """The error the run ended with, as OpenTelemetry records one: an ``exception`` event
        on the session span (type, message, stack trace)."""
        with self._lock:
            if self._session is not None and not self._closed:
                self._session.record_exception(exc)

    @staticmethod
    def deactivate(token: contextvars.Token[Context] | None) -> None:
        """Undo ``activate``. A session ended in another context than the one it entered in
        (a stream closed from elsewhere) has nothing set there: nothing to undo (OpenTelemetry's
        ``detach`` would log an error for it)."""
        if token is not None:
            with contextlib.suppress(ValueError, RuntimeError):
                token.var.reset(token)

    # ------------------------------------------------------------------ records
    def __call__(self, record: dict[str, Any]) -> None:
        with self._lock:
            if self._closed:
                return
            event = str(record.get("event") or "")
            session = self._ensure_session(record)
            if event == "session_started":
                return
            if event == "session_ended":
                self._session_ended(session, record)
            elif event == "llm_call":
                self._llm_call(record)
            elif event == "tool_call":
                self._tool_call(record)
            elif event == "claim_planned":
                self._claim_planned(session, record)
            elif event == "claim_ended":
                self._claim_ended(session, record)
            elif event.startswith("reaction_"):
                self._reaction(session, record)
            else:
                self._contract_event(session, record)

    def close(self, end_ns: int | None = None) -> None:
        """End every span still open (claims first, then the session's); idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            end = time.time_ns() if end_ns is None else end_ns
            for claim in self._claims.values():
                if claim.ended_ns is None:
                    claim.span.set_attribute("agentclaims.claim.open_at_session_end", True)
                    claim.span.end(end_time=end)
                else:
                    claim.span.end(end_time=claim.ended_ns)
            self._claims.clear()
            if self._session is not None:
                for pending in (*self._pending_calls, *self._pending_tools):
                    self._event(self._session, pending)
                self._session.end(end_time=end)
            self._pending_calls.clear()
            self._pending_tools.clear()

    # ------------------------------------------------------------------ the session
    def _ensure_session(self, record: Mapping[str, Any]) -> Span:
        if self._session is not None:
            return self._session
        thread = record.get("thread_id")
        self._thread_id = thread if isinstance(thread, str) else None
        attributes = _attributes(
            {
                "agentclaims.workflow.id": record.get("workflow_id"),
                "agentclaims.session.id": record.get("session_id"),
                "agentclaims.thread.id": self._thread_id,
                "gen_ai.conversation.id": self._thread_id,
                "agentclaims.backend": record.get("backend"),
            }
        )
        parent = self._parent if self._parent is not None else otel_context.get_current()
        self._session = self._tracer.start_span(
            SESSION_SPAN,
            context=parent,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=_wall_ns(record),
        )
        self._context = trace.set_span_in_context(self._session, parent)
        return self._session

    def _session_ended(self, session: Span, record: Mapping[str, Any]) -> None:
        reason = record.get("reason")
        session.set_attributes(
            _attributes(
                {
                    "agentclaims.session.end_reason": reason,
                    "agentclaims.session.duration_s": record.get("duration_s"),
                    "agentclaims.session.llm_calls": record.get("llm_calls"),
                    "agentclaims.session.tool_calls": record.get("tool_calls"),
                    "agentclaims.session.claims_submitted": record.get("claims_submitted"),
                    "agentclaims.session.hit_ratio": record.get("hit_ratio"),
                    "error.type": record.get("error"),
                }
            )
        )
        if reason == "error":
            session.set_status(Status(StatusCode.ERROR, str(record.get("error") or "error")))
        self.close(_wall_ns(record))

    # ------------------------------------------------------------------ spans
    def _start(
        self,
        name: str,
        start_ns: int,
        attributes: Mapping[str, object],
        *,
        kind: SpanKind = SpanKind.INTERNAL,
        claim_ids: Sequence[object] = (),
    ) -> Span:
        links = [
            Link(self._claims[cid].span.get_span_context())
            for cid in claim_ids
            if isinstance(cid, str) and cid in self._claims
        ]
        return self._tracer.start_span(
            name,
            context=self._context,
            kind=kind,
            attributes=_attributes(attributes),
            links=links,
            start_time=start_ns,
        )

    @staticmethod
    def _event(span: Span, record: Mapping[str, Any]) -> None:
        span.add_event(str(record.get("event")), _fields(record), timestamp=_wall_ns(record))

    def _llm_call(self, record: dict[str, Any]) -> None:
        end = _wall_ns(record)
        start = end - _seconds_ns(record.get("latency_s"))
        node = record.get("node")
        model = record.get("model")
        claim_id = record.get("claim_id")
        claim = self._claims.get(claim_id) if isinstance(claim_id, str) else None
        # the state of the claim that held the prefix, as last reported before the call
        outcome = claim.state if claim is not None else "held" if claim_id else "unclaimed"
        span = self._start(
            f"chat {model}" if isinstance(model, str) and model else "chat",
            start,
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": PROVIDER_NAME,
                "gen_ai.system": PROVIDER_NAME,
                "gen_ai.request.model": model,
                "gen_ai.response.id": record.get("request_id"),
                "gen_ai.conversation.id": self._thread_id,
                "gen_ai.usage.input_tokens": record.get("prompt_tokens"),
                "gen_ai.usage.output_tokens": record.get("completion_tokens"),
                "gen_ai.usage.cache_read.input_tokens": record.get("cached_tokens"),
                "agentclaims.node": node,
                "agentclaims.step": record.get("step"),
                "agentclaims.ste": record.get("ste"),
                "agentclaims.backend": record.get("backend"),
                "agentclaims.instance": record.get("instance"),
                "agentclaims.cached_tokens": record.get("cached_tokens"),
                "agentclaims.recomputed_tokens": record.get("recomputed_tokens"),
                "agentclaims.latency_s": record.get("latency_s"),
                "agentclaims.deferred_s": record.get("deferred_s"),
                "agentclaims.after": record.get("after"),
                "agentclaims.claim.id": claim_id,
                "agentclaims.claim.outcome": outcome,
            },
            kind=SpanKind.CLIENT,
            claim_ids=[claim_id],
        )
        mine: list[dict[str, Any]] = []
        kept: list[dict[str, Any]] = []
        for pending in self._pending_calls:
            (mine if pending.get("node") == node else kept).append(pending)
        self._pending_calls = kept
        deferrals, deferral_s = 0, 0.0
        for pending in mine:
            if _wall_ns(pending) < start and self._session is not None:
                self._event(self._session, pending)  # a call before this one, which failed
                continue
            self._event(span, pending)
            if pending.get("event") == "reaction_defer":
                deferrals += 1
                deferral_s += float(pending.get("delay_s") or 0.0)
            elif pending.get("event") in ("reaction_reroute", "reaction_failover"):
                span.set_attribute("agentclaims.rerouted", True)
        span.set_attribute("agentclaims.deferrals", deferrals)
        if deferrals:
            span.set_attribute("agentclaims.deferral_s", round(deferral_s, 6))
        span.end(end_time=end)
        if claim is not None:
            self._event(claim.span, record)

    def _tool_call(self, record: dict[str, Any]) -> None:
        end = _wall_ns(record)
        tool, node = record.get("tool"), record.get("node")
        claim_ids = record.get("claim_ids") or []
        error = record.get("error")
        span = self._start(
            f"execute_tool {tool}",
            end - _seconds_ns(record.get("duration_s")),
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": tool,
                "agentclaims.node": node,
                "agentclaims.tool.duration_s": record.get("duration_s"),
                "agentclaims.tool.predicted_s": record.get("predicted_s"),
                "agentclaims.claim.ttl_s": record.get("ttl_s"),
                "agentclaims.claim.ids": list(claim_ids),
                "error.type": error,
            },
            claim_ids=claim_ids,
        )
        mine: list[dict[str, Any]] = []
        kept: list[dict[str, Any]] = []
        for pending in self._pending_tools:
            same = pending.get("tool") == tool and pending.get("node") in (node, None)
            (mine if same else kept).append(pending)
        self._pending_tools = kept
        deferrals = 0
        for pending in mine:
            self._event(span, pending)
            deferrals += pending.get("event") == "reaction_defer"
        span.set_attribute("agentclaims.deferrals", deferrals)
        if error:
            span.set_status(Status(StatusCode.ERROR, str(error)))
        span.end(end_time=end)
        for cid in claim_ids:
            claim = self._claims.get(cid) if isinstance(cid, str) else None
            if claim is not None:
                self._event(claim.span, record)

    # ------------------------------------------------------------------ claims
    def _claim_planned(self, session: Span, record: dict[str, Any]) -> None:
        claim_id = record.get("claim_id")
        if not isinstance(claim_id, str) or not claim_id or claim_id in self._claims:
            self._event(session, record)
            return
        mode = record.get("mode")
        span = self._start(
            f"claim {mode}" if mode else "claim",
            _wall_ns(record),
            {
                "agentclaims.claim.id": claim_id,
                "agentclaims.claim.mode": mode,
                "agentclaims.claim.ttl_s": record.get("ttl_s"),
                "agentclaims.claim.ste": record.get("ste"),
                "agentclaims.claim.reuse_probability": record.get("reuse_probability"),
                "agentclaims.claim.expected_wait_s": record.get("expected_wait_s"),
                "agentclaims.claim.wait_learned": record.get("wait_learned"),
                "agentclaims.claim.reason": record.get("reason") or None,
                "agentclaims.claim.harmed": False,
                "agentclaims.node": record.get("node"),
                "agentclaims.prefix_id": record.get("prefix_id"),
            },
        )
        self._claims[claim_id] = _Claim(span)

    def _claim_ended(self, session: Span, record: dict[str, Any]) -> None:
        claim_id = record.get("claim_id")
        claim = self._claims.get(claim_id) if isinstance(claim_id, str) else None
        if claim is None:
            self._event(session, record)
            return
        at = _wall_ns(record)
        claim.span.set_attributes(
            _attributes(
                {
                    "agentclaims.claim.end_reason": record.get("reason"),
                    "agentclaims.claim.held_s": record.get("held_s"),
                    "agentclaims.claim.state": record.get("state"),
                    "agentclaims.claim.harm_cause": record.get("cause"),
                }
            )
        )
        self._event(claim.span, record)
        claim.ended_ns = at
        if claim.closed_by_event:
            self._end_claim(str(claim_id), at)

    def _contract_event(self, session: Span, record: dict[str, Any]) -> None:
        claim_id = record.get("claim_id")
        claim = self._claims.get(claim_id) if isinstance(claim_id, str) else None
        if claim is None:
            self._event(session, record)
            return
        span, event, at = claim.span, str(record.get("event")), _wall_ns(record)
        self._event(span, record)
        state = _STATES.get(event)
        if state is None:
            return
        claim.state = state
        span.set_attribute("agentclaims.claim.state", state)
        if event == "resident_claim_accepted":
            span.set_attribute("agentclaims.claim.outcome", str(record.get("decision") or state))
        elif event == "resident_claim_rejected":
            span.set_attribute("agentclaims.claim.outcome", "refused")
            reason = record.get("reason")
            if reason:
                span.set_attribute("agentclaims.claim.refusal_reason", str(reason))
        elif event == "resident_claim_materialized":
            span.set_attribute("agentclaims.claim.materialized", True)
        elif event == "resident_claim_harmed":
            cause = str(record.get("cause") or record.get("reason") or "harmed")
            span.set_attribute("agentclaims.claim.harmed", True)
            span.set_attribute("agentclaims.claim.harm_cause", cause)
            span.set_status(Status(StatusCode.ERROR, f"harmed: {cause}"))
        if event in _TERMINAL:
            claim.closed_by_event = True
            if event == "resident_claim_rejected" or claim.ended_ns is not None:
                self._end_claim(str(claim_id), at)

    def _end_claim(self, claim_id: str, at: int) -> None:
        claim = self._claims.pop(claim_id)
        claim.span.end(end_time=max(at, claim.ended_ns or at))

    # ------------------------------------------------------------------ reactions
    def _reaction(self, session: Span, record: dict[str, Any]) -> None:
        if record.get("tool"):
            self._pending_tools.append(record)
            return
        claim_id = record.get("claim_id")
        claim = self._claims.get(claim_id) if isinstance(claim_id, str) else None
        if claim is not None:
            self._event(claim.span, record)
            ttl = record.get("ttl_s")
            if record.get("event") == "reaction_renew" and isinstance(ttl, int | float):
                claim.span.set_attribute("agentclaims.claim.ttl_s", float(ttl))
            return
        if record.get("event") in _CALL_REACTIONS and not claim_id:
            self._pending_calls.append(record)
            return
        self._event(session, record)
