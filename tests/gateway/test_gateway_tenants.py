"""Two tenants on one real `agentclaims serve` process on loopback (API keys from a real key
file, the ledger in a real SQLite file): keys required, isolation in every endpoint, quotas
refused by the arbiter with the reason, salted prefix hashing, operator routes."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from prometheus_client.parser import text_string_to_metric_families
from servers import gateway_process

ALPHA = "ak-alpha-0123456789abcdef"
BETA = "ak-beta-0123456789abcdef"
OPS = "ak-ops-0123456789abcdef"
KEYS = f"""
[[key]]
key = "{ALPHA}"
tenant = "alpha"
quota_blocks = 6
max_ttl_s = 60
max_claims = 3

[[key]]
key = "{BETA}"
tenant = "beta"

[[key]]
key = "{OPS}"
tenant = "ops"
admin = true
"""
PROMPT = "the quick brown fox jumps over the lazy dog and keeps running far away"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    folder = tmp_path_factory.mktemp("tenants")
    keys = folder / "keys.toml"
    keys.write_text(KEYS)
    ledger = folder / "ledger.sqlite"
    args = ("--api-keys", str(keys), "--ledger", str(ledger), "--blocks", "64", "--block-size", "4")
    with gateway_process(*args) as url:
        yield url, ledger


def client(url: str, key: str | None) -> httpx2.Client:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    return httpx2.Client(base_url=url, headers=headers, timeout=10)


def chat(
    http: httpx2.Client,
    session: str,
    text: str = PROMPT,
    claims: list[dict[str, Any]] | None = None,
    request_id: str | None = None,
) -> httpx2.Response:
    ext: dict[str, Any] = {"session_id": session, "claims": claims or []}
    if request_id is not None:
        ext["request_id"] = request_id
    return http.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": text}], "agentclaims": ext},
    )


def prompt_claim(claim_id: str, **fields: Any) -> dict[str, Any]:
    return {
        "claim_id": claim_id,
        "object_id": "@prompt",
        "protection_mode": "hard_protected",
        **fields,
    }


def ledger_rows(path: Path) -> tuple[int, int, int]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return tuple(  # type: ignore[return-value]
            db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
            for t in ("events", "claims", "owners")
        )


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({}, "missing Authorization"),
        ({"Authorization": ALPHA}, "Bearer"),
        ({"Authorization": "Basic abc"}, "Bearer"),
        ({"Authorization": "Bearer ak-nobody-0123456789abcdef"}, "unknown API key"),
    ],
)
def test_every_route_needs_a_valid_key(
    gateway: tuple[str, Path], headers: dict[str, str], message: str
) -> None:
    url, ledger = gateway
    before = ledger_rows(ledger)
    with httpx2.Client(base_url=url, headers=headers, timeout=10) as http:
        for method, path in [
            ("POST", "/v1/chat/completions"),
            ("POST", "/v1/completions"),
            ("POST", "/v1/claims"),
            ("GET", "/v1/claims/c?owner_scope=o"),
            ("POST", "/v1/claims/c/renew"),
            ("POST", "/v1/claims/c/release"),
            ("DELETE", "/v1/claims/c?owner_scope=o"),
            ("GET", "/v1/events"),
            ("POST", "/v1/residency"),
            ("POST", "/v1/active"),
            ("GET", "/v1/descriptor"),
            ("GET", "/v1/models"),
            ("GET", "/metrics"),
        ]:
            r = http.request(method, path, json={} if method == "POST" else None)
            assert r.status_code == 401, (method, path, r.text)
            assert r.json()["error"]["type"] == "unauthorized"
            assert message in r.json()["error"]["message"]
        assert http.get("/health").status_code == 200  # liveness stays open
        doc = http.get("/openapi.json")
        assert doc.status_code == 200
        # the security in force: every route but these two requires a bearer key; no anonymous
        for path, ops in doc.json()["paths"].items():
            for method, op in ops.items():
                open_route = path in ("/health", "/openapi.json")
                assert op["security"] == ([] if open_route else [{"bearer": []}]), (method, path)
        assert doc.json()["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert ledger_rows(ledger) == before


def test_a_tenant_never_sees_or_touches_another_tenants_claims(gateway: tuple[str, Path]) -> None:
    """Claim ids, owner scopes and request ids are each tenant's own: beta naming alpha's gets
    what an id never issued gets, and the same ids used by beta are beta's, apart."""
    url, ledger = gateway
    with client(url, ALPHA) as alpha, client(url, BETA) as beta:
        r = chat(alpha, "iso-a", claims=[prompt_claim("iso-c1")])
        assert r.status_code == 200, r.text
        assert r.json()["agentclaims"]["decisions"][0]["decision"] == "accepted"
        before = ledger_rows(ledger)
        # naming alpha's claim, in every endpoint that names one: unknown, nothing changed
        for method, path, body in [
            ("GET", "/v1/claims/iso-c1?owner_scope=iso-a", None),
            ("POST", "/v1/claims/iso-c1/renew", {"owner_scope": "iso-a"}),
            ("POST", "/v1/claims/iso-c1/release", {"owner_scope": "iso-a"}),
            ("DELETE", "/v1/claims/iso-c1?owner_scope=iso-a", None),
        ]:
            r = beta.request(method, path, json=body)
            never = beta.request(method, path.replace("iso-c1", "never-c1"), json=body)
            assert r.status_code == never.status_code == 404, (method, path, r.text)
            assert r.json()["error"]["type"] == "unknown_claim"
            assert r.text == never.text.replace("never-c1", "iso-c1")  # not one byte more
        assert beta.get("/v1/claims/iso-c1?owner_scope=iso-b").status_code == 404
        # and in a batch of releases: that item unknown, the same bytes as an id never issued
        r, never = (
            beta.post("/v1/releases", json={"releases": [{"claim_id": c, "owner_scope": "iso-a"}]})
            for c in ("iso-c1", "never-c1")
        )
        assert r.status_code == never.status_code == 200, r.text
        (item,) = r.json()["released"]
        assert (item["status"], item["error"]["type"]) == (404, "unknown_claim")
        assert r.text == never.text.replace("never-c1", "iso-c1")
        assert ledger_rows(ledger) == before
        # the same owner scope, claim id and request id, used by beta: beta's own, apart
        r = chat(beta, "iso-a", claims=[prompt_claim("iso-c1")], request_id="iso-r1")
        assert r.status_code == 200, r.text
        assert r.json()["agentclaims"]["decisions"][0]["decision"] == "accepted"
        assert r.json()["agentclaims"]["request_id"] == "iso-r1"
        r = chat(alpha, "iso-a", request_id="iso-r1")
        assert r.status_code == 200, r.text
        assert r.json()["agentclaims"]["request_id"] == "iso-r1"
        view = beta.get("/v1/claims/iso-c1?owner_scope=iso-a").json()
        assert (view["claim_id"], view["owner_scope"]) == ("iso-c1", "iso-a")
        assert (
            beta.post("/v1/claims/iso-c1/release", json={"owner_scope": "iso-a"}).json()["state"]
            == "expired"
        )
        # events: each reads its own claim's story under its own ids, never the other's
        mine = alpha.get("/v1/events").json()["events"]
        theirs = beta.get("/v1/events").json()["events"]
        assert {"resident_claim_accepted", "resident_claim_materialized"} <= {
            e["event"] for e in mine if e["claim_id"] == "iso-c1"
        }
        assert {e["seq"] for e in mine}.isdisjoint(e["seq"] for e in theirs)
        assert "resident_claim_expired" in {e["event"] for e in theirs if e["claim_id"] == "iso-c1"}
        assert "alpha" not in json.dumps(theirs)
        with client(url, OPS) as ops:  # the operator reads the whole stream, ids in full
            ids = {e["claim_id"] for e in ops.get("/v1/events").json()["events"]}
            assert {"alpha/iso-c1", "beta/iso-c1"} <= ids
        # alpha's claim was never touched: alpha reads and releases it
        assert alpha.get("/v1/claims/iso-c1?owner_scope=iso-a").json()["state"] == "materialized"
        r = alpha.post("/v1/claims/iso-c1/release", json={"owner_scope": "iso-a"})
        assert r.json()["state"] == "expired"


