"""The HTTP transport that carries claims on every LLM call.

Give it to the OpenAI client (or LangChain's ``ChatOpenAI``) and every completion request made
inside a ``ClaimedSession`` is tagged with the session, workflow and node (read from LangGraph's
run metadata when the call happens inside a graph node, so prebuilt agents work unmodified),
sent to the session's backend, and its outcome handled: deferrals waited out, refusals answered
by the session's reaction policy, and the answer's prefix ids turned into the next claim.
Requests made outside any session pass straight through to the default backend (a refused
completion there raises ``ClaimRefused`` with the engine's detail). Streamed completions are
passed through chunk by chunk and read on the way (``_ObservedEvents``); synchronous clients
use ``SyncClaimsTransport``, which runs the same steps on the session's event loop.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import httpx2

from agentclaims import _json as fast_json
from agentclaims._json import may_stream
from agentclaims.contract import ArbiterAction
from agentclaims.errors import AgentClaimsError, BackendUnavailable, ClaimRefused, DeadlineExceeded
from agentclaims.protocol import EXTENSION_KEY, ActiveOutcome, outcome_from_error
from agentclaims.protocol.codec import raise_for_error
from agentclaims.session.portal import run_sync
from agentclaims.session.reactions import RetryRequested
from agentclaims.session.session import ClaimedSession, current_session

if TYPE_CHECKING:
    import tenacity

    from agentclaims.backends.base import Backend

__all__ = ["PLACEHOLDER_KEY", "ClaimsTransport", "SyncClaimsTransport"]

PLACEHOLDER_KEY = "agentclaims"
"""The API key ``openai_client`` gives the OpenAI client for a backend with none of its own
(the client insists on one): never sent on, so a gateway with keys answers that none came."""
_PLACEHOLDER_AUTH = f"Bearer {PLACEHOLDER_KEY}"

_COMPLETIONS = ("/chat/completions", "/completions", "/responses")
"""The calls a session claims on: chat and text completions, and the Responses API's."""
_DROP_HEADERS = ("content-encoding", "content-length", "transfer-encoding")


def _langgraph_metadata() -> Mapping[str, Any] | None:
    """LangChain's current run config metadata, if LangChain is in use (never imports it)."""
    module = sys.modules.get("langchain_core.runnables.config")
    if module is None:
        return None
    config = module.var_child_runnable_config.get()
    if not config:
        return None
    metadata = config.get("metadata")
    return metadata if isinstance(metadata, Mapping) else None


