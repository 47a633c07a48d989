"""``POST /v1/messages``: the real ``anthropic`` client (and LangChain's ``ChatAnthropic`` with
``AnthropicPromptCachingMiddleware``) against the gateway on the reference engine, its cache
breakpoints honoured as claims, its errors in the Messages API's shape."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentclaims.backends.embedded import EmbeddedBackend
from agentclaims.engine import ReferenceKV
from agentclaims.gateway import ScriptedModel, create_app
from agentclaims.gateway.anthropic import CACHE_HEADER, CACHE_OWNER
from agentclaims.gateway.tenants import Tenant, TenantKeys
from agentclaims.gateway.text import Reply

SYSTEM = [
    {
        "type": "text",
        "text": "You review pull requests carefully. " * 20,
        "cache_control": {"type": "ephemeral"},
    }
]


def turn(text: str, ttl: str | None = "5m") -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": text}
    if ttl is not None:
        block["cache_control"] = {"type": "ephemeral", "ttl": ttl}
    return {"role": "user", "content": [block]}


def script(request: Any) -> Any:
    return Reply.tool("lookup", {"q": "kv"}) if request.tools else "looks good to me"


@pytest.fixture
async def gateway():
    backend = EmbeddedBackend(num_blocks=512, block_size=16, script=script)
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=backend.app), base_url="http://gw")
    async with backend.app.router.lifespan_context(backend.app):
        client = anthropic.AsyncAnthropic(base_url="http://gw", api_key="none", http_client=http)
        yield backend, client, http
    await http.aclose()
    await backend.aclose()


def claims_held(backend: EmbeddedBackend) -> Any:
    return backend.kv.metrics()["claims"]


async def test_a_message_is_answered_in_the_messages_shape(gateway):
    _backend, client, _ = gateway
    reply = await client.messages.create(
        model="served", max_tokens=32, messages=[{"role": "user", "content": "review this"}]
    )
    assert reply.type == "message"
    assert reply.role == "assistant"
    assert reply.content[0].text == "looks good to me"
    assert reply.stop_reason == "end_turn"
    assert reply.usage.output_tokens > 0
    assert reply.usage.input_tokens > 0
    assert reply.usage.cache_creation_input_tokens == 0  # no breakpoint: nothing held
    assert reply.model_extra["agentclaims"]["outcome"]["action"].startswith("serve")


async def test_breakpoints_become_one_expiring_claim_on_the_prompt(gateway):
    """A breakpoint on the system prompt and one on the last block: one expiring claim on the
    whole prompt, its TTL the longest (1 h), reported for both; what the call computed is
    reported as cache creation."""
    _backend, client, http = gateway
    raw = await client.messages.with_raw_response.create(
        model="served", max_tokens=16, system=SYSTEM, messages=[turn("first diff", "1h")]
    )
    reply = await raw.parse()
    report = reply.model_extra["agentclaims"]["cache_control"]
    assert [r["breakpoint"] for r in report] == ["system[0]", "messages[0].content[0]"]
    assert {r["decision"] for r in report} == {"accepted"}
    assert report[0]["covered_by_prompt"] is True
    claim_id = report[1]["claim_id"]
    assert report[0]["claim_id"] == claim_id
    assert raw.headers[CACHE_HEADER] == "system[0]=accepted, messages[0].content[0]=accepted"
    view = (await http.get(f"/v1/claims/{claim_id}", params={"owner_scope": CACHE_OWNER})).json()
    assert view["protection_mode"] == "expiring"
    assert view["state"] == "materialized"
    assert reply.usage.cache_creation_input_tokens > 0
    assert reply.usage.input_tokens + reply.usage.cache_creation_input_tokens > 100


async def test_a_call_that_reads_a_claimed_prompt_refreshes_it(gateway):
    """The next turn starts with the claimed prompt: it is read from the cache, the new
    turn's claim holds it from now, and the earlier claim is let go (one live per chain)."""
    _backend, client, http = gateway
    messages = [turn("first diff")]
    first = await client.messages.create(
        model="served", max_tokens=16, system=SYSTEM, messages=messages
    )
    old = first.model_extra["agentclaims"]["cache_control"][-1]["claim_id"]
    messages += [{"role": "assistant", "content": first.content[0].text}, turn("second diff")]
    second = await client.messages.create(
        model="served", max_tokens=16, system=SYSTEM, messages=messages
    )
    new = second.model_extra["agentclaims"]["cache_control"][-1]["claim_id"]
    assert new != old
    assert second.usage.cache_read_input_tokens > 100
    states = {}
    for cid in (old, new):
        view = await http.get(f"/v1/claims/{cid}", params={"owner_scope": CACHE_OWNER})
        states[cid] = view.json()["state"]
    assert states[new] == "materialized"
    assert states[old] != "materialized"


