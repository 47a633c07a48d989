"""OpenAI's ``prompt_cache_key`` and ``prompt_cache_retention``, sent by the real ``openai``
client unmodified, become claims on the reference engine behind the gateway: each keyed call
claims its prompt ``expiring`` under the key, the key's previous claim goes with it, bad values
are refused as OpenAI refuses them (400 naming the field, nothing changed), and what cannot be
honoured is said in the answer and its header."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from servers import gateway_process

from agentclaims.backends.embedded import EmbeddedBackend
from agentclaims.engine import ReferenceKV
from agentclaims.gateway import ScriptedModel, create_app
from agentclaims.gateway.hosted import HEADER, IN_MEMORY_TTL_S
from agentclaims.gateway.tenants import Tenant, TenantKeys

SYSTEM = "You are a careful research agent who cites every source it reads. " * 4


@pytest.fixture
async def backend() -> AsyncIterator[EmbeddedBackend]:
    async with EmbeddedBackend(num_blocks=512, block_size=16) as b:
        yield b


def client(backend: EmbeddedBackend) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=backend.base_url, api_key="k", http_client=backend.http_client(), max_retries=0
    )


def messages(*turns: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}] + [{"role": "user", "content": t} for t in turns]


async def test_a_keyed_call_claims_its_prompt_and_the_next_lets_the_last_go(
    backend: EmbeddedBackend,
) -> None:
    openai_client = client(backend)
    raw = await openai_client.chat.completions.with_raw_response.create(
        model="m", messages=messages("find the papers"), prompt_cache_key="user-7"
    )
    first = raw.parse()
    report = first.model_extra["agentclaims"]["prompt_cache"]
    assert report["decision"] == "accepted"
    assert report["owner_scope"] == "user-7"
    assert raw.headers[HEADER] == "accepted"
    view = (
        await backend.http_client().get(
            f"/v1/claims/{report['claim_id']}", params={"owner_scope": "user-7"}
        )
    ).json()
    assert (view["protection_mode"], view["state"]) == ("expiring", "materialized")
    assert backend.engine._claims[report["claim_id"]].spec.ttl_s == IN_MEMORY_TTL_S
    second = await openai_client.chat.completions.create(
        model="m",
        messages=messages("find the papers", "and the newer ones"),
        prompt_cache_key="user-7",
        prompt_cache_retention="24h",
    )
    assert second.usage is not None
    assert second.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens_details.cached_tokens > 0  # the first prompt, kept
    latest = second.model_extra["agentclaims"]["prompt_cache"]
    assert latest["decision"] == "accepted"
    live = [
        c
        for c in backend.engine._claims.values()
        if c.state.live and c.spec.owner_scope == "user-7"
    ]
    assert [c.spec.claim_id for c in live] == [latest["claim_id"]]  # one live claim per key
    assert live[0].spec.ttl_s == 86_400.0
    another = await openai_client.chat.completions.create(
        model="m", messages=messages("something else"), prompt_cache_key="user-8"
    )
    assert another.model_extra["agentclaims"]["prompt_cache"]["owner_scope"] == "user-8"


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"prompt_cache_key": 123}, "prompt_cache_key"),
        ({"prompt_cache_key": ""}, "prompt_cache_key"),
        ({"prompt_cache_key": "k" * 513}, "prompt_cache_key"),
        ({"prompt_cache_key": "k", "prompt_cache_retention": "forever"}, "prompt_cache_retention"),
        ({"prompt_cache_retention": 24}, "prompt_cache_retention"),
    ],
)
async def test_bad_values_are_a_400_naming_the_field_and_change_nothing(
    backend: EmbeddedBackend, fields: dict[str, Any], named: str
) -> None:
    body = {"model": "m", "messages": messages("hello"), **fields}
    resp = await backend.http_client().post("/v1/chat/completions", json=body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["field"] == named
    assert backend.engine.last_seq == 0
    assert backend.engine.stats.requests_served == 0


async def test_the_openai_clients_error_names_the_field(backend: EmbeddedBackend) -> None:
    """The OpenAI client shows only the error's message in its exception text: the message
    names the field, and ``param`` (OpenAI's own key for it) carries it too."""
    with pytest.raises(openai.BadRequestError) as caught:
        await client(backend).chat.completions.create(
            model="m",
            messages=messages("hello"),
            prompt_cache_key="k",
            extra_body={"prompt_cache_retention": "forever"},
        )
    assert "prompt_cache_retention: must be one of" in str(caught.value)
    assert caught.value.param == "prompt_cache_retention"
    assert backend.engine.stats.requests_served == 0


async def test_what_cannot_be_honoured_is_refused_explicitly(backend: EmbeddedBackend) -> None:
    """A retention without a key has no owner to hold for; a prompt too short for a block has
    nothing to hold: the call is served, the header and the answer say why not."""
    openai_client = client(backend)
    raw = await openai_client.chat.completions.with_raw_response.create(
        model="m", messages=messages("hello"), prompt_cache_retention="24h"
    )
    assert raw.headers[HEADER].startswith("refused; prompt_cache_retention without a")
    assert raw.parse().model_extra["agentclaims"]["prompt_cache"]["decision"] == "refused"
    raw = await openai_client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "hi"}], prompt_cache_key="short"
    )
    assert raw.headers[HEADER] == "refused; the prefix has no full block to claim"


