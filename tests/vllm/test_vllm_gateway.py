"""The gateway in front of the real vLLM server (`agentclaims serve --kv vllm`, a real process
on loopback): the OpenAI API proxied with claims, the claims API and event stream, client
kv_transfer_params stripped, refusals as claim-scoped outcomes."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import subprocess
import warnings
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from conftest import ALWAYS_HELD, VllmServer
from servers import gateway_process, start_gateway, stop

from agentclaims.backends import HTTPBackend
from agentclaims.contract import CacheIdentity, ClaimSpec, ClaimState, ProtectionMode
from agentclaims.planner import PlannerPolicy
from agentclaims.protocol import collect_events

pytestmark = pytest.mark.vllm
BS = 32


@pytest.fixture(scope="module")
def gateway(vllm_server: VllmServer) -> Iterator[str]:
    """`agentclaims serve --kv vllm` on a free port, in front of the session's vLLM."""
    args = ("--kv", "vllm", "--upstream", vllm_server.url, "--claims-key", vllm_server.key)
    with gateway_process(*args, "--kv-events", vllm_server.events) as url:
        yield url


def chat(content: str, **agentclaims: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 4,
        "temperature": 0,
        "ignore_eos": True,
    }
    if agentclaims:
        body["agentclaims"] = agentclaims
    return body


def words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


async def test_a_claim_sent_with_a_chat_request_holds_its_prompt_on_vllm(gateway: str) -> None:
    """A chat request through the gateway with a claim on @prompt: accepted and materialized
    on vLLM, its prompt survives pressure (cached on the next turn), released through the
    claims API with the events in the stream."""
    async with httpx2.AsyncClient(base_url=gateway, timeout=60) as http:
        prompt = words("keep", 40)
        claim = {
            "claim_id": "gw-1",
            "object_id": "@prompt",
            "protection_mode": "hard_protected",
            "ttl_s": 60,
        }
        first = (
            await http.post(
                "/v1/chat/completions", json=chat(prompt, owner_scope="wf-gw", claims=[claim])
            )
        ).json()
        [decision] = first["agentclaims"]["decisions"]
        assert decision["decision"] == "accepted", decision
        assert decision["state"] == "materialized"
        for k in range(12):
            await http.post("/v1/chat/completions", json=chat(words(f"press{k}x", 40)))
        again = (await http.post("/v1/chat/completions", json=chat(prompt))).json()
        blocks = again["usage"]["prompt_tokens"] // BS
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == blocks * BS
        released = (
            await http.post("/v1/claims/gw-1/release", json={"owner_scope": "wf-gw"})
        ).json()
        assert released["state"] == "expired"
        assert released["end_reason"] == "released"
    async with HTTPBackend(gateway) as backend:
        names = [e.event.value for e in await collect_events(backend, id_prefix="gw-1")]
    assert names[:2] == ["resident_claim_accepted", "resident_claim_materialized"]
    assert names[-1] == "resident_claim_expired"


async def test_a_claim_on_a_served_prefix_through_the_claims_api(gateway: str) -> None:
    """A request without claims still names its prompt prefix (from the token ids vLLM
    returns with the answer); `POST /v1/claims` on it holds it (re-run for one token); a claim
    with another engine's cache identity is refused."""
    async with HTTPBackend(gateway) as backend, httpx2.AsyncClient(base_url=gateway) as http:
        body = (await http.post("/v1/chat/completions", json=chat(words("later", 40)))).json()
        assert "agentclaims" in body, body
        assert "prompt_token_ids" not in body  # asked of vLLM for the prefix ids, not shown
        pid = body["agentclaims"]["prefix_ids"]["prompt"]
        identity = await backend.cache_identity()
        blocks = int(pid.rsplit("-", 1)[1])
        spec = ClaimSpec(
            "gw-2", "wf-api", pid, identity, blocks, ProtectionMode.SOFT_PRIORITY, ttl_s=30
        )
        decision = await backend.submit_claim(spec)
        assert decision.accepted
        assert (await backend.get_claim("gw-2", "wf-api")).state is ClaimState.MATERIALIZED
        assert (await backend.residency([pid]))[pid] == blocks
        other = CacheIdentity("elsewhere", "m", "t", "default", BS)
        wrong = ClaimSpec("gw-3", "wf-api", pid, other, blocks, ProtectionMode.SOFT_PRIORITY)
        assert not (await backend.submit_claim(wrong)).accepted
        assert (await backend.release_claim("gw-2", "wf-api")).state is ClaimState.EXPIRED


async def test_client_kv_transfer_params_never_reach_the_connector(
    gateway: str, vllm_server: VllmServer
) -> None:
    """Claim operations a client puts in kv_transfer_params are stripped by the gateway:
    another owner's claim stays held."""
    from agentclaims.vllm import ConnectorClient

    async with httpx2.AsyncClient(base_url=gateway, timeout=60) as http:
        prompt = words("strip", 40)
        claim = {
            "claim_id": "gw-4",
            "object_id": "@prompt",
            "protection_mode": "hard_protected",
            "ttl_s": 60,
        }
        await http.post(
            "/v1/chat/completions", json=chat(prompt, owner_scope="wf-owner", claims=[claim])
        )
        # a well-formed, correctly signed release, but sent by a client through the gateway
        direct = ConnectorClient(vllm_server.url, vllm_server.key, model="x", tenant="wf-owner")
        forged = {"agentclaims": direct.envelope([{"op": "release", "claim_id": "gw-4"}])}
        await direct.aclose()
        body = {**chat(words("other", 10)), "kv_transfer_params": forged}
        await http.post("/v1/chat/completions", json=body)
        view = (await http.get("/v1/claims/gw-4", params={"owner_scope": "wf-owner"})).json()
        assert view["state"] == "materialized"
        for k in range(12):
            await http.post("/v1/chat/completions", json=chat(words(f"strp{k}x", 40)))
        again = (await http.post("/v1/chat/completions", json=chat(prompt))).json()
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        await http.post("/v1/claims/gw-4/release", json={"owner_scope": "wf-owner"})


async def test_the_descriptor_is_the_checked_connector_lowering_for_this_vllm(gateway: str) -> None:
    """The vLLM side's descriptor names its limits and serves the checker's classes for the
    connector's descriptor at this vLLM's version: hard, expiring and demotable adapter_policy,
    best effort observational, soft priority and offloadable not offered (unknown)."""
    async with HTTPBackend(gateway) as backend:
        desc = await backend.descriptor()
    assert desc["kv_side"] == "vllm"
    assert any("preempted" in limit for limit in desc["limits"])
    classes = {mode: entry["lowering_class"] for mode, entry in desc["modes"].items()}
    assert classes == {
        "hard_protected": "adapter_policy",
        "expiring": "adapter_policy",
        "demotable": "adapter_policy",
        "best_effort": "adapter_observational",
        "soft_priority": "unknown",
        "offloadable": "unknown",
    }


def _start_gateway(vllm_server: VllmServer) -> tuple[subprocess.Popen[bytes], str]:
    return start_gateway(
        "--kv", "vllm", "--upstream", vllm_server.url, "--claims-key", vllm_server.key
    )


async def test_a_gateway_killed_mid_workflow_loses_no_claim_silently(
    vllm_server: VllmServer, gateway: str
) -> None:
    """kill -9 of the gateway while its claim is held: the next gateway on that vLLM revokes
    the orphaned hold with an explicit event (its blocks handed back), never silently."""
    first, url = _start_gateway(vllm_server)
    try:
        async with httpx2.AsyncClient(base_url=url, timeout=60) as http:
            claim = {
                "claim_id": "kill-1",
                "object_id": "@prompt",
                "protection_mode": "hard_protected",
                "ttl_s": 100,
            }
            body = chat(words("orphan", 40), owner_scope="wf-kill", claims=[claim])
            answer = (await http.post("/v1/chat/completions", json=body)).json()
            assert answer["agentclaims"]["decisions"][0]["decision"] == "accepted"
    finally:
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
    second, url = _start_gateway(vllm_server)
    try:
        async with HTTPBackend(url) as backend:
            events = await collect_events(backend, id_prefix="kill-1")
        [ended] = [e for e in events if e.event.value == "resident_claim_expired"]
        assert ended.data["reason"] == "revoked: gateway_restart"
        assert ended.data["blocks"] > 0
    finally:
        stop(second)


