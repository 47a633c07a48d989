"""What makes the gateway a service: tenants from API keys, their quotas, the durable ledger.

``Service`` sits between the route handlers and the KV side. Without keys and without a
ledger it is a pass-through (the embedded default). With either:

- every request but ``/health`` and ``/openapi.json`` names its tenant by its key; the claim
  ids, owner scopes and request ids a tenant names live in a namespace of its own inside the KV
  side (``<tenant>/<id>``: ``TenantNamespace``), so tenants never meet in an id and another
  tenant's object (a prefix id too: ``TenantPrefixes``) is, to one, an id never issued;
- a tenant's claims are checked against its limits by the KV side's claim gate, so a claim
  over quota is refused by the arbiter itself (``refuse_residency_claim``, the reason named,
  ``resident_claim_rejected`` in the stream);
- a tenant's blocks are hashed with its own ``cache_salt``, derived from a secret kept in the
  ledger, so tenants never share (or probe) prefix-cache entries;
- the KV side's events are copied into the ledger after every operation and served from it,
  each with the tenant it belongs to: a tenant reads only its own.
"""

from __future__ import annotations

import asyncio
import bisect
import uuid
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from agentclaims.contract import (
    ClaimEvent,
    ClaimId,
    ClaimSpec,
    EventName,
    OwnerScope,
)
from agentclaims.errors import ServiceUnavailable, UsageError
from agentclaims.gateway.ledger import Ledger, LedgerClaim
from agentclaims.gateway.limits import SEQ_LIMIT
from agentclaims.gateway.namespace import TenantNamespace
from agentclaims.gateway.prefixes import TenantPrefixes
from agentclaims.gateway.tenants import Tenant, TenantKeys
from agentclaims.protocol import (
    ClaimDecision,
    ClaimsProtocol,
    EventPage,
    ServeResult,
)

__all__ = ["Service"]

_PAGE = 10_000
_REMEMBERED = 100_000


_ENDINGS = {
    EventName.RESIDENT_CLAIM_HARMED: ("harmed", "cause"),
    EventName.RESIDENT_CLAIM_DEMOTED: ("demoted", "reason"),
    EventName.RESIDENT_CLAIM_EXPIRED: ("expired", "reason"),
}
"""The events that end a claim, counted per tenant: what each is called and its why field."""


