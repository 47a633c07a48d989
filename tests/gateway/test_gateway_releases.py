"""`POST /v1/releases`: several releases in one request, each answered as its own request
would be; and the backend's release queue, which sends releases asked for while one is out
together (in-process, over a real gateway process on loopback, and to a gateway without the
route)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx2
import pytest
from gateway_sleeps import RecordingSleep
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from servers import gateway_process

from agentclaims.backends import EmbeddedBackend, HTTPBackend
from agentclaims.backends.asgi import StreamingASGITransport
from agentclaims.contract import ClaimSpec, ProtectionMode
from agentclaims.engine import hash_token_blocks
from agentclaims.errors import AgentClaimsError, ScopeViolation, UnknownClaim, UsageError


def spec(b: HTTPBackend, claim_id: str, owner: str, identity: Any) -> ClaimSpec:
    return ClaimSpec(
        claim_id=claim_id,
        owner_scope=owner,
        object_id=f"obj-{claim_id}",
        cache_identity=identity,
        footprint_blocks=2,
        protection_mode=ProtectionMode.SOFT_PRIORITY,
    )


async def claim(b: HTTPBackend, claim_id: str, owner: str = "o", tag: int = 0) -> None:
    hashes = hash_token_blocks(list(range(tag * 100, tag * 100 + 8)), 4)
    decision = await b.submit_claim(spec(b, claim_id, owner, await b.cache_identity()), hashes)
    assert decision.accepted


async def batch(b: HTTPBackend, *items: dict[str, Any]) -> list[dict[str, Any]]:
    data = await b._call("POST", "/releases", json={"releases": list(items)})
    released: list[dict[str, Any]] = data["released"]
    return released


@pytest.fixture
async def backend() -> Any:
    async with EmbeddedBackend(256, 4, sleep=RecordingSleep()) as b:
        yield b


async def test_each_item_is_answered_as_its_own_request(backend: EmbeddedBackend) -> None:
    for i, (cid, owner) in enumerate([("c1", "o"), ("c2", "o"), ("c3", "p")]):
        await claim(backend, cid, owner, tag=i)
    out = await batch(
        backend,
        {"claim_id": "c1", "owner_scope": "o"},
        {"claim_id": "never", "owner_scope": "o"},
        {"claim_id": "c3", "owner_scope": "o"},  # another owner's
        {"claim_id": "c2", "owner_scope": "o", "events_since": 0, "id_prefix": "c2"},
    )
    assert [a.get("state") for a in out] == ["expired", None, None, "expired"]
    assert (out[1]["status"], out[1]["error"]["type"]) == (404, "unknown_claim")
    assert (out[2]["status"], out[2]["error"]["type"]) == (403, "scope_violation")
    # the errors are what the single route raises for the same release
    with pytest.raises(UnknownClaim):
        await backend._release_one({"claim_id": "never", "owner_scope": "o"})
    with pytest.raises(ScopeViolation):
        await backend._release_one({"claim_id": "c3", "owner_scope": "o"})
    # only the item that asked has events: its own claim's, its release included
    assert "events" not in out[0]
    names = [(e["claim_id"], e["event"]) for e in out[3]["events"]["events"]]
    assert ("c2", "resident_claim_expired") in names
    assert {cid for cid, _ in names} == {"c2"}
    assert (await backend.get_claim("c3", "p")).state.live  # the refused item changed nothing


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "releases"),
        ({"releases": []}, "releases"),
        ({"releases": [{"claim_id": f"c{i}", "owner_scope": "o"} for i in range(65)]}, "releases"),
        ({"releases": [{"claim_id": "c1", "owner_scope": "o"}, "c2"]}, "releases[1]"),
        (
            {"releases": [{"claim_id": "c1", "owner_scope": "o"}, {"claim_id": 5}]},
            "releases[1].claim_id",
        ),
        ({"releases": [{"claim_id": "c1"}]}, "releases[0].owner_scope"),
        ({"releases": [{"claim_id": "c1", "owner_scope": "o", "done": "y"}]}, "releases[0].done"),
        (
            {"releases": [{"claim_id": "c1", "owner_scope": "o", "events_since": -1}]},
            "releases[0].events_since",
        ),
        ({"releases": [{"claim_id": "c1", "owner_scope": "o", "ttl_s": 3}]}, "releases[0]"),
    ],
)
async def test_a_malformed_request_releases_nothing(
    backend: EmbeddedBackend, body: dict[str, Any], field: str
) -> None:
    await claim(backend, "c1")
    with pytest.raises(UsageError) as err:
        await backend._call("POST", "/releases", json=body)
    assert err.value.field == field
    assert (await backend.get_claim("c1", "o")).state.live


ITEMS = st.lists(
    st.fixed_dictionaries(
        {
            "claim_id": st.sampled_from(["a", "b", "c", "zz"]),
            "owner_scope": st.sampled_from(["o", "p"]),
        },
        optional={"done": st.booleans()},
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=ITEMS)
async def test_a_batch_ends_where_its_releases_one_by_one_end(items: list[dict[str, Any]]) -> None:
    """Property: on two identical gateways, one request with ``items`` and each item alone, in
    order, answer the same per item (state, or error type) and leave every claim the same."""
    outcomes, states = [], []
    for together in (True, False):
        async with EmbeddedBackend(256, 4, sleep=RecordingSleep()) as b:
            for i, (cid, owner) in enumerate([("a", "o"), ("b", "o"), ("c", "p")]):
                await claim(b, cid, owner, tag=i)
            if together:
                got = [a.get("state") or a["error"]["type"] for a in await batch(b, *items)]
            else:
                got = []
                for item in items:
                    try:
                        got.append((await b._release_one(item))["state"])
                    except AgentClaimsError as exc:
                        got.append(type(exc).__name__)
            outcomes.append(got)
            states.append(
                [(await b.get_claim(c, o)).state for c, o in (("a", "o"), ("b", "o"), ("c", "p"))]
            )
    names = {"UnknownClaim": "unknown_claim", "ScopeViolation": "scope_violation"}
    assert outcomes[0] == [names.get(x, x) for x in outcomes[1]]
    assert states[0] == states[1]


async def test_releases_asked_together_go_together() -> None:
    """Twenty sessions' releases asked at once over a real gateway process: each gets its own
    view and its own events; they went in far fewer than twenty requests."""
    with gateway_process("--blocks", "1024", "--block-size", "4") as url:
        async with HTTPBackend(url) as b:
            ids = [f"s{i}-c1" for i in range(20)]
            for i, cid in enumerate(ids):
                await claim(b, cid, f"s{i}", tag=i)
            *answers, unknown = await asyncio.gather(
                *(
                    b.release_claim_with_events(cid, f"s{i}", events_since=0, id_prefix=f"s{i}-")
                    for i, cid in enumerate(ids)
                ),
                b.release_claim("never-c1", "s0"),  # its own error, to its own caller
                return_exceptions=True,
            )
            assert isinstance(unknown, UnknownClaim)
            for cid, (view, page) in zip(ids, answers, strict=True):
                assert view.claim_id == cid
                assert view.state.value == "expired"
                assert page is not None
                assert {e["claim_id"] for e in page["events"]} == {cid}
                assert "resident_claim_expired" in {e["event"] for e in page["events"]}
            calls = (await b.metrics())["gateway"]["calls"]
            sent = calls.get("POST /v1/claims/{claim_id}/release", 0) + calls.get(
                "POST /v1/releases", 0
            )
            assert sent == b._releases.requests <= 3
            assert b._releases.coalesced >= 19


async def test_a_gateway_without_the_route_gets_them_one_by_one() -> None:
    """A gateway that answers 404 to ``POST /v1/releases`` (an older one): the releases that
    waited go one by one, each answered, and later ones never try the route again."""
    inner = EmbeddedBackend(256, 4, sleep=RecordingSleep())
    refused: list[str] = []

    async def older(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].endswith("/release"):
            await asyncio.sleep(0.01)  # a release takes a while: the others are asked meanwhile
        if scope["type"] == "http" and scope["path"] == "/v1/releases":
            refused.append(scope["path"])
            scope = {**scope, "path": "/v1/no-such-route", "raw_path": b"/v1/no-such-route"}
        await inner.app(scope, receive, send)

    client = httpx2.AsyncClient(transport=StreamingASGITransport(older), base_url="http://older")
    b = HTTPBackend("http://older", client=client)
    try:
        for i in range(6):
            await claim(b, f"c{i}", tag=i)
        views = await asyncio.gather(*(b.release_claim(f"c{i}", "o") for i in range(6)))
        assert [v.state.value for v in views] == ["expired"] * 6
        assert refused == ["/v1/releases"]
        assert not b._releases.batches
        await claim(b, "d1", tag=9)
        await claim(b, "d2", tag=10)
        await asyncio.gather(b.release_claim("d1", "o"), b.release_claim("d2", "o"))
        assert refused == ["/v1/releases"]
    finally:
        await b.aclose()
        await client.aclose()
        await inner.aclose()


@pytest.mark.parametrize("done", [["c9"], "c1", [5]])
async def test_release_done_names_only_claims_the_call_releases(
    backend: EmbeddedBackend, done: Any
) -> None:
    """``agentclaims.release_done`` is a list of ids of ``release``: anything else is a 400
    naming it, and the claim it would have let go is still held."""
    await claim(backend, "c1")
    body = {
        "model": "scripted",
        "messages": [{"role": "user", "content": "hi"}],
        "agentclaims": {"owner_scope": "o", "release": ["c1"], "release_done": done},
    }
    with pytest.raises(UsageError) as err:
        await backend._call("POST", "/chat/completions", json=body)
    assert err.value.field == "agentclaims.release_done"
    assert (await backend.get_claim("c1", "o")).state.live


async def test_a_release_done_rides_and_ends_the_claim(backend: EmbeddedBackend) -> None:
    await claim(backend, "c1")
    body = {
        "model": "scripted",
        "messages": [{"role": "user", "content": "hi"}],
        "agentclaims": {"owner_scope": "o", "release": ["c1"], "release_done": ["c1"]},
    }
    answer = await backend._call("POST", "/chat/completions", json=body)
    assert answer["agentclaims"]["released"] == [{"claim_id": "c1", "state": "expired"}]
