"""``InProcessGateway``: the gateway app in this process, over a KV side, reached through an
ASGI transport that streams its answers as the app sends them (``StreamingASGITransport``).

An agent process with a vLLM of its own needs no gateway process between them.
``InProcessGateway.over_vllm(upstream, claims_key)`` runs the app ``agentclaims serve --kv
vllm`` runs, in the agents' process: each call goes from the session's transport into the app
and on to vLLM, with no socket to the gateway and no second process to wake on the way there
and back. The claims ride on the calls as they do through the gateway process, the answers
bring the session's events and the pool's figures alike, and the same descriptor says what the
engine honours. What it cannot be is shared: agents in other processes, and tenants with keys
and a ledger, need ``agentclaims serve``.

::

    backend = agentclaims.InProcessGateway.over_vllm("http://127.0.0.1:8000", claims_key)
    async with agentclaims.claimed_session(graph, backend=backend) as run:
        ...
    await backend.aclose()  # the app's connections to vLLM too

``EmbeddedBackend`` is the same over the reference engine and a scripted model.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

import httpx2

from agentclaims.backends.asgi import StreamingASGITransport
from agentclaims.backends.http import DEFAULT_TIMEOUT_S, HTTPBackend, check_name, check_seconds
from agentclaims.errors import UsageError
from agentclaims.gateway import KVSide, TextSide, create_app

if TYPE_CHECKING:
    from starlette.applications import Starlette

__all__ = ["InProcessGateway", "check_name"]


class InProcessGateway(HTTPBackend):
    """The gateway app over ``kv`` (and ``text``, where the KV side writes no replies of its
    own) in this process, reached through an ASGI transport (see the module). ``owns_kv``:
    closing the backend closes the KV side too (its connections to vLLM)."""

    _HOST = "in-process"
    """The host its URL names where ``name`` is not a host name."""

    def __init__(
        self,
        kv: KVSide,
        text: TextSide | None = None,
        *,
        name: str = "in-process",
        owns_kv: bool = True,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        check_name(name)
        check_seconds("timeout_s", timeout_s)  # before the app is built
        self.kv: KVSide = kv
        self.app: Starlette = create_app(kv, text, name=name)
        host = name if re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?", name) else self._HOST
        base_url = f"http://{host}.agentclaims/v1"
        client = httpx2.AsyncClient(
            transport=StreamingASGITransport(self.app),
            base_url=base_url.removesuffix("/v1"),  # relative paths read "/v1/...", "/health"
            timeout=timeout_s,
        )
        super().__init__(base_url, name=name, client=client)
        self._owns_client = True
        self._owns_kv = owns_kv
        self.share_key = None  # an app of its own: its sessions share by this object

    @classmethod
    def over_vllm(
        cls,
        upstream: str,
        claims_key: str | None = None,
        *,
        block_size: int = 32,
        ride_bound_s: float = 0.05,
        timeout_s: float = 120.0,
        name: str = "vllm",
    ) -> InProcessGateway:
        """The app over the vLLM at ``upstream`` (``http://HOST:PORT``) with the agentclaims
        connector, signing its claim operations with ``claims_key`` (the connector's key;
        default ``$AGENTCLAIMS_CLAIMS_KEY``), vLLM's KV cache in blocks of ``block_size``
        tokens (its ``--block-size``). ``ride_bound_s``: how long a claim operation waits to
        ride on a call before it goes on its own, as ``agentclaims serve --ride-bound-s``."""
        from agentclaims.vllm.kv import VllmKV

        check_name(name)  # before anything is built
        check_seconds("timeout_s", timeout_s)
        if not isinstance(upstream, str):
            raise UsageError("upstream", f"must be the server's http(s) URL, got {upstream!r}")
        key = claims_key or os.environ.get("AGENTCLAIMS_CLAIMS_KEY")
        if not key:
            raise UsageError("claims_key", "needs the connector's key (or $AGENTCLAIMS_CLAIMS_KEY)")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise UsageError("block_size", f"must be a positive integer, got {block_size!r}")
        kv = VllmKV(
            upstream, key, block_size=block_size, timeout_s=timeout_s, ride_bound_s=ride_bound_s
        )
        return cls(kv, name=name, timeout_s=timeout_s)

    async def aclose(self) -> None:
        closing = not self._closed
        await super().aclose()
        close = getattr(self.kv, "aclose", None)
        if closing and self._owns_kv and close is not None:
            await close()