class Service:
    """Tenants, quotas and the ledger over one KV side (see the module's docstring)."""

    def __init__(
        self, kv: ClaimsProtocol, keys: TenantKeys | None = None, ledger: Ledger | None = None
    ) -> None:
        self.kv = kv
        self.keys = keys
        if ledger is None and keys is not None:
            ledger = Ledger()  # tenants need the books even when nothing must survive
        self.ledger = ledger
        self.stopping = False
        self._ready = False
        self._lock = asyncio.Lock()
        self._cursor = 0
        self._inner: list[int] = []
        self._outer: list[int] = []
        self._reserved: dict[str, tuple[str, int, bool]] = {}
        self.prefixes = TenantPrefixes(_REMEMBERED)
        """The prefix ids given to tenants: a tenant may name only its own."""
        self._tenant_of_id: OrderedDict[str, str] = OrderedDict()
        """Request and claim ids of this process -> tenant (events of claims never accepted)."""
        self.namespace = TenantNamespace(b"" if ledger is None else ledger.secret().encode())
        """Each tenant's ids inside the KV side, and its cache salt."""
        self.counts: Counter[tuple[str, str]] = Counter()
        """(tenant, what) -> n: requests, refused, deferred, claims_refused, per tenant."""
        self.ends: Counter[tuple[str, str, str]] = Counter()
        """(tenant, how, why) -> claims ended so: ``harmed`` by cause, ``demoted`` and
        ``expired`` by reason (``-``: a claim no tenant is known for)."""
        self.gaps = 0
        if keys is not None:
            if not hasattr(kv, "claim_gate"):
                raise UsageError("api_keys", f"the {kv.name} KV side cannot enforce tenant limits")
            kv.claim_gate = self.gate

    # ------------------------------------------------------------------ start and stop
    async def ready(self) -> None:
        """Once, before the first operation: account for every claim an earlier gateway on
        this ledger left live (the KV side's own events first, e.g. vLLM's revoked holds)."""
        if self._ready or self.ledger is None:
            return
        async with self._lock:
            if not self._ready:  # another request may have done it while this one waited
                await self._sync_locked()
                owners = {c.claim_id: c.tenant for c in self.ledger.live()}
                ended = self.ledger.end_unaccounted(f"gateway-{uuid.uuid4().hex[:12]}")
                self._absorb(ended, [owners.get(str(e.claim_id)) for e in ended])
                self._ready = True

    async def close(self) -> None:
        """Stop: take the KV side's last events into the ledger and close it."""
        self.stopping = True
        if self.ledger is None or self.ledger.closed:
            return
        try:
            async with self._lock:
                await self._sync_locked()
        finally:
            self.ledger.close()

    def check_open(self) -> None:
        if self.stopping:
            raise ServiceUnavailable("the gateway is shutting down; send it to another")

    # ------------------------------------------------------------------ tenants
    def tenant(self, authorization: str | None) -> Tenant | None:
        return None if self.keys is None else self.keys.authenticate(authorization)

    def owner(self, owner: str | None, tenant: Tenant | None) -> str | None:
        """``owner`` as the KV side knows it: inside ``tenant``'s namespace (``ids``), so two
        tenants may use the same owner scope without meeting. It is bound to its tenant in the
        ledger once an operation naming it succeeds (``bind``): a request that fails leaves no
        trace."""
        return None if owner is None else self.namespace.inner(owner, tenant)

    def bind(self, owners: Iterable[str | None], tenant: Tenant | None) -> None:
        """Bind the owner scopes a successful operation named to its tenant (first one wins)."""
        if tenant is None or self.ledger is None:
            return
        for owner in owners:
            if owner is not None and owner not in self.ledger.owners:
                self.ledger.bind_owner(owner, tenant.name)

    def claims(
        self, raw: Sequence[Any], default_owner: str | None, tenant: Tenant | None
    ) -> tuple[Any, ...]:
        """A request's claim dicts with their owners checked and the tenant's TTL filled in."""
        if tenant is None:
            return tuple(raw)
        out = []
        for item in raw:
            if isinstance(item, Mapping):
                item = dict(item)
                named_owner = item.get("owner_scope")
                owner = self.owner(named_owner, tenant) if named_owner else default_owner
                if isinstance(owner, str) and owner:
                    item["owner_scope"] = owner
                if tenant.max_ttl_s is not None and item.get("ttl_s") is None:
                    item["ttl_s"] = tenant.max_ttl_s
                named = item.get("object_id")
                if isinstance(named, str) and not named.startswith("@"):
                    self.prefixes.own_or_unknown(named, tenant)
                if isinstance(item.get("claim_id"), str):
                    item["claim_id"] = self.namespace.inner(item["claim_id"], tenant)
                    self._remember(item["claim_id"], tenant)
            out.append(item)
        return tuple(out)

    def spec(self, spec: ClaimSpec, tenant: Tenant | None) -> ClaimSpec:
        """A claim submitted on its own, checked like one sent with a request."""
        if tenant is None:
            return spec
        claim_id = ClaimId(self.namespace.inner(spec.claim_id, tenant))
        spec = replace(
            spec, claim_id=claim_id, owner_scope=self.namespace.inner(spec.owner_scope, tenant)
        )
        self._remember(spec.claim_id, tenant)
        if tenant.max_ttl_s is not None and spec.ttl_s is None:
            return replace(spec, ttl_s=tenant.max_ttl_s)
        return spec

    def check_ttl(self, ttl_s: float | None, tenant: Tenant | None) -> None:
        """A renewal may not ask more than the tenant's maximum TTL (400, nothing changed)."""
        if tenant is None or tenant.max_ttl_s is None:
            return
        if ttl_s is None or ttl_s > tenant.max_ttl_s:
            raise UsageError(
                "ttl_s",
                f"tenant {tenant.name!r} may renew for at most {tenant.max_ttl_s:g} s, "
                f"asked {ttl_s!r}",
            )

    def gate(self, spec: ClaimSpec) -> str | None:
        """The KV side's claim gate: the tenant's limits, every one of them, for every mode,
        checked as the arbiter admits the claim (sent with a request or on its own); a claim
        let through is reserved until its decision is recorded."""
        if self.keys is None:
            return None
        name = self._tenant_of_id.get(spec.claim_id)
        if name is None and self.ledger is not None:
            name = self.ledger.owners.get(spec.owner_scope)
        tenant = self.keys.tenants.get(name) if name is not None else None
        if tenant is None:
            return None
        reason = self._over_limits(spec, tenant)
        if reason is not None:
            self.counts[tenant.name, "claims_refused"] += 1
            return reason
        if self.ledger is not None:
            protected = spec.protection_mode.value != "best_effort"
            self._reserved[spec.claim_id] = (tenant.name, spec.footprint_blocks, protected)
        return None

    def _over_limits(self, spec: ClaimSpec, tenant: Tenant) -> str | None:
        """The first of ``tenant``'s limits ``spec`` would break, or ``None``. The TTL is
        checked on its own; the counts need the ledger's books (and the claims let through,
        not yet decided)."""
        if (
            tenant.max_ttl_s is not None
            and spec.ttl_s is not None
            and spec.ttl_s > tenant.max_ttl_s
        ):
            return (
                f"ttl_s {spec.ttl_s:g} is over tenant {tenant.name!r}'s maximum of "
                f"{tenant.max_ttl_s:g} s"
            )
        if self.ledger is None:
            return None
        live, used = self.ledger.usage(tenant.name)
        for t, fp, p in self._reserved.values():
            if t == tenant.name:
                live, used = live + 1, used + (fp if p else 0)
        if tenant.max_claims is not None and live + 1 > tenant.max_claims:
            return (
                f"tenant {tenant.name!r} has {live} live claims, "
                f"at most {tenant.max_claims} allowed"
            )
        wanted = used + spec.footprint_blocks
        protected = spec.protection_mode.value != "best_effort"
        if protected and tenant.quota_blocks is not None and wanted > tenant.quota_blocks:
            return (
                f"tenant {tenant.name!r} would protect {wanted} blocks, over its quota of "
                f"{tenant.quota_blocks}"
            )
        return None

    # ------------------------------------------------------------------ after each operation
    async def decided(
        self, decisions: Sequence[ClaimDecision], owners: Mapping[str, str], tenant: Tenant | None
    ) -> None:
        """Bind the owners to the tenant, record the claims the KV side accepted, then take
        in its events."""
        if self.ledger is None:
            return
        self.bind(owners.values(), tenant)
        new = []
        for d in decisions:
            self._reserved.pop(d.claim_id, None)
            owner = owners.get(d.claim_id)
            if not d.accepted or owner is None:
                continue
            view = await self.kv.get_claim(d.claim_id, OwnerScope(owner))
            new.append(
                LedgerClaim(
                    d.claim_id,
                    None if tenant is None else tenant.name,
                    owner,
                    view.protection_mode,
                    view.footprint_blocks,
                    view.state,
                )
            )
        self.ledger.record_claims(new)
        await self.sync()

    async def served(
        self,
        result: ServeResult,
        owners: Mapping[str, str],
        tenant: Tenant | None,
        owner: str | None = None,
    ) -> ServeResult:
        """After a completion: its tenant's counts, its claims recorded, its events in the
        ledger, and its ``events_seq`` in the ledger's numbering."""
        if tenant is not None:
            outcome = result.outcome
            self._tenant_served(result.prefix_ids, outcome.request_id, tenant)
            if not outcome.served:
                self.counts[tenant.name, "deferred" if outcome.deferred else "refused"] += 1
        if self.ledger is None:
            return self.namespace.shown_result(result, tenant)
        self.bind([owner], tenant)
        await self.decided(result.decisions, owners, tenant)
        return self.namespace.shown_result(
            replace(result, events_seq=self.outer_seq(result.events_seq)), tenant
        )

    async def served_plain(
        self, request_id: str, prefix_ids: Mapping[str, Any], tenant: Tenant | None, seq: int
    ) -> int:
        """After a plain call served (no claims, no decisions): its tenant's counts and the
        ledger's events, as ``served`` keeps them (the ledger reads the KV side's events only
        where there are new ones); its ``events_seq`` in the ledger's numbering."""
        if tenant is not None:
            self._tenant_served(prefix_ids, request_id, tenant)
        if self.ledger is None:
            return seq
        if seq > self._cursor:
            await self.sync()
        return self.outer_seq(seq)

    def _tenant_served(self, prefix_ids: Any, request_id: str, tenant: Tenant) -> None:
        """A completion ``tenant`` sent: its prefix ids its own, counted, its id remembered."""
        self.prefixes.own(prefix_ids, tenant)
        self.counts[tenant.name, "requests"] += 1
        self._remember(request_id, tenant)

    async def sync(self) -> None:
        if self.ledger is None:
            return
        async with self._lock:
            await self._sync_locked()

    async def _sync_locked(self) -> None:
        assert self.ledger is not None
        while True:
            page = await self.kv.events(self._cursor, limit=_PAGE)
            if page.gap:
                self.gaps += 1  # the KV side dropped events before the ledger read them
            if page.events:
                tenants = [self._tenant(ev) for ev in page.events]  # before ingest ends them
                served = self.ledger.ingest(page.events, self._event_tenant)
                for inner, outer in zip(page.events, served, strict=True):
                    self._inner.append(inner.seq)
                    self._outer.append(outer.seq)
                self._absorb(served, tenants)
                if len(self._inner) > 2 * _REMEMBERED:
                    del self._inner[:_REMEMBERED], self._outer[:_REMEMBERED]
            self._cursor = page.next_since
            if not page.more:
                return

    def _remember(self, id_: str, tenant: Tenant) -> None:
        self._tenant_of_id[id_] = tenant.name
        while len(self._tenant_of_id) > _REMEMBERED:
            self._tenant_of_id.popitem(last=False)

    def _event_tenant(self, event: ClaimEvent) -> str | None:
        key = event.claim_id if event.claim_id is not None else event.request_id
        return None if key is None else self._tenant_of_id.get(key)

    def _tenant(self, event: ClaimEvent) -> str | None:
        """Whose claim ``event`` is about: the ledger's record of it, else this process's."""
        assert self.ledger is not None
        claim = self.ledger.claims.get(event.claim_id) if event.claim_id else None
        return (claim.tenant if claim is not None else None) or self._event_tenant(event)

    def _absorb(self, served: Sequence[ClaimEvent], tenants: Sequence[str | None]) -> None:
        """Count how claims ended, per tenant (``tenants``: each event's, found before the
        ledger took the events in and let go of the claims they end)."""
        for ev, tenant in zip(served, tenants, strict=True):
            ending = _ENDINGS.get(ev.event)
            if ending is not None:
                how, field = ending
                self.ends[tenant or "-", how, str(ev.data.get(field))] += 1

    def outer_seq(self, inner: int) -> int:
        """The ledger's ``seq`` of the KV side's event ``inner`` (the last one at or before)."""
        if self.ledger is None:
            return inner
        i = bisect.bisect_right(self._inner, inner)
        if i == 0:
            return self.ledger.last_seq if not self._inner else self._outer[0] - 1
        return self._outer[i - 1]

    async def last_seq(self) -> int:
        """The event stream's last number now (the ledger's, where there is one): a reader
        that starts after it hears only what is written from now on."""
        if self.ledger is None:
            return (await self.kv.events(SEQ_LIMIT, limit=1)).last_seq
        await self.sync()
        return self.ledger.last_seq

    async def events(
        self, since: int, *, limit: int, id_prefix: str | None, tenant: Tenant | None
    ) -> EventPage:
        if self.ledger is None:
            return await self.kv.events(since, id_prefix=id_prefix, limit=limit)
        await self.sync()
        name = None if tenant is None or tenant.admin else tenant.name
        inner_prefix = None if id_prefix is None else self.namespace.inner(id_prefix, tenant)
        page = self.ledger.page(since, limit=limit, tenant=name, id_prefix=inner_prefix)
        if not self.namespace.ns(tenant):
            return page
        return replace(
            page, events=tuple(self.namespace.shown_event(ev, tenant) for ev in page.events)
        )

    # ------------------------------------------------------------------ figures
    def health(self) -> dict[str, Any]:
        if self.ledger is None:
            return {"usable": True, "durable": False}
        return {
            "usable": self.ledger.usable(),
            "durable": self.ledger.path is not None,
            "path": None if self.ledger.path is None else str(self.ledger.path),
            "live_claims": len(self.ledger.live()) if not self.ledger.closed else None,
            "last_seq": self.ledger.last_seq,
        }

    def stats(self) -> dict[str, Any]:
        """Per tenant: counts, live claims and protected blocks; harm by cause; the ledger."""
        out: dict[str, Any] = {}
        if self.keys is not None and self.ledger is not None:
            tenants: dict[str, dict[str, int]] = {}
            for name in self.keys.tenants:
                live, blocks = self.ledger.usage(name)
                tenants[name] = {
                    "live_claims": live,
                    "protected_blocks": blocks,
                    **{what: n for (t, what), n in self.counts.items() if t == name},
                }
            out["tenants"] = tenants
        if self.ledger is not None:
            out["harm"] = [
                {"tenant": t, "cause": why, "claims": n}
                for (t, how, why), n in sorted(self.ends.items())
                if how == "harmed"
            ]
            out["ends"] = [
                {"tenant": t, "end": how, "why": why, "claims": n}
                for (t, how, why), n in sorted(self.ends.items())
            ]
            out["ledger"] = {
                "writes": self.ledger.writes,
                "write_s": round(self.ledger.write_s, 6),
                "last_seq": self.ledger.last_seq,
                "stream_gaps": self.gaps,
            }
        return out
