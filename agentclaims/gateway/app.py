"""The gateway's ASGI app: OpenAI-compatible completions with claims, and the claims API.

One server implementation: ``EmbeddedBackend`` reaches it in-process through an ASGI
transport, ``agentclaims serve`` puts it on a port. docs/gateway.md is the wire protocol.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, cast

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from agentclaims.contract import (
    SCHEMA_VERSION,
    BlockHash,
    ClaimId,
    ClaimSpec,
    OwnerScope,
    RequestId,
)
from agentclaims.engine import ReferenceKV
from agentclaims.errors import (
    AgentClaimsError,
    ContractViolation,
    OperationNotExposed,
    UnknownClaim,
    UsageError,
)
from agentclaims.gateway.ledger import Ledger
from agentclaims.gateway.limits import BodyTooLarge, Limits, parse_body
from agentclaims.gateway.metrics import CONTENT_TYPE, GatewayMetrics
from agentclaims.gateway.openapi import openapi
from agentclaims.gateway.service import Service
from agentclaims.gateway.streaming import (
    DONE,
    JSONResponse,
    event,
    respond,
    stream_requested,
    unstreamed,
)
from agentclaims.gateway.tenants import Tenant, TenantKeys
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
    EXTENSION_KEY,
    INSTANCE_HEADER,
    INSTANCE_URL_HEADER,
    ROUTER_SAFE_HEADER,
    ActiveRequest,
    ActiveServing,
    ClaimsProtocol,
    ClaimView,
    InstanceControl,
    Renewal,
    ServeResult,
    error_body,
    exception_error,
    refusal_error,
    timing,
)
from agentclaims.protocol.writer import (
    CompletionCall,
    CompletionKind,
    ReplyStream,
    ReplyWriter,
)

__all__ = [
    "INSTANCE_HEADER",
    "INSTANCE_URL_HEADER",
    "ROUTER_SAFE_HEADER",
    "Extension",
    "Instance",
    "KVSide",
    "create_app",
]


class KVSide(ClaimsProtocol, ActiveServing, Protocol):
    """What the gateway serves: the claims protocol with active serving. ``InstanceControl``
    and a ``metrics()`` method are used if present, and so are a ``lowering`` attribute (its
    lowering descriptor: a document or a file) and a ``runtime_version`` one (the version of
    the runtime it lowers onto). Who writes the replies is a ``ReplyWriter``: the KV side itself
    (``VllmKV``), or a text side over a KV side that tokenizes (``ScriptedWriter``)."""

    block_size: int


Handler = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class Instance:
    """Who this gateway is in a fleet (docs/fleet.md)."""

    instance_id: str = "gateway"
    advertise_url: str | None = None
    behind_router: bool = False

    @property
    def fields(self) -> dict[str, str]:
        """The same, in a completion's ``agentclaims`` object and a refusal's error body:
        routers pass bodies through but not every header."""
        out = {"instance": self.instance_id}
        if self.advertise_url:
            out["instance_url"] = self.advertise_url
        return out

    @property
    def headers(self) -> dict[str, str]:
        out = {INSTANCE_HEADER: self.instance_id}
        if self.advertise_url:
            out[INSTANCE_URL_HEADER] = self.advertise_url
        return out


_MAX_TOKEN_ID = 2**31
_MAX_RELEASES = 64


@dataclass(frozen=True, slots=True)
class Extension:
    """The ``agentclaims`` object of a completion request's body (every field optional)."""

    session_id: str | None = None
    workflow_id: str | None = None
    owner_scope: str | None = None
    node: str | None = None
    step: int | None = None
    admit: bool = True
    request_id: str | None = None
    claims: tuple[Mapping[str, Any], ...] = ()
    release: tuple[str, ...] = ()
    """Claims of this request's owner to let go before it runs: they ride on it."""

    @classmethod
    def parse(cls, body: Mapping[str, Any]) -> Extension:
        raw = body.get(EXTENSION_KEY)
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise UsageError(EXTENSION_KEY, f"expected an object, got {raw!r}")
        known = {"session_id", "workflow_id", "owner_scope", "node", "step", "admit"}
        known |= {"request_id", "claims", "release"}
        extra = set(raw) - known
        if extra:
            raise UsageError(EXTENSION_KEY, f"unknown fields {sorted(extra)}")
        strings = {}
        for name in ("session_id", "workflow_id", "owner_scope", "node", "request_id"):
            value = raw.get(name)
            if value is not None and (not isinstance(value, str) or not value):
                raise UsageError(
                    f"{EXTENSION_KEY}.{name}", f"must be a non-empty string, got {value!r}"
                )
            strings[name] = value
        step = raw.get("step")
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
            raise UsageError(
                f"{EXTENSION_KEY}.step", f"must be a non-negative integer, got {step!r}"
            )
        admit = raw.get("admit", True)
        if not isinstance(admit, bool):
            raise UsageError(f"{EXTENSION_KEY}.admit", f"must be true or false, got {admit!r}")
        claims = raw.get("claims")
        claims = [] if claims is None else claims
        if not isinstance(claims, list):
            raise UsageError(f"{EXTENSION_KEY}.claims", f"must be a list, got {claims!r}")
        release = raw.get("release")
        release = [] if release is None else release
        if (
            not isinstance(release, list)
            or len(release) > _MAX_RELEASES
            or not all(isinstance(c, str) and c for c in release)
            or len(set(release)) != len(release)
        ):
            raise UsageError(
                f"{EXTENSION_KEY}.release",
                f"must be a list of at most {_MAX_RELEASES} distinct claim ids, got {release!r}",
            )
        return cls(step=step, admit=admit, claims=tuple(claims), release=tuple(release), **strings)

    @property
    def default_owner(self) -> str | None:
        return self.owner_scope or self.session_id or self.workflow_id


