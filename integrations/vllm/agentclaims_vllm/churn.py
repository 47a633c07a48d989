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
its recompute is what holding it would have saved. Of the blocks evicted in the window at least
one pool turnover ago (``survival_s``: a block evicted a moment ago has had no time to be needed
again, and counting it would say regrets are rarer than they are), the share stored again since
(``evicted_reused_p``) is the chance that a block a hold displaces would have been used again:
the planner prices each displaced block at it (``displaced_reuse_p``).

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
BUCKET_S = 0.5
"""Evictions and their regrets are counted by the half-second they were evicted in."""


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
        self._evicted_at: dict[int, int] = {}
        """Blocks evicted, by the half-second (``BUCKET_S``) they were evicted in."""
        self._reused_at: dict[int, int] = {}
        """Of them, the blocks stored again since, by the same half-second."""
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
        bucket = int(now // BUCKET_S)
        self._evicted_at[bucket] = self._evicted_at.get(bucket, 0) + blocks
        self._trim(now)

    def saw(self, removed: Iterable[Hashable], stored: Iterable[Hashable]) -> None:
        """One step's KV events: the hashes of the cached blocks evicted (``BlockRemoved``)
        and of the blocks stored (``BlockStored``). A stored hash evicted within the window is
        an eviction regretted: counted once, and forgotten."""
        now = self._clock()
        gone, reused_at = self._gone, self._reused_at
        removed = list(removed)
        for h in stored:
            when = gone.pop(h, None)
            if when is not None and now - when <= self.window_s:
                bucket = int(when // BUCKET_S)
                reused_at[bucket] = reused_at.get(bucket, 0) + 1
                self.reused_blocks += 1
        for h in removed:
            gone[h] = now
            gone.move_to_end(h)
        while len(gone) > REMEMBERED:
            gone.popitem(last=False)
        self.evicted(len(removed))

    def reused_p(self, turnover_s: float | None) -> float | None:
        """Of the blocks evicted in the window at least ``turnover_s`` ago (the pool's
        survival time, at most half the window), the share stored again since; ``None`` under
        ``MIN_EVICTED`` such evictions (too few to tell) or while nothing is evicted."""
        if turnover_s is None:
            return None
        now = self._clock()
        self._trim(now)
        first = int((now - self.window_s) // BUCKET_S)
        last = int((now - min(turnover_s, self.window_s / 2)) // BUCKET_S)  # exclusive
        evicted = sum(self._evicted_at.get(b, 0) for b in range(first, last))
        if evicted < MIN_EVICTED:
            return None
        return min(1.0, sum(self._reused_at.get(b, 0) for b in range(first, last)) / evicted)

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
        survival = free_blocks / rate if rate > 0 else None
        reused = self.reused_p(survival)
        return {
            "free_blocks": free_blocks,
            "evicted_blocks": self.evicted_blocks,
            "evicted_per_s": round(rate, 3),
            "survival_s": None if survival is None else round(survival, 3),
            "reused_blocks": self.reused_blocks,
            "evicted_reused_p": None if reused is None else round(reused, 3),
            "window_s": self.window_s,
        }

    def _trim(self, now: float) -> None:
        cutoff = now - self.window_s
        recent = self._recent
        while recent and recent[0][0] < cutoff:
            self._in_window -= recent.popleft()[1]
        first = int(cutoff // BUCKET_S)
        for counts in (self._evicted_at, self._reused_at):
            if counts and min(counts) < first:
                for bucket in [b for b in counts if b < first]:
                    del counts[bucket]
        gone = self._gone
        while gone and next(iter(gone.values())) < cutoff:
            gone.popitem(last=False)
