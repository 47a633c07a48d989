"""``CacheSight``: what the vLLM side has seen of vLLM's prefix cache in its KV events.

vLLM's events of a request it answered come on another channel than the answer, a little
later. With the observer (``KVEventsObserver``) the side remembers the last served prompt's
blocks and waits, bounded, until the events show blocks stored, so that a reader of residency
or of the event stream sees what the answers did. Without the observer nothing waits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from agentclaims.contract import BlockHash
from agentclaims.vllm.mirror import ClaimMirror
from agentclaims.vllm.observer import KVEventsObserver

__all__ = ["CacheSight"]


class CacheSight:
    """The last served prompt's blocks, and waits on vLLM's KV events."""

    def __init__(self, observer: KVEventsObserver | None, mirror: ClaimMirror) -> None:
        self.observer = observer
        self._mirror = mirror
        self.last_stored: tuple[BlockHash, ...] = ()
        """The blocks of the last prompt vLLM served (the gateway's hashes)."""

    async def seen_stored(self, hashes: Sequence[BlockHash], timeout_s: float = 1.0) -> None:
        """Wait (bounded) until the observer has seen ``hashes`` stored: vLLM's events of a
        request it answered come on another channel, a little later."""
        if self.observer is not None and hashes:
            await self.observer.wait_resident(hashes, timeout_s)

    async def settle(self) -> None:
        """Let vLLM's events catch up with its answers: the last served prompt's blocks seen
        stored (what came before them is then in too: one ordered stream), and a quiet moment."""
        assert self.observer is not None
        await self.observer.wait_resident(self.last_stored, 0.5)
        await self.observer.quiet()
        if self._mirror.judging:
            await asyncio.gather(*list(self._mirror.judging), return_exceptions=True)
