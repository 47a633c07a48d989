"""Tenant isolation and the ledger's books as properties (hypothesis): any interleaving of
two tenants' completions, claims, renewals, releases and reads over the real gateway app (in
process), both naming the same owner scopes and claim ids, keeps them apart: each tenant's ids
are its own (another's claim is, to it, one never issued), it sees only its own events under
the ids it gave them, the ledger's live claims stay the engine's, and the stream is numbered
strictly upward."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentclaims.engine import ReferenceKV
from agentclaims.gateway import ScriptedModel, create_app
from agentclaims.gateway.ledger import Ledger
from agentclaims.gateway.tenants import Tenant, TenantKeys

KEYS = {"alpha": "ak-alpha-0123456789abcdef", "beta": "ak-beta-0123456789abcdef"}
OPS_KEY = "ak-ops-0123456789abcdef"

ops = st.lists(
    st.tuples(
        st.sampled_from(["alpha", "beta"]),
        st.sampled_from(["chat", "release", "renew", "get", "events"]),
        st.sampled_from(["o1", "o2", "o3"]),  # owner scopes both tenants may try
        st.integers(0, 5),  # which claim id
        st.integers(1, 12),  # prompt length in words
        st.sampled_from(["hard_protected", "soft_priority", "best_effort", "expiring"]),
    ),
    min_size=1,
    max_size=25,
)


async def _run(steps: list[tuple[str, str, str, int, int, str]]) -> None:
    kv = ReferenceKV.create(48, 4)
    keys = TenantKeys(
        [
            (KEYS["alpha"], Tenant("alpha", quota_blocks=12, max_claims=3)),
            (KEYS["beta"], Tenant("beta", max_ttl_s=30)),
            (OPS_KEY, Tenant("ops", admin=True)),
        ]
    )
    ledger = Ledger()
    app = create_app(kv, ScriptedModel(), keys=keys, ledger=ledger)
    transport = httpx2.ASGITransport(app=app)
    clients = {
        name: httpx2.AsyncClient(
            transport=transport,
            base_url="http://gw",
            headers={"Authorization": f"Bearer {key}"},
        )
        for name, key in {**KEYS, "ops": OPS_KEY}.items()
    }
    owners: set[tuple[str, str]] = set()
    submitted: dict[str, set[str]] = {"alpha": set(), "beta": set()}
    try:
        for tenant, op, owner, n, words, mode in steps:
            http = clients[tenant]
            claim_id = f"{owner}-c{n}"
            r: httpx2.Response
            if op == "chat":
                claim: dict[str, Any] = {
                    "claim_id": claim_id,
                    "object_id": "@prompt",
                    "protection_mode": mode,
                }
                if mode == "expiring":
                    claim["ttl_s"] = 10
                r = await http.post(
                    "/v1/chat/completions",
                    json={
                        "model": "m",
                        "messages": [{"role": "user", "content": " ".join(["w"] * words)}],
                        "agentclaims": {"session_id": owner, "claims": [claim]},
                    },
                )
                if r.status_code == 200:
                    submitted[tenant].add(claim_id)
            elif op == "release":
                r = await http.post(f"/v1/claims/{claim_id}/release", json={"owner_scope": owner})
            elif op == "renew":
                r = await http.post(
                    f"/v1/claims/{claim_id}/renew", json={"owner_scope": owner, "ttl_s": 5}
                )
            elif op == "get":
                r = await http.get(f"/v1/claims/{claim_id}", params={"owner_scope": owner})
            else:
                r = await http.get("/v1/events")
                seen = {e["claim_id"] for e in r.json()["events"] if e["claim_id"]}
                assert seen <= submitted[tenant], (tenant, seen - submitted[tenant])
            assert r.status_code < 500, r.text
            assert r.status_code != 403, r.text  # nothing says another tenant has the id
            other = "beta" if tenant == "alpha" else "alpha"
            assert other not in r.text, r.text
            if op in ("release", "renew", "get") and claim_id not in submitted[tenant]:
                assert r.status_code == 404, (tenant, op, claim_id, r.text)
            if op in ("release", "get") and claim_id in submitted[tenant]:
                assert r.status_code == 200, (tenant, op, claim_id, r.text)
                assert r.json()["claim_id"] == claim_id
                assert r.json()["owner_scope"] == owner
            if r.status_code == 200 and op == "chat":
                owners.add((tenant, owner))
            # the ledger's live claims are the engine's
            engine_live = {c.claim_id for c in kv.engine._claims.values() if c.state.live}
            assert {c.claim_id for c in ledger.live()} == engine_live
            for name in ("alpha", "beta"):  # the quota counters are the live claims' sums
                live = ledger.live(name)
                protected = sum(c.footprint_blocks for c in live if c.protected)
                assert ledger.usage(name) == (len(live), protected)
        everything = (await clients["ops"].get("/v1/events", params={"limit": 100_000})).json()
        seqs = [e["seq"] for e in everything["events"]]
        assert seqs == sorted(set(seqs))
        # each tenant's owner scopes are bound to it, inside its own namespace
        assert ledger.owners == {f"{t}/{o}": t for t, o in owners}
    finally:
        for c in clients.values():
            await c.aclose()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_any_interleaving_of_two_tenants_keeps_them_apart(
    steps: list[tuple[str, str, str, int, int, str]],
) -> None:
    asyncio.run(_run(steps))


async def test_a_tenants_request_id_comes_back_as_it_named_it() -> None:
    """The answer's ``id`` and ``agentclaims.request_id`` name the request as the tenant named
    it, never with the tenant's namespace inside the gateway."""
    keys = TenantKeys([(KEYS["alpha"], Tenant("alpha"))])
    app = create_app(ReferenceKV.create(48, 4), ScriptedModel(), keys=keys)
    async with httpx2.AsyncClient(
        transport=httpx2.ASGITransport(app=app),
        base_url="http://gw",
        headers={"Authorization": f"Bearer {KEYS['alpha']}"},
    ) as http:
        answer = (
            await http.post(
                "/v1/chat/completions",
                json={
                    "model": "m",
                    "messages": [{"role": "user", "content": "hello there"}],
                    "agentclaims": {"session_id": "o1", "request_id": "req-7"},
                },
            )
        ).json()
    assert answer["id"] == "req-7"
    assert answer["agentclaims"]["request_id"] == "req-7"


