"""The error codec of the claims protocol, both ways.

A server turns exceptions and refusals into HTTP errors (``exception_error``,
``refusal_error``); a client turns them back (``raise_for_error``, ``outcome_from_error``).
Every error body is ``{"error": {"type": ..., "message": ..., <fields>}}``; a refusal or
deferral carries the typed ``ActiveOutcome`` under ``outcome``. docs/gateway.md lists them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NoReturn

from agentclaims.errors import (
    AgentClaimsError,
    BackendError,
    BackendUnavailable,
    ContractViolation,
    Forbidden,
    IllegalTransition,
    OperationNotExposed,
    ScopeViolation,
    ServiceUnavailable,
    Unauthorized,
    UnknownClaim,
    UsageError,
)
from agentclaims.protocol.types import ActiveOutcome

__all__ = [
    "ACTIVE_REQUEST_DEFERRED",
    "ACTIVE_REQUEST_REFUSED",
    "error_body",
    "exception_error",
    "outcome_from_error",
    "raise_for_error",
    "refusal_error",
]

ACTIVE_REQUEST_REFUSED = "active_request_refused"
ACTIVE_REQUEST_DEFERRED = "active_request_deferred"
_REFUSALS = (ACTIVE_REQUEST_REFUSED, ACTIVE_REQUEST_DEFERRED)


def error_body(error_type: str, message: str, **fields: Any) -> dict[str, Any]:
    return {"error": {"type": error_type, "message": message, **fields}}


def exception_error(exc: AgentClaimsError) -> tuple[int, dict[str, Any]]:
    """HTTP status and body for an exception raised while serving a request."""
    if isinstance(exc, UsageError):
        # the message names the field: a client that shows only the message (the OpenAI
        # client's exception text) still says what was wrong; ``param`` is OpenAI's name for it
        message = f"{exc.field}: {exc.message}"
        return 400, error_body("usage_error", message, field=exc.field, param=exc.field)
    if isinstance(exc, ScopeViolation):
        return 403, error_body(
            "scope_violation", str(exc), claim_id=exc.claim_id, owner_scope=exc.owner_scope
        )
    if isinstance(exc, UnknownClaim):
        return 404, error_body("unknown_claim", str(exc), claim_id=exc.claim_id)
    if isinstance(exc, IllegalTransition):
        return 409, error_body(
            "illegal_transition",
            str(exc),
            claim_id=exc.claim_id,
            current=exc.current,
            target=exc.target,
        )
    if isinstance(exc, ContractViolation):
        return 409, error_body("contract_violation", str(exc))
    if isinstance(exc, OperationNotExposed):
        return 501, error_body("not_exposed", str(exc), operation=exc.operation)
    if isinstance(exc, Unauthorized):
        return 401, error_body("unauthorized", str(exc))
    if isinstance(exc, Forbidden):
        return 403, error_body("forbidden", str(exc))
    if isinstance(exc, BackendUnavailable):  # the gateway's own (shutting down, no ledger)
        return 503, error_body("unavailable", str(exc))  # or the engine behind it unreachable
    return 500, error_body("internal_error", str(exc))


def refusal_error(
    outcome: ActiveOutcome, prefix_ids: Mapping[str, Any], *, router_safe: bool = False
) -> tuple[int, dict[str, str], dict[str, Any]]:
    """Status, headers and body for an active request the arbiter did not serve: 503 with
    ``Retry-After`` when deferred (it will fit later), 409 when refused or over capacity.
    ``router_safe``: a deferral is a 409 too (same body and retry hint), since a router in
    front retries a 503 on the same worker and then counts it as the worker failing."""
    kind = ACTIVE_REQUEST_DEFERRED if outcome.deferred else ACTIVE_REQUEST_REFUSED
    body = error_body(
        kind,
        outcome.describe(),
        action=outcome.action.value,
        feasibility=outcome.feasibility.value,
        blocking_claim_ids=list(outcome.blocking_claim_ids),
        shortfall_blocks=outcome.shortfall_blocks,
        retry_after_s=outcome.retry_after_s,
        request_id=outcome.request_id,
        outcome=outcome.to_dict(),
        prefix_ids=dict(prefix_ids),
    )
    if not outcome.deferred:
        return 409, {}, body
    headers = {"Retry-After": "1"}
    if outcome.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(outcome.retry_after_s)))
        headers["retry-after-ms"] = str(max(1, round(outcome.retry_after_s * 1000)))
    return 409 if router_safe else 503, headers, body


def outcome_from_error(body: object) -> ActiveOutcome | None:
    """The arbiter's outcome in a refusal's error body (whole body or its ``error`` object, as
    ``openai.APIStatusError.body`` holds it); ``None`` for any other error or a body that does
    not parse (fail closed: an unreadable refusal is not taken for an answer)."""
    if isinstance(body, Mapping) and isinstance(body.get("error"), Mapping):
        body = body["error"]
    if not isinstance(body, Mapping) or body.get("type") not in _REFUSALS:
        return None
    try:
        return ActiveOutcome.from_dict(body.get("outcome"))
    except UsageError:
        return None


def raise_for_error(status: int, body: object) -> NoReturn:
    """Raise the exception an error response stands for (the inverse of ``exception_error``)."""
    err = body.get("error") if isinstance(body, Mapping) else None
    if not isinstance(err, Mapping):
        raise BackendError(f"HTTP {status} without an agentclaims error body: {body!r}")
    kind, message = err.get("type"), str(err.get("message", ""))
    if kind == "usage_error":
        field = str(err.get("field", "?"))
        raise UsageError(field, message.removeprefix(f"{field}: "))
    if kind == "scope_violation":
        raise ScopeViolation(str(err.get("claim_id")), str(err.get("owner_scope")))
    if kind == "unknown_claim":
        raise UnknownClaim(str(err.get("claim_id")))
    if kind == "illegal_transition":
        raise IllegalTransition(
            str(err.get("claim_id")), str(err.get("current")), str(err.get("target"))
        )
    if kind == "contract_violation":
        raise ContractViolation(message)
    if kind == "not_exposed":
        raise OperationNotExposed(str(err.get("backend", "gateway")), str(err.get("operation")))
    if kind == "unauthorized":
        raise Unauthorized(message)
    if kind == "forbidden":
        raise Forbidden(message)
    if kind == "unavailable":
        raise ServiceUnavailable(message)
    raise BackendError(f"HTTP {status} {kind}: {message}")
