"""``ClaimRoutes``: the claims API (submit, read, renew, release, events, residency), an active
request served as data, and instance control; each through the service (tenants, quotas, the
ledger) to the KV side."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from agentclaims.contract import ClaimId, ClaimSpec, OwnerScope, RequestId
from agentclaims.errors import (
    IllegalTransition,
    OperationNotExposed,
    ScopeViolation,
    UnknownClaim,
    UsageError,
)
from agentclaims.gateway.extension import event_cursor
from agentclaims.gateway.limits import EVENTS_PER_ANSWER, SEQ_LIMIT
from agentclaims.gateway.params import (
    block_hashes_of,
    claim_owners,
    int_param,
    json_object,
    optional_str,
    owner_of,
    tenant_of,
)
from agentclaims.gateway.service import Service
from agentclaims.gateway.sides import KVSide
from agentclaims.gateway.streaming import JSONResponse
from agentclaims.gateway.tenants import Tenant, TenantKeys
from agentclaims.protocol import ActiveRequest, ClaimView, InstanceControl, Renewal
from agentclaims.protocol.codec import exception_error

__all__ = ["ClaimRoutes"]


class ClaimRoutes:
    """The claims-API routes over one KV side, through its service."""

    def __init__(self, kv: KVSide, service: Service) -> None:
        self.kv = kv
        self.service = service

    async def submit_claim(self, request: Request) -> Response:
        body = await json_object(request)
        claim: Any = body.get("claim")  # from_dict names the field if it is not an object
        tenant = tenant_of(request)
        spec = self.service.spec(ClaimSpec.from_dict(claim, where="claim"), tenant)
        hashes = block_hashes_of(body) if body.get("block_hashes") is not None else None
        self.service.prefixes.check(spec, hashes, tenant)
        decision = await self.kv.submit_claim(spec, hashes)
        await self.service.decided([decision], {spec.claim_id: spec.owner_scope}, tenant)
        return JSONResponse(self.service.namespace.shown_decision(decision, tenant).to_dict())

    def _claim_id(self, request: Request) -> ClaimId:
        """The claim the path names, in the caller's namespace."""
        return ClaimId(
            self.service.namespace.inner(request.path_params["claim_id"], tenant_of(request))
        )

    def _view(self, view: ClaimView, request: Request) -> Response:
        return JSONResponse(self.service.namespace.shown_view(view, tenant_of(request)).to_dict())

    async def get_claim(self, request: Request) -> Response:
        view = await self.kv.get_claim(self._claim_id(request), owner_of(request))
        return self._view(view, request)

    async def renew_claim(self, request: Request) -> Response:
        body = await json_object(request)
        terms = {k: v for k, v in body.items() if k != "owner_scope"}
        renewal = Renewal.from_dict(terms, where="renewal")
        owner = owner_of(request, body)
        tenant = tenant_of(request)
        if tenant is not None and tenant.max_ttl_s is not None:
            self.service.check_ttl(renewal.ttl_s, tenant)
        view = await self.kv.renew_claim(self._claim_id(request), owner, renewal)
        await self.service.sync()
        return self._view(view, request)

    async def release_claim(self, request: Request) -> Response:
        """Release a claim. ``events_since`` (and ``id_prefix``, the session's): the answer
        carries the events after that cursor, the release's own included (``events``, the
        page ``GET /v1/events`` would give), so a session that ends needs no poll after it."""
        body = await json_object(request) if request.method == "POST" else {}
        done, since, id_prefix, owner = _release_terms(request, body)
        view = await self.kv.release_claim(self._claim_id(request), owner, done=done)
        await self.service.sync()
        tenant = tenant_of(request)
        shown = self.service.namespace.shown_view(view, tenant).to_dict()
        await self._add_events(shown, since, id_prefix, tenant)
        return JSONResponse(shown)

    async def _add_events(
        self, shown: dict[str, Any], since: int | None, id_prefix: str | None, tenant: Tenant | None
    ) -> None:
        """Into a release's answer: the events after ``since`` (``id_prefix``'s), if asked."""
        if since is not None:
            page = await self.service.events(
                since, limit=EVENTS_PER_ANSWER, id_prefix=id_prefix, tenant=tenant
            )
            shown["events"] = page.to_dict()

    async def release_claims(self, request: Request) -> Response:
        """Release several claims in one request (``releases``: 1 to ``MAX_RELEASES`` items,
        each a single release's body with its ``claim_id``). Every item is checked before
        any is released (a malformed one: 400, nothing changes); then each is released, or
        answered with the error its own request would have got (``status`` and ``error``), in
        order; one item's fate changes no other's. An item with ``events_since`` gets its
        page of events, read after every release of the request."""
        body = await json_object(request)
        items = body.get("releases")
        if not isinstance(items, list) or not 1 <= len(items) <= MAX_RELEASES:
            raise UsageError("releases", f"must be a list of 1 to {MAX_RELEASES} releases")
        tenant = tenant_of(request)
        ns = self.service.namespace
        checked = [_release_item(request, i, item) for i, item in enumerate(items)]
        out: list[dict[str, Any]] = []
        for claim_id, (done, _, _, owner) in checked:
            try:
                view = await self.kv.release_claim(
                    ClaimId(ns.inner(claim_id, tenant)), owner, done=done
                )
            except (UsageError, ScopeViolation, UnknownClaim, IllegalTransition) as exc:
                status, error = exception_error(exc)
                out.append({"status": status, **ns.shown_body(error, tenant)})
                continue
            out.append(ns.shown_view(view, tenant).to_dict())
        await self.service.sync()
        for shown, (_, (_, since, id_prefix, _)) in zip(out, checked, strict=True):
            if "error" not in shown:
                await self._add_events(shown, since, id_prefix, tenant)
        return JSONResponse({"released": out})

    async def events(self, request: Request) -> Response:
        since = int_param(request, "since", 0, 0, SEQ_LIMIT)
        limit = int_param(request, "limit", 10_000, 1, 100_000)
        id_prefix = request.query_params.get("id_prefix") or None
        page = await self.service.events(
            since, limit=limit, id_prefix=id_prefix, tenant=tenant_of(request)
        )
        return JSONResponse(page.to_dict())

    async def residency(self, request: Request) -> Response:
        """Leading resident blocks per prefix id, or (``block_hashes``) residency per block."""
        body = await json_object(request)
        tenant = tenant_of(request)
        if "block_hashes" in body:
            # a block hash names no tenant: per-block residency is the operator's (conformance)
            TenantKeys.require_admin(tenant, "residency by block_hashes")
            hashes = block_hashes_of(body)
            return JSONResponse({"resident": await self.kv.block_residency(hashes)})
        ids = body.get("prefix_ids")
        if not isinstance(ids, list) or not all(isinstance(p, str) for p in ids):
            raise UsageError("prefix_ids", "must be a list of prefix id strings")
        mine = [p for p in ids if self.service.prefixes.owns(p, tenant)]
        residency = await self.kv.residency(mine) if mine else {}
        # another tenant's prefix is, to this one, a prefix never served: 0 resident blocks
        return JSONResponse({"residency": {p: residency.get(p, 0) for p in ids}})

    async def active(self, request: Request) -> Response:
        """Serve one active request given by token ids or block hashes (no text is written):
        the ``ServeResult``, refusals included, as data."""
        body = await json_object(request)
        tenant = tenant_of(request)
        active = ActiveRequest.from_dict(body, where="request")
        if tenant is not None:
            owner = self.service.owner(active.owner_scope, tenant)
            claims = self.service.claims(active.claims, owner, tenant)
            active = replace(
                active,
                request_id=RequestId(self.service.namespace.inner(active.request_id, tenant)),
                owner_scope=None if owner is None else OwnerScope(owner),
                claims=claims,
                cache_salt=self.service.namespace.salt(active.cache_salt, tenant),
            )
        result = await self.kv.serve(active)
        result = await self.service.served(
            result, claim_owners(active.claims, active.owner_scope), tenant, active.owner_scope
        )
        return JSONResponse(result.to_dict())

    async def fresh_instance(self, request: Request) -> Response:
        body = await json_object(request)
        kv = self._instance_control("fresh_instance")
        usable: Any = body.get("usable_blocks")
        identity = await kv.fresh_instance(usable, owner_of(request, body))
        await self.service.sync()
        return JSONResponse({"cache_identity": identity.to_dict()})

    async def step(self, request: Request) -> Response:
        body = await json_object(request)
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


