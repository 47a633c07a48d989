"""HTTPBackend and the OpenAI client against `agentclaims serve` on loopback (real HTTP)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx2
import openai
import pytest
from servers import free_port, gateway_process

from agentclaims.backends import HTTPBackend
from agentclaims.cli import serve
from agentclaims.contract import ClaimState, ProtectionMode
from agentclaims.errors import BackendUnavailable, UnknownClaim, UsageError
from agentclaims.protocol import collect_events, outcome_from_error


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    """`agentclaims serve` in a subprocess (64 blocks of 4 tokens), stopped by PID at the end."""
    with gateway_process("--blocks", "64", "--block-size", "4") as url:
        yield f"{url}/v1"


def openai_client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=10)


async def test_http_backend_speaks_to_a_served_gateway(server_url: str) -> None:
    """Health, descriptor, a claim's decision and view come back over real HTTP."""
    async with HTTPBackend(server_url) as backend:
        assert await backend.health()
        desc = await backend.descriptor()
        assert desc["block_size"] == 4
        oc = openai_client(server_url)
        done = await oc.completions.create(model="m", prompt=list(range(100, 120)))
        pid = done.model_extra["agentclaims"]["prefix_ids"]["prompt"]  # type: ignore[index]
        from agentclaims.contract import CacheIdentity, ClaimSpec

        spec = ClaimSpec(
            claim_id="net-1",
            owner_scope="wf",
            object_id=pid,
            cache_identity=CacheIdentity.from_dict(desc["cache_identity"]),
            footprint_blocks=5,
            protection_mode=ProtectionMode.SOFT_PRIORITY,
        )
        decision = await backend.submit_claim(spec)
        assert decision.state is ClaimState.MATERIALIZED
        assert (await backend.residency([pid]))[pid] == 5
        assert (await backend.release_claim("net-1", "wf")).state is ClaimState.EXPIRED
        with pytest.raises(UnknownClaim):
            await backend.get_claim("missing", "wf")
        events = await collect_events(backend)
        assert [e.claim_id for e in events if e.claim_id][:1] == ["net-1"]
        await oc.close()


async def test_openai_client_sees_cached_tokens_and_decisions(server_url: str) -> None:
    """Through the real OpenAI client: cached_tokens grows on a shared prefix; the claim's
    decision rides in the response."""
    oc = openai_client(server_url)
    system = {"role": "system", "content": "You are the planner of a travel agency. " * 3}
    ext = {
        "agentclaims": {
            "session_id": "s-openai",
            "node": "planner",
            "claims": [
                {
                    "claim_id": "oa-1",
                    "object_id": "@prompt",
                    "protection_mode": "expiring",
                    "ttl_s": 60,
                }
            ],
        }
    }
    first = await oc.chat.completions.create(
        model="m",
        messages=[system, {"role": "user", "content": "a week in Lisbon"}],
        extra_body=ext,
    )
    decisions = first.model_extra["agentclaims"]["decisions"]  # type: ignore[index]
    assert decisions[0]["claim_id"] == "oa-1"
    assert decisions[0]["decision"] == "accepted"
    second = await oc.chat.completions.create(
        model="m", messages=[system, {"role": "user", "content": "a week in Porto"}]
    )
    assert first.usage is not None
    assert second.usage is not None
    assert first.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens_details is not None
    assert (
        second.usage.prompt_tokens_details.cached_tokens
        > first.usage.prompt_tokens_details.cached_tokens
    )
    await oc.close()


async def test_refusal_is_an_api_status_error_409(server_url: str) -> None:
    """A refused active request reaches the OpenAI client as APIStatusError 409 with the
    machine-readable body (action, feasibility, blocking claim ids)."""
    oc = openai_client(server_url)
    hold = {
        "agentclaims": {
            "owner_scope": "big",
            "claims": [
                {
                    "claim_id": "hold-all",
                    "object_id": "@prompt",
                    "protection_mode": "hard_protected",
                }
            ],
        }
    }
    await oc.completions.create(model="m", prompt=list(range(5000, 5160)), extra_body=hold)
    with pytest.raises(openai.APIStatusError) as info:
        await oc.completions.create(model="m", prompt=list(range(9000, 9160)))
    err = info.value
    assert err.status_code == 409
    assert isinstance(err.body, dict)
    assert err.body["type"] == "active_request_refused"
    assert err.body["action"] == "refuse_active"
    assert err.body["feasibility"] == "infeasible_preserve_resident_and_active"
    assert "hold-all" in err.body["blocking_claim_ids"]
    outcome = outcome_from_error(err.body)
    assert outcome is not None
    assert outcome.shortfall_blocks == err.body["shortfall_blocks"]
    async with HTTPBackend(server_url) as backend:
        await backend.release_claim("hold-all", "big")
    await oc.close()


async def test_down_backend_is_unavailable_quickly() -> None:
    """A closed port raises BackendUnavailable (chained to the transport error); health is False."""
    backend = HTTPBackend(f"http://127.0.0.1:{free_port()}", connect_timeout_s=2)
    with pytest.raises(BackendUnavailable) as info:
        await backend.descriptor()
    assert isinstance(info.value.__cause__, httpx2.TransportError)
    assert await backend.health() is False
    await backend.aclose()


async def test_silent_backend_times_out() -> None:
    """A server that accepts but never answers ends in BackendUnavailable, not a hang."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        async with HTTPBackend(url, timeout_s=0.2, connect_timeout_s=0.2) as backend:
            with pytest.raises(BackendUnavailable):
                await backend.get_claim("c", "o")


async def test_closed_backend_refuses_calls() -> None:
    """After aclose every call and http_client() raise BackendUnavailable."""
    backend = HTTPBackend("http://127.0.0.1:9/v1")
    await backend.aclose()
    with pytest.raises(BackendUnavailable):
        backend.http_client()
    with pytest.raises(BackendUnavailable):
        await collect_events(backend)


def test_base_url_is_normalised_and_checked() -> None:
    """``/v1`` is appended when missing; a non-HTTP URL or timeout is a usage error."""
    assert HTTPBackend("http://h:1").base_url == "http://h:1/v1"
    assert HTTPBackend("http://h:1/v1/").base_url == "http://h:1/v1"
    with pytest.raises(UsageError):
        HTTPBackend("h:1")
    with pytest.raises(UsageError):
        HTTPBackend("http://h:1", timeout_s=0)


VLLM_SERVE = ("serve", "--kv", "vllm", "--upstream", "http://127.0.0.1:9")


def test_serve_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    """`agentclaims serve` with a bad block count, promotion bound or share, or on vLLM without its
    upstream or its claims key or with a bad bound on its prompt book, exits 2 and names the
    flag as it was typed."""
    from agentclaims.cli.main import build_parser

    for argv, flag in (
        (["serve", "--blocks", "0"], "--blocks"),
        (["serve", "--kv", "vllm"], "--upstream"),
        (["serve", "--kv", "vllm", "--upstream", "http://127.0.0.1:9"], "--claims-key"),
        (["serve", "--promote", "-1"], "--promote"),
        (["serve", "--promote-share", "1.5"], "--promote-share"),
        (
            [*VLLM_SERVE, "--claims-key", "k", "--max-prefix-tokens", "0"],
            "--max-prefix-tokens",
        ),
    ):
        assert serve.run(build_parser().parse_args(argv)) == 2
        assert capsys.readouterr().err.startswith(f"agentclaims serve: {flag}: ")
