"""``PlainRoute``: a plain OpenAI completion answered with the least work that keeps it whole.

Most of an agent framework's LLM calls through the vLLM gateway are plain: no ``agentclaims``
object, not streamed. Between the wait on vLLM and the answer, vLLM's model run sweeps the
shared CPU cache, so the gateway's code after it runs cold and each object or step it makes
costs several times what it costs warm (docs/vllm.md, "a fourth look"). This route
answers such a call straight from the ASGI scope: the same checks, the same request to vLLM,
the same prompt book and the same answer, byte for byte, as the general route's
(``CompletionRoutes``), without Starlette's request and response, the call's and the
outcome's objects, or the tenants' plumbing.

It takes a call only where it can answer it as the general route would: on a gateway without
tenants or a ledger (``create_app`` wires it only there), for a body that is a plain call by
its fields, while no claim operation waits to ride. Anything else, and any body the checks
refuse, goes to the general route, which reads the body again from where this one kept it
and answers as always. Once the request has gone to vLLM, the call is this route's: an error
is answered as the general route answers it (``on_error``), and an answer the connector spoke
to (a refusal, a deferral, events) is booked and answered the general way.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from agentclaims import _json
from agentclaims.contract import ArbiterAction, Feasibility, RequestId
from agentclaims.errors import AgentClaimsError
from agentclaims.gateway.completions import CompletionRoutes
from agentclaims.gateway.limits import Limits, parse_body
from agentclaims.gateway.metrics import GatewayMetrics
from agentclaims.gateway.streaming import stream_requested
from agentclaims.protocol import EXTENSION_KEY, ActiveOutcome, Written, timing
from agentclaims.protocol.writer import CompletionKind, PlainReply, check_body

__all__ = ["PlainRoute", "PlainWrite"]

PlainWrite = Callable[[CompletionKind, Mapping[str, Any]], Awaitable[Any]]
"""A reply writer's plain path (``CompletionForwarder.plain``): ``None`` when it will not take
the call, a ``Written`` to answer the general way, else a ``PlainReply``."""

_ROUTES: dict[str, tuple[CompletionKind, str]] = {
    "/v1/chat/completions": ("chat", "POST /v1/chat/completions"),
    "/v1/completions": ("completion", "POST /v1/completions"),
}
"""Each completion path: its kind and its name in the gateway's counts and metrics."""
_SERVED = ActiveOutcome(
    RequestId(""), ArbiterAction.SERVE_ACTIVE_PRESERVE_RESIDENT, Feasibility.FEASIBLE
).to_dict()
"""A served outcome's JSON form, from the type itself: a plain call's fills in its request
and block counts."""


_PLAIN_FIELDS = frozenset({"cache_salt", "prompt_cache_key", "prompt_cache_retention"})
"""Fields a plain call does not carry (each asks the general route for something)."""


class PlainRoute:
    """The plain-call route in front of the general completion routes."""

    def __init__(
        self,
        write: PlainWrite,
        routes: CompletionRoutes,
        limits: Limits,
        calls: Counter[str],
        prometheus: GatewayMetrics,
        instance_headers: list[tuple[bytes, bytes]],
        on_error: Callable[[Request, Exception], Awaitable[Response]],
    ) -> None:
        self._write = write
        self._routes = routes
        self._limits = limits
        self._calls = calls
        self._prometheus = prometheus
        self._instance = instance_headers
        self._on_error = on_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> Receive | None:
        """Answer the call if it is a plain one: ``None`` once answered; else the ``receive``
        the general route reads the body from (what was read here comes first)."""
        kind, name = _ROUTES[scope["path"]]
        started = time.perf_counter()
        raw, receive = await self._read(scope, receive)
        if raw is None or self._routes.service.stopping:
            return receive
        try:
            body = parse_body(raw, self._limits)
            check_body(kind, body)
            streamed = stream_requested(body)
        except AgentClaimsError:
            return receive  # refused the general way, with its message
        if streamed or EXTENSION_KEY in body or not _PLAIN_FIELDS.isdisjoint(body):
            return receive
        waited = timing.track()
        reply = None
        try:
            reply = await self._write(kind, body)
            if reply is None:
                return receive  # an operation rides on it: the general route carries it
            self._calls[name] += 1
            if isinstance(reply, Written):  # booked the general way: answered the same way
                request = Request(scope, receive, send)
                response = await self._routes.answer(
                    request, body, reply, {}, None, None, [], False
                )
                headers, out, status = response.raw_headers, response.body, response.status_code
            else:
                headers, out = self._answer(reply)
                status = 200
        except AgentClaimsError as exc:  # after the request went: answered as the general route
            if reply is None:  # counted once it was answered
                self._calls[name] += 1
            response = await self._on_error(Request(scope, receive, send), exc)
            await response(scope, receive, send)
            self._prometheus.observe(name, time.perf_counter() - started)
            return None
        spent = timing.server_timing(time.perf_counter() - started, waited[0])
        headers = [*headers, *self._instance, (b"server-timing", spent.encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": out})
        self._prometheus.observe(name, time.perf_counter() - started)
        return None

    def _answer(self, reply: PlainReply) -> tuple[list[tuple[bytes, bytes]], bytes]:
        """A plain reply's headers and JSON: the payload with its ``agentclaims`` object, as
        ``CompletionRoutes`` writes a served call's with no claims."""
        outcome = _SERVED | {
            "request_id": reply.request_id,
            "hit_blocks": reply.hit_blocks,
            "computed_blocks": reply.computed_blocks,
        }
        payload = reply.payload
        prefix_ids: dict[str, Any] = {
            "prompt": reply.prompt,
            "sequence": reply.sequence,
            "messages": [],
        }
        payload[EXTENSION_KEY] = self._routes.extension_of(
            outcome, prefix_ids, [], reply.events_seq
        )
        out = _json.dumps(payload)
        headers = [
            (b"content-length", str(len(out)).encode()),
            (b"content-type", b"application/json"),
        ]
        return headers, out

    async def _read(self, scope: Scope, receive: Receive) -> tuple[bytes | None, Receive]:
        """The body, when its ``content-length`` says it is within the limit (a body without
        one, or past it, is the general route's to refuse before reading more), and a
        ``receive`` that gives again what was read, then the rest."""
        most = self._limits.max_body_bytes
        length = None
        for key, value in scope["headers"]:
            if key == b"content-length":
                length = value
                break
        if length is None or not length.isdigit() or int(length) > most:
            return None, receive
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                return None, _again(messages, receive)
            size += len(message.get("body", b""))
            if size > most:
                return None, _again(messages, receive)
            if not message.get("more_body", False):
                break
        raw = (
            messages[0].get("body", b"")
            if len(messages) == 1
            else b"".join(m.get("body", b"") for m in messages)
        )
        return raw, _again([{"type": "http.request", "body": raw, "more_body": False}], receive)


def _again(messages: list[Message], receive: Receive) -> Receive:
    """A ``receive`` that gives ``messages`` first, then what ``receive`` gives."""
    pending = list(messages)

    async def again() -> Message:
        return pending.pop(0) if pending else await receive()

    return again