MAX_RELEASES = 64
"""Most releases one ``POST /v1/releases`` carries."""
_RELEASE_FIELDS = frozenset({"claim_id", "owner_scope", "done", "events_since", "id_prefix"})


def _release_terms(
    request: Request, body: Mapping[str, Any]
) -> tuple[bool, int | None, str | None, OwnerScope]:
    """A release's terms, checked in this order: ``done``, the events cursor, the id prefix,
    the owner (the caller's tenant's)."""
    done = body.get("done", False)
    if not isinstance(done, bool):
        raise UsageError("done", f"must be true or false, got {done!r}")
    since = event_cursor(body.get("events_since"), "events_since")
    id_prefix = optional_str(body, "id_prefix")
    return done, since, id_prefix, owner_of(request, body)


def _release_item(
    request: Request, index: int, item: Any
) -> tuple[str, tuple[bool, int | None, str | None, OwnerScope]]:
    """One item of ``POST /v1/releases``: its claim id and ``_release_terms``. A problem names
    the item (``releases[i].field``)."""
    where = f"releases[{index}]"
    if not isinstance(item, dict):
        raise UsageError(where, f"must be an object, got {type(item).__name__}")
    unknown = sorted(set(item) - _RELEASE_FIELDS)
    if unknown:
        raise UsageError(where, f"unknown fields {unknown}")
    claim_id = item.get("claim_id")
    if not isinstance(claim_id, str) or not claim_id:
        raise UsageError(f"{where}.claim_id", "must be a non-empty string")
    if not isinstance(item.get("owner_scope"), str) or not item["owner_scope"]:
        raise UsageError(f"{where}.owner_scope", "missing: name the claim's owner scope")
    try:
        return claim_id, _release_terms(request, item)
    except UsageError as exc:
        raise UsageError(f"{where}.{exc.field}", exc.message) from None
