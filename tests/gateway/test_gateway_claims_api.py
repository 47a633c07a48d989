"""The claims API, events, residency, descriptor, health and metrics, in-process."""

from __future__ import annotations

from typing import Any

import pytest
from gateway_sleeps import RecordingSleep
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from agentclaims.backends import EmbeddedBackend
from agentclaims.contract import ClaimSpec, ClaimState, LoweringClass, ProtectionMode
from agentclaims.engine import hash_token_blocks
from agentclaims.errors import (
    AgentClaimsError,
    BackendError,
    ContractViolation,
    IllegalTransition,
    ScopeViolation,
    UnknownClaim,
    UsageError,
)
from agentclaims.protocol import (
    ActiveOutcome,
    ClaimDecision,
    ClaimView,
    Renewal,
    collect_events,
    exception_error,
    raise_for_error,
)


@pytest.fixture
async def backend() -> Any:
    async with EmbeddedBackend(32, 4, sleep=RecordingSleep()) as b:
        yield b


def spec_for(b: EmbeddedBackend, claim_id: str, blocks: int, **kw: Any) -> ClaimSpec:
    return ClaimSpec(
        claim_id=claim_id,
        owner_scope=kw.pop("owner_scope", "o"),
        object_id=kw.pop("object_id", f"obj-{claim_id}"),
        cache_identity=b.engine.cache_identity,
        footprint_blocks=blocks,
        protection_mode=kw.pop("protection_mode", ProtectionMode.HARD_PROTECTED),
        **kw,
    )


async def test_claim_lifecycle_over_the_api(backend: EmbeddedBackend) -> None:
    """Submit with block hashes, read, renew, release: each answer matches the engine."""
    hashes = hash_token_blocks(list(range(12)), 4)
    decision = await backend.submit_claim(spec_for(backend, "c", 3, ttl_s=30.0), hashes)
    assert decision.accepted
    assert decision.state is ClaimState.ACCEPTED
    view = await backend.get_claim("c", "o")
    assert view.present_blocks == 0
    assert view == backend.engine.get_claim("c", "o")
    renewed = await backend.renew_claim("c", "o", Renewal(duration_steps=5))
    assert renewed.expires_at_step == backend.engine.step_count + 5
    released = await backend.release_claim("c", "o")
    assert released.state is ClaimState.EXPIRED
    assert released.end_reason == "released"


async def test_delete_releases_a_claim(backend: EmbeddedBackend) -> None:
    """DELETE /v1/claims/{id}?owner_scope= ends the claim like POST .../release."""
    await backend.submit_claim(spec_for(backend, "d", 1), hash_token_blocks([1, 2, 3, 4], 4))
    resp = await backend.http_client().delete("/v1/claims/d", params={"owner_scope": "o"})
    assert resp.status_code == 200
    assert resp.json()["state"] == "expired"


async def test_a_release_can_carry_the_sessions_events(backend: EmbeddedBackend) -> None:
    """``events_since`` on a release: its answer carries the page ``GET /v1/events`` would give
    just after it (the release's own event included, other sessions' left out); a bad cursor is
    a 400 naming it, and the claim stays held."""
    for claim_id, owner in (("s1-c1", "s1"), ("s2-c1", "s2")):
        spec = spec_for(backend, claim_id, 1, owner_scope=owner)
        await backend.submit_claim(spec, hash_token_blocks([1, 2, 3, 4], 4))
    http = backend.http_client()
    for bad in (-1, "3", True, 2**62):
        refused = await http.post(
            "/v1/claims/s1-c1/release", json={"owner_scope": "s1", "events_since": bad}
        )
        assert refused.status_code == 400
        assert refused.json()["error"]["field"] == "events_since"
    assert (await backend.get_claim("s1-c1", "s1")).state is ClaimState.ACCEPTED
    view, page = await backend.release_claim_with_events(
        "s1-c1", "s1", events_since=0, id_prefix="s1-"
    )
    assert view.state is ClaimState.EXPIRED
    assert page is not None
    polled = (await http.get("/v1/events", params={"since": 0, "id_prefix": "s1-"})).json()
    assert page == polled
    assert {e["claim_id"] for e in page["events"]} == {"s1-c1"}
    assert page["events"][-1]["event"] == "resident_claim_expired"
    plain, none = await backend.release_claim_with_events("s2-c1", "s2")
    assert plain.state is ClaimState.EXPIRED
    assert none is None


