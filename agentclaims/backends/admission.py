"""An AIMD admission window on the number of active sessions (Concur-style), optional.

``AdmissionWindow`` admits at most ``window`` sessions at a time; sessions beyond it wait, in
arrival order (FIFO), and are admitted as others end or as the window grows. The window follows
the pool's health, measured over periods of ``period_calls`` answered LLM calls:

* pressure (any of): the share of calls that had to wait for memory (deferred or refused, then
  retried) above ``max_pressed_share``; claims harmed per call above ``max_harm_rate``; the
  period's prefix hit ratio more than ``max_hit_drop`` (a fraction) below its running average
  over earlier periods (thrashing: more contexts admitted than the cache holds); the KV usage
  reported with the calls (the share of the pool held by running requests, where the caller
  knows it) above ``max_kv_usage``. Then the window is multiplied by ``decrease`` (halved by
  default, never below ``min_window``);
* otherwise, if the window was full during the period (sessions waited, or as many ran as it
  allows), it grows by ``increase`` (never above ``max_window``). An unused window does not
  grow.

Shrinking never stops a running session: it only holds new ones back. ``request``/``release``
are the synchronous core (a simulation drives them); ``acquire`` waits on an asyncio future (no
polling) and, if cancelled while waiting, leaves the queue, giving back a slot granted in the
meantime. ``BackendPool(..., admission=AdmissionWindow(...))`` admits its sessions through one.
"""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict
from dataclasses import dataclass

from agentclaims.errors import UsageError

__all__ = ["AdmissionStats", "AdmissionWindow"]

_HIT_WEIGHT = 0.3
"""Weight of the newest period in the running hit-ratio average."""


@dataclass(slots=True)
class AdmissionStats:
    """What the window did so far."""

    admitted: int = 0
    """Sessions admitted (at once or after waiting)."""
    deferred: int = 0
    """Sessions that had to wait for a slot."""
    cancelled: int = 0
    """Sessions that left the queue before they were admitted."""
    increases: int = 0
    decreases: int = 0
    periods: int = 0