class ClaimsTransport(httpx2.AsyncBaseTransport):
    """An ``httpx2`` transport over a default backend (used when no session is active)."""

    def __init__(self, backend: Backend) -> None:
        self.default = backend

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        return await self.handle(request, current_session(), _langgraph_metadata())

    async def handle(
        self,
        request: httpx2.Request,
        session: ClaimedSession | None,
        metadata: Mapping[str, Any] | None,
        content: bytes | None = None,
    ) -> httpx2.Response:
        """Send ``request`` (its body ``content`` when already read) for ``session`` (the
        node from LangGraph's ``metadata``); ``handle_async_request`` reads both from the
        caller's context, ``SyncClaimsTransport`` passes those of its caller's thread."""
        suffix = self._suffix(request)
        if content is None:
            content = await request.aread()
        completion = request.method == "POST" and suffix.endswith(_COMPLETIONS)
        if session is None or not completion:
            response = await self._forward(self.default, request, suffix, content, stream=True)
            if completion and response.status_code in (409, 503):
                raise _refusal(await response.aread(), response.status_code)
            if response.status_code in (401, 403):  # the SDK's own error, as a session's calls
                raise_for_error(response.status_code, _json(await response.aread()))
            return _relayed(response, request, response.stream)
        # the client's bytes are sent as they are, the extension spliced in (re-encoding the
        # whole conversation on every call would cost in proportion to the context); most
        # calls are not even parsed (``_glance``): ``body`` then holds the extension alone
        glanced = _glance(content)
        model: Any
        if glanced is not None:
            body: dict[str, Any] = {}
            base: bytes | None = content
            streaming, model = False, glanced
        else:
            body = fast_json.loads(content or b"{}")
            whole = EXTENSION_KEY not in body and content.rstrip().endswith(b"}")
            base = content if whole else None
            streaming = body.get("stream") is True
            model = body.get("model")
        node = session.current_node(metadata)
        step = None if metadata is None else metadata.get("langgraph_step")
        await session.settle()
        ext = await session.prepare_call(node, step)
        body[EXTENSION_KEY] = {**(body.get(EXTENSION_KEY) or {}), **ext}
        started = session.clock()
        try:
            response, retried = await self._send_with_reactions(
                session, request, suffix, body, streaming, base
            )
        except BaseException:
            session.call_failed(ext["request_id"])
            raise
        if response.status_code != 200:
            session.call_failed(ext["request_id"])
            await response.aread()
            return _relayed(response, request, httpx2.ByteStream(response.content))

        async def answered(data: Mapping[str, Any], tools: list[str]) -> None:
            extension = data.get(EXTENSION_KEY) or {}
            await session.after_call(
                node,
                extension,
                # the chat usage (the Responses API's own counts differently: the gateway
                # puts the chat's in the ``agentclaims`` object)
                extension.get("usage") or data.get("usage") or {},
                latency_s=session.clock() - started,
                tool_names=tools,
                request_id=data.get("id"),
                retried=retried,
                model=model if isinstance(model, str) else None,
                call_id=ext["request_id"],
            )

        if streaming:
            return _relayed(response, request, _ObservedEvents(response, answered))
        data = fast_json.loads(await response.aread())
        await answered(data, _tool_names(data))
        return _relayed(response, request, httpx2.ByteStream(response.content))

    async def _send_with_reactions(
        self,
        session: ClaimedSession,
        request: httpx2.Request,
        suffix: str,
        body: dict[str, Any],
        streaming: bool = False,
        base: bytes | None = None,
    ) -> tuple[httpx2.Response, bool]:
        """The answer, and whether it needed a retry (deferred or refused first); ``base``:
        the client's own body bytes, when ``body`` is them plus the extension object."""

        def before_sleep(state: tenacity.RetryCallState) -> None:
            delay = state.next_action.sleep if state.next_action is not None else 0.0
            session.stats.deferrals += 1
            session.stats.deferral_s += delay
            exc = state.outcome.exception() if state.outcome is not None else None
            outcome = exc.outcome.to_dict() if isinstance(exc, RetryRequested) else None
            session.log_reaction(
                "defer", outcome=outcome, delay_s=round(delay, 6), attempt=state.attempt_number
            )

        # the first attempt goes outside the retry loop: most calls need none, and building
        # one costs more than the rest of the session's work on a call
        started = session.clock()
        try:
            return await self._attempt(session, request, suffix, body, streaming, base), False
        except RetryRequested as exc:
            first: RetryRequested | None = exc
        try:
            async for attempt in session.reaction.retrying(
                session.sleep, before_sleep, session.clock, started=started
            ):
                with attempt:
                    if first is not None:  # the loop's first attempt is the one made above
                        made, first = first, None
                        raise made
                    response = await self._attempt(session, request, suffix, body, streaming, base)
                    return response, True
        except RetryRequested as exc:
            session.stats.fails += 1
            session.log_reaction("fail", outcome=exc.outcome.to_dict(), reason="deadline")
            raise DeadlineExceeded(
                f"deferred past the {session.reaction.deadline_s}s deadline: "
                + exc.outcome.describe(),
                outcome=exc.outcome,
            ) from None
        raise AssertionError("unreachable: the retry loop returns or raises")

    async def _attempt(
        self,
        session: ClaimedSession,
        request: httpx2.Request,
        suffix: str,
        body: dict[str, Any],
        streaming: bool,
        base: bytes | None,
    ) -> httpx2.Response:
        """One try of a call: the answer, or ``RetryRequested`` where the session's reaction
        to its claim-scoped refusal is to wait and try again (``_react``)."""
        response = await self._forward_routed(session, request, suffix, body, streaming, base)
        if response.status_code in (409, 503):
            outcome = outcome_from_error(_json(await response.aread()))
            if outcome is not None:
                await self._react(session, outcome)
        return response

    async def _forward_routed(
        self,
        session: ClaimedSession,
        request: httpx2.Request,
        suffix: str,
        body: dict[str, Any],
        streaming: bool = False,
        base: bytes | None = None,
    ) -> httpx2.Response:
        """Forward to the session's backend; behind a router or in a pool, an instance that
        does not answer (a transport error, or a 5xx that is not a claim outcome) is failed
        over to another (``ClaimedSession.failover``), a bounded number of times: the call's
        claim then goes there, without what was planned for the other."""
        planned: str | None = None  # where the call was sent first
        while True:
            backend = session.backend
            planned = planned or backend.name
            ext = body.get(EXTENSION_KEY) or {}
            moved = not session.riding_to(ext.get("request_id"), backend)
            if moved or backend.name != planned:  # failed over since the call was planned
                ext.pop("release", None)  # for the instance it no longer goes to,
                ext.pop("events_since", None)  # as its events cursor was
            key = getattr(backend, "key", None)  # a fleet's routing key: also the body's user
            if isinstance(key, str) and base is not None and body.keys() == {EXTENSION_KEY}:
                body = {**fast_json.loads(base), **body}  # glanced at: the client's user is needed
            if isinstance(key, str) and str(body.get("user", key)).startswith(session.session_id):
                body["user"] = key
                base = None  # the body changed beyond its extension
            try:
                content = (
                    fast_json.dumps(body) if base is None else _spliced(base, body[EXTENSION_KEY])
                )
                response = await self._forward(backend, request, suffix, content, stream=streaming)
            except BackendUnavailable as exc:
                if await session.failover(str(exc)):
                    continue
                raise
            failed = response.status_code >= 500
            if failed and outcome_from_error(_json(await response.aread())) is None:
                reason = f"HTTP {response.status_code} from {backend.name}"
                if await session.failover(reason):
                    continue
            return response

    async def _react(self, session: ClaimedSession, outcome: ActiveOutcome) -> None:
        """Decide what to do with a refusal: raise RetryRequested to try again, or fail."""
        policy = session.reaction.on_refused
        if policy == "fail" or outcome.action is ArbiterAction.CAPACITY_REQUIRED:
            session.stats.fails += 1
            session.log_reaction("fail", outcome=outcome.to_dict())
            raise ClaimRefused(outcome.describe(), outcome=outcome)
        own = [cid for cid in outcome.blocking_claim_ids if cid.startswith(session.session_id)]
        if own and await session.relax_claims(own):
            raise RetryRequested(outcome, 0.0)  # a session never waits on its own claims
        if outcome.deferred:
            raise RetryRequested(outcome, outcome.retry_after_s)
        if policy == "reroute" and await session.reroute(outcome):
            raise RetryRequested(outcome, 0.0)
        raise RetryRequested(outcome, outcome.retry_after_s)

    def _suffix(self, request: httpx2.Request) -> str:
        base = _base_path(self.default.base_url)
        path = request.url.path
        return path[len(base) :] if path.startswith(base) else path

    async def _forward(
        self,
        backend: Backend,
        request: httpx2.Request,
        suffix: str,
        content: bytes,
        *,
        stream: bool = False,
    ) -> httpx2.Response:
        client = backend.http_client()
        url = _target(backend.base_url, suffix)
        if request.url.query:
            url = url.copy_with(query=request.url.query)
        # a backend with its own API key sends it, not the caller's
        key = _api_key(backend)
        drop = {"host", "content-length"} | ({"authorization"} if key else set())
        headers = [
            (k, v)
            for k, v in request.headers.items()
            if k.lower() not in drop
            and not (k.lower() == "authorization" and v == _PLACEHOLDER_AUTH)
        ]
        if key:
            headers.append(("authorization", f"Bearer {key}"))
        outgoing = client.build_request(request.method, url, headers=headers, content=content)
        try:
            return await client.send(outgoing, stream=stream)
        except httpx2.TransportError as exc:
            raise BackendUnavailable(f"backend {backend.name!r} unreachable: {exc!r}") from exc