async def test_rejected_claim_is_a_decision_not_an_error(backend: EmbeddedBackend) -> None:
    """A claim larger than the pool comes back rejected (200), with the reason."""
    hashes = hash_token_blocks(list(range(40 * 4)), 4)
    decision = await backend.submit_claim(spec_for(backend, "huge", 40), hashes)
    assert not decision.accepted
    assert decision.reason == "exceeds_capacity"


async def test_claim_errors_map_to_typed_exceptions(backend: EmbeddedBackend) -> None:
    """Unknown claim -> UnknownClaim (404); other owner -> ScopeViolation (403); bad -> 400."""
    await backend.submit_claim(spec_for(backend, "x", 1), hash_token_blocks([5, 6, 7, 8], 4))
    with pytest.raises(UnknownClaim):
        await backend.get_claim("nope", "o")
    with pytest.raises(ScopeViolation):
        await backend.release_claim("x", "intruder")
    with pytest.raises(UsageError) as info:
        await backend.renew_claim("x", "o", Renewal(duration_steps=-1))
    assert info.value.field == "duration_steps"
    with pytest.raises(UsageError) as dup:
        await backend.submit_claim(spec_for(backend, "x", 1), hash_token_blocks([9, 9, 9, 9], 4))
    assert dup.value.field == "claim_id"
    assert (await backend.get_claim("x", "o")).state is ClaimState.ACCEPTED


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/claims", {}, "claim"),
        ("/v1/claims", {"claim": {"claim_id": "z"}}, "claim.owner_scope"),
        # a value given and wrong is named before the fields left out
        ("/v1/claims", {"claim": {"protection_mode": "forever"}}, "claim.protection_mode"),
        ("/v1/claims/x/renew", {}, "owner_scope"),
        ("/v1/residency", {"prefix_ids": "pfx"}, "prefix_ids"),
    ],
)
async def test_claims_api_usage_errors(
    backend: EmbeddedBackend, path: str, body: dict[str, Any], field: str
) -> None:
    """Malformed claims-API bodies answer 400 naming the field."""
    resp = await backend.http_client().post(path, json=body)
    assert resp.status_code == 400
    assert resp.json()["error"]["field"] == field


async def test_block_hashes_must_be_unsigned_64_bit(backend: EmbeddedBackend) -> None:
    """Block hashes outside 0..2**64-1 are a usage error."""
    body = {"claim": spec_for(backend, "h", 1).to_dict(), "block_hashes": [-1]}
    resp = await backend.http_client().post("/v1/claims", json=body)
    assert resp.json()["error"]["field"] == "block_hashes"


async def test_get_claim_needs_owner_scope(backend: EmbeddedBackend) -> None:
    """Reading a claim without ``owner_scope`` is a usage error on that field."""
    resp = await backend.http_client().get("/v1/claims/x")
    assert resp.status_code == 400
    assert resp.json()["error"]["field"] == "owner_scope"


async def test_events_resume_from_a_sequence(backend: EmbeddedBackend) -> None:
    """Events after ``since`` come in order; paging with ``limit`` loses none."""
    for i in range(3):
        await backend.http_client().post("/v1/completions", json={"prompt": list(range(i, i + 8))})
    every = await collect_events(backend)
    assert [e.seq for e in every] == list(range(1, backend.engine.last_seq + 1))
    assert [e.seq for e in await collect_events(backend, since=2)] == [e.seq for e in every[2:]]
    page = (await backend.http_client().get("/v1/events", params={"since": 0, "limit": 2})).json()
    assert [e["seq"] for e in page["events"]] == [1, 2]
    assert page["more"] is True
    assert page["next_since"] == 2
    assert page["gap"] is False
    bad = await backend.http_client().get("/v1/events", params={"since": "x"})
    assert bad.json()["error"]["field"] == "since"


async def test_residency_counts_leading_resident_blocks(backend: EmbeddedBackend) -> None:
    """A served prompt's prefix is resident in full; an unknown prefix counts 0."""
    body = (
        await backend.http_client().post("/v1/completions", json={"prompt": list(range(16))})
    ).json()
    pid = body["agentclaims"]["prefix_ids"]["prompt"]
    assert await backend.residency([pid, "pfx-unknown-3"]) == {pid: 4, "pfx-unknown-3": 0}


