"""The gateway's completion endpoints, in-process through the ASGI transport."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx2
import openai
import pytest
from gateway_sleeps import GatedSleep, RecordingSleep

from agentclaims.backends import EmbeddedBackend
from agentclaims.contract import EventName, rebuild_claims
from agentclaims.gateway import Reply
from agentclaims.protocol import collect_events, outcome_from_error

SYSTEM = {"role": "system", "content": "You are a careful agent. " * 6}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


async def chat(
    client: httpx2.AsyncClient, messages: list[dict[str, Any]], **ext: Any
) -> httpx2.Response:
    body: dict[str, Any] = {"model": "m", "messages": messages}
    if ext:
        body["agentclaims"] = ext
    return await client.post("/v1/chat/completions", json=body)


@pytest.fixture
async def backend(sleep: RecordingSleep) -> Any:
    async with EmbeddedBackend(64, 4, sleep=sleep) as b:
        yield b


async def test_shared_prefix_grows_cached_tokens(backend: EmbeddedBackend) -> None:
    """A follow-up turn reuses the whole previous sequence: cached_tokens = its full blocks."""
    client = backend.http_client()
    first = (await chat(client, [SYSTEM, user("plan the trip to the coast")])).json()
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    seq_blocks = int(first["agentclaims"]["prefix_ids"]["sequence"].rsplit("-", 1)[1])
    messages = [SYSTEM, user("plan the trip to the coast"), first["choices"][0]["message"]]
    second = (await chat(client, [*messages, user("now book it")])).json()
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == seq_blocks * 4
    assert second["agentclaims"]["outcome"]["hit_blocks"] == seq_blocks
    boundaries = second["agentclaims"]["prefix_ids"]["messages"]
    assert boundaries[2] == first["agentclaims"]["prefix_ids"]["sequence"]
    assert boundaries[1] == first["agentclaims"]["prefix_ids"]["prompt"]


async def test_prompt_claim_is_decided_and_materialized(backend: EmbeddedBackend) -> None:
    """An ``@prompt`` claim resolves to the prompt prefix, is accepted and materializes."""
    resp = await chat(
        backend.http_client(),
        [SYSTEM, user("hello")],
        session_id="s1",
        claims=[{"claim_id": "c1", "object_id": "@prompt", "protection_mode": "hard_protected"}],
    )
    ext = resp.json()["agentclaims"]
    assert ext["decisions"] == [
        {
            "claim_id": "c1",
            "decision": "accepted",
            "state": "materialized",
            "action": None,
            "reason": None,
            "conditions": {},
        }
    ]
    view = await backend.get_claim("c1", "s1")
    assert view.object_id == ext["prefix_ids"]["prompt"]
    assert view.predicate_holds
    assert view.present_blocks == view.footprint_blocks
    assert ext["events_seq"] == backend.engine.last_seq
    history = rebuild_claims(await collect_events(backend))["c1"]
    assert history.materialized
    assert history.mode is not None


async def test_sequence_claim_covers_the_reply(backend: EmbeddedBackend) -> None:
    """An ``@sequence`` claim covers prompt + reply full blocks."""
    resp = await chat(
        backend.http_client(),
        [SYSTEM, user("hi")],
        owner_scope="team",
        claims=[{"claim_id": "c2", "object_id": "@sequence", "protection_mode": "soft_priority"}],
    )
    ext = resp.json()["agentclaims"]
    view = await backend.get_claim("c2", "team")
    assert view.object_id == ext["prefix_ids"]["sequence"]


async def test_refused_request_is_409_with_machine_readable_body(backend: EmbeddedBackend) -> None:
    """A hard claim holding most of the pool makes a large request refuse_active, naming it."""
    client = backend.http_client()
    prompt = {"prompt": list(range(160)), "agentclaims": {"owner_scope": "w"}}
    prompt["agentclaims"]["claims"] = [
        {"claim_id": "big", "object_id": "@prompt", "protection_mode": "hard_protected"}
    ]
    assert (await client.post("/v1/completions", json=prompt)).status_code == 200
    before = backend.engine.stats.requests_served
    other = {
        "prompt": list(range(1000, 1160)),
        "agentclaims": {
            "owner_scope": "w",
            "claims": [
                {"claim_id": "never", "object_id": "@prompt", "protection_mode": "hard_protected"}
            ],
        },
    }
    resp = await client.post("/v1/completions", json=other)
    assert resp.status_code == 409
    err = resp.json()["error"]
    assert err["type"] == "active_request_refused"
    assert err["action"] == "refuse_active"
    assert err["feasibility"] == "infeasible_preserve_resident_and_active"
    assert err["blocking_claim_ids"] == ["big"]
    assert err["shortfall_blocks"] > 0
    outcome = outcome_from_error(resp.json())
    assert outcome is not None
    assert outcome.blocking_claim_ids == ("big",)
    assert backend.engine.stats.requests_served == before
    with pytest.raises(Exception, match="never"):
        await backend.get_claim("never", "w")


async def test_capacity_required_is_409() -> None:
    """A request larger than the whole pool answers capacity_required."""
    async with EmbeddedBackend(8, 4, sleep=RecordingSleep()) as b:
        resp = await b.http_client().post("/v1/completions", json={"prompt": list(range(100))})
    assert resp.status_code == 409
    assert resp.json()["error"]["action"] == "capacity_required"


async def test_deferred_request_is_503_with_retry_after() -> None:
    """While another request holds the pool, a request that fits later is deferred (503)."""
    gate = GatedSleep()
    async with EmbeddedBackend(48, 4, sleep=gate) as b:
        client = b.http_client()
        first = asyncio.create_task(
            client.post("/v1/completions", json={"prompt": list(range(120))})
        )
        await asyncio.wait_for(gate.entered.wait(), 5)
        resp = await client.post("/v1/completions", json={"prompt": list(range(500, 620))})
        gate.gate.set()
        assert (await first).status_code == 200
    assert resp.status_code == 503
    err = resp.json()["error"]
    assert err["type"] == "active_request_deferred"
    assert err["feasibility"] == "feasible_after_active_drain"
    assert int(resp.headers["Retry-After"]) >= 1
    assert float(resp.headers["retry-after-ms"]) == pytest.approx(
        err["retry_after_s"] * 1000, abs=1
    )


async def test_concurrent_requests_overlap_in_the_pool() -> None:
    """Two held requests are active at once (the service time is slept outside the lock)."""
    gate = GatedSleep()
    async with EmbeddedBackend(64, 4, sleep=gate) as b:
        client = b.http_client()
        tasks = [
            asyncio.create_task(client.post("/v1/completions", json={"prompt": f"task {i} " * 5}))
            for i in range(2)
        ]
        for _ in range(100):
            if len(b.engine.active_requests()) == 2:
                break
            await asyncio.sleep(0)
        assert len(b.engine.active_requests()) == 2
        gate.gate.set()
        assert [(await t).status_code for t in tasks] == [200, 200]
        assert b.engine.active_requests() == []


async def test_service_time_is_modelled(sleep: RecordingSleep) -> None:
    """Hold time = computed prompt tokens x prefill rate + reply tokens x decode rate."""
    async with EmbeddedBackend(64, 4, sleep=sleep) as b:
        body = (
            await b.http_client().post("/v1/completions", json={"prompt": list(range(10))})
        ).json()
        usage = body["usage"]
        assert sleep.calls == [pytest.approx(10 * 20e-6 + usage["completion_tokens"] * 0.5e-3)]
        await b.http_client().post("/v1/completions", json={"prompt": list(range(10))})
        assert sleep.calls[1] == pytest.approx(2 * 20e-6 + usage["completion_tokens"] * 0.5e-3)
        assert b.engine.step_count == 2


async def test_admit_false_denies_future_reuse(backend: EmbeddedBackend) -> None:
    """``admit: false`` serves with serve_active_no_admit and leaves nothing to reuse."""
    client = backend.http_client()
    body = {"prompt": list(range(40)), "agentclaims": {"admit": False}}
    first = (await client.post("/v1/completions", json=body)).json()
    assert first["agentclaims"]["outcome"]["action"] == "serve_active_no_admit"
    second = (await client.post("/v1/completions", json={"prompt": list(range(40))})).json()
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    names = [e.event for e in await collect_events(backend)]
    assert EventName.FUTURE_REUSE_DENIED in names


async def test_completions_accepts_text_and_token_ids(backend: EmbeddedBackend) -> None:
    """A text prompt is tokenized; the same text twice hits the cache the second time."""
    client = backend.http_client()
    text = "the quick brown fox jumps over the lazy dog again and again"
    first = (await client.post("/v1/completions", json={"model": "m", "prompt": text})).json()
    assert first["object"] == "text_completion"
    assert first["choices"][0]["text"].startswith("echo: the quick")
    again = (await client.post("/v1/completions", json={"prompt": [text]})).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 12
    assert again["agentclaims"]["prefix_ids"]["messages"] == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"model": "m", "messages": [], "stream": False}, "messages"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
        (
            {"messages": [{"role": "user", "content": "x"}], "stream_options": {}},
            "stream_options",
        ),
        (
            {
                "messages": [{"role": "user", "content": "x"}],
                "stream": True,
                "stream_options": {"include_usage": 1},
            },
            "stream_options.include_usage",
        ),
        ({"messages": [{"role": "user", "content": "x"}], "agentclaims": []}, "agentclaims"),
        (
            {"messages": [{"role": "user", "content": "x"}], "agentclaims": {"nod": "a"}},
            "agentclaims",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "agentclaims": {"step": -1}},
            "agentclaims.step",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "agentclaims": {"admit": "no"}},
            "agentclaims.admit",
        ),
        ({"messages": [{"content": "x"}]}, "messages[0].role"),
        ({"messages": ["x"]}, "messages[0]"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": {}}, "tools"),
        (
            {
                "messages": [{"role": "user", "content": "a b c d e f g h"}],
                "agentclaims": {
                    "claims": [
                        {
                            "claim_id": "c",
                            "object_id": "@prompt",
                            "protection_mode": "hard_protected",
                        }
                    ]
                },
            },
            "agentclaims.claims[0].owner_scope",
        ),
        (
            {
                "messages": [{"role": "user", "content": "a b c d e f g h"}],
                "agentclaims": {
                    "owner_scope": "o",
                    "claims": [
                        {
                            "claim_id": "c",
                            "object_id": "pfx-nope-1",
                            "footprint_blocks": 1,
                            "protection_mode": "hard_protected",
                        }
                    ],
                },
            },
            "agentclaims.claims[0].object_id",
        ),
        (
            {
                "messages": [{"role": "user", "content": "a b c d e f g h"}],
                "agentclaims": {
                    "owner_scope": "o",
                    "claims": [
                        {
                            "claim_id": "c",
                            "object_id": "@prompt",
                            "footprint_blocks": 99,
                            "protection_mode": "hard_protected",
                        }
                    ],
                },
            },
            "agentclaims.claims[0].footprint_blocks",
        ),
        (
            {
                "messages": [{"role": "user", "content": "a b c d e f g h"}],
                "agentclaims": {
                    "owner_scope": "o",
                    "claims": [
                        {"claim_id": "c", "object_id": "@prompt", "protection_mode": "forever"}
                    ],
                },
            },
            "agentclaims.claims[0].protection_mode",
        ),
    ],
)
async def test_bad_chat_input_is_400_and_changes_nothing(
    backend: EmbeddedBackend, body: dict[str, Any], field: str
) -> None:
    """Bad input answers usage_error naming the field; the engine saw nothing."""
    resp = await backend.http_client().post("/v1/chat/completions", json=body)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["type"] == "usage_error"
    assert err["field"] == field
    assert backend.engine.last_seq == 0
    assert backend.engine.stats.requests_served == 0


async def test_a_claim_on_a_request_too_short_for_a_block_is_refused_not_the_request(
    backend: EmbeddedBackend,
) -> None:
    """A claim riding on a call whose prompt fills no block: the call is served, the claim
    refused with the reason (as the vLLM connector refuses such a hold), its submission and
    refusal in the event stream."""
    client = backend.http_client()
    claim = {"claim_id": "tiny", "object_id": "@prompt", "protection_mode": "hard_protected"}
    resp = await chat(client, [user("a")], owner_scope="o", claims=[claim])
    assert resp.status_code == 200, resp.text
    [decision] = resp.json()["agentclaims"]["decisions"]
    assert (decision["decision"], decision["state"]) == ("rejected", "refused")
    assert decision["reason"] == "the prefix has no full block to claim"
    events = (await client.get("/v1/events", params={"id_prefix": "tiny"})).json()["events"]
    assert [e["event"] for e in events] == ["resident_claim_submitted", "resident_claim_rejected"]
    assert backend.engine.stats.requests_served == 1


async def test_duplicate_claim_id_is_refused_before_the_request_runs(
    backend: EmbeddedBackend,
) -> None:
    """A claim id already in use is a usage error; the request is not started."""
    client = backend.http_client()
    claim = {"claim_id": "dup", "object_id": "@prompt", "protection_mode": "best_effort"}
    ok = await chat(client, [SYSTEM, user("one")], owner_scope="o", claims=[claim])
    assert ok.status_code == 200
    served = backend.engine.stats.requests_served
    again = await chat(client, [SYSTEM, user("two")], owner_scope="o", claims=[claim])
    assert again.status_code == 400
    assert again.json()["error"]["field"] == "agentclaims.claims[0].claim_id"
    assert backend.engine.stats.requests_served == served


@pytest.mark.parametrize(
    "body", [{"prompt": ""}, {"prompt": [1, -2]}, {"prompt": [True]}, {"prompt": ["a", "b"]}, {}]
)
async def test_bad_completion_prompt_is_400(backend: EmbeddedBackend, body: dict[str, Any]) -> None:
    """A prompt that is neither text nor token ids is a usage error on ``prompt``."""
    resp = await backend.http_client().post("/v1/completions", json=body)
    assert resp.status_code == 400
    assert resp.json()["error"]["field"] == "prompt"


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/chat/completions", {"messages": []}, "messages"),
        ("/v1/chat/completions", {"messages": [SYSTEM], "tools": "search"}, "tools"),
        ("/v1/completions", {"prompt": [1, -2]}, "prompt"),
    ],
)
async def test_a_bad_body_lets_go_of_nothing_it_carries(
    backend: EmbeddedBackend, path: str, body: dict[str, Any], field: str
) -> None:
    """A completion whose body is bad is refused before the claims it releases are let go:
    the claim it names is still held, and no event was written."""
    client = backend.http_client()
    claim = {"claim_id": "keep-1", "object_id": "@prompt", "protection_mode": "hard_protected"}
    held = await chat(client, [SYSTEM, user("hold this")], owner_scope="o", claims=[claim])
    [decision] = held.json()["agentclaims"]["decisions"]
    assert decision["state"] == "materialized"
    before = (await client.get("/v1/events")).json()["last_seq"]
    bad = await client.post(
        path, json={**body, "agentclaims": {"owner_scope": "o", "release": ["keep-1"]}}
    )
    assert bad.status_code == 400
    assert bad.json()["error"]["field"] == field
    view = (await client.get("/v1/claims/keep-1", params={"owner_scope": "o"})).json()
    assert view["state"] == "materialized", view
    assert (await client.get("/v1/events")).json()["last_seq"] == before


async def test_non_json_body_is_400(backend: EmbeddedBackend) -> None:
    """A body that is not a JSON object is a usage error on ``body``."""
    resp = await backend.http_client().post("/v1/chat/completions", content=b"{nope")
    assert resp.status_code == 400
    assert resp.json()["error"]["field"] == "body"


async def test_react_agent_through_the_openai_client() -> None:
    """A scripted ReAct turn pair runs through the real OpenAI client, tool call and all."""
    script = {"agent": [Reply.tool("search", {"q": "pizza"}), "Luigi's is best."]}
    async with EmbeddedBackend(128, 4, script=script, sleep=RecordingSleep()) as b:
        client = openai.AsyncOpenAI(
            base_url=b.base_url, api_key="none", http_client=b.http_client(), max_retries=0
        )
        messages: list[Any] = [SYSTEM, user("where is the best pizza?")]
        ext = {"agentclaims": {"session_id": "s", "node": "agent"}}
        first = await client.chat.completions.create(model="m", messages=messages, extra_body=ext)
        call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
        assert first.choices[0].finish_reason == "tool_calls"
        assert call.function.name == "search"
        assert call.function.arguments == '{"q": "pizza"}'
        messages += [first.choices[0].message.model_dump(exclude_none=True)]
        messages += [{"role": "tool", "tool_call_id": call.id, "content": "Luigi's, 4.9 stars"}]
        second = await client.chat.completions.create(model="m", messages=messages, extra_body=ext)
        assert second.choices[0].message.content == "Luigi's is best."
        assert second.usage is not None
        assert second.usage.prompt_tokens_details is not None
        assert second.usage.prompt_tokens_details.cached_tokens == 4 * (
            first.usage.total_tokens // 4  # type: ignore[union-attr]
        )


async def test_max_tokens_and_stop_end_a_reply_as_the_openai_client_asks(
    backend: EmbeddedBackend,
) -> None:
    """The reference engine honours ``max_tokens`` (``finish_reason`` ``length``, that many
    words) and ``stop`` (cut before the string, ``finish_reason`` ``stop``), through the real
    OpenAI client; a reply of tool calls is whole."""
    client = openai.AsyncOpenAI(
        base_url=backend.base_url, api_key="k", http_client=backend.http_client()
    )
    messages: Any = [SYSTEM, user("plan the trip to the coast")]
    whole = (await client.chat.completions.create(model="m", messages=messages)).choices[0]
    words = str(whole.message.content).split()
    assert len(words) > 3
    assert whole.finish_reason == "stop"
    cut = await client.chat.completions.create(model="m", messages=messages, max_tokens=3)
    assert cut.choices[0].message.content == " ".join(words[:3])
    assert cut.choices[0].finish_reason == "length"
    assert cut.usage is not None
    assert cut.usage.completion_tokens < len(words) + 2
    stop = words[2]
    stopped = await client.chat.completions.create(model="m", messages=messages, stop=[stop])
    assert stopped.choices[0].message.content == str(whole.message.content).split(stop)[0]
    assert stopped.choices[0].finish_reason == "stop"
