"""OpenAI clients bound to an agentclaims backend.

The client's HTTP transport is ``ClaimsTransport``: inside a ``ClaimedSession`` every completion
carries the session's claims and its outcomes are handled by the session. The OpenAI SDK's own
retries are off (``max_retries=0``): the session's reaction policy (tenacity) owns retries, so
the two never multiply.
"""

from __future__ import annotations

import weakref
from typing import Any

import httpx2
import openai

from agentclaims.backends.base import Backend
from agentclaims.errors import UsageError
from agentclaims.session.transport import PLACEHOLDER_KEY, ClaimsTransport, SyncClaimsTransport

__all__ = [
    "claims_http_client",
    "claims_sync_http_client",
    "client_backend",
    "is_claims_client",
    "openai_client",
    "openai_sync_client",
]

_CLAIMS_CLIENTS: weakref.WeakSet[httpx2.AsyncClient | httpx2.Client] = weakref.WeakSet()


def is_claims_client(client: object) -> bool:
    """Whether ``client`` is an HTTP client made here, sending through a claims transport."""
    try:
        return client in _CLAIMS_CLIENTS
    except TypeError:  # not weakly referenceable: not one of ours
        return False


def client_backend(backend: object) -> Backend:
    """``backend`` if it is one a client can send to, else ``UsageError("backend")``."""
    from agentclaims.backends.pool import BackendPool

    if isinstance(backend, BackendPool) and not isinstance(getattr(backend, "base_url", None), str):
        raise UsageError(  # a FleetBackend is a pool with one URL, its router's
            "backend",
            "a BackendPool has no one URL to send to: make the client with one of its members "
            "(pool.backends[0]); the session moves its calls between them",
        )
    if not isinstance(getattr(backend, "base_url", None), str) or not all(
        hasattr(backend, name) for name in ("submit_claim", "http_client", "name")
    ):
        raise UsageError(
            "backend", f"expected a Backend (EmbeddedBackend, HTTPBackend, ...), got {backend!r}"
        )
    return backend  # type: ignore[return-value]


def claims_http_client(backend: Backend) -> httpx2.AsyncClient:
    """An ``httpx2.AsyncClient`` whose requests go through the claims transport."""
    backend = client_backend(backend)
    client = httpx2.AsyncClient(
        transport=ClaimsTransport(backend), base_url=backend.base_url, timeout=60.0
    )
    _CLAIMS_CLIENTS.add(client)
    return client


def claims_sync_http_client(backend: Backend) -> httpx2.Client:
    """An ``httpx2.Client`` (synchronous) whose requests go through the claims transport, on
    the session's event loop (``SyncClaimsTransport``)."""
    backend = client_backend(backend)
    client = httpx2.Client(
        transport=SyncClaimsTransport(backend), base_url=backend.base_url, timeout=60.0
    )
    _CLAIMS_CLIENTS.add(client)
    return client


def openai_sync_client(backend: Backend, **kwargs: Any) -> openai.OpenAI:
    """``openai.OpenAI`` (synchronous) for ``backend``: for ``def`` code running inside a
    claimed session (a LangGraph ``def`` node) or outside one."""
    backend = client_backend(backend)
    kwargs.setdefault("api_key", getattr(backend, "api_key", None) or PLACEHOLDER_KEY)
    kwargs.setdefault("max_retries", 0)
    return openai.OpenAI(
        base_url=backend.base_url, http_client=claims_sync_http_client(backend), **kwargs
    )


def openai_client(backend: Backend, **kwargs: Any) -> openai.AsyncOpenAI:
    """``openai.AsyncOpenAI`` for ``backend`` (extra keyword arguments go to the client)."""
    backend = client_backend(backend)
    kwargs.setdefault("api_key", getattr(backend, "api_key", None) or PLACEHOLDER_KEY)
    kwargs.setdefault("max_retries", 0)
    return openai.AsyncOpenAI(
        base_url=backend.base_url, http_client=claims_http_client(backend), **kwargs
    )
