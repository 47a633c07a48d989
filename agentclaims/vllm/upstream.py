"""One vLLM server's HTTP API as the gateway calls it: JSON in and out over a pool of
keep-alive connections (aiohttp's client), every wait counted as upstream time.

The gateway pays this client's CPU on every proxied request, so it is the lean one: with
aiohttp's client (its HTTP parser in C) the gateway takes about a third less CPU per proxied
request than with httpx2's (docs/vllm.md, "Gateway added latency"). A connection is kept at most ``KEEP_ALIVE_S`` idle,
less than vLLM's own idle timeout (uvicorn's 5 s), so the client never reuses a connection
the server is closing.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import TYPE_CHECKING, Any

from agentclaims import _json
from agentclaims.errors import BackendUnavailable, UsageError
from agentclaims.protocol import timing

if TYPE_CHECKING:
    import aiohttp

__all__ = ["ENGINE_DEAD", "KEEP_ALIVE_S", "MAX_CONNECTIONS", "SseFramer", "Stream", "Upstream"]

KEEP_ALIVE_S = 3.0
"""How long an idle connection to vLLM is kept for reuse (vLLM closes them after 5 s)."""
MAX_CONNECTIONS = 256
"""Connections open to one server at most: a request past them waits for one to come free
(within its timeout)."""

_JSON = {"content-type": "application/json"}
ENGINE_DEAD = b"EngineCore encountered an issue"
"""The start of vLLM's own message for a dead engine (``EngineDeadError``, an HTTP 500)."""


def _check_url(url: str) -> None:
    """A ``UsageError`` (field ``upstream``) unless ``url`` is an http(s) URL with a host and,
    if it names one, a port within 1..65535."""
    from urllib.parse import urlsplit

    problem = None
    if not url.startswith(("http://", "https://")):
        problem = "must be the server's http(s) URL"
    else:
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            problem = f"is not a URL ({exc})"
        else:
            if not parts.hostname:
                problem = "names no host"
            elif port == 0:
                problem = "names port 0"
    if problem is not None:
        raise UsageError("upstream", f"{problem}, got {url!r}")


