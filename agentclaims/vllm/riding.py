"""``RidingOps``: claim operations that wait to ride on the next request to vLLM.

A release, a renewal the caller need not wait for, a supersession: the gateway is the only
signer, so it may put any pending operation, from any tenant, on whichever request goes to vLLM
next. While vLLM is idle it evicts nothing, so the wait loses nothing. An operation that finds no
request within ``bound_s`` goes on its own (the connector's channel, else a one-token request).
What waited, how long, and how each went is counted for ``/metrics`` and ``/v1/stats``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from agentclaims_vllm.ops import Op

from agentclaims.errors import BackendError, BackendUnavailable
from agentclaims.vllm.client import ConnectorAnswer

__all__ = ["RidingOps"]

log = logging.getLogger("agentclaims.vllm")

Send = Callable[[Sequence[Op]], Awaitable[ConnectorAnswer]]
Absorb = Callable[[ConnectorAnswer], Awaitable[None]]


class RidingOps:
    """Pending operations (each naming its tenant), and how they went."""

    def __init__(
        self, bound_s: float, send: Send, absorb: Absorb, alive: Callable[[], bool]
    ) -> None:
        self.bound_s = bound_s
        """How long a pending operation waits for a request to ride on."""
        self._send = send
        self._absorb = absorb
        self._alive = alive
        self._pending: list[tuple[Op, float]] = []
        """Pending operations and when each was queued."""
        self._timer: asyncio.TimerHandle | None = None
        self._flushing: set[asyncio.Task[None]] = set()
        self.rode = 0
        """Operations that rode on a request going to vLLM anyway."""
        self.standalone = 0
        """Operations sent on their own (the channel, or a one-token request)."""
        self.waits: deque[float] = deque(maxlen=4096)
        """How long recent pending operations waited before they went (either way)."""
        self.wait_sum = 0.0
        self.wait_count = 0

    def __bool__(self) -> bool:
        return bool(self._pending)

    def queue(self, op: Op) -> None:
        """``op`` waits for the next request to vLLM, at most ``bound_s``; then it goes on
        its own."""
        self._pending.append((op, time.monotonic()))
        if self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.bound_s, self._due)

    def take(self) -> list[Op]:
        """Every pending operation, for the request about to go (counted as riding)."""
        if not self._pending:
            return []
        taken, self._pending = self._pending, []
        self.rode += len(taken)
        return self._waited(taken)

    def put_back(self, ops: Sequence[Op]) -> None:
        """Operations whose request may not have reached the connector go again (a release
        or renewal applied twice changes nothing the second time)."""
        self.rode -= len(ops)
        for op in ops:
            self.queue(op)

    def clear(self) -> None:
        """Forget what is pending (the engine died, or every hold is being revoked)."""
        self._pending.clear()

    async def send_now(self, ops: Sequence[Op]) -> ConnectorAnswer:
        """``ops`` sent now, with every pending operation going first: whatever reaches the
        connector carries them."""
        riding = self.take()
        try:
            return await self._send([*riding, *ops])
        except BaseException:
            self.put_back(riding)
            raise

    async def settle(self) -> None:
        """Pending operations applied now (a reader of the event stream or of residency sees
        what they did, not what it will be within the bound)."""
        if self._pending and self._alive():
            await self._flush()
        if self._flushing:  # one the bound set off, still on its way
            await asyncio.gather(*list(self._flushing), return_exceptions=True)

    async def aclose(self) -> None:
        """Nothing pending is lost: it is handed over before closing."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._pending:
            with contextlib.suppress(BackendError, BackendUnavailable):
                await self._flush()
        if self._flushing:
            await asyncio.gather(*list(self._flushing), return_exceptions=True)

    def metrics(self) -> dict[str, Any]:
        waits = sorted(self.waits)
        return {
            "claim_operation_wait_s": {
                "count": self.wait_count,
                "sum": round(self.wait_sum, 6),
                "p50": round(waits[len(waits) // 2], 6) if waits else None,
                "max": round(waits[-1], 6) if waits else None,
                "bound": self.bound_s,
            },
        }

    def _waited(self, taken: Sequence[tuple[Op, float]]) -> list[Op]:
        now = time.monotonic()
        for _, queued in taken:
            wait = now - queued
            self.waits.append(wait)
            self.wait_sum += wait
            self.wait_count += 1
        return [op for op, _ in taken]

    def _due(self) -> None:
        self._timer = None
        if not self._pending:
            return
        task = asyncio.ensure_future(self._flush())
        self._flushing.add(task)
        task.add_done_callback(self._flushing.discard)

    async def _flush(self) -> None:
        """The pending operations no request took within the bound, on their own."""
        if not self._pending or not self._alive():
            return
        taken, self._pending = self._pending, []
        ops = self._waited(taken)
        self.standalone += len(ops)
        try:
            answer = await self._send(ops)
        except (BackendError, BackendUnavailable) as exc:
            log.warning("agentclaims: %d pending claim operations not applied: %r", len(ops), exc)
            return  # a dead engine ends every claim itself; else its TTLs end the holds
        await self._absorb(answer)
