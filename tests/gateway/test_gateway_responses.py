"""``POST /v1/responses``: the real ``openai`` client's Responses API (and LangChain's
``ChatOpenAI(use_responses_api=True)``) against the gateway on the reference engine: text,
function calls and their outputs, streaming, prompt-cache parameters as claims, and the
refusal of what is not served."""

from __future__ import annotations

from typing import Any

import httpx2
import openai
import pytest

from agentclaims.backends.embedded import EmbeddedBackend
from agentclaims.gateway.text import Reply

TOOLS = [
    {
        "type": "function",
        "name": "lookup",
        "description": "Look it up.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    }
]


def script(request: Any) -> Any:
    asked = request.tools and request.messages[-1].get("role") != "tool"
    return Reply.tool("lookup", {"q": "kv"}) if asked else "all done here"


@pytest.fixture
async def client():
    backend = EmbeddedBackend(num_blocks=512, block_size=16, script=script)
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=backend.app), base_url="http://gw")
    async with backend.app.router.lifespan_context(backend.app):
        yield openai.AsyncOpenAI(base_url="http://gw/v1", api_key="none", http_client=http)
    await http.aclose()
    await backend.aclose()


async def test_a_response_with_text_and_its_usage(client):
    reply = await client.responses.create(
        model="served", input="review this diff", instructions="You review code."
    )
    assert reply.object == "response"
    assert reply.status == "completed"
    assert reply.output_text == "all done here"
    assert reply.usage is not None
    assert reply.usage.input_tokens > 0
    assert reply.usage.output_tokens > 0
    assert reply.model_extra["agentclaims"]["outcome"]["action"].startswith("serve")


async def test_function_calls_go_out_and_their_outputs_come_back(client):
    first = await client.responses.create(model="served", input="find it", tools=TOOLS)
    [call] = first.output
    assert call.type == "function_call"
    assert (call.name, call.arguments) == ("lookup", '{"q": "kv"}')
    items = [
        {"role": "user", "content": "find it"},
        {
            "type": "function_call",
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments,
        },
        {"type": "function_call_output", "call_id": call.call_id, "output": "found three"},
    ]
    second = await client.responses.create(model="served", input=items, tools=TOOLS)
    assert second.output_text == "all done here"


async def test_a_streamed_response_comes_as_numbered_events(client):
    async with client.responses.stream(model="served", input="stream it") as stream:
        events = [event async for event in stream]
        final = await stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == (
        "all done here"
    )
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert final.output_text == "all done here"
    assert final.usage is not None
    assert final.usage.output_tokens > 0
    assert final.model_extra["agentclaims"]["outcome"]["action"].startswith("serve")


async def test_prompt_cache_key_on_a_response_is_a_claim(client):
    """The key's claim on the prompt, as on chat completions; the next call reads it."""
    prompt = "You review pull requests carefully. " * 20
    first = await client.responses.create(
        model="served", input=prompt, prompt_cache_key="user-7", prompt_cache_retention="24h"
    )
    report = first.model_extra["agentclaims"]["prompt_cache"]
    assert report["decision"] == "accepted"
    assert report["owner_scope"] == "user-7"
    second = await client.responses.create(
        model="served", input=prompt + " And one more.", prompt_cache_key="user-7"
    )
    assert second.usage is not None
    assert second.usage.input_tokens_details.cached_tokens > 100


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"store": True}, "store"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"prompt_cache_retention": "forever", "prompt_cache_key": "k"}, "prompt_cache_retention"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
    ],
)
async def test_what_is_not_served_is_a_400_naming_the_field(client, extra, field):
    with pytest.raises(openai.BadRequestError) as info:
        await client.responses.create(model="served", input="x", **extra)
    assert info.value.body["field"] == field


def test_langchain_chat_openai_on_the_responses_api():
    """``ChatOpenAI(use_responses_api=True)``, unmodified, through a real gateway on
    loopback: text and a tool call, streamed and not."""
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from servers import gateway_process

    @tool
    def lookup(q: str) -> str:
        """Look it up."""
        return q

    with gateway_process("--blocks", "256", "--block-size", "16") as url:
        model = ChatOpenAI(
            base_url=f"{url}/v1", api_key="none", model="served", use_responses_api=True
        )
        reply = model.invoke("hello there")
        assert reply.text.startswith("echo:")
        streamed = "".join(chunk.text for chunk in model.stream("hello again"))
        assert streamed.startswith("echo:")
        assert reply.usage_metadata["input_tokens"] > 0
        bound = model.bind_tools([lookup])
        assert bound.invoke("hello tools").text.startswith("echo:")