def _int(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise UsageError(name, f"must be an integer >= {low}, got {value!r}")
    return value


def _share(name: str, value: object, *, high: float = 1.0, open_low: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise UsageError(name, f"must be a number, got {value!r}")
    low_ok = value > 0 if open_low else value >= 0
    if not low_ok or value > high:
        bound = "(0" if open_low else "[0"
        raise UsageError(name, f"must be within {bound}, {high:g}], got {value!r}")
    return float(value)


class AdmissionWindow:
    """At most ``window`` active sessions; AIMD on the window from the pool's health."""

    def __init__(
        self,
        *,
        initial: int = 8,
        min_window: int = 1,
        max_window: int = 256,
        increase: int = 1,
        decrease: float = 0.5,
        period_calls: int = 32,
        max_pressed_share: float = 0.05,
        max_harm_rate: float = 0.0,
        max_hit_drop: float = 0.2,
        max_kv_usage: float = 0.95,
    ) -> None:
        self.min_window = _int("min_window", min_window, 1)
        self.max_window = _int("max_window", max_window, 1)
        if self.max_window < self.min_window:
            raise UsageError(
                "max_window", f"must be >= min_window ({min_window}), got {max_window}"
            )
        start = _int("initial", initial, 1)
        if not self.min_window <= start <= self.max_window:
            raise UsageError(
                "initial", f"must be within [{min_window}, {max_window}], got {initial}"
            )
        self.increase = _int("increase", increase, 1)
        self.decrease = _share("decrease", decrease, open_low=True)
        if self.decrease >= 1.0:
            raise UsageError("decrease", f"must be below 1 (a decrease), got {decrease!r}")
        self.period_calls = _int("period_calls", period_calls, 1)
        self.max_pressed_share = _share("max_pressed_share", max_pressed_share)
        self.max_harm_rate = _share("max_harm_rate", max_harm_rate, high=math.inf)
        self.max_hit_drop = _share("max_hit_drop", max_hit_drop)
        self.max_kv_usage = _share("max_kv_usage", max_kv_usage)
        self.window = start
        self.stats = AdmissionStats()
        self._active: set[str] = set()
        self._queue: OrderedDict[str, asyncio.Future[None] | None] = OrderedDict()
        self._hit_average: float | None = None
        self._calls = self._prompt = self._cached = self._pressed = self._harmed = 0
        self._kv_peak = 0.0
        self._saturated = False

    # ------------------------------------------------------------------ views
    @property
    def active(self) -> int:
        """Sessions admitted and not yet released."""
        return len(self._active)

    @property
    def waiting(self) -> int:
        """Sessions waiting for a slot."""
        return len(self._queue)

    def is_active(self, key: str) -> bool:
        return key in self._active

    # ------------------------------------------------------------------ admission
    def request(self, key: str) -> bool:
        """Ask for a slot for ``key``: ``True`` if admitted now; else it waits in line (FIFO)
        and a later ``release`` or ``observe`` admits it (they return the keys they admit)."""
        if not isinstance(key, str) or not key:
            raise UsageError("key", f"must be a non-empty string, got {key!r}")
        if key in self._active or key in self._queue:
            raise UsageError("key", f"{key!r} is already admitted or waiting")
        if not self._queue and len(self._active) < self.window:
            self._active.add(key)
            self.stats.admitted += 1
            self._saturated = self._saturated or len(self._active) >= self.window
            return True
        self._queue[key] = None
        self.stats.deferred += 1
        self._saturated = True
        return False

    async def acquire(self, key: str) -> None:
        """Wait until ``key`` is admitted (at once if a slot is free and nobody waits). If the
        wait is cancelled, ``key`` leaves the line, or gives its slot back if it was admitted
        in the meantime, and the cancellation propagates."""
        if self.request(key):
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue[key] = future
        try:
            await future
        except asyncio.CancelledError:
            self.cancel(key)
            raise

    def cancel(self, key: str) -> list[str]:
        """``key`` gives up: out of the line, or its slot released if it was admitted.
        Returns the keys admitted in its place."""
        if key in self._queue:
            del self._queue[key]
            self.stats.cancelled += 1
            return []
        return self.release(key)

    def release(self, key: str) -> list[str]:
        """``key`` ended (unknown keys are ignored: ending twice is harmless); returns the
        keys admitted in its place, in order."""
        self._active.discard(key)
        return self._admit()

    def resize(self, window: int) -> list[str]:
        """Set the window (counted as an increase or a decrease; never below ``min_window``,
        never above ``max_window``) and admit whom it now lets in; returns their keys."""
        window = max(self.min_window, min(self.max_window, window))
        if window > self.window:
            self.stats.increases += 1
        elif window < self.window:
            self.stats.decreases += 1
        self.window = window
        return self._admit()

    def _admit(self) -> list[str]:
        admitted: list[str] = []
        while self._queue and len(self._active) < self.window:
            key, future = self._queue.popitem(last=False)
            self._active.add(key)
            self.stats.admitted += 1
            admitted.append(key)
            if future is not None and not future.done():
                future.set_result(None)
        return admitted

    # ------------------------------------------------------------------ the controller
    def observe(
        self,
        *,
        prompt_tokens: int = 0,
        cached_tokens: int = 0,
        pressed: bool = False,
        harmed: int = 0,
        kv_usage: float | None = None,
    ) -> list[str]:
        """Record one answered LLM call (``prompt_tokens > 0``) or, with no tokens, a harm
        seen apart from a call; every ``period_calls`` calls the window moves. Returns the
        keys a grown window admits."""
        _int("prompt_tokens", prompt_tokens, 0)
        _int("cached_tokens", cached_tokens, 0)
        _int("harmed", harmed, 0)
        if cached_tokens > prompt_tokens:
            raise UsageError("cached_tokens", "must not exceed prompt_tokens")
        if kv_usage is not None:
            _share("kv_usage", kv_usage)
        self._harmed += harmed
        if prompt_tokens == 0:
            return []
        self._calls += 1
        self._prompt += prompt_tokens
        self._cached += cached_tokens
        self._pressed += bool(pressed)
        if kv_usage is not None:
            self._kv_peak = max(self._kv_peak, kv_usage)
        self._saturated = self._saturated or len(self._active) >= self.window or bool(self._queue)
        if self._calls < self.period_calls:
            return []
        return self._step()

    def _pressure(self) -> bool:
        calls = self._calls
        hit = self._cached / self._prompt if self._prompt else 0.0
        average = self._hit_average
        self._hit_average = (
            hit if average is None else (1 - _HIT_WEIGHT) * average + (_HIT_WEIGHT * hit)
        )
        return (
            self._pressed / calls > self.max_pressed_share
            or self._harmed / calls > self.max_harm_rate
            or (average is not None and hit < average * (1.0 - self.max_hit_drop))
            or self._kv_peak > self.max_kv_usage
        )

    def _step(self) -> list[str]:
        self.stats.periods += 1
        if self._pressure():
            shrunk = max(self.min_window, math.floor(self.window * self.decrease))
            if shrunk < self.window:
                self.window = shrunk
                self.stats.decreases += 1
        elif self._saturated and self.window < self.max_window:
            self.window = min(self.max_window, self.window + self.increase)
            self.stats.increases += 1
        self._reset_period()
        return self._admit()

    def _reset_period(self) -> None:
        self._calls = self._prompt = self._cached = self._pressed = self._harmed = 0
        self._kv_peak = 0.0
        self._saturated = len(self._active) >= self.window or bool(self._queue)

    def __repr__(self) -> str:
        return (
            f"AdmissionWindow(window={self.window}, active={self.active}, waiting={self.waiting})"
        )