async def test_a_session_through_the_gateway_holds_its_claims_on_vllm(
    gateway: str, tmp_path: Any
) -> None:
    """A ClaimedSession on the gateway in front of vLLM: the planner's hard claim, planned
    before each call and riding on it (the descriptor states ``claims_ride_on_requests``), is
    accepted and materialized by the connector, a soft one is relaxed locally to demotable (the
    descriptor says soft priority is not offered), the first rides away with the second call
    (superseded) and the session's end releases the second, every step in the outcome log."""
    import json

    import agentclaims
    from agentclaims.contract import ProtectionMode
    from agentclaims.planner import ClaimPlan, ClaimPlanner, PrefixContext
    from agentclaims.protocol import SEQUENCE_OBJECT

    class Planned(ClaimPlanner):
        """One mode per call, planned before it (on ``@sequence``) and kept after."""

        def __init__(self, *modes: ProtectionMode) -> None:
            super().__init__()
            self.modes = list(modes)
            self.mode: ProtectionMode | None = None

        def plan(self, ctx: PrefixContext) -> ClaimPlan:
            if ctx.prefix_id == SEQUENCE_OBJECT:
                self.mode = self.modes.pop(0) if self.modes else None
            return ClaimPlan(self.mode, 30.0, "test")

    backend = agentclaims.HTTPBackend(gateway, timeout_s=120)
    client = agentclaims.openai_client(backend)
    model = (await client.models.list()).data[0].id
    messages = [{"role": "user", "content": words("session", 30)}]
    planner = Planned(ProtectionMode.HARD_PROTECTED, ProtectionMode.SOFT_PRIORITY)
    async with agentclaims.ClaimedSession(backend, planner=planner, log_dir=tmp_path) as session:
        with session.node("agent"):
            reply = await client.chat.completions.create(
                model=model, messages=messages, max_tokens=4
            )
            messages += [{"role": "assistant", "content": reply.choices[0].message.content or "ok"}]
            async with session.tool_call("search"):
                await session.settle()
                [held] = session.claims.values()
                assert held.plan.mode is ProtectionMode.HARD_PROTECTED
                assert held.state == "materialized"
            messages += [{"role": "user", "content": "and then"}]
            await client.chat.completions.create(model=model, messages=messages, max_tokens=4)
            await session.settle()
            [second] = session.claims.values()
            assert second.plan.mode is ProtectionMode.DEMOTABLE
    await backend.aclose()
    assert session.stats.claims_accepted == 2
    lines = [
        json.loads(x) for x in (tmp_path / f"{session.workflow_id}.jsonl").read_text().splitlines()
    ]
    names = [d["event"] for d in lines]
    assert "resident_claim_materialized" in names
    assert "reaction_relax" in names
    ended = {d["claim_id"]: d["reason"] for d in lines if d["event"] == "claim_ended"}
    assert sorted(ended.values()) == ["session_end", "superseded"]


async def test_conformance_over_the_gateway_on_vllm_runs_every_level_it_can(gateway: str) -> None:
    """`run_suite` over HTTP on the real vLLM with the connector: each level's served variant
    on vLLM's own pool (fresh instances by revoking holds and resetting vLLM's prefix cache,
    residency from its KV events). L1, L3, L4, L5, L7 and C1 pass from real runs; L2 (no write
    no-admit in vLLM) and L6 (block 0 cannot be lost alone) are not_exposed, saying why."""
    from agentclaims.conformance import run_suite
    from agentclaims.contract import ConformanceStatus

    async with HTTPBackend(gateway, timeout_s=120) as backend:
        results = await run_suite(backend)
        desc = await backend.descriptor()
    status = {level: r.status for level, r in results.items()}
    details = {level: r.detail for level, r in results.items()}
    report = "\n".join(f"{level} {status[level].value}: {details[level]}" for level in results)
    assert status == {
        "L1": ConformanceStatus.PASS,
        "L2": ConformanceStatus.NOT_EXPOSED,
        "L3": ConformanceStatus.PASS,
        "L4": ConformanceStatus.PASS,
        "L5": ConformanceStatus.PASS,
        "L6": ConformanceStatus.NOT_EXPOSED,
        "L7": ConformanceStatus.PASS,
        "C1": ConformanceStatus.PASS,
    }, report
    assert "write no-admit" in details["L2"]
    assert "block 0" in details["L6"]
    assert all(results[level].evidence for level in ("L3", "L4", "L5", "L7", "C1"))
    assert "refused" in details["L3"]
    assert "rejected" in details["C1"]
    assert desc["kv_events"]["running"]
    assert desc["fault"] is None
    assert desc["kv_events"]["unjoined_blocks"] == 0


async def test_block_residency_and_materialization_come_from_vllms_kv_events(
    gateway: str,
) -> None:
    """Per-block residency over the gateway is vLLM's own BlockStored/BlockRemoved joined to
    the gateway's hashes: a claimed prompt stays resident under pressure, an unclaimed one
    goes; the claim is materialized when vLLM's events show its blocks stored; after the
    release its blocks' eviction is counted as losses after release, never harm."""
    from agentclaims.engine import hash_token_blocks

    def tokens(base: int, n: int = 200) -> list[int]:
        return [3 + (base + 7 * i) % 997 for i in range(n)]

    def completion(prompt: list[int], **agentclaims: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"prompt": prompt, "max_tokens": 2, "temperature": 0}
        if agentclaims:
            body["agentclaims"] = agentclaims
        return body

    kept, gone = tokens(11), tokens(517)
    claim = {"claim_id": "ev-1", "object_id": "@prompt", "protection_mode": "hard_protected"}
    async with (
        HTTPBackend(gateway) as backend,
        httpx2.AsyncClient(base_url=gateway, timeout=60) as http,
    ):
        answer = (
            await http.post(
                "/v1/completions", json=completion(kept, owner_scope="wf-ev", claims=[claim])
            )
        ).json()
        assert answer["agentclaims"]["decisions"][0]["state"] == "materialized"
        await http.post("/v1/completions", json=completion(gone))
        kept_h, gone_h = hash_token_blocks(kept, BS), hash_token_blocks(gone, BS)
        assert await backend.block_residency(kept_h + gone_h) == [True] * 12
        for k in range(8):
            await http.post("/v1/completions", json=completion(tokens(2000 + 97 * k)))
        assert await backend.block_residency(kept_h) == [True] * 6
        assert await backend.block_residency(gone_h) == [False] * 6
        await backend.release_claim("ev-1", "wf-ev")
        for k in range(8):
            await http.post("/v1/completions", json=completion(tokens(5000 + 97 * k)))
        lost = 6 - sum(await backend.block_residency(kept_h))
        events = await collect_events(backend, id_prefix="ev-1")
    names = [e.event.value for e in events]
    assert names[:2] == ["resident_claim_accepted", "resident_claim_materialized"]
    assert events[1].data["seen"] == "vllm_kv_events"
    assert "resident_claim_harmed" not in names
    after = [e for e in events if e.event.value == "resident_claim_block_lost_after_release"]
    assert lost > 0
    assert sum(e.data["blocks"] for e in after) == lost
    assert all(e.seq > names.index("resident_claim_expired") for e in after)


ALPHA = "ak-alpha-0123456789abcdef"
BETA = "ak-beta-0123456789abcdef"


