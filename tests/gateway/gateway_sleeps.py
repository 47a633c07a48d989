"""Sleeps for gateway tests: one that never waits, one that waits for a gate."""

from __future__ import annotations

import asyncio


class RecordingSleep:
    """Records the modelled hold times; returns at once (tests never really wait)."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


class GatedSleep(RecordingSleep):
    """Holds every request until ``open()``: lets a test keep requests active."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)
        self.entered.set()
        await self.gate.wait()
