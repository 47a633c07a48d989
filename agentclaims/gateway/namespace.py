"""``TenantNamespace``: what keeps tenants apart inside one KV side.

A tenant's claim ids, owner scopes and request ids live in a namespace of its own inside
the KV side (``<tenant>/<id>``): two tenants may use the same ids without meeting, and an
id of another tenant is, to this one, an id never issued. Without keys, and for an
operator's key, ids are the KV side's own. Answers show a tenant its own ids as it named
them; another tenant's (a claim in the way of its request) only as an opaque token.

A tenant's blocks are hashed with a salt of its own (``salt``), derived from the ledger's
secret, so tenants never share (or probe) prefix-cache entries.
"""

from __future__ import annotations

import hashlib
import hmac
import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from agentclaims.contract import ClaimEvent, ClaimId, OwnerScope, RequestId
from agentclaims.gateway.tenants import Tenant
from agentclaims.protocol import ActiveOutcome, ClaimDecision, ClaimView, ServeResult

__all__ = ["TenantNamespace"]


class TenantNamespace:
    """Tenants' ids inside the KV side and as each may see them, and their salts
    (``secret``: the ledger's)."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret
        self._salts: dict[str, str] = {}
        """Each tenant's salt, derived once (every call of a tenant's carries it)."""

    def salt(self, cache_salt: str | None, tenant: Tenant | None) -> str | None:
        """The tenant's own salt (the client's, if any, inside it)."""
        if tenant is None:
            return cache_salt
        mac = self._salts.get(tenant.name)
        if mac is None:
            mac = hmac.new(self._secret, tenant.name.encode(), hashlib.sha256).hexdigest()[:32]
            self._salts[tenant.name] = mac
        return f"{mac}:{cache_salt}" if cache_salt else mac

    def ns(self, tenant: Tenant | None) -> str:
        """What ``tenant``'s ids start with inside the KV side (``""``: its own ids)."""
        if tenant is None or tenant.admin:
            return ""
        return tenant.name.replace("%", "%25").replace("/", "%2F") + "/"

    def inner(self, id_: str, tenant: Tenant | None) -> str:
        """``id_`` as ``tenant`` named it -> as the KV side knows it."""
        return self.ns(tenant) + id_

    def request_id(self, given: str | None, tenant: Tenant | None, prefix: str) -> str | None:
        """A request's id inside the KV side: the client's (``given``) in ``tenant``'s
        namespace, or for a tenant that named none one made here (``PREFIX-<hex>``) in it too,
        so the tenant sees its request as its own; ``None`` where the KV side names it."""
        ns = self.ns(tenant)
        if given is None:
            return f"{ns}{prefix}-{uuid.uuid4().hex}" if ns else None
        return ns + given

    def shown(self, id_: str, tenant: Tenant | None) -> str:
        """An id of the KV side -> as ``tenant`` may see it."""
        ns = self.ns(tenant)
        if not ns:
            return id_
        if id_.startswith(ns):
            return id_[len(ns) :]
        mac = hmac.new(self._secret, id_.encode(), hashlib.sha256).hexdigest()[:16]
        return f"other:{mac}"

    def shown_text(self, text: str, tenant: Tenant | None) -> str:
        """A message of the KV side with ``tenant``'s namespace taken out of its ids."""
        ns = self.ns(tenant)
        return text.replace(ns, "") if ns else text

    def shown_body(self, body: Any, tenant: Tenant | None) -> Any:
        """An error body (JSON data) with ``tenant``'s namespace taken out of every string."""
        if not self.ns(tenant):
            return body
        if isinstance(body, str):
            return self.shown_text(body, tenant)
        if isinstance(body, Mapping):
            return {k: self.shown_body(v, tenant) for k, v in body.items()}
        if isinstance(body, list | tuple):
            return [self.shown_body(v, tenant) for v in body]
        return body

    def shown_outcome(self, outcome: ActiveOutcome, tenant: Tenant | None) -> ActiveOutcome:
        if not self.ns(tenant):
            return outcome
        return replace(
            outcome,
            request_id=RequestId(self.shown(outcome.request_id, tenant)),
            blocking_claim_ids=tuple(
                ClaimId(self.shown(c, tenant)) for c in outcome.blocking_claim_ids
            ),
        )

    def shown_decision(self, decision: ClaimDecision, tenant: Tenant | None) -> ClaimDecision:
        if not self.ns(tenant):
            return decision
        return replace(
            decision,
            claim_id=ClaimId(self.shown(decision.claim_id, tenant)),
            reason=None if decision.reason is None else self.shown_text(decision.reason, tenant),
        )

    def shown_view(self, view: ClaimView, tenant: Tenant | None) -> ClaimView:
        if not self.ns(tenant):
            return view
        return replace(
            view,
            claim_id=ClaimId(self.shown(view.claim_id, tenant)),
            owner_scope=OwnerScope(self.shown(view.owner_scope, tenant)),
        )

    def shown_result(self, result: ServeResult, tenant: Tenant | None) -> ServeResult:
        if not self.ns(tenant):
            return result
        return replace(
            result,
            outcome=self.shown_outcome(result.outcome, tenant),
            decisions=tuple(self.shown_decision(d, tenant) for d in result.decisions),
        )

    def shown_event(self, event: ClaimEvent, tenant: Tenant | None) -> ClaimEvent:
        data = dict(event.data)
        for key in ("blocking_claim_ids", "claim_ids"):
            if isinstance(data.get(key), list | tuple):
                data[key] = [self.shown(str(c), tenant) for c in data[key]]
        for key in ("owner_scope", "superseded_by"):
            if isinstance(data.get(key), str):
                data[key] = self.shown(data[key], tenant)
        return replace(
            event,
            claim_id=None
            if event.claim_id is None
            else ClaimId(self.shown(event.claim_id, tenant)),
            request_id=(
                None
                if event.request_id is None
                else RequestId(self.shown(event.request_id, tenant))
            ),
            data=data,
        )
