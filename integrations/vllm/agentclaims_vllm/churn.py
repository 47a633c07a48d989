"""``PoolChurn``: how fast vLLM's block pool evicts cached blocks, from its own KV events.

vLLM records a ``BlockRemoved`` KV event each time it takes a cached block out of the prefix
cache to reuse it (an eviction: the free queue's head, LRU). ``ClaimsScheduler`` counts them
before vLLM publishes each step's batch, so the connector sees the pool's churn whether or not
anyone listens on the events' socket. From it the connector's answers carry the pool's
pressure: evicted blocks per second over a sliding window, and the time an unheld block freed
now would survive (the free blocks ahead of it in the LRU queue, divided by that rate). An
agent whose next call comes sooner than that needs no hold; one that waits longer does.

Only a pool that records its events can be measured: without them the figures are absent,
never zero (unknown churn is not no churn). Standard library only (the replay imports it too).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["PoolChurn"]

WINDOW_S = 30.0
"""The sliding window evictions are counted over."""


class PoolChurn:
    """Evictions of cached blocks over the last ``window_s`` seconds (``clock``: monotonic)."""

    def __init__(
        self, window_s: float = WINDOW_S, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s!r}")
        self.window_s = window_s
        self._clock = clock
        self._since = clock()
        self._recent: deque[tuple[float, int]] = deque()  # (when, blocks evicted), oldest first
        self._in_window = 0
        self.evicted_blocks = 0
        """Blocks evicted since the pool was bound."""

    def evicted(self, blocks: int) -> None:
        """``blocks`` cached blocks were evicted now."""
        if blocks <= 0:
            return
        now = self._clock()
        self._recent.append((now, blocks))
        self._in_window += blocks
        self.evicted_blocks += blocks
        self._trim(now)

    def rate(self) -> float:
        """Blocks evicted per second over the window (over the time measured, when shorter)."""
        now = self._clock()
        self._trim(now)
        span = min(self.window_s, now - self._since)
        return self._in_window / span if span > 0 else 0.0

    def figures(self, free_blocks: int) -> dict[str, Any]:
        """What an answer says of the pool: its free blocks, evictions per second and the time
        a block freed now survives them (``None`` while nothing is evicted: no end in sight)."""
        rate = self.rate()
        return {
            "free_blocks": free_blocks,
            "evicted_blocks": self.evicted_blocks,
            "evicted_per_s": round(rate, 3),
            "survival_s": round(free_blocks / rate, 3) if rate > 0 else None,
            "window_s": self.window_s,
        }

    def _trim(self, now: float) -> None:
        cutoff = now - self.window_s
        recent = self._recent
        while recent and recent[0][0] < cutoff:
            self._in_window -= recent.popleft()[1]