async def test_descriptor_classes_come_from_the_lowering_checker(backend: EmbeddedBackend) -> None:
    """The reference engine's shipped descriptor, checked with a self-test run, is native in
    every mode; the descriptor and the run it read are served for clients to check again."""
    desc = await backend.descriptor()
    assert set(desc["modes"]) == {m.value for m in ProtectionMode}
    classes = {mode: v["lowering_class"] for mode, v in desc["modes"].items()}
    assert set(classes.values()) == {LoweringClass.NATIVE_CONFORMANCE.value}
    assert all(v["reasons"] for v in desc["modes"].values())
    lowering = desc["lowering"]
    assert lowering["source"] == "agentclaims/lowering/descriptors/reference-engine.yaml"
    assert lowering["descriptor"]["runtime"] == lowering["runtime"]
    assert set(lowering["runs"]["self_test:reference_engine"].values()) == {"pass"}
    assert desc["cache_identity"] == backend.engine.cache_identity.to_dict()
    assert desc["extension_key"] == "agentclaims"


async def test_the_self_test_evidence_is_taken_at_start_up_not_on_a_request() -> None:
    """The reference engine's descriptor is checked (its self-test run made) while the app
    starts, so no request waits for the conformance suite."""
    from agentclaims.engine import ReferenceKV
    from agentclaims.gateway import ScriptedModel, create_app

    app = create_app(ReferenceKV.create(64, 16), ScriptedModel())
    gateway = app.state.gateway
    assert gateway._lowering is None
    async with app.router.lifespan_context(app):
        checked = gateway._lowering
        assert checked is not None
        assert set(checked.section["runs"]["self_test:reference_engine"].values()) == {"pass"}
        assert await gateway.lowering() is checked  # what a descriptor request reads


async def test_health_metrics_and_unknown_routes(backend: EmbeddedBackend) -> None:
    """Health is ok; /v1/stats (JSON) and /metrics (Prometheus text, read back with
    prometheus-client's own parser) count calls, latency and pool state; unknown paths answer
    JSON 404."""
    assert await backend.health() is True
    await backend.http_client().post("/v1/completions", json={"prompt": [1, 2, 3, 4, 5]})
    metrics = await backend.metrics()
    assert metrics["gateway"]["calls"]["POST /v1/completions"] == 1
    assert metrics["requests"]["total"] == 1
    assert metrics["pool"]["usable_blocks"] == 32
    assert metrics["engine"]["requests_served"] == 1
    text = (await backend.http_client().get("/metrics")).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    [served] = families["agentclaims_engine_requests_served"].samples
    assert served.value == 1
    calls = {s.labels["route"]: s.value for s in families["agentclaims_gateway_calls"].samples}
    assert calls["POST /v1/completions"] == 1
    latency = [
        s for s in families["agentclaims_request_seconds"].samples if s.name.endswith("_count")
    ]
    assert {s.labels["route"] for s in latency} >= {"POST /v1/completions"}
    pool = {s.labels["kind"]: s.value for s in families["agentclaims_pool_blocks"].samples}
    assert pool["usable_blocks"] == 32
    missing = await backend.http_client().get("/v1/nothing")
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "not_found"


async def test_models_lists_the_text_side(backend: EmbeddedBackend) -> None:
    """GET /v1/models names the scripted model."""
    body = (await backend.http_client().get("/v1/models")).json()
    assert [m["id"] for m in body["data"]] == ["scripted"]


@pytest.mark.parametrize(
    "exc",
    [
        UsageError("f", "bad"),
        ScopeViolation("c", "o"),
        UnknownClaim("c"),
        IllegalTransition("c", "expired", "materialized"),
        ContractViolation("no"),
    ],
)
def test_error_bodies_round_trip(exc: AgentClaimsError) -> None:
    """Every exception the server maps comes back as the same type with the same fields."""
    status, body = exception_error(exc)
    assert status in (400, 403, 404, 409)
    with pytest.raises(type(exc)) as info:
        raise_for_error(status, body)
    assert str(info.value) == str(exc)


def test_unreadable_error_body_is_backend_error() -> None:
    """An error without an agentclaims body is a BackendError."""
    with pytest.raises(BackendError):
        raise_for_error(500, "<html>")


@given(
    hits=st.integers(0, 50),
    shortfall=st.integers(0, 50),
    ids=st.lists(st.text(min_size=1, max_size=5), max_size=3),
    retry=st.none() | st.floats(0, 100),
)
def test_wire_types_round_trip(
    hits: int, shortfall: int, ids: list[str], retry: float | None
) -> None:
    """ActiveOutcome, ClaimDecision and ClaimView survive to_dict/from_dict unchanged."""
    from agentclaims.contract import ArbiterAction, Decision, Feasibility

    outcome = ActiveOutcome(
        "r",
        ArbiterAction.DEFER_ACTIVE,
        Feasibility.FEASIBLE_AFTER_ACTIVE_DRAIN,
        hit_blocks=hits,
        blocking_claim_ids=tuple(ids),
        shortfall_blocks=shortfall,
        retry_after_s=retry,
    )
    assert ActiveOutcome.from_dict(outcome.to_dict()) == outcome
    decision = ClaimDecision(
        "c", Decision.CONDITIONALLY_ACCEPTED, ClaimState.ACCEPTED, None, None, {"ttl_s": 1.0}
    )
    assert ClaimDecision.from_dict(decision.to_dict()) == decision
    view = ClaimView(
        "c",
        "o",
        "p",
        ProtectionMode.EXPIRING,
        ClaimState.MATERIALIZED,
        hits + 1,
        hits,
        True,
        3,
        None,
        None,
    )
    assert ClaimView.from_dict(view.to_dict()) == view


