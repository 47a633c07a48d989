"""The one boundary between the SDK and a serving backend.

A backend is reached over HTTP (the agentclaims gateway's OpenAI-compatible API plus its claims
API). ``EmbeddedBackend`` runs the same gateway app in-process through an ASGI transport, so the
embedded default and a served gateway are the same code. The SDK talks to every backend through
this protocol; LLM calls go through ``http_client()`` (what the OpenAI client is given).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import httpx2

    from agentclaims.contract import ClaimEvent, ClaimSpec
    from agentclaims.engine import ClaimDecision, ClaimView

__all__ = ["EXTENSION_KEY", "Backend"]

EXTENSION_KEY = "agentclaims"
"""Key of the extension object in a completion request's body and in its response."""


@runtime_checkable
class Backend(Protocol):
    """What the SDK needs from a serving backend (embedded, http, or a pool member)."""

    name: str
    base_url: str
    """OpenAI-compatible base URL, ending in ``/v1``."""

    def http_client(self) -> httpx2.AsyncClient:
        """An async HTTP client that reaches this backend (ASGI in-process for embedded)."""
        ...

    async def submit_claim(
        self, spec: ClaimSpec, block_hashes: Sequence[int] | None = None
    ) -> ClaimDecision: ...

    async def get_claim(self, claim_id: str, owner_scope: str) -> ClaimView: ...

    async def renew_claim(
        self,
        claim_id: str,
        owner_scope: str,
        *,
        duration_steps: int | None = None,
        ttl_s: float | None = None,
    ) -> ClaimView: ...

    async def release_claim(self, claim_id: str, owner_scope: str) -> ClaimView: ...

    async def events(self, since: int = 0, *, id_prefix: str | None = None) -> list[ClaimEvent]:
        """Events with ``seq`` greater than ``since``, in order; with ``id_prefix``, only those
        whose claim id (else request id) starts with it (a session's own events)."""
        ...

    async def residency(self, prefix_ids: Sequence[str]) -> Mapping[str, int]:
        """How many leading blocks of each known prefix are resident now (0 if unknown)."""
        ...

    async def descriptor(self) -> Mapping[str, Any]:
        """What this backend can honour: the lowering classification per protection mode."""
        ...

    async def health(self) -> bool: ...

    async def aclose(self) -> None: ...