async def test_a_breakpoint_short_of_the_prompts_end_is_refused_with_its_reason(gateway):
    """Only the system prompt marked: no claim can hold a prefix ending mid-prompt here; the
    breakpoint is refused, said in the answer and its header, not dropped."""
    _backend, client, _ = gateway
    raw = await client.messages.with_raw_response.create(
        model="served", max_tokens=16, system=SYSTEM, messages=[turn("a diff", None)]
    )
    reply = await raw.parse()
    [report] = reply.model_extra["agentclaims"]["cache_control"]
    assert report["decision"] == "refused"
    assert "end of the prompt" in report["reason"]
    assert raw.headers[CACHE_HEADER] == "system[0]=refused"
    assert reply.usage.cache_creation_input_tokens == 0


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"cache_control": {"type": "ephemeral", "ttl": "forever"}}, "cache_control.ttl"),
        ({"cache_control": {"type": "persistent"}}, "cache_control"),
        ({"max_tokens": 0}, "max_tokens"),
    ],
)
async def test_bad_values_are_a_400_in_the_messages_shape_and_change_nothing(gateway, extra, field):
    backend, client, _ = gateway
    before = claims_held(backend)
    body = {"model": "served", "max_tokens": 16, "messages": [turn("x", None)], **extra}
    with pytest.raises(anthropic.BadRequestError) as info:
        await client.messages.create(**body)
    assert info.value.status_code == 400
    assert info.value.body["type"] == "error"
    assert info.value.body["error"]["type"] == "invalid_request_error"
    assert field in info.value.body["error"]["message"]
    assert claims_held(backend) == before


async def test_more_than_four_breakpoints_are_refused(gateway):
    _, client, _ = gateway
    messages = [turn(f"part {i}") for i in range(5)]
    with pytest.raises(anthropic.BadRequestError) as info:
        await client.messages.create(model="served", max_tokens=8, messages=messages)
    assert "a maximum of 4 blocks" in info.value.body["error"]["message"]


async def test_streamed_messages_come_as_the_messages_api_events(gateway):
    """The SDK's stream helper assembles the text and the final usage (cache fields too);
    the last delta carries the ``agentclaims`` object."""
    _, client, _ = gateway
    async with client.messages.stream(
        model="served", max_tokens=16, system=SYSTEM, messages=[turn("stream it")]
    ) as stream:
        pieces = [text async for text in stream.text_stream]
        final = await stream.get_final_message()
    assert "".join(pieces) == "looks good to me"
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens > 0
    assert final.usage.cache_creation_input_tokens > 0
    raw = await client.messages.create(
        model="served", max_tokens=16, messages=[turn("again", None)], stream=True
    )
    kinds, extension = [], None
    async for event in raw:
        kinds.append(event.type)
        if event.type == "message_delta":
            extension = event.model_extra.get("agentclaims")
    assert kinds[0] == "message_start"
    assert kinds[-2:] == ["message_delta", "message_stop"]
    assert extension is not None
    assert extension["outcome"]["action"].startswith("serve")


