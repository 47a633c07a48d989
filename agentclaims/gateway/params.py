"""What the route handlers read of a request: its JSON body within the gateway's limits, its
query parameters, its tenant and the owner scope it names, and its claims' owners and block
hashes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from starlette.requests import ClientDisconnect, Request

from agentclaims.contract import BlockHash, OwnerScope
from agentclaims.errors import UsageError
from agentclaims.gateway.limits import BodyTooLarge, Limits, parse_body
from agentclaims.gateway.service import Service
from agentclaims.gateway.tenants import Tenant

__all__ = [
    "block_hashes_of",
    "claim_owners",
    "header",
    "int_param",
    "json_object",
    "optional_str",
    "owner_of",
    "tenant_of",
]


def header(request: Request, name: bytes) -> str | None:
    """The request's first ``name`` header (lower case), read straight from its ASGI scope:
    every agent's call reads two, and Starlette's ``Headers`` costs more than the lookup."""
    for key, value in request.scope["headers"]:
        if key == name:
            text: str = value.decode("latin-1")
            return text
    return None


async def json_object(request: Request, limits: Limits | None = None) -> dict[str, Any]:
    """The body as a JSON object, within the gateway's limits (``limits.parse_body``; by
    default the app's): one that says or turns out to be too large is refused before more of
    it is read."""
    if limits is None:
        limits = getattr(request.app.state, "limits", None) or Limits()
    most = limits.max_body_bytes
    length = header(request, b"content-length")
    if length is not None and length.isdigit() and int(length) > most:
        raise BodyTooLarge("body", f"{length} bytes; at most {most}")
    receive = request.receive  # read here: every agent's call comes this way
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > most:
            raise BodyTooLarge("body", f"over {most} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return parse_body(b"".join(chunks), limits)


def optional_str(body: Mapping[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and (not isinstance(value, str) or not value):
        raise UsageError(name, f"must be a non-empty string, got {value!r}")
    return value


def int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise UsageError(name, f"must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise UsageError(name, f"must be within {low}..{high}, got {value}")
    return value


def owner_of(request: Request, body: Mapping[str, Any] | None = None) -> OwnerScope:
    """The owner scope a claims-API call names, checked against the caller's tenant."""
    owner = (body or {}).get("owner_scope") or request.query_params.get("owner_scope")
    if not isinstance(owner, str) or not owner:
        raise UsageError("owner_scope", "missing: name the claim's owner scope")
    service: Service = request.app.state.gateway.service
    return OwnerScope(service.owner(owner, tenant_of(request)) or owner)


TENANT_SCOPE_KEY = "agentclaims.tenant"
"""Where ``_Gateway.counted`` puts the request's tenant in its ASGI scope."""


def tenant_of(request: Request) -> Tenant | None:
    """The tenant of the request's key (set by ``_Gateway.counted``); ``None`` without keys."""
    tenant: Tenant | None = request.scope.get(TENANT_SCOPE_KEY)
    return tenant


def claim_owners(claims: Sequence[Any], default_owner: str | None) -> dict[str, str]:
    """claim_id -> owner scope of a request's claim dicts (for the ledger)."""
    out = {}
    for c in claims:
        if isinstance(c, Mapping) and isinstance(c.get("claim_id"), str):
            owner = c.get("owner_scope") or default_owner
            if isinstance(owner, str):
                out[c["claim_id"]] = owner
    return out


def block_hashes_of(body: Mapping[str, Any]) -> list[BlockHash]:
    hashes = body.get("block_hashes")
    if not (
        isinstance(hashes, list)
        and all(isinstance(h, int) and not isinstance(h, bool) and 0 <= h < 2**64 for h in hashes)
    ):
        raise UsageError("block_hashes", "must be a list of 64-bit unsigned integers")
    return [BlockHash(h) for h in hashes]
