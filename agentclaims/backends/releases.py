"""``ReleaseQueue``: a backend's releases, one request out at a time, the rest together.

Sessions that end together (a batch of agents finishing, a process shutting down) each release
their claims. A release that finds none out goes at once, alone, as before; those asked for
while one is out wait for it and then go together, in one ``POST /v1/releases`` (at most
``most`` per request), and each caller gets its own answer, or its own error, as if it had
gone alone. Nothing is held back on a timer: a lone release is never later than it was.

A gateway without the route (404 or 405: an older one) gets each release alone from then on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from agentclaims.errors import AgentClaimsError, BackendError, BackendUnavailable

__all__ = ["ReleaseQueue"]

Item = dict[str, Any]
"""One release as ``POST /v1/releases`` carries it (``claim_id``, ``owner_scope``, ...)."""
SendOne = Callable[[Item], Awaitable[dict[str, Any]]]
SendMany = Callable[[Sequence[Item]], Awaitable[list[dict[str, Any] | AgentClaimsError]]]


class ReleaseQueue:
    """A backend's releases (see the module): ``send_one`` sends one alone and answers its
    data (or raises); ``send_many`` sends several in one request and answers, per item, its
    data or the error its own request would have raised."""

    def __init__(self, send_one: SendOne, send_many: SendMany, *, most: int = 64) -> None:
        self._send_one = send_one
        self._send_many = send_many
        self._most = most
        self._busy = False
        self._waiting: list[tuple[Item, asyncio.Future[dict[str, Any]]]] = []
        self._task: asyncio.Task[None] | None = None
        self.batches = True
        """Whether the gateway takes ``POST /v1/releases`` (``False`` after it said no)."""
        self.requests = 0
        self.coalesced = 0
        """Releases that went in a request with others."""

    async def release(self, item: Item) -> dict[str, Any]:
        """Release ``item``: its answer's data, or the error its request raised."""
        if self._busy:
            future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
            self._waiting.append((item, future))
            return await future
        self._busy = True
        try:
            self.requests += 1
            return await self._send_one(item)
        finally:
            self._next()

    def close(self, reason: str) -> None:
        """Fail every release still waiting (the backend is closed)."""
        waiting, self._waiting = self._waiting, []
        for _, future in waiting:
            if not future.done():
                future.set_exception(BackendUnavailable(reason))

    def _next(self) -> None:
        """Send what waits, if anything does; else nothing is out any more."""
        if not self._waiting:
            self._busy = False
            return
        batch, self._waiting = self._waiting[: self._most], self._waiting[self._most :]
        self._task = asyncio.ensure_future(self._send(batch))

    async def _send(self, batch: list[tuple[Item, asyncio.Future[dict[str, Any]]]]) -> None:
        results: list[dict[str, Any] | BaseException] = []
        try:
            results = await self._answers([item for item, _ in batch])
        except Exception as exc:
            results = [exc] * len(batch)
        except asyncio.CancelledError:  # the loop is closing: the callers hear an outage
            results = [BackendUnavailable("the release was cancelled")] * len(batch)
            raise
        finally:
            for (_, future), result in zip(batch, results or [], strict=False):
                if future.done():
                    continue  # its caller gave up; the release went all the same
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)
            for _, future in batch[len(results) :]:
                if not future.done():
                    future.set_exception(BackendUnavailable("the release was not sent"))
            self._next()

    async def _answers(self, items: list[Item]) -> list[dict[str, Any] | BaseException]:
        """Each item's answer: together where the gateway takes it, else one by one."""
        if len(items) > 1 and self.batches:
            self.requests += 1
            try:
                answers = await self._send_many(items)
            except BackendError as exc:
                if not _no_route(exc):
                    raise
                self.batches = False  # an older gateway: one by one from now on
            else:
                if len(answers) != len(items):
                    raise BackendError(
                        f"POST /v1/releases answered {len(answers)} releases for {len(items)}"
                    )
                self.coalesced += len(items)
                return list(answers)
        out: list[dict[str, Any] | BaseException] = []
        for item in items:
            self.requests += 1
            try:
                out.append(await self._send_one(item))
            except AgentClaimsError as exc:
                out.append(exc)
        return out


def _no_route(exc: BackendError) -> bool:
    """Whether ``exc`` is a gateway saying it has no ``POST /v1/releases``."""
    text = str(exc)
    return "HTTP 404" in text or "HTTP 405" in text