async def test_an_operator_names_a_tenants_claim_in_full_on_every_claim_route() -> None:
    """An operator key acts in the KV side's own namespace: ``alpha/c-1`` (as the events
    and the ledger name it; a slash in the path, raw or escaped) reads, renews and releases
    alpha's claim ``c-1``; alpha still reads it as ``c-1``."""
    keys = TenantKeys([(KEYS["alpha"], Tenant("alpha")), (OPS_KEY, Tenant("ops", admin=True))])
    app = create_app(ReferenceKV.create(48, 4), ScriptedModel(), keys=keys)
    transport = httpx2.ASGITransport(app=app)
    alpha, ops = (
        httpx2.AsyncClient(
            transport=transport, base_url="http://gw", headers={"Authorization": f"Bearer {key}"}
        )
        for key in (KEYS["alpha"], OPS_KEY)
    )
    claim = {"claim_id": "c-1", "protection_mode": "soft_priority", "ttl_s": 60}
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "one two three four five six seven eight"}],
        "agentclaims": {"session_id": "s-1", "claims": [{**claim, "object_id": "@prompt"}]},
    }
    async with alpha, ops:
        served = await alpha.post("/v1/chat/completions", json=body)
        assert served.json()["agentclaims"]["decisions"][0]["decision"] == "accepted"
        scope = {"owner_scope": "alpha/s-1"}
        for path in ("/v1/claims/alpha/c-1", "/v1/claims/alpha%2Fc-1"):
            view = await ops.get(path, params=scope)
            assert view.status_code == 200, view.text
            assert (view.json()["claim_id"], view.json()["state"]) == ("alpha/c-1", "materialized")
        renewed = await ops.post("/v1/claims/alpha/c-1/renew", params=scope, json={"ttl_s": 30})
        assert renewed.status_code == 200, renewed.text
        mine = await alpha.get("/v1/claims/c-1", params={"owner_scope": "s-1"})
        assert mine.json()["claim_id"] == "c-1"
        released = await ops.delete("/v1/claims/alpha/c-1", params=scope)
        assert released.status_code == 200, released.text
        assert released.json()["state"] == "expired"  # released: ended, as the contract has it
        gone = await alpha.get("/v1/claims/c-1", params={"owner_scope": "s-1"})
        assert gone.json()["state"] == "expired"
        other = await alpha.get("/v1/claims/beta/c-1", params={"owner_scope": "s-1"})
        assert other.status_code == 404  # a tenant's path with a slash stays its own namespace
