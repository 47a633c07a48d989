"""What the SDK needs from a serving backend: the claims protocol, plus where LLM calls go.

A ``Backend`` speaks ``agentclaims.protocol.ClaimsProtocol`` (the claims API, defined once
beside the contract) and adds the OpenAI-compatible side: ``base_url`` and the HTTP client
the OpenAI SDK is given. ``HTTPBackend`` (a gateway on the network), ``EmbeddedBackend`` (the
same gateway in-process) and ``agentclaims.testing.FakeBackend`` are backends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from agentclaims.protocol import EXTENSION_KEY, ClaimsProtocol

if TYPE_CHECKING:
    import httpx2

__all__ = ["EXTENSION_KEY", "Backend"]


@runtime_checkable
class Backend(ClaimsProtocol, Protocol):
    """A claims backend that also serves LLM calls."""

    base_url: str
    """OpenAI-compatible base URL, ending in ``/v1``."""

    def http_client(self) -> httpx2.AsyncClient:
        """An async HTTP client that reaches this backend (ASGI in-process for embedded)."""
        ...

    async def health(self) -> bool: ...

    async def aclose(self) -> None: ...