class Upstream:
    """JSON requests to one HTTP server (``base_url``, no trailing ``/v1``).

    Transport failures (refused, reset, timed out) raise ``BackendUnavailable`` naming the
    server; any HTTP status comes back with the body, parsed when it is JSON and else as
    ``{"error": {"message": <text>}}``: what a status means is the caller's to say."""

    def __init__(
        self, base_url: str, *, timeout_s: float = 120.0, max_connections: int = MAX_CONNECTIONS
    ) -> None:
        _check_url(base_url)
        if not timeout_s > 0:
            raise UsageError("timeout_s", f"must be positive, got {timeout_s!r}")
        if isinstance(max_connections, bool) or not (
            isinstance(max_connections, int) and max_connections >= 1
        ):
            raise UsageError("max_connections", f"must be at least 1, got {max_connections!r}")
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self.on_engine_dead: Callable[[str, bool], None] | None = None
        """Called when vLLM's engine is dead, with what was seen and whether it was a refused
        connection (no vLLM listens: it stopped, or died) rather than vLLM's own 500 for a
        dead engine."""

    def _client(self) -> aiohttp.ClientSession:
        # made on first use: an aiohttp session belongs to the event loop that runs it
        if self._session is None or self._session.closed:
            import aiohttp

            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self.max_connections, keepalive_timeout=KEEP_ALIVE_S
                ),
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    def _failed(self, exc: BaseException) -> BackendUnavailable:
        """The error a transport failure is (a refused connection also says the engine may
        be dead: ``on_engine_dead``)."""
        import aiohttp

        if isinstance(exc, aiohttp.ClientConnectorError) and self.on_engine_dead:
            self.on_engine_dead(f"vLLM at {self.base_url} refused the connection: {exc}", True)
        why = str(exc) or type(exc).__name__  # aiohttp's own words, not its repr
        return BackendUnavailable(f"vLLM at {self.base_url} unreachable: {why}")

    def _dead_if(self, status: int, raw: bytes) -> None:
        if status == 500 and ENGINE_DEAD in raw and self.on_engine_dead is not None:
            self.on_engine_dead(f"vLLM at {self.base_url} answered: {ENGINE_DEAD.decode()}", False)

    async def stream(self, path: str, body: Mapping[str, Any]) -> Stream:
        """``POST path`` with ``body`` as JSON, answered with server-sent events: the
        ``Stream`` of its events once the status is in (any status but 200 comes with its body,
        read whole). Each wait for the next event may take up to ``timeout_s``; the stream as
        a whole has no limit. Closing the stream early closes its connection, and vLLM aborts
        the request."""
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=None, sock_read=self.timeout_s)
        data = _json.dumps(body)
        started = time.perf_counter()
        try:
            response = await self._client().post(
                self.base_url + path, data=data, headers=_JSON, timeout=timeout
            )
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise self._failed(exc) from exc
        finally:
            timing.waited(time.perf_counter() - started)
        stream = Stream(self, response)
        if response.status != 200:
            try:
                stream.error = await response.read()
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                raise self._failed(exc) from exc
            finally:
                response.release()
            self._dead_if(response.status, stream.error)
        return stream

    async def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
    ) -> tuple[int, bytes]:
        """``method path`` (with ``body`` as JSON): the status and the raw body."""
        import aiohttp

        url = self.base_url + path
        data = None if body is None else _json.dumps(body)
        timeout = None if timeout_s is None else aiohttp.ClientTimeout(total=timeout_s)
        started = time.perf_counter()
        try:
            async with self._client().request(
                method,
                url,
                data=data,
                headers=_JSON if data is not None else None,
                timeout=timeout,
            ) as response:
                status, raw = response.status, await response.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise self._failed(exc) from exc
        finally:
            timing.waited(time.perf_counter() - started)
        self._dead_if(status, raw)
        return status, raw

    async def get(self, path: str, *, timeout_s: float | None = None) -> tuple[int, Any]:
        """``GET path``: the status and the body (JSON parsed; see the class)."""
        status, raw = await self.request("GET", path, timeout_s=timeout_s)
        return status, _parsed(raw)

    async def get_text(self, path: str, *, timeout_s: float | None = None) -> tuple[int, str]:
        """``GET path``: the status and the body as text (``/metrics``)."""
        status, raw = await self.request("GET", path, timeout_s=timeout_s)
        return status, raw.decode(errors="replace")

    async def post(self, path: str, body: Mapping[str, Any]) -> tuple[int, Any]:
        """``POST path`` with ``body`` as JSON: the status and the body (see the class)."""
        status, raw = await self.request("POST", path, body)
        return status, _parsed(raw)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class Stream:
    """One streamed answer (``Upstream.stream``): ``status``; for a 200, its events' ``data``
    payloads parsed as JSON, in order, up to ``[DONE]`` (``batches()``); else ``error``, the
    body (``body()`` parses it). ``aclose()`` ends it early (idempotent)."""

    def __init__(self, upstream: Upstream, response: aiohttp.ClientResponse) -> None:
        self._upstream = upstream
        self._response = response
        self.status = response.status
        self.error: bytes | None = None

    def body(self) -> Any:
        return _parsed(self.error or b"")

    async def batches(self) -> AsyncGenerator[list[dict[str, Any]], None]:
        """The events, in order, a batch per read of the connection: every event whose bytes
        had come when the gateway got to read them (one, while it keeps up with vLLM; several
        where it fell behind, so it writes them on in one piece). It never waits for more
        than what has come."""
        import aiohttp

        framer = SseFramer()
        try:
            async for data in self._response.content.iter_any():
                batch = framer.feed(data)
                if batch:
                    yield batch
                if framer.done:
                    return
            batch = framer.end()
            if batch:
                yield batch
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise self._upstream._failed(exc) from exc

    async def aclose(self) -> None:
        self._response.close()


class SseFramer:
    """A server-sent event stream's ``data:`` objects as its bytes come, in any pieces:
    ``feed`` a piece, get the objects of the lines it completed; ``end`` takes the last line
    if it had no newline. Other lines, and payloads that are not JSON objects, are skipped;
    ``done`` once ``[DONE]`` came (nothing after it is read)."""

    __slots__ = ("_pending", "done")

    def __init__(self) -> None:
        self._pending = b""
        self.done = False

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        if self.done:
            return []
        *lines, self._pending = (self._pending + data).split(b"\n")
        return self._objects(lines)

    def end(self) -> list[dict[str, Any]]:
        pending, self._pending = self._pending, b""
        return [] if self.done or not pending else self._objects([pending])

    def _objects(self, lines: list[bytes]) -> list[dict[str, Any]]:
        batch: list[dict[str, Any]] = []
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                break
            try:
                event = _json.loads(payload)
            except ValueError:
                continue
            if isinstance(event, dict):
                batch.append(event)
        return batch


def _parsed(raw: bytes) -> Any:
    try:
        return _json.loads(raw)
    except ValueError:
        return {"error": {"message": raw[:500].decode(errors="replace")}}
