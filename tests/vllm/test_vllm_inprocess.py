"""The gateway app in the agents' process over the real vLLM (``InProcessGateway.over_vllm``):
no gateway process between them, the claims riding on the calls as through one."""

from __future__ import annotations

import io

import pytest
from conftest import ALWAYS_HELD, VllmServer

import agentclaims
from agentclaims.contract import ClaimState, ProtectionMode
from agentclaims.errors import UsageError

pytestmark = pytest.mark.vllm


def words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


async def test_a_claimed_agent_in_process_holds_its_prefix_on_vllm(
    vllm_server: VllmServer,
) -> None:
    """Three calls of one agent through the app in this process: the descriptor is the
    connector's (claims ride on requests), each call carries its claim (none goes to the
    claims API on its own), the connector holds the last one ``demotable``, each call after
    the first is served its prefix from vLLM's cache, and closing the backend closes the
    app's connections to vLLM."""
    backend = agentclaims.InProcessGateway.over_vllm(vllm_server.url, vllm_server.key)
    try:
        await _three_turns(backend, vllm_server)
    finally:
        await backend.aclose()
    assert backend.kv._http._session is None  # type: ignore[attr-defined]  # vLLM's, closed
    await backend.aclose()  # again: nothing to do


async def _three_turns(backend: agentclaims.InProcessGateway, vllm_server: VllmServer) -> None:
    descriptor = await backend.descriptor()
    assert descriptor["claims_ride_on_requests"] is True
    client = agentclaims.openai_client(backend)
    messages = [{"role": "user", "content": words("in", 24)}]
    log = io.StringIO()
    async with agentclaims.ClaimedSession(backend, planner=ALWAYS_HELD, log_stream=log) as session:
        with session.node("agent"):
            for turn in range(3):
                reply = await client.chat.completions.create(
                    model=vllm_server.model, messages=messages, max_tokens=4, temperature=0
                )
                messages += [
                    {"role": "assistant", "content": reply.choices[0].message.content or ""},
                    {"role": "user", "content": words(f"t{turn}", 6)},
                ]
            await session.settle()
            [held] = list(session.claims.values())
            view = await backend.get_claim(held.claim_id, session.owner_scope)
            assert view.protection_mode is ProtectionMode.DEMOTABLE
            assert view.state in (ClaimState.ACCEPTED, ClaimState.MATERIALIZED), view
    assert session.stats.llm_calls == 3
    assert session.stats.claims_accepted == 3, log.getvalue()[-3000:]
    assert session.stats.cached_tokens >= 2 * 32  # the later calls' prefixes, from the cache
    calls = (await backend.metrics())["gateway"]["calls"]
    assert calls["POST /v1/chat/completions"] == 3
    assert "POST /v1/claims" not in calls, calls  # every claim rode on its call
    assert backend.kv._http._session is not None  # type: ignore[attr-defined]
    await client.close()


def test_a_gateway_over_vllm_needs_the_connectors_key_and_a_block_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the connector's key (argument or ``$AGENTCLAIMS_CLAIMS_KEY``), or with a block
    size that is no positive integer, nothing is built: a typed error names what is wrong."""
    monkeypatch.delenv("AGENTCLAIMS_CLAIMS_KEY", raising=False)
    with pytest.raises(UsageError, match="claims_key"):
        agentclaims.InProcessGateway.over_vllm("http://127.0.0.1:9")
    for bad in (0, -32, 32.0, True):
        with pytest.raises(UsageError, match="block_size"):
            agentclaims.InProcessGateway.over_vllm("http://127.0.0.1:9", "k", block_size=bad)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="name"):
        agentclaims.InProcessGateway.over_vllm("http://127.0.0.1:9", "k", name="")