@functools.lru_cache(maxsize=64)
def _base_path(base_url: str) -> str:
    """The path of a backend's base URL, without its trailing slash (parsed once per URL)."""
    return httpx2.URL(base_url).path.rstrip("/")


@functools.lru_cache(maxsize=256)
def _target(base_url: str, suffix: str) -> httpx2.URL:
    """Where a call to ``suffix`` goes on the backend at ``base_url`` (parsed once per pair:
    a URL is immutable)."""
    return httpx2.URL(base_url.rstrip("/") + suffix)


_MODEL = re.compile(rb'"model"\s*:\s*"([^"\\]*)"')
_EXTENSION = b'"' + EXTENSION_KEY.encode() + b'"'


def _glance(content: bytes) -> str | None:
    """The ``model`` of a JSON object body asking for no stream, read without parsing its
    conversation; ``None`` where that is not certain (the body is parsed then): a body that
    may ask for a stream (``may_stream``), has the ``agentclaims`` key, or has not exactly
    one ``"model": "..."`` without escapes (a quote in a JSON string is escaped, so the
    pattern matches a key)."""
    if not content.rstrip().endswith(b"}") or _EXTENSION in content or may_stream(content):
        return None
    models = _MODEL.findall(content)
    return models[0].decode() if len(models) == 1 else None


