"""``PoolChurn``: how fast vLLM's block pool evicts cached blocks, from its own KV events.

vLLM records a ``BlockRemoved`` KV event each time it takes a cached block out of the prefix
cache to reuse it (an eviction: the free queue's head, LRU). ``ClaimsScheduler`` counts them
before vLLM publishes each step's batch, so the connector sees the pool's churn whether or not
anyone listens on the events' socket. From it the connector's answers carry the pool's
pressure: evicted blocks per second over a sliding window, and the time an unheld block freed
now would survive (the free blocks ahead of it in the LRU queue, divided by that rate). An
agent whose next call comes sooner than that needs no hold; one that waits longer does.

The same events say how often an eviction was regretted: a block removed from the cache and
stored again (its hash in a later ``BlockStored``) within the window was needed after all, and
its recompute is what holding it would have saved. Of the blocks evicted in the window, the
share stored again (``evicted_reused_p``) is the chance that a block a hold displaces would
have been used again: the planner prices each displaced block at it (``displaced_reuse_p``).

Only a pool that records its events can be measured: without them the figures are absent,
never zero (unknown churn is not no churn). Standard library only (the replay imports it too).
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable
from typing import Any

__all__ = ["PoolChurn"]

WINDOW_S = 30.0
"""The sliding window evictions are counted over."""
MIN_EVICTED = 32
"""Evictions in the window below which the share stored again is not said (too few to tell)."""
REMEMBERED = 1 << 16
"""Evicted block hashes remembered at most (the oldest forgotten first)."""


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
        self._gone: OrderedDict[Hashable, float] = OrderedDict()
        """Hashes of blocks evicted lately -> when, oldest first."""
        self._reused: deque[tuple[float, int]] = deque()  # (when, blocks stored again)
        self._reused_in_window = 0
        self.reused_blocks = 0
        """Evicted blocks stored again within the window since the pool was bound."""

    def evicted(self, blocks: int) -> None:
        """``blocks`` cached blocks were evicted now."""
        if blocks <= 0:
            return
        now = self._clock()
        self._recent.append((now, blocks))
        self._in_window += blocks
        self.evicted_blocks += blocks
        self._trim(now)

    def saw(self, removed: Iterable[Hashable], stored: Iterable[Hashable]) -> None:
        """One step's KV events: the hashes of the cached blocks evicted (``BlockRemoved``)
        and of the blocks stored (``BlockStored``). A stored hash evicted within the window is
        an eviction regretted: counted once, and forgotten."""
        now = self._clock()
        gone = self._gone
        removed = list(removed)
        again = 0
        for h in stored:
            when = gone.pop(h, None)
            if when is not None and now - when <= self.window_s:
                again += 1
        for h in removed:
            gone[h] = now
            gone.move_to_end(h)
        while len(gone) > REMEMBERED:
            gone.popitem(last=False)
        if again:
            self._reused.append((now, again))
            self._reused_in_window += again
            self.reused_blocks += again
        self.evicted(len(removed))
        self._trim(now)

    def reused_p(self) -> float | None:
        """Of the blocks evicted in the window, the share stored again within it (``None``
        under ``MIN_EVICTED`` evictions: too few to tell)."""
        self._trim(self._clock())
        if self._in_window < MIN_EVICTED:
            return None
        return min(1.0, self._reused_in_window / self._in_window)

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
        reused = self.reused_p()
        return {
            "free_blocks": free_blocks,
            "evicted_blocks": self.evicted_blocks,
            "evicted_per_s": round(rate, 3),
            "survival_s": round(free_blocks / rate, 3) if rate > 0 else None,
            "evicted_reused_p": None if reused is None else round(reused, 3),
            "window_s": self.window_s,
        }

    def _trim(self, now: float) -> None:
        cutoff = now - self.window_s
        recent = self._recent
        while recent and recent[0][0] < cutoff:
            self._in_window -= recent.popleft()[1]
        reused = self._reused
        while reused and reused[0][0] < cutoff:
            self._reused_in_window -= reused.popleft()[1]
        gone = self._gone
        while gone and next(iter(gone.values())) < cutoff:
            gone.popitem(last=False)
