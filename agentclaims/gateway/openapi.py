"""``GET /openapi.json``: the OpenAPI 3.1 document of every gateway route.

Request and response bodies are the wire types' JSON Schemas (``contract.wire.json_schema``:
the same annotations the codec reads), so the document says exactly what the gateway accepts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentclaims.contract import CacheIdentity, ClaimSpec
from agentclaims.contract.wire import json_schema
from agentclaims.protocol import (
    ActiveRequest,
    ClaimDecision,
    ClaimView,
    EventPage,
    ServeResult,
)

__all__ = ["openapi"]

_SUMMARIES = {
    "POST /v1/chat/completions": "OpenAI chat completion; the agentclaims object names the session and its claims; stream: true answers server-sent events",
    "POST /v1/completions": "OpenAI text completion (a string or token ids), with claims; stream: true answers server-sent events",
    "POST /v1/messages": "Anthropic Messages API; cache_control breakpoints become expiring claims on the prompt; stream: true answers its server-sent events",
    "POST /v1/responses": "OpenAI Responses API (function tools, prompt_cache_key as a claim), nothing stored; stream: true answers its server-sent events",
    "POST /v1/claims": "Submit a residency claim on a known prefix (or on the given block hashes)",
    "GET /v1/claims/{claim_id}": "The owner's view of a claim",
    "DELETE /v1/claims/{claim_id}": "Release a claim",
    "POST /v1/claims/{claim_id}/renew": "Renew a claim (new duration_steps and/or ttl_s)",
    "POST /v1/claims/{claim_id}/release": "Release a claim",
    "POST /v1/releases": "Release several claims in one request; each item answered as its own request would be",
    "GET /v1/events": "The ordered claim event stream after a sequence number (since, limit, id_prefix)",
    "POST /v1/residency": "Leading resident blocks per prefix id, or residency per block hash",
    "POST /v1/active": "Serve one active request without text (the claims protocol's serve)",
    "POST /v1/instance": "Replace the KV instance by an empty one of N usable blocks (conformance)",
    "POST /v1/instance/step": "Advance the step counter duration_steps count",
    "GET /v1/descriptor": "What this backend honours: identity, limits, the checked lowering per mode",
    "GET /v1/models": "The text side's model",
    "GET /health": "Whether the gateway answers, with its KV and text sides",
    "GET /metrics": "Counters and histograms in the Prometheus text format",
    "GET /v1/stats": "The same figures as JSON",
    "GET /openapi.json": "This document",
}

_ERRORS = {
    "400": "usage_error: bad input, the field named",
    "401": "unauthorized: no valid API key (the gateway has keys)",
    "403": "scope_violation (another owner's claim) or forbidden (another tenant's owner scope, an operator route)",
    "404": "unknown_claim or not_found",
    "409": "a refusal (active_request_refused), illegal_transition or contract_violation",
    "413": "the body is over the size limit",
    "501": "not_exposed: the KV side does not offer the operation",
    "503": "active_request_deferred, with Retry-After; or unavailable (shutting down, ledger unusable)",
}


_OPEN = frozenset({"GET /health", "GET /openapi.json"})
_STR = {"type": "string"}
_INT = {"type": "integer"}
_HASHES = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 2**64 - 1}}


def _object(props: dict[str, Any], required: Sequence[str] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required)}


def _bodies(defs: dict[str, Any], extension: type) -> dict[str, tuple[Any, Any]]:
    """Per operation: (request body schema, 200 response schema); ``None`` for none stated."""

    def ref(cls: type) -> dict[str, Any]:
        return json_schema(cls, defs)

    messages = {"type": "array", "items": {"type": "object"}, "minItems": 1}
    stream = {"type": "boolean"}  # true: server-sent events (gateway/streaming.py, #13)
    stream_options = _object({"include_usage": {"type": "boolean"}})
    view = ref(ClaimView)
    return {
        "POST /v1/chat/completions": (
            _object(
                {
                    "model": _STR,
                    "messages": messages,
                    "tools": {"type": "array", "items": {"type": "object"}},
                    "stream": stream,
                    "stream_options": stream_options,
                    "cache_salt": _STR,
                    "agentclaims": ref(extension),
                },
                ["messages"],
            ),
            None,
        ),
        "POST /v1/completions": (
            _object(
                {
                    "model": _STR,
                    "prompt": {"anyOf": [_STR, {"type": "array", "items": _INT}]},
                    "stream": stream,
                    "stream_options": stream_options,
                    "cache_salt": _STR,
                    "agentclaims": ref(extension),
                },
                ["prompt"],
            ),
            None,
        ),
        "POST /v1/claims": (
            _object({"claim": ref(ClaimSpec), "block_hashes": _HASHES}, ["claim"]),
            ref(ClaimDecision),
        ),
        "GET /v1/claims/{claim_id}": (None, view),
        "DELETE /v1/claims/{claim_id}": (None, view),
        "POST /v1/claims/{claim_id}/renew": (
            _object(
                {
                    "owner_scope": _STR,
                    "duration_steps": {"anyOf": [_INT, {"type": "null"}]},
                    "ttl_s": {"anyOf": [{"type": "number"}, {"type": "null"}]},
                },
                ["owner_scope"],
            ),
            view,
        ),
        "POST /v1/claims/{claim_id}/release": (
            _object({"owner_scope": _STR, "done": {"type": "boolean"}}, ["owner_scope"]),
            view,
        ),
        "POST /v1/releases": (
            _object(
                {
                    "releases": {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": 64,
                        "items": _object(
                            {
                                "claim_id": _STR,
                                "owner_scope": _STR,
                                "done": {"type": "boolean"},
                                "events_since": _INT,
                                "id_prefix": _STR,
                            },
                            ["claim_id", "owner_scope"],
                        ),
                    }
                },
                ["releases"],
            ),
            _object(
                {
                    "released": {
                        "type": "array",
                        "description": "per item, in order: its claim view (with events where "
                        "asked), or status and error as its own request would have got",
                        "items": {"type": "object"},
                    }
                },
                ["released"],
            ),
        ),
        "GET /v1/events": (None, ref(EventPage)),
        "POST /v1/residency": (
            _object({"prefix_ids": {"type": "array", "items": _STR}, "block_hashes": _HASHES}),
            _object(
                {
                    "residency": {"type": "object", "additionalProperties": _INT},
                    "resident": {"type": "array", "items": {"type": "boolean"}},
                }
            ),
        ),
        "POST /v1/active": (ref(ActiveRequest), ref(ServeResult)),
        "POST /v1/instance": (
            _object({"usable_blocks": _INT, "owner_scope": _STR}, ["usable_blocks", "owner_scope"]),
            _object({"cache_identity": ref(CacheIdentity)}),
        ),
        "POST /v1/instance/step": (_object({"n": _INT}), _object({"stepped": _INT})),
    }


_QUERY = {
    "GET /v1/claims/{claim_id}": [("owner_scope", _STR, True)],
    "DELETE /v1/claims/{claim_id}": [("owner_scope", _STR, True)],
    "GET /v1/events": [("since", _INT, False), ("limit", _INT, False), ("id_prefix", _STR, False)],
}


_BEARER = {
    "bearer": {
        "type": "http",
        "scheme": "bearer",
        "description": "A tenant's or operator's API key (agentclaims serve --api-keys)",
    }
}


def openapi(
    routes: Sequence[tuple[str, list[str]]], name: str, extension: type, *, keys: bool = False
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``routes`` (path, methods): a summary per operation, its
    parameters, its request and response bodies, every error as the agentclaims error body
    (docs/gateway.md), and the security in force: with ``keys`` (``--api-keys``), the bearer
    key every route but ``/health`` and ``/openapi.json`` requires (docs/operations.md);
    without, no security at all (anonymous access is what such a gateway allows)."""
    defs: dict[str, Any] = {"Error": _ERROR}
    bodies = _bodies(defs, extension)
    error = {
        "description": "an agentclaims error",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }
    paths: dict[str, dict[str, Any]] = {}
    for path, methods in routes:
        for method in methods:
            key = f"{method} {path}"
            request, response = bodies.get(key, (None, None))
            ok: dict[str, Any] = {"description": "OK"}
            if response is not None:
                ok["content"] = {"application/json": {"schema": response}}
            op: dict[str, Any] = {
                "summary": _SUMMARIES.get(key, path),
                "operationId": f"{method.lower()}_{path.strip('/').replace('/', '_').replace('{', '').replace('}', '')}",
                "responses": {
                    "200": ok,
                    **{k: {**error, "description": v} for k, v in _ERRORS.items()},
                },
            }
            op["security"] = [{"bearer": []}] if keys and key not in _OPEN else []
            params = [
                {"name": p.strip("{}"), "in": "path", "required": True, "schema": _STR}
                for p in path.split("/")
                if p.startswith("{")
            ]
            params += [
                {"name": n, "in": "query", "required": req, "schema": schema}
                for n, schema, req in _QUERY.get(key, [])
            ]
            if params:
                op["parameters"] = params
            if request is not None:
                op["requestBody"] = {
                    "required": True,
                    "content": {"application/json": {"schema": request}},
                }
            paths.setdefault(path, {})[method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {
            "title": name,
            "version": "1",
            "description": "The agentclaims gateway: OpenAI-compatible completions with claims, and the claims API (docs/gateway.md).",
        },
        "paths": paths,
        "components": {
            "schemas": dict(sorted(defs.items())),
            **({"securitySchemes": _BEARER} if keys else {}),
        },
    }


_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {
                "type": {"type": "string"},
                "message": {"type": "string"},
                "field": {"type": "string"},
            },
        }
    },
}
