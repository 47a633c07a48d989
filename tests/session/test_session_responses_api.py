"""The SDK's clients on the Responses API: ``chat_model(..., use_responses_api=True)`` in a
real ``create_agent`` agent, and ``openai_client(...).responses``, each call claimed and
counted like a chat completion's."""

from __future__ import annotations

from langchain.agents import create_agent
from surface import SCRIPT, ask, search

import agentclaims
from agentclaims.backends.embedded import EmbeddedBackend


async def test_a_create_agent_agent_on_the_responses_api_is_claimed(tmp_path):
    backend = EmbeddedBackend(2048, 16, script=SCRIPT)
    model = agentclaims.chat_model(backend, use_responses_api=True)
    claimed = agentclaims.claimed_session(
        create_agent(model, [search]), backend=backend, log_dir=tmp_path
    )
    result = await claimed.ainvoke(ask())
    assert result["messages"][-1].text == "found three papers on it"
    stats = claimed.last_session.stats
    assert stats.llm_calls == 2
    assert stats.tool_calls == 1
    assert stats.prompt_tokens > 0
    assert stats.cached_tokens > 0  # the second call read the first one's prefix
    assert stats.claims_accepted >= 1
    await backend.aclose()


async def test_the_openai_clients_responses_streamed_and_not_are_counted():
    backend = EmbeddedBackend(2048, 16)
    client = agentclaims.openai_client(backend)
    async with agentclaims.ClaimedSession(backend) as session:
        with session.node("agent"):
            reply = await client.responses.create(model="scripted", input="hello " * 40)
            async with client.responses.stream(
                model="scripted", input="hello " * 40 + "again"
            ) as stream:
                final = await stream.get_final_response()
        await session.settle()
    assert reply.output_text.startswith("echo:")
    assert final.output_text.startswith("echo:")
    assert session.stats.llm_calls == 2
    assert session.stats.cached_tokens > 0
    await backend.aclose()