@pytest.mark.parametrize("kind", [ActiveOutcome, ClaimDecision, ClaimView])
def test_wire_types_reject_garbage(kind: Any) -> None:
    """Parsing a dict that is not the type's form is a UsageError."""
    with pytest.raises(UsageError):
        kind.from_dict({"action": "fly"})


async def test_openapi_describes_every_route(backend: EmbeddedBackend) -> None:
    """GET /openapi.json lists every route of the app with its methods, a summary, its path
    parameters and the error responses."""
    from starlette.routing import Route

    doc = (await backend.http_client().get("/openapi.json")).json()
    assert doc["openapi"].startswith("3.")
    served = {
        (method.lower(), route.path.replace(":path}", "}"))  # OpenAPI has no converters
        for route in backend.app.routes
        if isinstance(route, Route)
        for method in (route.methods or ()) - {"HEAD"}
    }
    described = {(m, path) for path, ops in doc["paths"].items() for m in ops}
    assert described == served
    renew = doc["paths"]["/v1/claims/{claim_id}/renew"]["post"]
    assert renew["parameters"][0]["name"] == "claim_id"
    assert {"400", "404", "409"} <= set(renew["responses"])
    assert all(op["summary"] != path for path, ops in doc["paths"].items() for op in ops.values())
    # no --api-keys: no security is stated, as none is in force
    assert all(op["security"] == [] for ops in doc["paths"].values() for op in ops.values())
    assert "securitySchemes" not in doc["components"]


async def test_openapi_bodies_are_the_wire_types_schemas(backend: EmbeddedBackend) -> None:
    """Real requests and answers validate against the request and response schemas
    /openapi.json states for their route, and a body the gateway refuses does not."""
    import jsonschema

    http = backend.http_client()
    doc = (await http.get("/openapi.json")).json()

    def check(method: str, path: str, body: Any, part: str) -> None:
        op = doc["paths"][path][method]
        node = (
            op["requestBody"]["content"]["application/json"]["schema"]
            if part == "request"
            else op["responses"]["200"]["content"]["application/json"]["schema"]
        )
        schema = {**node, "components": doc["components"]}
        jsonschema.validate(body, schema)

    chat = {
        "model": "m",
        "messages": [{"role": "user", "content": "one two three four five six seven eight"}],
        "agentclaims": {
            "session_id": "oa",
            "claims": [
                {"claim_id": "oa-1", "object_id": "@prompt", "protection_mode": "soft_priority"}
            ],
        },
    }
    check("post", "/v1/chat/completions", chat, "request")
    done = (await http.post("/v1/chat/completions", json=chat)).json()
    check("post", "/v1/claims/{claim_id}/renew", {"owner_scope": "oa", "ttl_s": 5}, "request")
    view = (await http.get("/v1/claims/oa-1", params={"owner_scope": "oa"})).json()
    check("get", "/v1/claims/{claim_id}", view, "response")
    page = (await http.get("/v1/events")).json()
    check("get", "/v1/events", page, "response")
    assert page["events"]
    identity = (await http.get("/v1/descriptor")).json()["cache_identity"]
    claim = {
        "claim_id": "oa-2",
        "owner_scope": "oa",
        "object_id": done["agentclaims"]["prefix_ids"]["prompt"],
        "cache_identity": identity,
        "footprint_blocks": done["usage"]["prompt_tokens"] // 16 or 1,
        "protection_mode": "best_effort",
    }
    check("post", "/v1/claims", {"claim": claim}, "request")
    active = {"request_id": "oa-r", "segments": [[1, 2, 3] * 8], "reply_tokens": [4]}
    check("post", "/v1/active", active, "request")
    served = (await http.post("/v1/active", json=active)).json()
    check("post", "/v1/active", served, "response")
    bad = {"claim": {**claim, "protection_mode": "granite"}}
    assert (await http.post("/v1/claims", json=bad)).status_code == 400
    with pytest.raises(jsonschema.ValidationError):
        check("post", "/v1/claims", bad, "request")