async def test_tools_go_and_come_back_as_tool_use_blocks(gateway):
    _, client, _ = gateway
    tools = [{"name": "lookup", "description": "Look it up.", "input_schema": {"type": "object"}}]
    reply = await client.messages.create(
        model="served", max_tokens=32, tools=tools, messages=[turn("find it", None)]
    )
    assert reply.stop_reason == "tool_use"
    [use] = reply.content
    assert (use.type, use.name, use.input) == ("tool_use", "lookup", {"q": "kv"})
    followup = [
        turn("find it", None),
        {"role": "assistant", "content": [use.model_dump(include={"type", "id", "name", "input"})]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "found it"}],
        },
    ]
    again = await client.messages.create(
        model="served", max_tokens=32, tools=tools, messages=followup
    )
    assert again.content[0].type == "tool_use"


def test_langchain_chat_anthropic_with_the_prompt_caching_middleware():
    """An unmodified LangChain agent (``create_agent``, ``ChatAnthropic``) with LangChain's
    ``AnthropicPromptCachingMiddleware``, pointed at a real gateway on loopback: its cache
    breakpoints become an expiring claim the gateway holds, its usage says what was written
    to the cache and then read from it."""
    from langchain.agents import create_agent
    from langchain_anthropic import ChatAnthropic
    from langchain_anthropic.middleware import AnthropicPromptCachingMiddleware
    from servers import gateway_process

    with gateway_process("--blocks", "256", "--block-size", "16") as url:
        model = ChatAnthropic(base_url=url, api_key="none", model="served", max_tokens=16)
        agent = create_agent(
            model,
            tools=[],
            system_prompt="You review code carefully. " * 30,
            middleware=[AnthropicPromptCachingMiddleware(ttl="5m", min_messages_to_cache=0)],
        )
        first = agent.invoke({"messages": [{"role": "user", "content": "review this"}]})
        reply = first["messages"][-1]
        report = reply.response_metadata["agentclaims"]["cache_control"]
        assert {r["decision"] for r in report} == {"accepted"}
        assert reply.usage_metadata["input_token_details"]["cache_creation"] > 100
        again = agent.invoke({"messages": [*first["messages"], ("user", "and this")]})
        details = again["messages"][-1].usage_metadata["input_token_details"]
        assert details["cache_read"] > 100
        claims = httpx2.get(f"{url}/v1/stats", timeout=10).json()["claims"]
        assert claims.get("expiring/materialized") == 1  # refreshed: one live per chain


def test_tenants_on_messages_key_by_x_api_key_and_cap_the_breakpoint_ttl(tmp_path):
    """With API keys, an Anthropic client's ``x-api-key`` names its tenant: the breakpoint's
    1 h is capped by the tenant's ``max_ttl_s``; an unknown key is refused (401)."""
    from servers import gateway_process

    keys = tmp_path / "keys.toml"
    keys.write_text(
        '[[key]]\nkey = "ak-alpha-0123456789abcdef"\ntenant = "alpha"\n'
        "quota_blocks = 128\nmax_ttl_s = 30\nmax_claims = 4\n"
    )
    args = ("--blocks", "256", "--block-size", "16", "--api-keys", str(keys))
    with gateway_process(*args) as url:
        client = anthropic.Anthropic(base_url=url, api_key="ak-alpha-0123456789abcdef")
        reply = client.messages.create(
            model="served", max_tokens=8, system=SYSTEM, messages=[turn("tenant diff", "1h")]
        )
        report = reply.model_extra["agentclaims"]["cache_control"]
        assert {r["decision"] for r in report} == {"accepted"}
        assert [r["asked_ttl_s"] for r in report] == [300.0, 3600.0]
        assert {r["ttl_s"] for r in report} == {30.0}  # the tenant's cap
        view = httpx2.get(
            f"{url}/v1/claims/{report[-1]['claim_id']}",
            params={"owner_scope": CACHE_OWNER},
            headers={"x-api-key": "ak-alpha-0123456789abcdef"},
            timeout=10,
        ).json()
        assert view["protection_mode"] == "expiring"
        assert view["state"] == "materialized"
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=url, api_key="ak-nobody-0123456789abcd").messages.create(
                model="served", max_tokens=8, messages=[turn("x", None)]
            )


