"""The gateway's ASGI app: OpenAI-compatible completions with claims, and the claims API.

One server implementation: ``EmbeddedBackend`` reaches it in-process through an ASGI
transport, ``agentclaims serve`` puts it on a port. docs/gateway.md is the wire protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from agentclaims.contract import SCHEMA_VERSION
from agentclaims.engine import ReferenceKV
from agentclaims.errors import AgentClaimsError, ServiceUnavailable, UsageError
from agentclaims.gateway.anthropic import MessagesRoute, anthropic_error, anthropic_path
from agentclaims.gateway.claim_routes import ClaimRoutes
from agentclaims.gateway.completions import CompletionRoutes
from agentclaims.gateway.extension import Extension, Instance
from agentclaims.gateway.ledger import Ledger
from agentclaims.gateway.limits import BodyTooLarge, Limits
from agentclaims.gateway.metrics import CONTENT_TYPE, GatewayMetrics
from agentclaims.gateway.openapi import openapi
from agentclaims.gateway.params import TENANT_SCOPE_KEY, header, json_object, tenant_of
from agentclaims.gateway.queueing import DEFAULT_PROMOTED, SHARE, Promotions, engine_orders
from agentclaims.gateway.responses import ResponsesRoute
from agentclaims.gateway.service import Service
from agentclaims.gateway.sides import KVSide
from agentclaims.gateway.streaming import JSONResponse
from agentclaims.gateway.tenants import TenantKeys
from agentclaims.gateway.text import TextSide
from agentclaims.gateway.writer import ScriptedWriter, TokenizingKV
from agentclaims.lowering import (
    SELF_TEST,
    LoweringSource,
    ServedLowering,
    reference_descriptor,
    serve_lowering,
)
from agentclaims.protocol import (
    EVENTS_RIDE_ON_ANSWERS,
    EXTENSION_KEY,
    INSTANCE_HEADER,
    INSTANCE_URL_HEADER,
    ROUTER_SAFE_HEADER,
    error_body,
    exception_error,
    timing,
)
from agentclaims.protocol.writer import CompletionKind, ReplyWriter

__all__ = [
    "INSTANCE_HEADER",
    "INSTANCE_URL_HEADER",
    "ROUTER_SAFE_HEADER",
    "Extension",
    "Instance",
    "KVSide",
    "create_app",
]

Handler = Callable[[Request], Awaitable[Response]]


class _Gateway:
    """The gateway over one KV side and its reply writer: the introspection routes and the
    plumbing every route goes through. The completions (``CompletionRoutes``) and the claims
    API (``ClaimRoutes``) have their own."""

    def __init__(
        self,
        kv: KVSide,
        writer: ReplyWriter,
        name: str,
        lowering: LoweringSource | None,
        service: Service,
        instance: Instance,
        promotions: Promotions,
        limits: Limits,
    ) -> None:
        self.kv = kv
        self.writer = writer
        self.service = service
        self.instance = instance
        self._instance_headers = instance.raw_headers  # on every answer: built once
        self.limits = limits
        self.name = name
        self._lowering_source = lowering
        self._lowering: ServedLowering | None = None
        self.calls: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.prometheus = GatewayMetrics(self.stats)
        self.completion_routes = CompletionRoutes(
            kv, writer, service, instance, self.errors, promotions
        )
        self.claim_routes = ClaimRoutes(kv, service)

    # ------------------------------------------------------------------ introspection
    async def descriptor(self, request: Request) -> Response:
        """The KV side's facts, its lowering descriptor and the runs it read (``lowering``),
        and per mode the class the lowering checker gave it (``modes``): never a class taken
        on trust, ``unknown`` for every mode of a KV side without a descriptor."""
        lowering = await self.lowering()
        return JSONResponse(
            {
                "name": self.name,
                "schema_version": SCHEMA_VERSION,
                "extension_key": EXTENSION_KEY,
                "text_side": self.writer.model_name,
                **await self.kv.descriptor(),
                EVENTS_RIDE_ON_ANSWERS: True,  # every KV side's, through the gateway
                # none of a reader's own events is at or before it (a process's first
                # session starts its reads there, not at 0)
                "events_seq": await self.service.last_seq(),
                "lowering": lowering.section,
                "modes": lowering.modes,
            }
        )

    async def lowering(self) -> ServedLowering:
        """The KV side's descriptor, checked once. The reference engine's is the one shipped
        with it, its ``self_test:reference_engine`` run made on a scratch engine of the same
        block size (about 30 ms, once per process): at start-up (``create_app``'s lifespan),
        so no request waits for the conformance suite."""
        if self._lowering is None:
            kv = self.kv
            start = getattr(kv, "start", None)
            if callable(start):  # a KV side on a real runtime learns its version first
                await start()
            source = self._lowering_source
            if source is None:
                source = getattr(kv, "lowering", None)
            runs: dict[str, dict[str, str]] = {}
            if source is None and isinstance(kv, ReferenceKV):
                from agentclaims.conformance import self_test

                source = reference_descriptor()
                runs[SELF_TEST] = dict((await self_test(kv.block_size))["levels"])
            self._lowering = serve_lowering(
                source,
                name=kv.name,
                runs=runs,
                runtime_version=getattr(kv, "runtime_version", None),
            )
        return self._lowering

    async def models(self, request: Request) -> Response:
        model = {
            "id": self.writer.model_name,
            "object": "model",
            "created": 0,
            "owned_by": self.name,
        }
        return JSONResponse({"object": "list", "data": [model]})

    async def health(self, request: Request) -> Response:
        """Whether the gateway can take work: its KV side answers and its ledger is usable
        (503 and ``status: unavailable`` otherwise, or while it shuts down)."""
        probe = getattr(self.kv, "health", None)
        kv = await probe() if callable(probe) else {"usable": True}
        ledger = self.service.health()
        ok = bool(kv.get("usable")) and bool(ledger.get("usable")) and not self.service.stopping
        body = {
            "status": "ok" if ok else ("stopping" if self.service.stopping else "unavailable"),
            "kv_side": self.kv.name,
            "text_side": self.writer.model_name,
            "kv": kv,
            "ledger": ledger,
            "tenants": None if self.service.keys is None else len(self.service.keys.tenants),
        }
        return JSONResponse(body, status_code=200 if ok else 503)

    def stats(self) -> dict[str, Any]:
        """The gateway's counters and its KV side's figures, as one JSON object."""
        gateway = {
            "calls": dict(sorted(self.calls.items())),
            "errors": dict(sorted(self.errors.items())),
            "promotions": {
                **self.completion_routes.promotions.stats(),
                "engine_orders_by_priority": engine_orders(self.writer),
            },
        }
        metrics = getattr(self.kv, "metrics", None)
        return {
            "gateway": gateway,
            **(metrics() if callable(metrics) else {}),
            **self.service.stats(),
        }

    async def stats_route(self, request: Request) -> Response:
        return JSONResponse(self.stats())

    async def metrics(self, request: Request) -> Response:
        """The same figures in the Prometheus text format (prometheus-client)."""
        return Response(self.prometheus.render(), media_type=CONTENT_TYPE)

    # ------------------------------------------------------------------ plumbing
    def counted(self, name: str, handler: Handler) -> Handler:
        """The route's handler behind the service's checks (``admit``), counted and timed."""
        open_route = name in _OPEN_ROUTES

        async def run(request: Request) -> Response:
            self.calls[name] += 1
            started = time.perf_counter()
            waited = timing.track()
            try:
                if not open_route:
                    await self.admit(request, name)
                response = await handler(request)
            except asyncio.CancelledError:
                if not self.service.stopping:  # a caller's own cancellation stays one
                    raise
                return await self.on_error(request, _cut_off())  # the stop cut it off
            else:
                self._stamp(response, started, waited[0])
                return response
            finally:
                self.prometheus.observe(name, time.perf_counter() - started)

        return run

    def _stamp(self, response: Response, started: float, upstream_s: float) -> None:
        """The gateway's headers on an answer: its instance and its ``Server-Timing``."""
        spent = timing.server_timing(time.perf_counter() - started, upstream_s)
        response.raw_headers += [*self._instance_headers, (b"server-timing", spent.encode())]

    async def admit(self, request: Request, name: str) -> None:
        """What a call of any route but the open ones goes through: not while stopping
        (503), the caller's key (401 without one; ``x-api-key`` as Anthropic's clients send
        it), an operator key for operator routes (403), and the ledger accounted for before
        the first operation."""
        service = self.service
        service.check_open()
        tenant = None
        if service.keys is not None:
            auth = header(request, b"authorization")
            if auth is None and (key := header(request, b"x-api-key")):
                auth = f"Bearer {key}"
            tenant = service.tenant(auth)
        request.scope[TENANT_SCOPE_KEY] = tenant
        if name in _OPERATOR_ROUTES:
            TenantKeys.require_admin(tenant, name)
        await service.ready()

    async def complete(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A completion call's way in (``POST /v1/chat/completions`` and ``/v1/completions``,
        every agent's LLM call), as a counted route goes in one frame: admitted, its body
        read within the limits, taken by the one completion pipeline
        (``CompletionRoutes.completion_of``), answered with the gateway's timing."""
        kind, name = _COMPLETIONS[scope["path"]]
        self.calls[name] += 1
        started = time.perf_counter()
        waited = timing.track()
        request = Request(scope, receive, send)
        try:
            try:
                await self.admit(request, name)
                body = await json_object(request, self.limits)
                response = await self.completion_routes.completion_of(request, kind, body)
            except AgentClaimsError as exc:  # as Starlette's exception handler answers it
                response = await self.on_error(request, exc)
            except asyncio.CancelledError:
                if not self.service.stopping:  # a caller's own cancellation stays one
                    raise
                response = await self.on_error(request, _cut_off())  # the stop cut it off
            else:
                self._stamp(response, started, waited[0])
            await response(scope, receive, send)
        finally:
            self.prometheus.observe(name, time.perf_counter() - started)

    async def on_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, AgentClaimsError)
        status, body = exception_error(exc)
        body = self.service.namespace.shown_body(
            body, tenant_of(request)
        )  # its own ids, as it named them
        if isinstance(exc, BodyTooLarge):
            status = 413
        self.errors[body["error"]["type"]] += 1
        if anthropic_path(request):  # an Anthropic client's call: that API's shape
            return anthropic_error(status, body, self.instance.headers)
        return JSONResponse(body, status_code=status, headers=self.instance.headers)

    async def on_http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = "not_found" if exc.status_code == 404 else "http_error"
        self.errors[kind] += 1
        body = error_body(kind, f"{request.method} {request.url.path}: {exc.detail}")
        if anthropic_path(request):
            return anthropic_error(exc.status_code, body, self.instance.headers)
        return JSONResponse(body, status_code=exc.status_code, headers=self.instance.headers)


class _GatewayApp(Starlette):
    """The gateway's Starlette app, with the completion calls (every agent's LLM call) sent
    straight to their way in (``_Gateway.complete``), without the walk through the routing
    table and the middleware stack, which cost a proxied request about a fifth of the
    gateway's own CPU. Every other route goes the usual way."""

    gateway: _Gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in _COMPLETIONS:
            scope["app"] = self
            await self.gateway.complete(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def create_app(
    kv: KVSide,
    text: TextSide | None = None,
    *,
    name: str = "agentclaims-gateway",
    lowering: LoweringSource | None = None,
    limits: Limits | None = None,
    keys: TenantKeys | None = None,
    ledger: Ledger | None = None,
    instance: Instance | None = None,
    promote: int = DEFAULT_PROMOTED,
    promote_share: float | None = None,
) -> Starlette:
    """The gateway app over a KV side (e.g. ``ReferenceKV``) and a text side (``ScriptedModel``)
    that writes the replies; without ``text`` the KV side writes its own (``VllmKV``: a
    ``ReplyWriter``).

    ``lowering`` is the KV side's lowering descriptor (a document, or a YAML or JSON file whose
    ``conformance_run`` anchors are read beside it), checked once for ``/v1/descriptor``; by
    default the KV side's own ``lowering`` attribute, the shipped one for the reference engine,
    and else none: every mode ``unknown``. ``keys`` makes it serve tenants (``TenantKeys``),
    ``ledger`` keeps claims and events across restarts (``Ledger``); docs/operations.md.
    ``instance`` names it in a fleet behind a router (docs/fleet.md). The app's stop (its
    lifespan's end, under any ASGI server) closes the KV side (``aclose``: vLLM's side its
    connections and its KV events reader). ``promote``: how many
    workflow calls at most go ahead in the engine's queue at once (0: none), ``promote_share``
    the share of each second they may put the calls they overtake back by (``SHARE`` by
    default; ``agentclaims.gateway.queueing``)."""
    limits = limits or Limits()
    share = SHARE if promote_share is None else promote_share
    promotions = Promotions(promote, share=share)  # a bad bound refused before anything is built
    writer: ReplyWriter
    if text is not None:
        writer = ScriptedWriter(cast(TokenizingKV, kv), text, limits)
    elif isinstance(kv, ReplyWriter):
        writer = kv
    else:
        raise UsageError(
            "text", f"the KV side {type(kv).__name__} writes no replies: give a text side"
        )
    promotions.queue = getattr(writer, "engine_queue", None)  # vLLM's queue times
    service = Service(kv, keys, ledger)
    gw = _Gateway(kv, writer, name, lowering, service, instance or Instance(), promotions, limits)
    comp, claims = gw.completion_routes, gw.claim_routes
    messages, responses = MessagesRoute(comp), ResponsesRoute(comp)
    table: list[tuple[str, Handler, list[str]]] = [
        ("/v1/chat/completions", comp.chat_completions, ["POST"]),
        ("/v1/completions", comp.completions, ["POST"]),
        ("/v1/messages", messages.messages, ["POST"]),
        ("/v1/responses", responses.responses, ["POST"]),
        ("/v1/claims", claims.submit_claim, ["POST"]),
        ("/v1/claims/{claim_id:path}", claims.get_claim, ["GET"]),
        ("/v1/claims/{claim_id:path}", claims.release_claim, ["DELETE"]),
        ("/v1/claims/{claim_id:path}/renew", claims.renew_claim, ["POST"]),
        ("/v1/claims/{claim_id:path}/release", claims.release_claim, ["POST"]),
        ("/v1/releases", claims.release_claims, ["POST"]),
        ("/v1/events", claims.events, ["GET"]),
        ("/v1/residency", claims.residency, ["POST"]),
        ("/v1/active", claims.active, ["POST"]),
        ("/v1/instance", claims.fresh_instance, ["POST"]),
        ("/v1/instance/step", claims.step, ["POST"]),
        ("/v1/descriptor", gw.descriptor, ["GET"]),
        ("/v1/models", gw.models, ["GET"]),
        ("/health", gw.health, ["GET"]),
        ("/metrics", gw.metrics, ["GET"]),
        ("/v1/stats", gw.stats_route, ["GET"]),
    ]
    document = openapi(
        [(_shown(path), methods) for path, _, methods in table] + [("/openapi.json", ["GET"])],
        name,
        Extension,
        keys=keys is not None,
    )

    async def openapi_route(request: Request) -> Response:
        return JSONResponse(document)

    table.append(("/openapi.json", openapi_route, ["GET"]))
    routes = [
        Route(path, gw.counted(f"{methods[0]} {_shown(path)}", handler), methods=methods)
        for path, handler, methods in table
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await service.ready()
        if isinstance(kv, ReferenceKV) and lowering is None:
            await gw.lowering()  # its self-test evidence now, not on a request
        yield
        await promotions.aclose()
        await service.close()
        closing = getattr(kv, "aclose", None)  # vLLM's side: its HTTP clients and KV events
        if closing is not None:
            await closing()

    app = _GatewayApp(
        routes=routes,
        exception_handlers={AgentClaimsError: gw.on_error, HTTPException: gw.on_http_error},
        lifespan=lifespan,
    )
    app.gateway = gw
    app.state.gateway = gw
    app.state.limits = limits
    return app


def _cut_off() -> ServiceUnavailable:
    """What a call gets that the stopping gateway's server cancelled before its answer began
    (the grace for calls in flight, ``--grace-s``, ran out): a 503 ``unavailable``, not the
    server's bare 500 and a traceback. An answer already begun (a stream) is cut short."""
    return ServiceUnavailable(
        "the gateway stopped before this call finished (its grace period ran out); "
        "send it to another"
    )


_COMPLETIONS: dict[str, tuple[CompletionKind, str]] = {
    "/v1/chat/completions": ("chat", "POST /v1/chat/completions"),
    "/v1/completions": ("completion", "POST /v1/completions"),
}
"""Each completion path: its kind and its name in the gateway's counts and metrics."""


def _shown(path: str) -> str:
    """A route's path as its name, metrics and OpenAPI show it: ``{claim_id:path}`` (an
    operator's full id, ``alpha/c-1``, has a slash) as ``{claim_id}``."""
    return path.replace(":path}", "}")


_OPEN_ROUTES = frozenset({"GET /health", "GET /openapi.json"})
_OPERATOR_ROUTES = frozenset(
    {"GET /metrics", "GET /v1/stats", "POST /v1/instance", "POST /v1/instance/step"}
)
