"""Outcome logs: one JSON line per claim event, reaction, LLM call and tool call, per workflow,
and the summary ``agentclaims report`` prints from them. ``agentclaims.observability.otel``
(the ``otel`` extra; not imported here) turns a session's records into OpenTelemetry spans."""

from agentclaims.observability.log import (
    ENVELOPE_FIELDS,
    REACTION_KINDS,
    SESSION_EVENTS,
    Listener,
    ReactionKind,
    WorkflowLog,
)
from agentclaims.observability.report import iter_log_files, summarise

__all__ = [
    "ENVELOPE_FIELDS",
    "REACTION_KINDS",
    "SESSION_EVENTS",
    "Listener",
    "ReactionKind",
    "WorkflowLog",
    "iter_log_files",
    "summarise",
]