async def test_tenants_and_the_ledger_on_vllm(vllm_server: VllmServer, tmp_path: Any) -> None:
    """The gateway with keys and a ledger in front of the real vLLM: tenants never share
    vLLM's prefix cache (vLLM's own cache_salt), nor ids (the same claim id and owner scope are
    two claims), a claim over a tenant's quota is refused before it reaches vLLM, and after a kill -9 and a restart on the ledger every accepted
    claim ends exactly once, explicitly, with the stream numbered on."""
    keys = tmp_path / "keys.toml"
    keys.write_text(
        f'[[key]]\nkey = "{ALPHA}"\ntenant = "alpha"\nquota_blocks = 2\n\n'
        f'[[key]]\nkey = "{BETA}"\ntenant = "beta"\n'
    )
    args = (
        *("--kv", "vllm", "--upstream", vllm_server.url, "--claims-key", vllm_server.key),
        *("--api-keys", str(keys), "--ledger", str(tmp_path / "ledger.sqlite")),
    )
    auth = {"Authorization": f"Bearer {ALPHA}"}
    first, url = start_gateway(*args)
    try:
        async with (
            httpx2.AsyncClient(base_url=url, timeout=60, headers=auth) as alpha,
            httpx2.AsyncClient(
                base_url=url, timeout=60, headers={"Authorization": f"Bearer {BETA}"}
            ) as beta,
        ):
            shared = words("tenant", 40)
            await alpha.post("/v1/chat/completions", json=chat(shared, owner_scope="t-a"))
            again = (
                await alpha.post("/v1/chat/completions", json=chat(shared, owner_scope="t-a"))
            ).json()
            theirs = (
                await beta.post("/v1/chat/completions", json=chat(shared, owner_scope="t-b"))
            ).json()
            assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
            assert theirs["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            # alpha's prefix id is, to beta, one never served: no residency, no claim on it
            alphas = again["agentclaims"]["prefix_ids"]["prompt"]
            seen = (await beta.post("/v1/residency", json={"prefix_ids": [alphas]})).json()
            assert seen == {"residency": {alphas: 0}}
            # plain calls (OpenAI's fields only: the lean way) keep the tenants apart too
            lone = words("lone", 40)
            await alpha.post("/v1/chat/completions", json=chat(lone))
            plain = (await alpha.post("/v1/chat/completions", json=chat(lone))).json()
            other = (await beta.post("/v1/chat/completions", json=chat(lone))).json()
            assert plain["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
            assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            for answer in (plain, again):  # the lean way's, and the general way's
                ext = answer["agentclaims"]
                assert ext["request_id"] == ext["outcome"]["request_id"] == answer["id"]
                assert answer["id"].startswith("chatcmpl-"), answer["id"]  # its own, as named
                assert "/" not in answer["id"], answer["id"]
                assert "other:" not in answer["id"], answer["id"]
            theirs_too = plain["agentclaims"]["prefix_ids"]["prompt"]
            own = {
                "claim_id": "t-own",
                "owner_scope": "t-a",
                "object_id": theirs_too,
                "cache_identity": (await alpha.get("/v1/descriptor")).json()["cache_identity"],
                "footprint_blocks": 1,
                "protection_mode": "demotable",
            }
            mine = await alpha.post("/v1/claims", json={"claim": own})
            assert mine.status_code == 200, mine.text  # the tenant's own prefix id
            await alpha.post("/v1/claims/t-own/release", json={"owner_scope": "t-a"})
            stolen = await beta.post("/v1/claims", json={"claim": {**own, "owner_scope": "t-b"}})
            assert stolen.status_code == 400, stolen.text
            assert "unknown prefix" in stolen.json()["error"]["message"]
            identity = (await beta.get("/v1/descriptor")).json()["cache_identity"]
            pin = {
                "claim_id": "t-steal",
                "owner_scope": "t-b",
                "object_id": alphas,
                "cache_identity": identity,
                "footprint_blocks": 1,
                "protection_mode": "hard_protected",
            }
            stolen = await beta.post("/v1/claims", json={"claim": pin})
            assert stolen.status_code == 400
            assert "unknown prefix" in stolen.json()["error"]["message"]
            big = {
                "claim_id": "t-over",
                "object_id": "@prompt",
                "protection_mode": "hard_protected",
            }
            over = (
                await alpha.post(
                    "/v1/chat/completions",
                    json=chat(words("quota", 40), owner_scope="t-a", claims=[big]),
                )
            ).json()
            [decision] = over["agentclaims"]["decisions"]
            assert decision["decision"] == "rejected"
            assert decision["action"] == "refuse_residency_claim"
            assert "quota of 2" in decision["reason"]
            small = {
                "claim_id": "t-kept",
                "object_id": "@prompt",
                "protection_mode": "hard_protected",
                "ttl_s": 100,
            }
            kept = (
                await alpha.post(
                    "/v1/chat/completions",
                    json=chat(words("small", 15), owner_scope="t-a", claims=[small]),
                )
            ).json()
            assert kept["agentclaims"]["decisions"][0]["decision"] == "accepted"
            # the same claim id and owner scope, used by beta: beta's own claim, apart
            mirror = (
                await beta.post(
                    "/v1/chat/completions",
                    json=chat(words("mirror", 15), owner_scope="t-a", claims=[small]),
                )
            ).json()
            assert mirror["agentclaims"]["decisions"][0]["decision"] == "accepted"
            view = (await beta.get("/v1/claims/t-kept", params={"owner_scope": "t-a"})).json()
            assert (view["claim_id"], view["owner_scope"]) == ("t-kept", "t-a")
            gone = await beta.post("/v1/claims/t-kept/release", json={"owner_scope": "t-a"})
            assert gone.json()["state"] == "expired"
            mine = (await alpha.get("/v1/claims/t-kept", params={"owner_scope": "t-a"})).json()
            assert mine["state"] == "materialized"  # alpha's is untouched
            cursor = (await alpha.get("/v1/events")).json()["last_seq"]
    finally:
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
    second, url = start_gateway(*args)
    try:
        async with httpx2.AsyncClient(base_url=url, timeout=60, headers=auth) as alpha:
            page = (await alpha.get("/v1/events", params={"since": cursor})).json()
        ends = [
            e
            for e in page["events"]
            if e["claim_id"] == "t-kept"
            and e["event"] in ("resident_claim_expired", "resident_claim_harmed")
        ]
        assert len(ends) == 1, page["events"]
        assert "gateway_restart" in ends[0]["reason"]  # the connector revoked the held blocks
        assert all(e["seq"] > cursor for e in page["events"])
    finally:
        stop(second)


async def test_a_plain_call_names_its_sequence_by_the_blocks_its_reply_completes(
    gateway: str,
) -> None:
    """A reply that completes no block past the prompt leaves the prompt's prefix cached: its
    sequence is the prompt's own id; one that completes a block names the longer chain."""
    from agentclaims.contract import prefix_id_of
    from agentclaims.engine import hash_token_blocks

    prompt = [3 + (57 + 13 * i) % 997 for i in range(3 * BS + 5)]
    async with httpx2.AsyncClient(base_url=gateway, timeout=60) as http:
        answers = []
        for max_tokens in (2, 40):  # 102 and 140 computed tokens: 3 and 4 full blocks
            body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
            body |= {"temperature": 0, "return_token_ids": True}
            answers.append((await http.post("/v1/completions", json=body)).json())
    short, long = (a["agentclaims"]["prefix_ids"] for a in answers)
    assert short["prompt"] == prefix_id_of(hash_token_blocks(prompt, BS))
    assert short["sequence"] == short["prompt"] == long["prompt"]
    reply = answers[1]["choices"][0]["token_ids"]
    assert len(reply) == 40
    assert long["sequence"] == prefix_id_of(hash_token_blocks((prompt + reply)[: 4 * BS], BS))


async def test_a_sequence_claim_holds_the_prompt_and_the_reply_blocks(gateway: str) -> None:
    """`@sequence` on vLLM: the connector holds every full block the request leaves cached,
    the reply's included (all but the reply's last token, whose KV is never computed); the
    next turn over prompt + reply hits those blocks after pressure."""
    from agentclaims.engine import hash_token_blocks

    prompt = [3 + (31 + 11 * i) % 997 for i in range(100)]
    claim = {"claim_id": "seq-1", "object_id": "@sequence", "protection_mode": "hard_protected"}
    body = {
        "prompt": prompt,
        "max_tokens": 60,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        "agentclaims": {"owner_scope": "wf-seq", "claims": [claim]},
    }
    async with (
        HTTPBackend(gateway) as backend,
        httpx2.AsyncClient(base_url=gateway, timeout=60) as http,
    ):
        answer = (await http.post("/v1/completions", json=body)).json()
        [decision] = answer["agentclaims"]["decisions"]
        assert decision["state"] == "materialized", decision
        reply = answer["choices"][0]["token_ids"]
        sequence = (prompt + reply)[: (len(prompt) + len(reply) - 1) // BS * BS]
        assert len(sequence) == 4 * BS  # 159 computed tokens: 3 prompt blocks + 1 of the reply
        hashes = hash_token_blocks(sequence, BS)
        pid = answer["agentclaims"]["prefix_ids"]["sequence"]
        assert (await backend.get_claim("seq-1", "wf-seq")).object_id == pid
        for k in range(8):
            filler = [3 + (4000 + 97 * k + 5 * i) % 997 for i in range(200)]
            await http.post("/v1/completions", json={"prompt": filler, "max_tokens": 2})
        assert await backend.block_residency(hashes) == [True] * 4
        turn = {"prompt": [*sequence, 7, 8, 9], "max_tokens": 2, "temperature": 0}
        again = (await http.post("/v1/completions", json=turn)).json()
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 4 * BS
        await backend.release_claim("seq-1", "wf-seq")


async def _fill_the_pool(http: httpx2.AsyncClient, tag: str) -> list[str]:
    """Another owner's hard claims (owner ``wf-fill``) on 5 x 6 blocks: 30 of the 40, under
    the cap of 31, TTL 6 s; their ids (each test its own: a release may still be riding)."""
    ids = []
    for i in range(5):
        cid = f"{tag}-{i}"
        claim = {"claim_id": cid, "object_id": "@prompt", "ttl_s": 6}
        body = chat(words(f"fill{i}x", 34), owner_scope="wf-fill", claims=[claim])
        body["agentclaims"]["claims"][0]["protection_mode"] = "hard_protected"
        first = (await http.post("/v1/chat/completions", json=body)).json()
        assert "agentclaims" in first, first
        [decision] = first["agentclaims"]["decisions"]
        assert decision["state"] == "materialized", decision
        assert first["usage"]["prompt_tokens"] >= 6 * BS
        ids.append(cid)
    return ids


async def _renew_the_fill(gateway: str, ids: list[str]) -> None:
    """Renewed just before a burst: a slow run must not let the TTLs end."""
    async with httpx2.AsyncClient(base_url=gateway, timeout=60) as http:
        for cid in ids:
            renewed = await http.post(
                f"/v1/claims/{cid}/renew", json={"owner_scope": "wf-fill", "ttl_s": 6}
            )
            assert renewed.json()["state"] == "materialized", renewed.json()


async def _release_the_fill(gateway: str, ids: list[str]) -> None:
    """What a test holds goes with it, pass or fail."""
    async with httpx2.AsyncClient(base_url=gateway, timeout=60) as http:
        for cid in ids:
            await http.post(f"/v1/claims/{cid}/release", json={"owner_scope": "wf-fill"})


async def test_a_deferral_inside_vllm_reaches_the_session_as_pressure(
    gateway: str, tmp_path: Any
) -> None:
    """Another owner's hard claims fill the pool up to the connector's cap (TTL 6 s, renewed
    just before); three concurrent calls of one session cannot all start beside them (one
    takes most of the free blocks), so the connector's admission hook holds the others back
    inside vLLM until blocks come free. Each answer says for how long
    (``agentclaims.deferred_s``); the session counts it as a deferral and as memory pressure,
    as it would a retried 409."""
    import asyncio

    import agentclaims

    async with httpx2.AsyncClient(base_url=gateway, timeout=60) as http:
        fill = await _fill_the_pool(http, "press")

    def deferred_s(reply: Any) -> float:
        return float((reply.model_extra or {}).get("agentclaims", {}).get("deferred_s", 0))

    try:
        backend = agentclaims.HTTPBackend(gateway, timeout_s=120)
        client = agentclaims.openai_client(backend)
        model = (await client.models.list()).data[0].id
        replies: list[Any] = []
        async with agentclaims.ClaimedSession(backend, planner="off", log_dir=tmp_path) as session:
            with session.node("warm-up"):  # the session's first call reads the descriptor: not
                await client.chat.completions.create(  # in a burst, whose calls must overlap
                    model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=1
                )
            for attempt in range(3):  # a burst whose calls did not overlap (a loaded machine
                # ran them one after another) defers none: up to 3 bursts
                await _renew_the_fill(gateway, fill)
                with session.node("agent"):
                    burst = await asyncio.gather(
                        *(
                            client.chat.completions.create(
                                model=model,
                                # 5 blocks each: two fit in the 10 free blocks, the third cannot
                                messages=[
                                    {"role": "user", "content": words(f"b{attempt}u{k}x", 26)}
                                ],
                                max_tokens=120,
                                extra_body={"ignore_eos": True},
                            )
                            for k in range(3)
                        )
                    )
                replies += burst
                if any(deferred_s(r) for r in burst):
                    break
        await backend.aclose()
        held_back = [deferred_s(r) for r in replies]
        assert any(s > 0 for s in held_back), [
            (r.model_extra or {}).get("agentclaims") for r in replies
        ]
        assert session.stats.deferrals == sum(1 for s in held_back if s > 0)
        assert session.stats.deferral_s == pytest.approx(sum(held_back))
        assert session.workflow.pressure > 0
        import json

        logged = [
            json.loads(line)
            for line in (tmp_path / f"{session.workflow_id}.jsonl").read_text().splitlines()
        ]
        calls = [d for d in logged if d["event"] == "llm_call" and d["node"] == "agent"]
        assert sorted(d.get("deferred_s", 0) for d in calls) == pytest.approx(sorted(held_back))
    finally:
        await _release_the_fill(gateway, fill)


async def test_a_plain_call_goes_to_vllm_unsigned_and_still_hears_its_deferral(
    gateway: str,
) -> None:
    """A plain OpenAI call (no ``agentclaims`` object) with no claim operation waiting to ride
    goes to vLLM as vLLM's own: no signed envelope (``/v1/stats`` counts it in
    ``bare_completions``). Its answer still names its prefixes, and the connector still
    answers a deferral of it: with another owner's hard holds filling the pool, three
    concurrent plain calls cannot all start, and the one held back says for how long."""
    import asyncio

    async with httpx2.AsyncClient(base_url=gateway, timeout=120) as http:

        async def counts() -> tuple[int, int]:
            stats = (await http.get("/v1/stats")).json()
            return stats["bare_completions"], stats["claim_operations"]["rode"]

        fill = await _fill_the_pool(http, "plain-fill")
        try:
            answers: list[dict[str, Any]] = []
            for attempt in range(3):  # calls that did not overlap defer none: up to 3 bursts
                await _renew_the_fill(gateway, fill)
                bare, rode = await counts()
                burst = [
                    {**chat(words(f"plain{attempt}u{k}x", 26)), "max_tokens": 120} for k in range(3)
                ]
                replies = await asyncio.gather(
                    *(http.post("/v1/chat/completions", json=body) for body in burst)
                )
                assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
                answers = [r.json()["agentclaims"] for r in replies]
                bare_after, rode_after = await counts()
                # a call that carried a pending operation (a renewal riding) was signed
                assert 3 - (rode_after - rode) <= bare_after - bare <= 3
                assert all(a["prefix_ids"]["prompt"] for a in answers), answers
                if any(a.get("deferred_s", 0) > 0 for a in answers):
                    break
            assert any(a.get("deferred_s", 0) > 0 for a in answers), answers
        finally:
            await _release_the_fill(gateway, fill)


async def test_another_tenants_request_held_back_for_the_gateways_claims_is_counted(
    gateway: str, vllm_server: VllmServer
) -> None:
    """Requests sent straight to vLLM (another tenant: nothing of the gateway's) that the
    gateway's hard claims keep waiting are deferred by the connector like any other, and the
    gateway counts every such verdict it hears of (``/v1/stats`` ``request_verdicts``,
    ``agentclaims_request_verdicts_total`` on ``/metrics``): none goes uncounted because it
    was not the gateway's own."""
    direct = f"{vllm_server.url}/v1/completions"

    def held_back(reply: httpx2.Response) -> float:
        params = reply.json().get("kv_transfer_params") or {}
        return float((params.get("agentclaims") or {}).get("deferred_s") or 0.0)

    async with httpx2.AsyncClient(base_url=gateway, timeout=120) as http:
        before = (await http.get("/v1/stats")).json()["request_verdicts"]
        fill = await _fill_the_pool(http, "tenant-fill")
        try:
            waited: list[float] = []
            for attempt in range(3):  # calls that did not overlap defer none: up to 3 bursts
                await _renew_the_fill(gateway, fill)
                burst = [  # 100 prompt tokens of its own each (one-shot prompts, as token ids)
                    {
                        "model": vllm_server.model,
                        "prompt": [3 + (attempt * 1000 + k * 300 + i) % 2000 for i in range(100)],
                        "max_tokens": 120,
                        "ignore_eos": True,
                    }
                    for k in range(3)
                ]
                replies = await asyncio.gather(*(http.post(direct, json=b) for b in burst))
                assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
                waited = [held_back(r) for r in replies]
                if any(waited):
                    break
            assert any(waited), waited
            # the gateway hears the connector's events with an answer that brings them (a call
            # with pool figures a second old, or one that carries an operation): calls go on
            # until one has, a bounded number of times
            held = sum(1 for w in waited if w > 0)
            for turn in range(20):
                ask = chat(words(f"tenant-after-{turn}", 8), owner_scope="wf-tenant-check")
                assert (await http.post("/v1/chat/completions", json=ask)).status_code == 200
                after = (await http.get("/v1/stats")).json()["request_verdicts"]
                if after["deferred"] - before["deferred"] >= held:
                    break
                await asyncio.sleep(0.25)
            metrics = (await http.get("/metrics")).text
        finally:
            await _release_the_fill(gateway, fill)
    assert after["deferred"] - before["deferred"] >= held
    assert after["refused"] >= before["refused"]
    line = f'agentclaims_request_verdicts_total{{verdict="deferred"}} {float(after["deferred"])}'
    assert line in metrics.splitlines(), [m for m in metrics.splitlines() if "verdict" in m]


def test_the_middleware_example_runs_through_the_gateway_on_vllm(gateway: str) -> None:
    """`examples/agent_middleware.py --url` as a user runs it: a LangChain `create_agent` agent
    with `ClaimsMiddleware`, three turns of one thread through the gateway on the real vLLM;
    each later turn finds the conversation's prefix in vLLM's cache, and no session is left
    open."""
    import re
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [
            sys.executable,
            "-W",
            "error::DeprecationWarning",
            str(root / "examples" / "agent_middleware.py"),
            "--url",
            gateway,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert done.returncode == 0, done.stderr
    turns = re.findall(r"(\d+) LLM call\(s\).*?(\d+)/(\d+) prompt tokens cached", done.stdout)
    assert len(turns) == 3, done.stdout
    assert all(int(calls) >= 1 for calls, _, _ in turns)
    assert all(int(cached) > 0 for _, cached, _ in turns[1:]), done.stdout
    assert "open sessions: 0" in done.stdout


async def test_the_held_preset_holds_prefixes_demotable_on_vllm(gateway: str) -> None:
    """The ``held`` mapping on the real vLLM, whose descriptor states ``sheds_by_hints``
    (not weighed by time here: this tiny model recomputes a prefix in microseconds): an
    answer that calls no tool (its next use unknown), which the ``default`` mapping claimed
    ``best_effort`` and then dropped (only watched on vLLM), is held ``demotable`` by the
    connector."""
    import agentclaims

    descriptor = httpx2.get(f"{gateway}/v1/descriptor", timeout=30).json()
    assert descriptor["sheds_by_hints"] is True
    backend = HTTPBackend(gateway, timeout_s=120)
    client = agentclaims.openai_client(backend)
    model = (await client.models.list()).data[0].id
    messages = [{"role": "user", "content": words("held", 40)}]
    import io

    log = io.StringIO()
    held_mapping = PlannerPolicy.named("held").with_(decide_by_time=False)
    async with agentclaims.ClaimedSession(backend, planner=held_mapping, log_stream=log) as session:
        with session.node("agent"):
            reply = await client.chat.completions.create(
                model=model, messages=messages, max_tokens=4, temperature=0
            )
            await session.settle()
            holding = list(session.claims.values())
            assert len(holding) == 1, log.getvalue()[-3000:]  # the outcome log says why not
            [held] = holding
            assert held.plan.mode is ProtectionMode.DEMOTABLE
            view = await backend.get_claim(held.claim_id, session.owner_scope)
            assert view.protection_mode is ProtectionMode.DEMOTABLE
            assert view.state in (ClaimState.ACCEPTED, ClaimState.MATERIALIZED), view
    assert reply.choices[0].message is not None
    assert session.stats.claims_accepted == 1
    assert not session.stats.claims_refused
    await client.close()
    await backend.aclose()


async def _sse(http: httpx2.AsyncClient, url: str, body: dict[str, Any]) -> list[Any]:
    """The events of one streamed completion: each ``data`` parsed, ``[DONE]`` as is."""
    import json

    out: list[Any] = []
    async with http.stream("POST", url, json=body) as r:
        assert r.status_code == 200, await r.aread()
        assert r.headers["content-type"].startswith("text/event-stream")
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                data = line[len("data: ") :]
                out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def test_a_streamed_completion_passes_vllms_tokens_through(gateway: str) -> None:
    """``stream: true`` through the gateway on vLLM: vLLM's own chunks, a token at a time, and
    no chunk more: the last (the finish chunk, or the usage chunk when the client asked for
    usage) carries the ``agentclaims`` object (served, the prompt named, the usage), then
    ``[DONE]``. Token ids and the usage chunk reach the client only when it asks for them; the
    prompt it names is vLLM's, resident and claimable after the stream."""
    body = {**chat(words("stream", 40)), "max_tokens": 8, "stream": True}
    async with httpx2.AsyncClient(timeout=60) as http:
        events = await _sse(http, f"{gateway}/v1/chat/completions", body)
        assert events[-1] == "[DONE]"
        chunks = events[:-1]
        tokens = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
        assert len(tokens) >= 4  # passed on as vLLM makes them, not one burst at the end
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        assert not any("usage" in c or "prompt_token_ids" in c for c in chunks[:-1])
        assert not any("token_ids" in ch for c in chunks for ch in c["choices"])
        ext = chunks[-1]["agentclaims"]
        assert all(c["choices"] for c in chunks)  # no chunk without choices was asked for
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert not any("agentclaims" in c for c in chunks[:-1])
        assert ext["outcome"]["action"].startswith("serve_active")
        assert ext["usage"]["completion_tokens"] == 8
        prompt = ext["prefix_ids"]["prompt"]
        assert prompt
        seen = (await http.post(f"{gateway}/v1/residency", json={"prefix_ids": [prompt]})).json()
        assert seen["residency"][prompt] > 0
        # asked for: the usage chunk (OpenAI's shape) and the token ids, as vLLM sends them
        asked = {**body, "stream_options": {"include_usage": True}, "return_token_ids": True}
        events = await _sse(http, f"{gateway}/v1/chat/completions", asked)
        usage = [c for c in events[:-1] if not c["choices"]]
        assert usage == [events[-2]]  # one usage chunk, the last, with the agentclaims object
        assert usage[-1]["usage"]["completion_tokens"] == 8
        assert usage[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the same prompt
        assert usage[-1]["agentclaims"]["outcome"]["action"].startswith("serve_active")
        assert any(ch.get("token_ids") for c in events[:-1] for ch in c["choices"])
        # counted: vLLM's chunks passed on, in as many writes or fewer (those that came together)
        streamed = (await http.get(f"{gateway}/v1/stats")).json()["streamed"]
        assert streamed["chunks"] >= len(chunks) + len(events) - 2
        assert 2 <= streamed["writes"] <= streamed["chunks"]


async def test_a_client_that_leaves_a_stream_aborts_the_vllm_request(
    gateway: str, vllm_server: VllmServer
) -> None:
    """A client reading two chunks of a long stream, then closing it: vLLM aborts the request
    (its running requests drop back to none, within a bounded wait) and the gateway serves the
    next one."""
    import asyncio
    import time

    body = {**chat(words("leave", 20)), "max_tokens": 200, "stream": True}
    async with httpx2.AsyncClient(timeout=60) as http:
        async with http.stream("POST", f"{gateway}/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            read = 0
            async for line in r.aiter_lines():
                read += line.startswith("data: ")
                if read >= 2:
                    break
        deadline = time.monotonic() + 30
        while True:
            metrics = (await http.get(f"{vllm_server.url}/metrics")).text
            running = [
                float(line.rsplit(" ", 1)[1])
                for line in metrics.splitlines()
                if line.startswith("vllm:num_requests_running")
            ]
            if running and max(running) == 0:
                break
            assert time.monotonic() < deadline, "vLLM still runs the abandoned request"
            await asyncio.sleep(0.2)
        again = await http.post(f"{gateway}/v1/chat/completions", json=chat(words("next", 5)))
        assert again.status_code == 200


async def test_a_langgraph_agent_streams_tokens_over_the_vllm_gateway(gateway: str) -> None:
    """``astream(stream_mode="messages")`` of a claimed LangGraph graph over the gateway on the
    real vLLM yields the model's tokens one by one, and the session still plans its claim from
    the stream's last chunk."""
    from langchain_core.messages import AIMessageChunk, HumanMessage
    from langgraph.graph import END, START, MessagesState, StateGraph

    import agentclaims

    backend = HTTPBackend(gateway, timeout_s=120)
    served = await agentclaims.openai_client(backend).models.list()
    model = agentclaims.chat_model(
        backend, model=served.data[0].id, max_tokens=8, temperature=0, streaming=True
    )

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", END)
    claimed = agentclaims.claimed_session(builder.compile(), backend=backend)
    run = claimed.run()
    pieces = [
        message.content
        async for message, _meta in run.astream(
            {"messages": [HumanMessage(words("graph", 30))]}, stream_mode="messages"
        )
        if isinstance(message, AIMessageChunk) and message.content
    ]
    assert len(pieces) >= 4
    assert run.stats.llm_calls == 1
    await backend.aclose()


async def test_the_gateway_counts_the_engine_requests_it_makes_on_vllm(gateway: str) -> None:
    """``/v1/stats`` and ``/metrics`` count the requests sent to vLLM: an agent's completion is
    one ``completion``; a claim made through ``POST /v1/claims`` on a served prefix costs one
    ``operation`` of the gateway's own (a one-token request carrying the hold). (Its start,
    the first time it is used, makes a few of its own too.)"""
    from prometheus_client.parser import text_string_to_metric_families

    async with httpx2.AsyncClient(base_url=gateway, timeout=60) as http:

        async def counts() -> dict[str, float]:
            text = (await http.get("/metrics")).text
            [family] = [
                f
                for f in text_string_to_metric_families(text)
                if f.name == "agentclaims_engine_requests"
            ]
            return {s.labels["kind"]: s.value for s in family.samples if s.name.endswith("_total")}

        await http.post("/v1/chat/completions", json=chat("warm"))  # the gateway's start is done
        before = await counts()
        served = (await http.post("/v1/chat/completions", json=chat(words("count", 40)))).json()
        after_call = await counts()
        assert after_call["completion"] == before["completion"] + 1
        assert after_call["operation"] == before["operation"]
        prompt = served["agentclaims"]["prefix_ids"]["prompt"]
        identity = (await http.get("/v1/descriptor")).json()["cache_identity"]
        claim = {
            "claim_id": "count-c1",
            "owner_scope": "count",
            "object_id": prompt,
            "cache_identity": identity,
            "footprint_blocks": 1,
            "protection_mode": "hard_protected",
            "ttl_s": 30,
        }
        decided = (await http.post("/v1/claims", json={"claim": claim})).json()
        assert decided["decision"] == "accepted", decided
        after_claim = await counts()
        assert after_claim["operation"] >= after_call["operation"] + 1
        assert after_claim["completion"] == after_call["completion"]
        stats = (await http.get("/v1/stats")).json()
        assert stats["engine_requests"] == after_claim
        assert stats["engine_requests_per_completion"] > 1
        # the plain calls above that went unsigned, the same in both
        text = (await http.get("/metrics")).text
        [bare] = [
            s.value
            for f in text_string_to_metric_families(text)
            if f.name == "agentclaims_bare_completions"
            for s in f.samples
            if s.name.endswith("_total")
        ]
        assert 1 <= bare == stats["bare_completions"] <= after_claim["completion"]
        await http.post("/v1/claims/count-c1/release", json={"owner_scope": "count"})


async def _samples(http: httpx2.AsyncClient, family: str) -> dict[tuple[str, ...], float]:
    """One family of the gateway's ``/metrics``: each sample's label values -> its value."""
    from prometheus_client.parser import text_string_to_metric_families

    text = (await http.get("/metrics")).text
    return {
        tuple(s.labels.values()): s.value
        for f in text_string_to_metric_families(text)
        if f.name == family
        for s in f.samples
    }


async def test_the_prefix_hit_ratio_behind_vllm_is_what_vllm_served_from_its_cache(
    gateway: str,
) -> None:
    """``agentclaims_prefix_hit_ratio`` behind vLLM comes from vLLM's own answers (their
    ``cached_tokens``): the same prompt twice, the second served from the cache, moves it up
    from what it was, and ``/v1/stats`` has the token counts it is made of."""
    async with httpx2.AsyncClient(base_url=gateway, timeout=60) as http:

        async def ratio() -> float:
            [value] = (await _samples(http, "agentclaims_prefix_hit_ratio")).values()
            return value

        body = chat(words("hits", 40))
        first = (await http.post("/v1/chat/completions", json=body)).json()
        before = (await http.get("/v1/stats")).json()["requests"]
        low = await ratio()
        second = (await http.post("/v1/chat/completions", json=body)).json()
        after = (await http.get("/v1/stats")).json()["requests"]
        cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached > 0
        assert after["cached_tokens"] - before["cached_tokens"] == cached
        assert after["prompt_tokens"] - before["prompt_tokens"] == second["usage"]["prompt_tokens"]
        assert first["usage"]["prompt_tokens"] == second["usage"]["prompt_tokens"]
        assert 0 < after["cached_tokens"] / after["prompt_tokens"] == pytest.approx(await ratio())
        assert await ratio() > low


async def test_a_plain_call_is_answered_as_a_call_with_the_sdks_object_is(
    vllm_server: VllmServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One completion pipeline: a call with nothing but OpenAI's fields takes the writer's
    lean way (``CompletionForwarder.plain``), and so does the SDK's call whose
    ``agentclaims`` object carries nothing (no claim, no release) while the connector's pool
    figures are fresh (``LEAN_POOL_FRESH_S``); older, it goes the general way, with an
    envelope. The answers are, byte for byte but for the request's own names and the
    server's timing, the same: the lean SDK call's with the figures the last envelope
    brought and its events page, the plain call's without the pool's figures. The same
    gateway takes them in turn, its prefix cached by the calls before, so all see the same
    hits."""
    from agentclaims.gateway import completions
    from agentclaims.gateway.app import create_app
    from agentclaims.vllm.kv import VllmKV

    kv = VllmKV(vllm_server.url, vllm_server.key)
    lean = kv.plain
    taken: list[tuple[dict[str, Any], bool]] = []

    async def seen(kind: str, body: dict[str, Any], **names: Any) -> Any:
        reply = await lean(kind, body, **names)  # type: ignore[arg-type]
        taken.append((body, reply is not None))
        return reply

    kv.plain = seen  # type: ignore[method-assign]
    app = create_app(kv)
    body = {**chat(words("same", 60)), "max_tokens": 40}
    sdk = {**body, "agentclaims": {"session_id": "lean-s", "events_since": 0}}
    answers: dict[str, list[httpx2.Response]] = {"plain": [], "general": [], "sdk": []}
    try:
        transport = httpx2.ASGITransport(app=app)
        async with httpx2.AsyncClient(transport=transport, base_url="http://gw") as http:
            for _ in range(2):
                # figures that are never fresh enough: the SDK's call goes with an envelope
                monkeypatch.setattr(completions, "LEAN_POOL_FRESH_S", -1.0)
                answers["general"].append(await http.post("/v1/chat/completions", json=sdk))
                monkeypatch.setattr(completions, "LEAN_POOL_FRESH_S", 60.0)
                answers["sdk"].append(await http.post("/v1/chat/completions", json=sdk))
                answers["plain"].append(await http.post("/v1/chat/completions", json=body))
            # a call that carries a release is never asked for: it goes with an envelope
            releasing = {**sdk, "agentclaims": {**sdk["agentclaims"], "release": ["c-gone"]}}
            carried = await http.post("/v1/chat/completions", json=releasing)
            assert carried.status_code == 200, carried.text
            assert "pool" in carried.json()["agentclaims"]  # the connector's answer: new figures
        # the lean way was asked for all three, and took the SDK's call only when fresh
        assert taken == [(sdk, False), (sdk, True), (body, True)] * 2
    finally:
        await kv.aclose()

    def comparable(response: httpx2.Response) -> dict[str, Any]:
        assert response.status_code == 200, response.text
        out = response.json()
        ext = out["agentclaims"]
        assert ext["request_id"] == ext["outcome"]["request_id"] == out["id"]
        for names in (out, ext, ext["outcome"]):
            names.pop("id", None), names.pop("request_id", None)
        out.pop("created")
        return out

    general, lean_sdk, plain = (answers[k][1] for k in ("general", "sdk", "plain"))
    asked = comparable(general)
    assert asked["agentclaims"]["pool"]  # the SDK's object asks for the pool's figures
    assert asked["agentclaims"]["events"]["events"] == []  # and its session's events
    assert comparable(lean_sdk) == asked  # the figures the last envelope brought
    assert list(lean_sdk.json()["agentclaims"]) == list(general.json()["agentclaims"])
    asked["agentclaims"].pop("pool"), asked["agentclaims"].pop("events")
    assert comparable(plain) == asked
    order = [key for key in general.json()["agentclaims"] if key not in ("pool", "events")]
    assert list(plain.json()["agentclaims"]) == order  # its order
    assert plain.json()["agentclaims"]["outcome"]["hit_blocks"] > 0  # the prefix was cached
    assert plain.json()["agentclaims"]["prefix_ids"]["sequence"]
    heads = ("content-type", "x-agentclaims-instance", "server-timing")
    for lean_answer in (plain, lean_sdk):
        assert [lean_answer.headers.get(h) is not None for h in heads] == [True, True, True]
        assert lean_answer.headers["content-type"] == general.headers["content-type"]
    stats = app.state.gateway.stats()["gateway"]["calls"]
    assert stats["POST /v1/chat/completions"] == 7


async def test_what_the_lean_way_does_not_take_is_answered_as_always(gateway: str) -> None:
    """A call the lean way will not take (a body over the limit, a malformed field, a
    stream) is answered the general way, and a body read in several pieces
    goes on to vLLM whole: vLLM's own refusal of a prompt past its context comes back as the
    client's 400."""
    async with httpx2.AsyncClient(base_url=gateway, timeout=60) as http:
        too_large = {**chat("x"), "messages": [{"role": "user", "content": "y" * (9 << 20)}]}
        r = await http.post("/v1/chat/completions", json=too_large)
        assert r.status_code == 413, r.text
        r = await http.post("/v1/chat/completions", json={**chat("bad stream"), "stream": "yes"})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["field"] == "stream", r.text
        r = await http.post("/v1/chat/completions", content=b"{not json")
        assert r.status_code == 400, r.text
        events = await _sse(http, "/v1/chat/completions", {**chat("a stream"), "stream": True})
        assert events[-1] == "[DONE]"
        assert "agentclaims" in events[-2], events[-2:]
        long = {**chat(words("long", 30_000))}  # about 300 kB: read in pieces, past 2048 tokens
        r = await http.post("/v1/chat/completions", json=long)
        assert r.status_code == 400, r.text
        assert "vLLM refused the request" in r.json()["error"]["message"]
        assert (await http.post("/v1/chat/completions", json=chat("after"))).status_code == 200


def test_a_gateway_stopped_after_traffic_closes_its_clients(vllm_server: VllmServer) -> None:
    """SIGTERM after proxied calls, with KV events on: the gateway closes its connections to
    vLLM and its event reader before it exits, so nothing is left for aiohttp to complain
    about ("Unclosed client session", "Unclosed connector")."""
    proc, url = start_gateway(
        "--kv", "vllm", "--upstream", vllm_server.url, "--claims-key", vllm_server.key,
        "--kv-events", vllm_server.events,
    )  # fmt: skip
    try:
        with httpx2.Client(base_url=url, timeout=60) as http:
            claim = {"claim_id": "close-1", "object_id": "@prompt", "protection_mode": "demotable"}
            for body in (
                chat(words("close", 20)),
                chat(words("close", 24), owner_scope="wf-close", claims=[claim]),
            ):
                assert http.post("/v1/chat/completions", json=body).status_code == 200
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        stop(proc)
    text = err.decode()
    assert proc.returncode == 0, text
    assert "stopped" in text
    assert "Unclosed" not in text, text


def test_an_app_served_by_the_users_own_server_closes_its_vllm_side_when_it_stops(
    vllm_server: VllmServer,
) -> None:
    """``create_app(VllmKV(...))`` run by the user's own ASGI server (Starlette's
    ``TestClient`` runs the app's lifespan as uvicorn does), not by ``agentclaims serve``:
    after traffic, the app's stop closes the KV side's connections to vLLM, so nothing is
    left for aiohttp to warn of when the objects go."""
    from starlette.testclient import TestClient

    from agentclaims.gateway import create_app
    from agentclaims.vllm.kv import VllmKV

    kv = VllmKV(vllm_server.url, vllm_server.key)
    app = create_app(kv)
    with TestClient(app) as http:
        for n in (20, 24):
            r = http.post("/v1/chat/completions", json=chat(words("embedded", n)))
            assert r.status_code == 200, r.text
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del app, kv, http
        gc.collect()
    unclosed = [str(w.message) for w in caught if "Unclosed" in str(w.message)]
    assert not unclosed, unclosed


def test_the_openai_clients_streaming_idioms_work_through_the_gateway(gateway: str) -> None:
    """The real ``openai`` client, sync and async, iterating a streamed chat through the
    gateway on vLLM as it does against vLLM: ``chunk.choices[0]`` on every chunk without
    usage, and with ``include_usage`` the usage on the last chunk; the ``agentclaims`` object
    on the last chunk either way."""
    import asyncio

    import openai

    kwargs: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": words("idiom", 30)}],
        "max_tokens": 6,
        "stream": True,
    }
    with openai.OpenAI(base_url=f"{gateway}/v1", api_key="k") as client:
        chunks = list(client.chat.completions.create(**kwargs))
        text = "".join(c.choices[0].delta.content or "" for c in chunks)  # never IndexError
        assert text
        assert chunks[-1].choices[0].finish_reason == "length"
        assert chunks[-1].model_extra["agentclaims"]["outcome"]["action"].startswith("serve")
        with_usage = list(
            client.chat.completions.create(**kwargs, stream_options={"include_usage": True})
        )
        assert with_usage[-1].usage is not None
        assert with_usage[-1].usage.completion_tokens == 6
        assert all(c.choices for c in with_usage[:-1])

    async def stream_async() -> str:
        async with openai.AsyncOpenAI(base_url=f"{gateway}/v1", api_key="k") as client:
            out = ""
            async for chunk in await client.chat.completions.create(**kwargs):
                out += chunk.choices[0].delta.content or ""
            return out

    assert asyncio.run(stream_async())


def test_langchains_chat_model_streams_through_the_gateway(gateway: str) -> None:
    """LangChain's ``ChatOpenAI`` streaming through the gateway on vLLM, as against vLLM:
    every chunk a message chunk, the text joined, the usage on the stream with
    ``stream_usage=True``."""
    from langchain_openai import ChatOpenAI

    model = ChatOpenAI(
        base_url=f"{gateway}/v1", api_key="k", model="m", max_tokens=6, stream_usage=True
    )
    chunks = list(model.stream(words("lc", 30)))
    assert chunks
    joined = chunks[0]
    for chunk in chunks[1:]:
        joined = joined + chunk
    assert isinstance(joined.content, str)
    assert joined.content
    assert joined.usage_metadata is not None
    assert joined.usage_metadata["output_tokens"] == 6


def test_openais_prompt_cache_key_becomes_a_claim_on_vllm(gateway: str) -> None:
    """The real ``openai`` client's ``prompt_cache_key`` through the gateway on vLLM: the
    connector holds the prompt ``expiring`` (its TTL capped by the connector's maximum, said
    as a condition), the key's next call lets the last claim go, and a bad retention is a 400
    naming the field."""
    import openai

    with openai.OpenAI(base_url=f"{gateway}/v1", api_key="k", max_retries=0) as client:
        first = client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": words("pck", 40)}],
            max_tokens=4,
            prompt_cache_key="vllm-user",
            prompt_cache_retention="24h",
        )
        report = first.model_extra["agentclaims"]["prompt_cache"]
        assert report["decision"] == "accepted", report
        assert report["ttl_s"] == 120  # a day, capped by the connector's --max-ttl-s here
        second = client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": words("pck", 40) + " and more"}],
            max_tokens=4,
            prompt_cache_key="vllm-user",
        )
        assert second.model_extra["agentclaims"]["prompt_cache"]["decision"] == "accepted"
        assert second.usage is not None
        assert second.usage.prompt_tokens_details is not None
        assert second.usage.prompt_tokens_details.cached_tokens > 0
        with pytest.raises(openai.BadRequestError) as bad:
            client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "hello"}],
                max_tokens=4,
                extra_body={"prompt_cache_key": "k", "prompt_cache_retention": "forever"},
            )
        assert isinstance(bad.value.body, dict)
        assert bad.value.body["field"] == "prompt_cache_retention"
    with httpx2.Client(base_url=gateway, timeout=30) as http:
        first_id = report["claim_id"]
        view = http.get(f"/v1/claims/{first_id}", params={"owner_scope": "vllm-user"}).json()
        assert view["state"] == "expired"  # let go with the key's next call


async def test_pool_gauges_and_claims_by_mode_come_from_the_connector(gateway: str) -> None:
    """Behind vLLM, ``agentclaims_pool_blocks`` and ``agentclaims_claims{mode,state}`` are what
    the connector's answers say: a hard claim held on vLLM shows as claimed blocks and as a
    ``hard_protected`` claim, and no longer counts as held once released."""
    async with httpx2.AsyncClient(base_url=gateway, timeout=60) as http:

        async def families() -> dict[str, dict[tuple[str, ...], float]]:
            names = ("agentclaims_pool_blocks", "agentclaims_claims")
            return {name: await _samples(http, name) for name in names}

        claim = {"claim_id": "gauge-1", "object_id": "@prompt", "protection_mode": "hard_protected"}
        body = chat(words("gauge", 40), owner_scope="wf-gauge", claims=[claim])
        answer = (await http.post("/v1/chat/completions", json=body)).json()
        assert answer["agentclaims"]["decisions"][0]["decision"] == "accepted"
        held = await families()
        pool = held["agentclaims_pool_blocks"]
        assert pool[("usable_blocks",)] > 0
        assert pool[("hard_cap_blocks",)] > 0
        assert pool[("claimed_blocks",)] >= 1
        live = {k: v for k, v in held["agentclaims_claims"].items() if k[0] == "hard_protected"}
        assert sum(v for k, v in live.items() if k[1] in ("accepted", "materialized")) >= 1
        await http.post("/v1/claims/gauge-1/release", json={"owner_scope": "wf-gauge"})
        after = await families()
        assert after["agentclaims_pool_blocks"][("claimed_blocks",)] < pool[("claimed_blocks",)]


def test_anthropic_messages_and_their_cache_breakpoints_on_vllm(gateway: str) -> None:
    """The real ``anthropic`` client on ``/v1/messages`` through the gateway on vLLM, streamed
    and not: its breakpoints become one ``expiring`` claim the connector holds (TTL capped by
    its maximum), the next turn reads the prompt from vLLM's cache and refreshes the claim,
    and a bad ``ttl`` is a 400 in the Messages API's shape."""
    import anthropic

    system = [{"type": "text", "text": words("anth", 16), "cache_control": {"type": "ephemeral"}}]
    turn = {
        "role": "user",
        "content": [
            {
                "type": "text",
                "text": words("diff", 8),
                "cache_control": {"type": "ephemeral", "ttl": "1h"},
            }
        ],
    }
    with anthropic.Anthropic(base_url=gateway, api_key="k", max_retries=0) as client:
        first = client.messages.create(model="m", max_tokens=4, system=system, messages=[turn])
        report = first.model_extra["agentclaims"]["cache_control"]
        assert {r["decision"] for r in report} <= {"accepted", "conditionally_accepted"}, report
        assert report[-1]["ttl_s"] == 120  # an hour, capped by the connector's --max-ttl-s
        assert first.usage.cache_creation_input_tokens > 0
        history = [
            turn,
            {"role": "assistant", "content": first.content[0].text or "ok"},
            {
                "role": "user",
                "content": [
                    {
                        "type": "text",
                        "text": "and the next one",
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
            },
        ]
        with client.messages.stream(
            model="m", max_tokens=4, system=system, messages=history
        ) as stream:
            text = "".join(stream.text_stream)
            second = stream.get_final_message()
        assert text == "".join(b.text for b in second.content if b.type == "text")
        assert second.usage.cache_read_input_tokens > 0
        with pytest.raises(anthropic.BadRequestError) as bad:
            client.messages.create(
                model="m",
                max_tokens=4,
                messages=[turn],
                cache_control={"type": "ephemeral", "ttl": "forever"},
            )
        assert bad.value.body["error"]["type"] == "invalid_request_error"
    with httpx2.Client(base_url=gateway, timeout=30) as http:
        view = http.get(
            f"/v1/claims/{report[-1]['claim_id']}", params={"owner_scope": "anthropic-cache"}
        ).json()
        assert view["state"] == "expired"  # refreshed: the next turn's claim holds it now


def test_openai_responses_api_through_the_gateway_on_vllm(gateway: str) -> None:
    """The real ``openai`` client's Responses API, streamed and not, on
    vLLM through the gateway: vLLM's text and usage (its prefix cache's hits too), and a
    ``prompt_cache_key`` held as a claim by the connector."""
    import openai

    prompt = words("resp", 40)
    with openai.OpenAI(base_url=f"{gateway}/v1", api_key="k", max_retries=0) as client:
        first = client.responses.create(
            model="m", input=prompt, max_output_tokens=4, prompt_cache_key="resp-user"
        )
        assert first.status in ("completed", "incomplete")
        assert first.output_text
        assert first.model_extra["agentclaims"]["prompt_cache"]["decision"] == "accepted"
        with client.responses.stream(
            model="m", input=prompt + " again", max_output_tokens=4, prompt_cache_key="resp-user"
        ) as stream:
            events = list(stream)
        # 4 tokens end it ``incomplete`` (max_output_tokens), as OpenAI ends such a stream
        assert events[-1].type in ("response.completed", "response.incomplete")
        final = events[-1].response
        deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
        assert "".join(deltas) == final.output_text
        assert final.usage is not None
        assert final.usage.input_tokens_details.cached_tokens > 0


SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the notes.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["query", "limit"],
        },
    },
}


