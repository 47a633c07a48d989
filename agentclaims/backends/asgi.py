"""``StreamingASGITransport``: an ASGI app reached from ``httpx2`` in this process, its answers
streamed as the app sends them.

``httpx2.ASGITransport`` runs the app to its end and hands back the whole body: a streamed
completion then reaches the client in one piece, its first token as late as its last. This
transport runs the app in a task of its own for a request that asks for a stream (its body
says ``"stream": true``) and answers as soon as the app starts its response; each body
chunk the app sends is the next chunk of the response's stream. A client that closes the
stream early is a client gone: the app's next ``receive()`` says
``http.disconnect`` (as a server says when the socket closes), and the app's task is awaited,
then cancelled if it does not end on its own. An error the app raises before it starts its
response is raised to the client, as ``httpx2.ASGITransport`` raises it; one it raises after
is raised from the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

import httpx2

from agentclaims._json import may_stream

__all__ = ["StreamingASGITransport"]

_Message = MutableMapping[str, Any]
_App = Callable[
    [_Message, Callable[[], Awaitable[_Message]], Callable[[_Message], Awaitable[None]]],
    Awaitable[None],
]

_END = object()
"""The app sent its last body chunk."""
_LEFT_S = 1.0
"""How long a left stream's app may take to end on its own before it is cancelled."""


class StreamingASGITransport(httpx2.AsyncBaseTransport):
    """Requests to ``app`` in this process, each answer streamed as the app sends it (see the
    module). ``client`` is the peer the app sees. A request whose body asks for no stream
    (``agentclaims._json.may_stream``) is answered as ``httpx2.ASGITransport`` answers it:
    the app runs to its end in the caller's task, with no task or queue of its own."""

    def __init__(self, app: _App, client: tuple[str, int] = ("127.0.0.1", 123)) -> None:
        self.app = app
        self.client = client
        self._whole = httpx2.ASGITransport(app=app, client=client)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        body = await request.aread()
        if not may_stream(body):
            return await self._whole.handle_async_request(request)
        url = request.url
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": request.method,
            "headers": [(k.lower(), v) for k, v in request.headers.raw],
            "scheme": url.scheme,
            "path": url.path,
            "raw_path": url.raw_path.split(b"?")[0],
            "query_string": url.query,
            "server": (url.host, url.port),
            "client": self.client,
            "root_path": "",
        }
        exchange = _Exchange(body)
        task = asyncio.ensure_future(self.app(scope, exchange.receive, exchange.send))
        task.add_done_callback(exchange.app_ended)
        try:
            await exchange.started.wait()
        except asyncio.CancelledError:  # the client gave up waiting: so does the app
            exchange.left.set()
            task.cancel()
            raise
        if exchange.status is None:  # it ended without starting a response
            exc = task.exception()
            if exc is not None:
                raise exc
            raise RuntimeError("the ASGI app ended without sending a response")
        return httpx2.Response(
            exchange.status, headers=exchange.headers, stream=_Body(exchange, task)
        )


class _Exchange:
    """One request's messages between the client and the app."""

    def __init__(self, body: bytes) -> None:
        self._body: bytes | None = body
        self.left = asyncio.Event()
        """The client closed the stream before its end."""
        self.started = asyncio.Event()
        """The app started its response, or ended without one."""
        self.status: int | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: asyncio.Queue[Any] = asyncio.Queue()

    async def receive(self) -> _Message:
        if self._body is not None:
            body, self._body = self._body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self.left.wait()  # nothing more comes from the client until it goes
        return {"type": "http.disconnect"}

    async def send(self, message: _Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.status = int(message["status"])
            self.headers = list(message.get("headers") or [])
            self.started.set()
        elif kind == "http.response.body":
            chunk = message.get("body", b"")
            if chunk:
                self.chunks.put_nowait(bytes(chunk))
            if not message.get("more_body", False):
                self.chunks.put_nowait(_END)

    def app_ended(self, task: asyncio.Future[None]) -> None:
        self.started.set()
        self.chunks.put_nowait(_END)  # after whatever it sent; a second end is never read


class _Body(httpx2.AsyncByteStream):
    """The response's body: the app's chunks as they come."""

    def __init__(self, exchange: _Exchange, task: asyncio.Future[None]) -> None:
        self._exchange = exchange
        self._task = task
        self._done = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks = self._exchange.chunks
        while not self._done:
            chunk = await chunks.get()
            if chunk is _END:
                self._done = True
                break
            yield chunk
        task = self._task
        with contextlib.suppress(Exception):
            await asyncio.shield(task)  # what the app does after its last chunk, done too
        if task.done() and not task.cancelled() and (exc := task.exception()) is not None:
            raise exc

    async def aclose(self) -> None:
        task = self._task
        if task.done():
            return
        self._exchange.left.set()  # the client went: the app hears http.disconnect
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(asyncio.shield(task), _LEFT_S)
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