def test_a_request_id_the_gateway_makes_is_the_tenants_own(gateway: tuple[str, Path]) -> None:
    """A tenant's call that names no request id gets one in the tenant's namespace: the
    tenant sees it as its own (never ``other:<hex>``), the operator sees it qualified."""
    url, _ = gateway
    with client(url, ALPHA) as alpha, client(url, OPS) as ops:
        r = chat(alpha, "gen-a", claims=[prompt_claim("gen-c1", ttl_s=30)])
        assert r.status_code == 200, r.text
        rid = r.json()["agentclaims"]["request_id"]
        assert rid.startswith("chatcmpl-"), rid
        assert r.json()["id"] == rid
        mine = alpha.get("/v1/events").json()["events"]
        assert rid in {e["request_id"] for e in mine}  # its admission event names it
        assert not any(str(e["request_id"]).startswith("other:") for e in mine)
        every = ops.get("/v1/events").json()["events"]
        assert f"alpha/{rid}" in {e["request_id"] for e in every}
        alpha.post("/v1/claims/gen-c1/release", json={"owner_scope": "gen-a"})


def _identity(http: httpx2.Client) -> dict[str, Any]:
    identity: dict[str, Any] = http.get("/v1/descriptor").json()["cache_identity"]
    return identity


def test_limits_are_refused_by_the_arbiter_with_the_reason(gateway: tuple[str, Path]) -> None:
    """alpha may protect 6 blocks, hold 3 claims, for at most 60 s."""
    url, _ = gateway
    with client(url, ALPHA) as alpha:
        words = [f"w{i}" for i in range(40)]

        def claim_on(session: str, n_words: int, claim_id: str, **fields: Any) -> dict[str, Any]:
            r = chat(alpha, session, " ".join(words[:n_words]), [prompt_claim(claim_id, **fields)])
            assert r.status_code == 200, r.text
            decision: dict[str, Any] = r.json()["agentclaims"]["decisions"][0]
            return decision

        first = claim_on("lim", 8, "lim-1")  # about 3 blocks of 4 tokens
        assert first["decision"] == "accepted"
        view = alpha.get("/v1/claims/lim-1?owner_scope=lim").json()
        assert view["expires_at_ns"] is not None  # no ttl_s given: the tenant's 60 s
        over = claim_on("lim", 30, "lim-2")  # would protect far more than 6 blocks
        assert over["decision"] == "rejected"
        assert over["action"] == "refuse_residency_claim"
        assert "quota of 6" in over["reason"]
        long_ttl = claim_on("lim", 2, "lim-3", ttl_s=120, protection_mode="best_effort")
        assert long_ttl["decision"] == "rejected"
        assert "maximum of 60" in long_ttl["reason"]
        d4 = claim_on("lim", 2, "lim-4", protection_mode="best_effort")
        assert d4["decision"] == "accepted", d4
        assert claim_on("lim", 3, "lim-5", protection_mode="best_effort")["decision"] == "accepted"
        fourth = claim_on("lim", 4, "lim-6", protection_mode="best_effort")
        assert fourth["decision"] == "rejected"
        assert "at most 3" in fourth["reason"]
        events = alpha.get("/v1/events", params={"id_prefix": "lim-"}).json()["events"]
        rejected = {e["claim_id"]: e for e in events if e["event"] == "resident_claim_rejected"}
        assert set(rejected) == {"lim-2", "lim-3", "lim-6"}
        assert "quota" in rejected["lim-2"]["reason"]
        # a renewal past the maximum is refused and changes nothing
        r = alpha.post("/v1/claims/lim-1/renew", json={"owner_scope": "lim", "ttl_s": 600})
        assert r.status_code == 400
        assert r.json()["error"]["field"] == "ttl_s"
        assert (
            alpha.post(
                "/v1/claims/lim-1/renew", json={"owner_scope": "lim", "ttl_s": 30}
            ).status_code
            == 200
        )
        for cid in ("lim-1", "lim-4", "lim-5"):  # room again once released
            alpha.post(f"/v1/claims/{cid}/release", json={"owner_scope": "lim"})
        assert claim_on("lim", 30, "lim-7", protection_mode="best_effort")["decision"] == "accepted"