def test_a_tenants_key_is_its_own_and_its_retention_capped(tmp_path: Path) -> None:
    """With API keys: the TTL is capped by the tenant's ``max_ttl_s``, and two tenants using
    the same key hold apart (each sees only its own claim)."""
    keys = tmp_path / "keys.toml"
    keys.write_text(
        '[[key]]\nkey = "ak-a-0123456789abcdef"\ntenant = "a"\nmax_ttl_s = 60\n\n'
        '[[key]]\nkey = "ak-b-0123456789abcdef"\ntenant = "b"\n'
    )
    body = {
        "model": "m",
        "messages": messages("the shared question"),
        "prompt_cache_key": "same",
        "prompt_cache_retention": "24h",
    }
    with gateway_process("--api-keys", str(keys), "--blocks", "256") as url:
        answers = {}
        for name in ("a", "b"):
            headers = {"Authorization": f"Bearer ak-{name}-0123456789abcdef"}
            with httpx2.Client(base_url=url, headers=headers, timeout=30) as http:
                resp = http.post("/v1/chat/completions", json=body)
                assert resp.status_code == 200, resp.text
                answers[name] = resp.json()["agentclaims"]["prompt_cache"]
                claim_id = answers[name]["claim_id"]
                view = http.get(f"/v1/claims/{claim_id}", params={"owner_scope": "same"}).json()
                assert "expires_at_ns" in view, view
                answers[name]["expires_at_ns"] = view["expires_at_ns"]
        assert answers["a"]["decision"] == answers["b"]["decision"] == "accepted"
        # a's day is capped at its 60 s; b's is a day (the two calls seconds apart)
        apart_s = (answers["b"]["expires_at_ns"] - answers["a"]["expires_at_ns"]) / 1e9
        assert 86_400 - 60 <= apart_s < 86_400 - 60 + 60


TENANT_KEY = "ak-gamma-0123456789abcdef"


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["k1", "k2"]), st.booleans()), min_size=1, max_size=8))
def test_a_tenants_keys_hold_one_live_claim_each_at_its_limit(calls: list) -> None:
    """Any run of keyed calls (each resending its key's last prompt or going on a turn) by a
    tenant allowed as many live claims as it uses keys: every call's claim is accepted, since
    the key's previous claim goes with it, and the tenant holds one live claim per key."""

    async def run() -> None:
        kv = ReferenceKV.create(512, 16)
        keys = TenantKeys([(TENANT_KEY, Tenant("gamma", max_claims=len({k for k, _ in calls})))])
        app = create_app(kv, ScriptedModel(), keys=keys)
        http = httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app),
            base_url="http://gw",
            headers={"Authorization": f"Bearer {TENANT_KEY}"},
        )
        turns: dict[str, list[str]] = {}
        async with app.router.lifespan_context(app):
            for key, go_on in calls:
                asked = turns.setdefault(key, [f"the question of {key}"])
                if go_on:
                    asked.append(f"and then {len(asked)}")
                body = {"model": "m", "messages": messages(*asked), "prompt_cache_key": key}
                answer = (await http.post("/v1/chat/completions", json=body)).json()
                report = answer["agentclaims"]["prompt_cache"]
                assert report["decision"] == "accepted", report
                live = [c for c in kv.engine._claims.values() if c.state.live]
                assert len(live) == len(turns), [c.spec.claim_id for c in live]
        await http.aclose()

    asyncio.run(run())
