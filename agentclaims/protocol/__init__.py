"""The claims protocol: one async boundary, its wire types, the extension key, the error codec.

Defined once, beside the contract; every backend speaks it (see ``api``). Nothing here does
I/O or imports a server, an engine or a client library.
"""

from agentclaims.protocol.api import (
    EXTENSION_KEY,
    INSTANCE_HEADER,
    INSTANCE_URL_HEADER,
    ROUTER_SAFE_HEADER,
    ActiveServing,
    ClaimsProtocol,
    InstanceControl,
    Tokenizer,
    collect_events,
    supports,
)
from agentclaims.protocol.codec import (
    ACTIVE_REQUEST_DEFERRED,
    ACTIVE_REQUEST_REFUSED,
    error_body,
    exception_error,
    outcome_from_error,
    raise_for_error,
    refusal_error,
)
from agentclaims.protocol.types import (
    PROMPT_OBJECT,
    RANKS_BY_HINTS,
    RENEW_AS_IS,
    SEQUENCE_OBJECT,
    SERVED_ACTIONS,
    ActiveOutcome,
    ActiveRequest,
    ClaimDecision,
    ClaimView,
    Descriptor,
    EventPage,
    Renewal,
    ServeResult,
    ranks_by_hints,
    stated_class,
)

__all__ = [
    "ACTIVE_REQUEST_DEFERRED",
    "ACTIVE_REQUEST_REFUSED",
    "EXTENSION_KEY",
    "INSTANCE_HEADER",
    "INSTANCE_URL_HEADER",
    "PROMPT_OBJECT",
    "RANKS_BY_HINTS",
    "RENEW_AS_IS",
    "ROUTER_SAFE_HEADER",
    "SEQUENCE_OBJECT",
    "SERVED_ACTIONS",
    "ActiveOutcome",
    "ActiveRequest",
    "ActiveServing",
    "ClaimDecision",
    "ClaimView",
    "ClaimsProtocol",
    "Descriptor",
    "EventPage",
    "InstanceControl",
    "Renewal",
    "ServeResult",
    "Tokenizer",
    "collect_events",
    "error_body",
    "exception_error",
    "outcome_from_error",
    "raise_for_error",
    "ranks_by_hints",
    "refusal_error",
    "stated_class",
    "supports",
]
