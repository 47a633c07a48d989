"""``VllmLink``: what the vLLM side's helpers use of it, and nothing more.

``VllmKV`` builds its helpers (``ClaimsApi``, ``CompletionForwarder``, ``InstanceReset``) and
hands each itself typed as this protocol: the parts they share (the claim mirror, the prompt
book, what the gateway sees of vLLM's cache, the riding operations, the engine's liveness) and
the few steps of the connection they take (start it, wait for the connector, read vLLM's
model, its health, a tokenization). They import this module, never ``VllmKV``'s: no import
circle, and a helper's reach is written down here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from agentclaims.contract import CacheIdentity
from agentclaims.vllm.client import ConnectorClient
from agentclaims.vllm.liveness import EngineLiveness
from agentclaims.vllm.mirror import ClaimMirror
from agentclaims.vllm.observer import KVEventsObserver
from agentclaims.vllm.prompts import PromptBook
from agentclaims.vllm.riding import RidingOps
from agentclaims.vllm.sight import CacheSight

__all__ = ["VllmLink"]


class VllmLink(Protocol):
    """The vLLM side as its helpers see it (``VllmKV`` is one)."""

    name: str
    block_size: int
    usable_blocks: int
    """vLLM's pool, learned at start (0 before)."""
    mirror: ClaimMirror
    prompts: PromptBook
    sight: CacheSight
    riding: RidingOps
    liveness: EngineLiveness
    observer: KVEventsObserver | None

    @property
    def streams_claims(self) -> bool:
        """A streamed call may carry claims (the connector hears them)."""
        ...

    async def start(self) -> None:
        """Once per vLLM: its version, pool and connector learned, orphaned holds revoked."""
        ...

    async def connector_ready(self) -> ConnectorClient:
        """The connector's client, once vLLM's model is known."""
        ...

    async def model(self) -> str:
        """The model vLLM serves."""
        ...

    async def health(self) -> dict[str, Any]:
        """vLLM's health, as the gateway's ``/health`` reports it (a dead engine named)."""
        ...

    async def tokenize(self, kind: str, body: Mapping[str, Any]) -> list[int]:
        """vLLM's own tokens for a completion body of ``kind``."""
        ...

    def identity(self) -> CacheIdentity:
        """The cache identity claims on this vLLM carry."""
        ...