async def test_the_same_prompt_sent_again_refreshes_its_claim_rather_than_adding_one(gateway):
    """A client that resends its cached prompt (a retry, a poll) reads its own claimed
    prompt: each call's claim takes over, the last one's is let go; one live claim, not
    three."""
    backend, client, http = gateway
    ids = []
    for _ in range(3):
        reply = await client.messages.create(
            model="served", max_tokens=16, system=SYSTEM, messages=[turn("the same diff")]
        )
        ids.append(reply.model_extra["agentclaims"]["cache_control"][-1]["claim_id"])
    assert len(set(ids)) == 3
    states = [
        (await http.get(f"/v1/claims/{c}", params={"owner_scope": CACHE_OWNER})).json()["state"]
        for c in ids
    ]
    assert states[-1] == "materialized"
    assert "materialized" not in states[:-1]
    assert sum(c.state.live for c in backend.kv.engine._claims.values()) == 1


TENANT_KEY = "ak-gamma-0123456789abcdef"


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.tuples(st.integers(0, 1), st.booleans()), min_size=1, max_size=8))
def test_a_tenants_breakpoint_claims_stay_one_per_conversation(calls: list) -> None:
    """Any run of two conversations' calls, each resending its last prompt or going on a
    turn, by a tenant allowed two live claims: every call's breakpoint is accepted, and the
    tenant holds one live claim per conversation begun, never more (none left behind to
    use up its limit)."""

    async def run() -> None:
        kv = ReferenceKV.create(512, 16)
        keys = TenantKeys([(TENANT_KEY, Tenant("gamma", max_claims=2))])
        app = create_app(kv, ScriptedModel(script), keys=keys)
        http = httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app),
            base_url="http://gw",
            headers={"x-api-key": TENANT_KEY, "anthropic-version": "2023-06-01"},
        )
        conversations: dict[int, list[dict[str, Any]]] = {}
        async with app.router.lifespan_context(app):
            for which, go_on in calls:
                first = turn(f"conversation {which}: " + "review this diff " * 12, None)
                messages = conversations.setdefault(which, [first])
                if go_on and len(messages) > 1:
                    messages += [turn(f"more {len(messages)}", None)]
                body = {
                    "model": "served",
                    "max_tokens": 16,
                    "messages": messages,
                    "cache_control": {"type": "ephemeral"},
                }
                answer = (await http.post("/v1/messages", json=body)).json()
                [report] = answer["agentclaims"]["cache_control"]
                assert report["decision"] == "accepted", report
                messages.append({"role": "assistant", "content": answer["content"][0]["text"]})
                live = [c for c in kv.engine._claims.values() if c.state.live]
                assert len(live) == len(conversations), [c.spec.claim_id for c in live]
        await http.aclose()

    asyncio.run(run())


async def test_max_tokens_and_stop_sequences_end_a_reply_as_they_say(gateway):
    """The reference engine honours ``max_tokens`` (``stop_reason`` ``max_tokens``) and
    ``stop_sequences`` (``stop_sequence``, the string named), as the Messages API does."""
    _, client, _ = gateway
    cut = await client.messages.create(
        model="served", max_tokens=2, messages=[turn("review this", None)]
    )
    assert (cut.content[0].text, cut.stop_reason) == ("looks good", "max_tokens")
    stopped = await client.messages.create(
        model="served", max_tokens=64, stop_sequences=["to"], messages=[turn("again", None)]
    )
    assert stopped.content[0].text == "looks good "
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "to")
    whole = await client.messages.create(
        model="served", max_tokens=64, stop_sequences=["never"], messages=[turn("once", None)]
    )
    assert (whole.content[0].text, whole.stop_reason) == ("looks good to me", "end_turn")