def _spliced(base: bytes, ext: Mapping[str, Any]) -> bytes:
    """The JSON object ``base`` with the ``agentclaims`` member ``ext`` added at its end."""
    head = base.rstrip()[:-1].rstrip()
    sep = b"" if head.endswith(b"{") else b","
    return head + sep + _EXTENSION + b":" + fast_json.dumps(ext) + b"}"


def _api_key(backend: Backend) -> str | None:
    key = getattr(backend, "api_key", None)
    return key if isinstance(key, str) and key else None


def _json(raw: bytes) -> Any:
    """``raw`` as JSON, or ``None`` when it is not (an outcome is then not read from it)."""
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _relayed(
    response: httpx2.Response, request: httpx2.Request, stream: httpx2.AsyncByteStream | Any
) -> httpx2.Response:
    """``response`` handed back to the client: its status and headers over ``stream``."""
    headers = [(k, v) for k, v in response.headers.items() if k.lower() not in _DROP_HEADERS]
    return httpx2.Response(response.status_code, headers=headers, stream=stream, request=request)


def _refusal(raw: bytes, status: int) -> AgentClaimsError:
    """The SDK's own error for a request refused or deferred outside any session (there is
    no reaction policy to apply): the engine's detail (shortfall, blocking claims) in it; a
    503 that is no claim outcome (the gateway stopping, its engine unreachable) is the error
    it names (``ServiceUnavailable``)."""
    outcome = outcome_from_error(_json(raw))
    if outcome is None:
        body = _json(raw)
        if isinstance(body, Mapping) and isinstance(body.get("error"), Mapping):
            try:
                raise_for_error(status, body)
            except AgentClaimsError as exc:
                return exc
        return ClaimRefused(f"HTTP {status}: {raw[:200].decode(errors='replace')}")
    return ClaimRefused(
        f"{outcome.describe()} (outside any ClaimedSession: no reaction applies)", outcome=outcome
    )


Answered = Callable[[Mapping[str, Any], list[str]], Awaitable[None]]


