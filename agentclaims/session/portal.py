"""Synchronous code meets the asynchronous session: one background event loop per process.

The session, its claim round trips and the backends' clients are asynchronous. Synchronous
callers reach them here:

* ``run_sync(coro)`` runs a coroutine to its end on a loop and returns (or raises) its result:
  on ``loop`` when given (a session's own loop, running in another thread: a LangGraph ``def``
  node calling ``model.invoke()`` while the graph runs under ``ainvoke``), else on the portal, a
  daemon thread running one event loop for the whole process (a plain synchronous program:
  ``ClaimedGraph.invoke``/``stream``/``batch``). One loop for every synchronous call keeps the
  backends' HTTP connection pools and locks on one loop.
* ``iterate_sync(agen)`` iterates an async iterator from synchronous code on the portal;
  leaving the ``for`` early closes it (``aclose()``) before returning.

The caller's context variables travel with the coroutine (each one runs in a copy of the
caller's context), so LangChain's run config, structlog's bound ids and the current session
are seen on the loop as in the caller. Calling from the loop's own thread would wait on
itself forever: that raises ``UsageError`` instead.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

from agentclaims.errors import UsageError

__all__ = ["iterate_sync", "portal_loop", "run_sync"]

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def portal_loop() -> asyncio.AbstractEventLoop:
    """The process's background event loop (started at the first use, a daemon thread)."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def serve() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            threading.Thread(target=serve, name="agentclaims-portal", daemon=True).start()
            ready.wait(timeout=10)
            _loop = loop
        return _loop


def _running_here(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def run_sync(
    coro: Coroutine[Any, Any, T],
    *,
    loop: asyncio.AbstractEventLoop | None = None,
    what: str = "call",
) -> T:
    """Run ``coro`` on ``loop`` (default: the portal) from synchronous code; its result."""
    target = loop or portal_loop()
    if _running_here(target) or (loop is None and _running_in_thread()):
        coro.close()
        raise UsageError(
            what,
            "a synchronous call inside a running event loop would block it: "
            "use the async method (ainvoke, astream, abatch) there",
        )
    context = contextvars.copy_context()
    done: concurrent.futures.Future[T] = concurrent.futures.Future()

    def start() -> None:
        task = target.create_task(coro, context=context)

        def finished(t: asyncio.Task[T]) -> None:
            if t.cancelled():
                done.set_exception(asyncio.CancelledError())
            elif t.exception() is not None:
                done.set_exception(t.exception())
            else:
                done.set_result(t.result())

        task.add_done_callback(finished)

    target.call_soon_threadsafe(start)
    return done.result()


def _running_in_thread() -> bool:
    """Whether this thread runs an event loop (then blocking it on the portal is refused)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def iterate_sync(items: AsyncIterator[T], *, what: str = "stream") -> Iterator[T]:
    """Iterate ``items`` from synchronous code, each step on the portal; closing the
    generator (``break``, an exception in the loop body) closes ``items`` first."""
    finished = False
    try:
        while True:
            try:
                item = run_sync(_next(items), what=what)
            except StopAsyncIteration:
                finished = True
                return
            yield item
    finally:
        aclose = getattr(items, "aclose", None)
        if not finished and aclose is not None:
            run_sync(aclose(), what=what)


async def _next(items: AsyncIterator[T]) -> T:
    return await items.__anext__()