def test_the_tiny_model_calls_tools_through_vllms_own_parser(gateway: str) -> None:
    """The tiny model follows its chat template's script (``agentclaims_vllm.script``): offered
    tools after a user's turn, vLLM's hermes parser returns a real OpenAI tool call (each
    required argument filled by its type), whole and streamed; after the tool's turn it answers
    with the result; offered none, it writes its own tokens as before."""
    import json

    from openai import OpenAI

    client = OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    messages: list[dict[str, Any]] = [{"role": "user", "content": words("tools", 20)}]
    reply = client.chat.completions.create(
        model=model, messages=messages, tools=[SEARCH_TOOL], max_tokens=64, temperature=0
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls or []
    assert call.function.name == "search"
    assert json.loads(call.function.arguments) == {"query": "x", "limit": 1}
    streamed = client.chat.completions.create(
        model=model,
        messages=messages,
        tools=[SEARCH_TOOL],
        max_tokens=64,
        temperature=0,
        stream=True,
    )
    deltas = [d for c in streamed if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert deltas[0].function is not None
    assert deltas[0].function.name == "search"
    arguments = "".join(d.function.arguments or "" for d in deltas if d.function is not None)
    assert json.loads(arguments) == {"query": "x", "limit": 1}
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "forty-two notes"},
    ]
    answer = client.chat.completions.create(
        model=model, messages=messages, tools=[SEARCH_TOOL], max_tokens=64, temperature=0
    )
    assert answer.choices[0].finish_reason == "stop"
    assert answer.choices[0].message.content == "result: forty-two notes"
    plain = client.chat.completions.create(
        model=model,
        messages=messages[:1],
        max_tokens=6,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert plain.choices[0].finish_reason == "length"
    assert not plain.choices[0].message.tool_calls
    assert plain.usage is not None
    assert plain.usage.completion_tokens == 6


async def test_a_create_agent_agent_holds_its_claim_across_a_real_tool_call_on_vllm(
    gateway: str, tmp_path: Any
) -> None:
    """LangChain's ``create_agent`` with ``ClaimsMiddleware`` through the gateway on the real
    vLLM: the model asks for the tool (vLLM's parser, the tiny model's script), the tool runs
    while the claim planned for the call before it holds the conversation's prefix in vLLM's
    pool (accepted and materialized by the connector), and the call after the tool finds that
    prefix in vLLM's cache and answers with the tool's result. That answer calls no tool, so
    the claim its call carried ends with it (``release_when_done``): the run's end sends the
    gateway nothing (claims held whatever the pool's churn, ``ALWAYS_HELD``)."""
    import json

    from langchain.agents import create_agent
    from langchain_core.messages import HumanMessage
    from langchain_core.tools import tool

    import agentclaims

    ran: list[tuple[str, int]] = []

    @tool
    async def search(query: str, limit: int) -> str:
        """Search the notes."""
        ran.append((query, limit))
        await asyncio.sleep(0.2)  # while it runs, the claim holds the prefix
        return "notes on " + words("kv", 8)

    backend = agentclaims.HTTPBackend(gateway, timeout_s=120)
    served = await agentclaims.openai_client(backend).models.list()
    model = agentclaims.chat_model(backend, model=served.data[0].id, max_tokens=80)  # of 256
    claims = agentclaims.ClaimsMiddleware(backend, log_dir=tmp_path, planner=ALWAYS_HELD)
    agent = create_agent(model, [search], system_prompt=words("system", 16), middleware=[claims])
    async with httpx2.AsyncClient(base_url=gateway, timeout=30) as http:
        calls = (await http.get("/v1/stats")).json()["gateway"]["calls"]
        result = await agent.ainvoke({"messages": [HumanMessage(words("ask", 6))]})
        await backend.aclose()
        after = (await http.get("/v1/stats")).json()["gateway"]["calls"]
    assert ran == [("x", 1)]
    assert str(result["messages"][-1].content).startswith("result: notes on kv0 kv1")
    session = claims.last_session
    assert session is not None
    assert (session.stats.llm_calls, session.stats.tool_calls) == (2, 1)
    assert session.stats.cached_tokens > 0  # the call after the tool reused the held prefix
    lines = [
        json.loads(x) for x in (tmp_path / f"{session.workflow_id}.jsonl").read_text().splitlines()
    ]
    at = next(i for i, d in enumerate(lines) if d["event"] == "tool_call")
    held = lines[at]["claim_ids"]
    assert held, lines[at]  # the claims held across the tool, as the session saw them
    before = [(d["event"], d.get("claim_id")) for d in lines[:at]]
    for claim in held:
        assert ("resident_claim_materialized", claim) in before, before
        assert ("claim_ended", claim) not in before, before
    assert claims.open_sessions == 0
    # the answer calls no tool: the claim its call carried (``release_when_done``) was let go
    # as vLLM's answer came back, so the run's end sent nothing of its own to the gateway
    ends = [(d["reason"], d["state"]) for d in lines if d["event"] == "claim_ended"]
    assert ends[-1] == ("session_end", "expired"), ends
    sent = {k: n - calls.get(k, 0) for k, n in after.items() if n != calls.get(k, 0)}
    assert sent.pop("POST /v1/chat/completions") == 2, sent
    # nor an event read: this process's first session on a gateway that earlier tests kept
    # busy starts reading at the descriptor's ``events_seq``, not at 0
    assert not [k for k in sent if "/v1/claims" in k or "release" in k or "/events" in k], sent


def test_chat_anthropic_agent_with_prompt_caching_calls_its_tool_on_vllm(gateway: str) -> None:
    """An unmodified LangChain agent on the Anthropic wire (``ChatAnthropic``, LangChain's
    ``AnthropicPromptCachingMiddleware``) through the gateway on the real vLLM: the model's
    tool call comes back as a ``tool_use`` block, the tool runs, its result goes back as a
    ``tool_result``, and the call after it reads the cached prompt its breakpoint claimed."""
    from langchain.agents import create_agent
    from langchain_anthropic import ChatAnthropic
    from langchain_anthropic.middleware import AnthropicPromptCachingMiddleware
    from langchain_core.tools import tool

    ran: list[str] = []

    @tool
    def lookup(topic: str) -> str:
        """Look the topic up."""
        ran.append(topic)
        return "three notes"

    model = ChatAnthropic(base_url=gateway, api_key="k", model="m", max_tokens=64, max_retries=0)
    agent = create_agent(
        model,
        tools=[lookup],
        system_prompt=words("review", 16),
        middleware=[AnthropicPromptCachingMiddleware(ttl="5m", min_messages_to_cache=0)],
    )
    result = agent.invoke({"messages": [{"role": "user", "content": words("pr", 6)}]})
    assert ran == ["x"]
    call, answer = result["messages"][1], result["messages"][-1]
    assert [c["name"] for c in call.tool_calls] == ["lookup"]
    assert answer.content == "result: three notes"
    report = call.response_metadata["agentclaims"]["cache_control"]
    assert {r["decision"] for r in report} <= {"accepted", "conditionally_accepted"}, report
    assert answer.usage_metadata["input_token_details"]["cache_read"] > 0


async def test_chat_openai_on_the_responses_api_calls_its_tool_on_vllm(gateway: str) -> None:
    """LangChain's ``ChatOpenAI(use_responses_api=True)`` in a ``create_agent`` agent, and the
    async ``openai`` client's Responses API, unmodified, through the gateway on the real vLLM:
    the model's tool call comes back as a ``function_call`` item, the tool runs, its output goes
    back as ``function_call_output``, and the answer quotes it."""
    import openai
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    ran: list[str] = []

    @tool
    def lookup(topic: str) -> str:
        """Look the topic up."""
        ran.append(topic)
        return "two notes"

    model = ChatOpenAI(
        base_url=f"{gateway}/v1",
        api_key="k",
        model="m",
        use_responses_api=True,
        max_tokens=64,
        max_retries=0,
    )
    agent = create_agent(model, tools=[lookup], system_prompt=words("resp", 12))
    result = await agent.ainvoke({"messages": [{"role": "user", "content": words("ask", 6)}]})
    assert ran == ["x"]
    assert [c["name"] for c in result["messages"][1].tool_calls] == ["lookup"]
    assert result["messages"][-1].text == "result: two notes"
    function = {
        "type": "function",
        "name": "lookup",
        "parameters": {
            "type": "object",
            "properties": {"topic": {"type": "string"}},
            "required": ["topic"],
        },
    }
    async with openai.AsyncOpenAI(base_url=f"{gateway}/v1", api_key="k", max_retries=0) as client:
        reply = await client.responses.create(
            model="m", input=words("ask", 6), tools=[function], max_output_tokens=64
        )
        [call] = [item for item in reply.output if item.type == "function_call"]
        assert (call.name, call.arguments) == ("lookup", '{"topic": "x"}')
