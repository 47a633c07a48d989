"""Every tenant limit, for every mode, by one gate (hypothesis): any interleaving of two
tenants' claims (sent with a chat request or on their own through ``POST /v1/claims``), with
any TTL, renewals and releases, over the real gateway app in process with a real SQLite
ledger, never leaves a live claim outside its tenant's limits: its TTL at most the tenant's
``max_ttl_s``, the tenant's live claims at most ``max_claims``, its protected blocks at most
``quota_blocks``. A claim over a limit is refused by the gateway with the limit named."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentclaims.engine import ReferenceKV
from agentclaims.gateway import ScriptedModel, create_app
from agentclaims.gateway.ledger import Ledger
from agentclaims.gateway.tenants import Tenant, TenantKeys

KEYS = {"alpha": "ak-alpha-0123456789abcdef", "beta": "ak-beta-0123456789abcdef"}
LIMITS = {
    "alpha": Tenant("alpha", quota_blocks=10, max_ttl_s=60, max_claims=3),
    "beta": Tenant("beta", quota_blocks=6, max_ttl_s=20, max_claims=2),
}
MODES = ["hard_protected", "expiring", "soft_priority", "demotable", "best_effort"]

ops = st.lists(
    st.tuples(
        st.sampled_from(["alpha", "beta"]),
        st.sampled_from(["chat", "claim", "renew", "release"]),
        st.integers(0, 5),  # which claim id
        st.integers(4, 40),  # prompt length in words
        st.sampled_from(MODES),
        st.sampled_from([None, 5, 20, 45, 60, 900]),  # ttl_s asked
    ),
    min_size=1,
    max_size=20,
)


def _limits_hold(kv: ReferenceKV, ledger: Ledger) -> None:
    live = [c for c in kv.engine._claims.values() if c.state.live]
    for name, tenant in LIMITS.items():
        mine = [c for c in live if ledger.owners.get(c.spec.owner_scope) == name]
        assert len(mine) <= (tenant.max_claims or 0), (name, [c.spec.claim_id for c in mine])
        protected = sum(
            c.spec.footprint_blocks for c in mine if c.spec.protection_mode.value != "best_effort"
        )
        assert protected <= (tenant.quota_blocks or 0), (name, protected)
        for c in mine:
            assert c.spec.ttl_s is not None, c.spec  # the tenant's maximum filled in
            assert c.spec.ttl_s <= (tenant.max_ttl_s or 0), (name, c.spec.claim_id, c.spec.ttl_s)


async def _run(steps: list[tuple[str, str, int, int, str, int | None]], db: Path | None) -> None:
    kv = ReferenceKV.create(64, 4)
    keys = TenantKeys([(KEYS[name], tenant) for name, tenant in LIMITS.items()])
    ledger = Ledger(db)
    app = create_app(kv, ScriptedModel(), keys=keys, ledger=ledger)
    transport = httpx2.ASGITransport(app=app)
    clients = {
        name: httpx2.AsyncClient(
            transport=transport, base_url="http://gw", headers={"Authorization": f"Bearer {key}"}
        )
        for name, key in KEYS.items()
    }
    served: dict[str, str] = {}  # tenant -> a prompt prefix id it has served
    try:
        identity = (await clients["alpha"].get("/v1/descriptor")).json()["cache_identity"]
        for tenant, op, n, words, mode, ttl in steps:
            http = clients[tenant]
            owner = f"{tenant}-wf"
            claim_id = f"{tenant}-c{n}"
            claim: dict[str, Any] = {"claim_id": claim_id, "protection_mode": mode}
            if ttl is not None:
                claim["ttl_s"] = ttl
            elif mode == "expiring":
                claim["ttl_s"] = 10
            r: httpx2.Response
            if op == "chat":
                r = await http.post(
                    "/v1/chat/completions",
                    json={
                        "model": "m",
                        "messages": [
                            {"role": "user", "content": " ".join([f"{tenant}{n}"] * words)}
                        ],
                        "agentclaims": {
                            "session_id": owner,
                            "claims": [{**claim, "object_id": "@prompt"}],
                        },
                    },
                )
                if r.status_code == 200:
                    pid = r.json()["agentclaims"]["prefix_ids"]["prompt"]
                    if pid:
                        served[tenant] = pid
            elif op == "claim":
                if tenant not in served:
                    continue
                body = {
                    **claim,
                    "owner_scope": owner,
                    "object_id": served[tenant],
                    "cache_identity": identity,
                    "footprint_blocks": 1 + words % 4,
                }
                r = await http.post("/v1/claims", json={"claim": body})
            elif op == "renew":
                r = await http.post(
                    f"/v1/claims/{claim_id}/renew",
                    json={"owner_scope": owner, "ttl_s": ttl if ttl is not None else 5},
                )
            else:
                r = await http.post(f"/v1/claims/{claim_id}/release", json={"owner_scope": owner})
            assert r.status_code < 500, r.text
            if op in ("chat", "claim") and r.status_code == 200:
                decisions = r.json()["agentclaims"]["decisions"] if op == "chat" else [r.json()]
                for d in decisions:
                    reason = str(d.get("reason") or "")
                    asked = claim.get("ttl_s")
                    limit = LIMITS[tenant].max_ttl_s or 0
                    if asked is not None and asked > limit:
                        assert d["decision"] != "accepted", (tenant, claim, d)
                        assert "maximum" in reason, reason
            _limits_hold(kv, ledger)
    finally:
        for c in clients.values():
            await c.aclose()
        ledger.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=ops)
def test_no_interleaving_leaves_a_claim_outside_its_tenants_limits(
    steps: list[tuple[str, str, int, int, str, int | None]], tmp_path_factory: Any
) -> None:
    db = tmp_path_factory.mktemp("ledger") / "claims.db"
    asyncio.run(_run(steps, db))


def test_a_protected_claim_under_quota_but_over_the_ttl_is_refused() -> None:
    """The case an ``elif`` let through: quota set and room left, TTL over the maximum."""
    asyncio.run(
        _run(
            [
                ("alpha", "chat", 0, 8, "hard_protected", 900),
                ("beta", "chat", 0, 8, "expiring", 45),
            ],
            None,
        )
    )