def test_tenants_never_share_prefix_cache_entries(gateway: tuple[str, Path]) -> None:
    url, _ = gateway
    text = "salted prompt " * 6
    with client(url, ALPHA) as alpha, client(url, BETA) as beta:
        a1 = chat(alpha, "salt-a", text).json()
        a2 = chat(alpha, "salt-a", text).json()
        b1 = chat(beta, "salt-b", text).json()
    assert a2["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # alpha reuses its own
    assert b1["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # but beta cannot
    assert a1["agentclaims"]["prefix_ids"]["prompt"] != b1["agentclaims"]["prefix_ids"]["prompt"]


def test_operator_routes_need_an_operator_key(gateway: tuple[str, Path]) -> None:
    url, _ = gateway
    with client(url, ALPHA) as alpha, client(url, OPS) as ops:
        for path in ("/metrics", "/v1/stats"):
            r = alpha.get(path)
            assert r.status_code == 403
            assert r.json()["error"]["type"] == "forbidden"
        r = alpha.post("/v1/instance", json={"usable_blocks": 8, "owner_scope": "x"})
        assert r.status_code == 403
        chat(alpha, "metrics-a")
        families = {f.name: f for f in text_string_to_metric_families(ops.get("/metrics").text)}
        requests = {
            s.labels["tenant"]: s.value for s in families["agentclaims_tenant_requests"].samples
        }
        assert requests["alpha"] >= 1
        assert requests["beta"] >= 0
        assert "agentclaims_tenant_protected_blocks" in families
        assert families["agentclaims_ledger_writes"].samples[0].value > 0
        stats = ops.get("/v1/stats").json()
        assert stats["tenants"]["alpha"]["requests"] >= 1


async def test_an_sdk_session_works_with_its_tenant_key(tmp_path: Path) -> None:
    """The SDK as a user runs it (HTTPBackend with ``api_key``, the OpenAI client, a claimed
    workflow with tool calls) against a keyed gateway: claims accepted, their events read back
    through the tenant's filtered stream, none left live; without the key, a typed error."""
    import agentclaims
    from agentclaims.session import current_session

    keys = tmp_path / "keys.toml"
    keys.write_text(KEYS)
    with gateway_process("--api-keys", str(keys), "--blocks", "1024") as url:
        async with agentclaims.HTTPBackend(url, api_key=BETA) as backend:
            oai = agentclaims.openai_client(backend)

            @agentclaims.claimed_session(backend=backend)
            async def workflow() -> Any:
                session = current_session()
                assert session is not None
                messages = [{"role": "system", "content": "be brief " * 80}]
                with session.node("agent"):
                    for i in range(3):
                        messages.append({"role": "user", "content": f"step {i} " * 10})
                        reply = await oai.chat.completions.create(
                            model="scripted", messages=messages
                        )
                        text = reply.choices[0].message.content
                        messages.append({"role": "assistant", "content": text})
                        async with session.tool_call("search"):
                            pass
                return session

            session = await workflow()
            assert session.stats.llm_calls == 3
            assert session.stats.claims_accepted >= 1
            with client(url, OPS) as ops:
                live = ops.get("/v1/stats").json()["tenants"]["beta"]["live_claims"]
            assert live == 0
        async with agentclaims.HTTPBackend(url) as anonymous:
            with pytest.raises(agentclaims.Unauthorized):
                await anonymous.descriptor()


def test_another_tenants_prefix_id_is_to_it_a_prefix_never_served(
    gateway: tuple[str, Path],
) -> None:
    """Beta naming alpha's prefix id (leaked in a log, say) learns nothing and pins nothing:
    residency 0, a claim on it refused with the very answer an id never issued gets, and
    per-block residency is an operator's route. Alpha's own view is unchanged."""
    url, ledger = gateway
    with client(url, ALPHA) as alpha, client(url, BETA) as beta, client(url, OPS) as ops:
        served = chat(alpha, "pfx-a", text=PROMPT + " for alpha only")
        assert served.status_code == 200, served.text
        theirs = served.json()["agentclaims"]["prefix_ids"]["prompt"]
        assert theirs
        own = alpha.post("/v1/residency", json={"prefix_ids": [theirs]}).json()["residency"]
        assert own[theirs] > 0
        never = "pfx-0123456789abcdef-" + theirs.rsplit("-", 1)[1]
        seen = beta.post("/v1/residency", json={"prefix_ids": [theirs, never]}).json()
        assert seen == {"residency": {theirs: 0, never: 0}}
        identity = beta.get("/v1/descriptor").json()["cache_identity"]
        before = ledger_rows(ledger)

        def claim_on(pid: str) -> httpx2.Response:
            spec = {
                "claim_id": f"steal-{pid[-6:]}",
                "owner_scope": "pfx-b",
                "object_id": pid,
                "cache_identity": identity,
                "footprint_blocks": 2,
                "protection_mode": "hard_protected",
            }
            return beta.post("/v1/claims", json={"claim": spec})

        stolen, unknown = claim_on(theirs), claim_on(never)
        assert stolen.status_code == unknown.status_code == 400
        assert stolen.json()["error"]["message"].replace(theirs, "PID") == unknown.json()["error"][
            "message"
        ].replace(never, "PID")
        in_request = chat(
            beta,
            "pfx-b",
            text="beta's own words",
            claims=[{**prompt_claim("steal-2"), "object_id": theirs}],
        )
        assert in_request.status_code == 400
        assert "unknown prefix" in in_request.json()["error"]["message"]
        blocks = beta.post("/v1/residency", json={"block_hashes": [1, 2, 3]})
        assert blocks.status_code == 403
        assert ops.post("/v1/residency", json={"block_hashes": [1, 2, 3]}).status_code == 200
        assert ledger_rows(ledger) == before  # nothing recorded for beta
        # the operator may still name any prefix
        assert (
            ops.post("/v1/residency", json={"prefix_ids": [theirs]}).json()["residency"][theirs]
            == own[theirs]
        )