async def _json_object(request: Request) -> dict[str, Any]:
    """The body as a JSON object, within the gateway's limits (``limits.parse_body``)."""
    limits: Limits = getattr(request.app.state, "limits", None) or Limits()
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limits.max_body_bytes:
        raise BodyTooLarge("body", f"{length} bytes; at most {limits.max_body_bytes}")
    return parse_body(await request.body(), limits)


def _optional_str(body: Mapping[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and (not isinstance(value, str) or not value):
        raise UsageError(name, f"must be a non-empty string, got {value!r}")
    return value


def _int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise UsageError(name, f"must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise UsageError(name, f"must be within {low}..{high}, got {value}")
    return value


def _owner(request: Request, body: Mapping[str, Any] | None = None) -> OwnerScope:
    """The owner scope a claims-API call names, checked against the caller's tenant."""
    owner = (body or {}).get("owner_scope") or request.query_params.get("owner_scope")
    if not isinstance(owner, str) or not owner:
        raise UsageError("owner_scope", "missing: name the claim's owner scope")
    service: Service = request.app.state.gateway.service
    return OwnerScope(service.owner(owner, _tenant(request)) or owner)


def _tenant(request: Request) -> Tenant | None:
    """The tenant of the request's key (set by ``_Gateway.counted``); ``None`` without keys."""
    return getattr(request.state, "tenant", None)


def _claim_owners(claims: Sequence[Any], default_owner: str | None) -> dict[str, str]:
    """claim_id -> owner scope of a request's claim dicts (for the ledger)."""
    out = {}
    for c in claims:
        if isinstance(c, Mapping) and isinstance(c.get("claim_id"), str):
            owner = c.get("owner_scope") or default_owner
            if isinstance(owner, str):
                out[c["claim_id"]] = owner
    return out


class _Gateway:
    """The route handlers over one KV side and one text side."""

    def __init__(
        self,
        kv: KVSide,
        writer: ReplyWriter,
        name: str,
        lowering: LoweringSource | None,
        service: Service,
        instance: Instance,
    ) -> None:
        self.kv = kv
        self.writer = writer
        self.service = service
        self.instance = instance
        self.name = name
        self._lowering_source = lowering
        self._lowering: ServedLowering | None = None
        self.calls: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.prometheus = GatewayMetrics(self.stats)

    # ------------------------------------------------------------------ completions
    async def _completion(self, request: Request, kind: CompletionKind) -> Response:
        """Both completion endpoints: the call checked (nothing changes on bad input), the
        claims it releases let go, the reply written with its KV life, the claims' decisions
        in its ``agentclaims`` object; streamed as the engine produces it where it can."""
        body = await _json_object(request)
        ext = Extension.parse(body)
        tenant = _tenant(request)
        owner = self.service.owner(ext.default_owner, tenant)
        call = self.writer.prepare(
            CompletionCall(
                kind,
                body,
                claims=tuple(self.service.claims(ext.claims, owner, tenant)),
                owner_scope=owner,
                cache_salt=self.service.salt(_optional_str(body, "cache_salt"), tenant),
                request_id=self.service.inner(ext.request_id, tenant) if ext.request_id else None,
                admit=ext.admit,
                node=ext.node,
            )
        )
        streamed = stream_requested(body)  # (#13) a bad stream field is refused up front
        released = await self._release(ext, owner, tenant)
        writer = self.writer
        if streamed and writer.streams and (not call.claims or writer.streams_claims):
            return await self._stream(request, call, tenant, released)
        # a reply written whole (a scripted one, or claims whose answer vLLM sends only in an
        # answer read whole): the gateway then streams it itself (#13)
        written = await writer.write(replace(call, body=unstreamed(body)) if streamed else call)
        result = await self.service.served(
            written.result, _claim_owners(call.claims, owner), tenant, owner
        )
        if not result.outcome.served:
            return self._refusal(request, result)
        payload = dict(written.payload)
        if isinstance(payload.get("id"), str):  # it names the request: as the caller named it
            payload["id"] = self.service.shown_text(payload["id"], tenant)
        payload[EXTENSION_KEY] = self._extension(result, released)
        return respond(body, payload)  # JSON, or server-sent events (#13)

    async def _release(
        self, ext: Extension, owner: str | None, tenant: Tenant | None
    ) -> list[dict[str, Any]]:
        """Let go of the claims a completion names in ``agentclaims.release`` (its owner's),
        before it runs; their ids and states, for its answer. Each is checked first: another
        owner's is refused and nothing changes. One this gateway does not know (the call
        reached another instance than the claim's, say) is held nowhere here: ``unknown``,
        not an error, so a release never costs the call it rides on."""
        if not ext.release:
            return []
        if owner is None:
            raise UsageError(
                f"{EXTENSION_KEY}.release", "needs the owner scope (or session id) of its claims"
            )
        scope = OwnerScope(owner)
        known = []
        for shown in ext.release:
            cid = ClaimId(self.service.inner(shown, tenant))
            try:
                await self.kv.get_claim(cid, scope)
            except UnknownClaim:
                continue
            known.append(cid)
        states: dict[str, str] = {}
        for cid in known:
            states[cid] = (await self.kv.release_claim(cid, scope)).state.value
        await self.service.sync()
        return [
            {"claim_id": shown, "state": states.get(self.service.inner(shown, tenant), "unknown")}
            for shown in ext.release
        ]

    async def _stream(
        self,
        request: Request,
        call: CompletionCall,
        tenant: Tenant | None,
        released: Sequence[Mapping[str, Any]] = (),
    ) -> Response:
        """A streamed completion on the upstream engine: its chunks passed on as it produces
        them, then one chunk more with the ``agentclaims`` object (its usage and its claims'
        decisions inside). A request the engine ends before its first token (refused) is the
        claim-scoped refusal, not a stream; a client that leaves early closes the engine's
        stream (it aborts)."""
        owner = call.owner_scope
        owners = _claim_owners(call.claims, owner)
        streamed = await self.writer.stream(call)
        try:
            early = await streamed.start()
            if early is not None:
                early = await self.service.served(early, owners, tenant, owner)
                if not early.outcome.served:
                    await streamed.aclose()
                    return self._refusal(request, early)
        except BaseException:
            await streamed.aclose()
            raise

        async def events() -> AsyncIterator[bytes]:
            try:
                async for chunk in streamed.chunks():
                    yield event(chunk)
                result = early or await self.service.served(
                    _settled(streamed), owners, tenant, owner
                )
                ext = {**self._extension(result, released), "usage": streamed.usage}
                yield event({**streamed.shape, "choices": [], EXTENSION_KEY: ext})
                yield DONE
            finally:
                await streamed.aclose()

        return StreamingResponse(
            events(), media_type="text/event-stream", headers={"cache-control": "no-cache"}
        )

    def _extension(
        self, result: ServeResult, released: Sequence[Mapping[str, Any]] = ()
    ) -> dict[str, Any]:
        """The ``agentclaims`` object of an upstream engine's answer."""
        return {
            "request_id": result.outcome.request_id,
            "outcome": result.outcome.to_dict(),
            "prefix_ids": result.prefix_ids,
            "decisions": [d.to_dict() for d in result.decisions],
            "events_seq": result.events_seq,
            **({"deferred_s": result.deferred_s} if result.deferred_s else {}),
            **({"released": list(released)} if released else {}),
            **self.instance.fields,
        }

    def _refusal(self, request: Request, result: ServeResult) -> Response:
        """A request the KV side did not serve: its claim-scoped refusal (409, or 503 where
        the router may retry it elsewhere), counted."""
        status, headers, err = refusal_error(
            result.outcome, result.prefix_ids, router_safe=self.router_safe(request)
        )
        err["error"].update(self.instance.fields)
        self.errors[err["error"]["type"]] += 1
        return JSONResponse(err, status_code=status, headers=headers)

    async def chat_completions(self, request: Request) -> Response:
        return await self._completion(request, "chat")

    async def completions(self, request: Request) -> Response:
        return await self._completion(request, "completion")

    async def submit_claim(self, request: Request) -> Response:
        body = await _json_object(request)
        claim: Any = body.get("claim")  # from_dict names the field if it is not an object
        tenant = _tenant(request)
        spec = self.service.spec(ClaimSpec.from_dict(claim), tenant)
        hashes = _block_hashes(body) if body.get("block_hashes") is not None else None
        self.service.check_prefix(spec, hashes, tenant)
        decision = await self.kv.submit_claim(spec, hashes)
        await self.service.decided([decision], {spec.claim_id: spec.owner_scope}, tenant)
        return JSONResponse(self.service.shown_decision(decision, tenant).to_dict())

    def _claim_id(self, request: Request) -> ClaimId:
        """The claim the path names, in the caller's namespace."""
        return ClaimId(self.service.inner(request.path_params["claim_id"], _tenant(request)))

    def _view(self, view: ClaimView, request: Request) -> Response:
        return JSONResponse(self.service.shown_view(view, _tenant(request)).to_dict())

    async def get_claim(self, request: Request) -> Response:
        view = await self.kv.get_claim(self._claim_id(request), _owner(request))
        return self._view(view, request)

    async def renew_claim(self, request: Request) -> Response:
        body = await _json_object(request)
        terms = {k: v for k, v in body.items() if k != "owner_scope"}
        renewal = Renewal.from_dict(terms, where="renewal")
        owner = _owner(request, body)
        tenant = _tenant(request)
        if tenant is not None and tenant.max_ttl_s is not None:
            self.service.check_ttl(renewal.ttl_s, tenant)
        view = await self.kv.renew_claim(self._claim_id(request), owner, renewal)
        await self.service.sync()
        return self._view(view, request)

    async def release_claim(self, request: Request) -> Response:
        body = await _json_object(request) if request.method == "POST" else {}
        view = await self.kv.release_claim(self._claim_id(request), _owner(request, body))
        await self.service.sync()
        return self._view(view, request)

    async def events(self, request: Request) -> Response:
        since = _int_param(request, "since", 0, 0, 2**62)
        limit = _int_param(request, "limit", 10_000, 1, 100_000)
        id_prefix = request.query_params.get("id_prefix") or None
        page = await self.service.events(
            since, limit=limit, id_prefix=id_prefix, tenant=_tenant(request)
        )
        return JSONResponse(page.to_dict())

    async def residency(self, request: Request) -> Response:
        """Leading resident blocks per prefix id, or (``block_hashes``) residency per block."""
        body = await _json_object(request)
        tenant = _tenant(request)
        if "block_hashes" in body:
            # a block hash names no tenant: per-block residency is the operator's (conformance)
            TenantKeys.require_admin(tenant, "residency by block_hashes")
            hashes = _block_hashes(body)
            return JSONResponse({"resident": await self.kv.block_residency(hashes)})
        ids = body.get("prefix_ids")
        if not isinstance(ids, list) or not all(isinstance(p, str) for p in ids):
            raise UsageError("prefix_ids", "must be a list of prefix id strings")
        mine = [p for p in ids if self.service.owns_prefix(p, tenant)]
        residency = await self.kv.residency(mine) if mine else {}
        # another tenant's prefix is, to this one, a prefix never served: 0 resident blocks
        return JSONResponse({"residency": {p: residency.get(p, 0) for p in ids}})

    async def active(self, request: Request) -> Response:
        """Serve one active request given by token ids or block hashes (no text is written):
        the ``ServeResult``, refusals included, as data."""
        body = await _json_object(request)
        tenant = _tenant(request)
        active = ActiveRequest.from_dict(body, where="request")
        if tenant is not None:
            owner = self.service.owner(active.owner_scope, tenant)
            claims = self.service.claims(active.claims, owner, tenant)
            active = replace(
                active,
                request_id=RequestId(self.service.inner(active.request_id, tenant)),
                owner_scope=None if owner is None else OwnerScope(owner),
                claims=claims,
                cache_salt=self.service.salt(active.cache_salt, tenant),
            )
        result = await self.kv.serve(active)
        result = await self.service.served(
            result, _claim_owners(active.claims, active.owner_scope), tenant, active.owner_scope
        )
        return JSONResponse(result.to_dict())

    async def fresh_instance(self, request: Request) -> Response:
        body = await _json_object(request)
        kv = self._instance_control("fresh_instance")
        usable: Any = body.get("usable_blocks")
        identity = await kv.fresh_instance(usable, _owner(request, body))
        await self.service.sync()
        return JSONResponse({"cache_identity": identity.to_dict()})

    async def step(self, request: Request) -> Response:
        body = await _json_object(request)
        n = body.get("n", 1)
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 1_000_000:
            raise UsageError("n", f"must be an integer within 1..1000000, got {n!r}")
        await self._instance_control("step").step(n)
        await self.service.sync()
        return JSONResponse({"stepped": n})

    def _instance_control(self, operation: str) -> InstanceControl:
        if not isinstance(self.kv, InstanceControl):
            raise OperationNotExposed(self.kv.name, operation)
        return self.kv

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
    def router_safe(self, request: Request) -> bool:
        """Whether a deferral answers 409 (behind a router: ``--behind-router``, or the client's
        ``X-Agentclaims-Router-Safe: 1``), not 503."""
        return self.instance.behind_router or request.headers.get(ROUTER_SAFE_HEADER) == "1"

    def counted(self, name: str, handler: Handler) -> Handler:
        """The route's handler behind the service's checks: the caller's key (401 without
        one), an operator key for operator routes (403), not while stopping (503), and the
        ledger accounted for before the first operation."""
        open_route = name in _OPEN_ROUTES
        operator = name in _OPERATOR_ROUTES

        async def run(request: Request) -> Response:
            self.calls[name] += 1
            started = time.perf_counter()
            waited = timing.track()
            try:
                service = self.service
                if not open_route:
                    service.check_open()
                    tenant = service.tenant(request.headers.get("authorization"))
                    request.state.tenant = tenant
                    if operator:
                        TenantKeys.require_admin(tenant, name)
                    await service.ready()
                response = await handler(request)
                response.headers.update(self.instance.headers)
                response.headers["server-timing"] = timing.server_timing(
                    time.perf_counter() - started, waited[0]
                )
                return response
            finally:
                self.prometheus.observe(name, time.perf_counter() - started)

        return run

    async def on_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, AgentClaimsError)
        status, body = exception_error(exc)
        body = self.service.shown_body(body, _tenant(request))  # its own ids, as it named them
        if isinstance(exc, BodyTooLarge):
            status = 413
        self.errors[body["error"]["type"]] += 1
        return JSONResponse(body, status_code=status, headers=self.instance.headers)

    async def on_http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = "not_found" if exc.status_code == 404 else "http_error"
        self.errors[kind] += 1
        return JSONResponse(
            error_body(kind, f"{request.method} {request.url.path}: {exc.detail}"),
            status_code=exc.status_code,
            headers=self.instance.headers,
        )


class _GatewayApp(Starlette):
    """The gateway's Starlette app, with the completion routes (every agent's LLM call) sent
    straight to their handlers: the same handler, request and response objects, without the
    walk through the routing table and the middleware stack, which cost a proxied request
    about a fifth of the gateway's own CPU. Every other route goes the usual way."""

    completions: dict[str, Handler]
    on_error: Callable[[Request, Exception], Awaitable[Response]]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            handler = self.completions.get(scope["path"])
            if handler is not None:
                scope["app"] = self
                request = Request(scope, receive, send)
                try:
                    response = await handler(request)
                except AgentClaimsError as exc:  # as Starlette's exception handler answers it
                    response = await self.on_error(request, exc)
                await response(scope, receive, send)
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
) -> Starlette:
    """The gateway app over a KV side (e.g. ``ReferenceKV``) and a text side (``ScriptedModel``)
    that writes the replies; without ``text`` the KV side writes its own (``VllmKV``: a
    ``ReplyWriter``).

    ``lowering`` is the KV side's lowering descriptor (a document, or a YAML or JSON file whose
    ``conformance_run`` anchors are read beside it), checked once for ``/v1/descriptor``; by
    default the KV side's own ``lowering`` attribute, the shipped one for the reference engine,
    and else none: every mode ``unknown``. ``keys`` makes it serve tenants (``TenantKeys``),
    ``ledger`` keeps claims and events across restarts (``Ledger``); docs/operations.md.
    ``instance`` names it in a fleet behind a router (docs/fleet.md)."""
    limits = limits or Limits()
    writer: ReplyWriter
    if text is not None:
        writer = ScriptedWriter(cast(TokenizingKV, kv), text, limits)
    elif isinstance(kv, ReplyWriter):
        writer = kv
    else:
        raise UsageError(
            "text", f"the KV side {type(kv).__name__} writes no replies: give a text side"
        )
    service = Service(kv, keys, ledger)
    gw = _Gateway(kv, writer, name, lowering, service, instance or Instance())
    table: list[tuple[str, Handler, list[str]]] = [
        ("/v1/chat/completions", gw.chat_completions, ["POST"]),
        ("/v1/completions", gw.completions, ["POST"]),
        ("/v1/claims", gw.submit_claim, ["POST"]),
        ("/v1/claims/{claim_id}", gw.get_claim, ["GET"]),
        ("/v1/claims/{claim_id}", gw.release_claim, ["DELETE"]),
        ("/v1/claims/{claim_id}/renew", gw.renew_claim, ["POST"]),
        ("/v1/claims/{claim_id}/release", gw.release_claim, ["POST"]),
        ("/v1/events", gw.events, ["GET"]),
        ("/v1/residency", gw.residency, ["POST"]),
        ("/v1/active", gw.active, ["POST"]),
        ("/v1/instance", gw.fresh_instance, ["POST"]),
        ("/v1/instance/step", gw.step, ["POST"]),
        ("/v1/descriptor", gw.descriptor, ["GET"]),
        ("/v1/models", gw.models, ["GET"]),
        ("/health", gw.health, ["GET"]),
        ("/metrics", gw.metrics, ["GET"]),
        ("/v1/stats", gw.stats_route, ["GET"]),
    ]
    document = openapi(
        [(path, methods) for path, _, methods in table] + [("/openapi.json", ["GET"])],
        name,
        Extension,
        keys=keys is not None,
    )

    async def openapi_route(request: Request) -> Response:
        return JSONResponse(document)

    table.append(("/openapi.json", openapi_route, ["GET"]))
    routes = [
        Route(path, gw.counted(f"{methods[0]} {path}", handler), methods=methods)
        for path, handler, methods in table
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await service.ready()
        if isinstance(kv, ReferenceKV) and lowering is None:
            await gw.lowering()  # its self-test evidence now, not on a request
        yield
        await service.close()

    app = _GatewayApp(
        routes=routes,
        exception_handlers={AgentClaimsError: gw.on_error, HTTPException: gw.on_http_error},
        lifespan=lifespan,
    )
    app.completions = {
        route.path: route.endpoint
        for route in routes
        if route.path in ("/v1/chat/completions", "/v1/completions")
    }
    app.on_error = gw.on_error
    app.state.gateway = gw
    app.state.limits = limits
    return app


_OPEN_ROUTES = frozenset({"GET /health", "GET /openapi.json"})
_OPERATOR_ROUTES = frozenset(
    {"GET /metrics", "GET /v1/stats", "POST /v1/instance", "POST /v1/instance/step"}
)


def _settled(stream: ReplyStream) -> ServeResult:
    """The KV life of a stream its chunks have all been read of."""
    if stream.result is None:
        raise ContractViolation("the reply stream ended without its KV life")
    return stream.result


def _block_hashes(body: Mapping[str, Any]) -> list[BlockHash]:
    hashes = body.get("block_hashes")
    if not (
        isinstance(hashes, list)
        and all(isinstance(h, int) and not isinstance(h, bool) and 0 <= h < 2**64 for h in hashes)
    ):
        raise UsageError("block_hashes", "must be a list of 64-bit unsigned integers")
    return [BlockHash(h) for h in hashes]