def _tool_names(data: Mapping[str, Any]) -> list[str]:
    """The tools an answer calls: a chat completion's ``tool_calls``, or a response's
    ``function_call`` items."""
    if "output" in data and "choices" not in data:
        return [
            str(item["name"])
            for item in data.get("output") or ()
            if isinstance(item, Mapping) and item.get("type") == "function_call" and "name" in item
        ]
    message = (data.get("choices") or [{}])[0].get("message") or {}
    return [c["function"]["name"] for c in message.get("tool_calls") or () if "function" in c]


class _ObservedEvents(httpx2.AsyncByteStream):
    """A streamed completion (server-sent events) passed through chunk by chunk, read on
    the way: the tool calls of its deltas, its usage and the ``agentclaims`` object of its
    last chunk, handed to ``answered`` once the stream ends (or is closed early)."""

    def __init__(self, response: httpx2.Response, answered: Answered) -> None:
        self._response = response
        self._answered = answered
        self._pending = b""
        self._final: dict[str, Any] = {}
        self._tools: dict[int, str] = {}
        self._done = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.aiter_raw():
                self._read(chunk)
                yield chunk
        finally:
            await self.aclose()

    def _read(self, chunk: bytes) -> None:
        self._pending += chunk
        *lines, self._pending = self._pending.split(b"\n")
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if not payload or payload == b"[DONE]":
                continue
            try:
                data = fast_json.loads(payload)
            except json.JSONDecodeError:
                continue
            if not isinstance(data, dict):
                continue
            if data.get("type") in ("response.completed", "response.incomplete"):
                done = data.get("response") or {}  # the Responses API's last event
                for key in ("id", EXTENSION_KEY):
                    if done.get(key):
                        self._final[key] = done[key]
                self._tools.update(enumerate(_tool_names(done)))
                continue
            for key in ("id", "usage", EXTENSION_KEY):
                if data.get(key):
                    self._final[key] = data[key]
            for choice in data.get("choices") or ():
                for call in (choice.get("delta") or {}).get("tool_calls") or ():
                    name = (call.get("function") or {}).get("name")
                    if name:
                        self._tools[int(call.get("index") or 0)] = name

    async def aclose(self) -> None:
        if self._done:
            return
        self._done = True
        await self._response.aclose()
        await self._answered(self._final, [self._tools[i] for i in sorted(self._tools)])


class SyncClaimsTransport(httpx2.BaseTransport):
    """The claims transport for synchronous clients (``ChatOpenAI``'s ``invoke``/``stream``
    from a ``def`` node, ``openai.OpenAI``): each request runs through ``ClaimsTransport`` on
    the session's event loop (or, outside a session, on the portal's:
    ``agentclaims.session.portal``), with the session and LangGraph node of the calling
    thread. A streamed answer is handed back chunk by chunk as the loop reads it."""

    def __init__(self, backend: Backend) -> None:
        self.inner = ClaimsTransport(backend)

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        content = request.read()
        session = current_session()
        metadata = _langgraph_metadata()
        loop = None if session is None else session.loop
        response = run_sync(
            self.inner.handle(request, session, metadata, content), loop=loop, what="invoke"
        )
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            stream=_SyncChunks(response, loop),
            request=request,
        )


class _SyncChunks(httpx2.SyncByteStream):
    """An async response's body read from synchronous code, a chunk at a time, on ``loop``."""

    def __init__(self, response: httpx2.Response, loop: Any) -> None:
        self._chunks = response.aiter_raw()
        self._response = response
        self._loop = loop
        self._closed = False

    def __iter__(self) -> Iterator[bytes]:
        try:
            while True:
                try:
                    yield run_sync(_next_chunk(self._chunks), loop=self._loop, what="stream")
                except StopAsyncIteration:
                    return
        finally:
            self.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            run_sync(self._response.aclose(), loop=self._loop, what="stream")


async def _next_chunk(chunks: AsyncIterator[bytes]) -> bytes:
    return await chunks.__anext__()
