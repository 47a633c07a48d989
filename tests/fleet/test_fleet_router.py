"""Claims across a fleet behind the real vllm-router: two `agentclaims serve` gateways on the
reference engine (real processes on loopback), the router in front (`sticky_least_loaded`), the
SDK's FleetBackend as one backend. Affinity, reroute on refusal, failover after a real kill -9,
and refusals that never trip the router's circuit breaker."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from fleetkit import Fleet, log_lines, running_fleet, turn, two_claimed_turns

import agentclaims
from agentclaims.backends.fleet import FleetBackend
from agentclaims.session import ClaimedSession


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    """The fleet, started for the test and stopped by PID after it."""
    with running_fleet() as out:
        yield out


def fill(url: str, tag: str) -> None:
    """Hard-claim prompts straight on one gateway (not through the router) until its arbiter
    refuses a claim: no room is left there for anyone else."""
    with httpx2.Client(base_url=url, timeout=10) as http:
        for i in range(40):
            body = {
                "model": "m",
                "messages": [
                    {"role": "user", "content": " ".join(f"{tag}{i}w{j}" for j in range(30))}
                ],
                "agentclaims": {
                    "owner_scope": f"blocker-{tag}",
                    "claims": [
                        {
                            "claim_id": f"blocker-{tag}-{i}",
                            "object_id": "@prompt",
                            "protection_mode": "hard_protected",
                        }
                    ],
                },
            }
            r = http.post("/v1/chat/completions", json=body)
            if (
                r.status_code != 200
                or r.json()["agentclaims"]["decisions"][0]["decision"] != "accepted"
            ):
                return
    raise AssertionError(f"{url} never refused a claim")


async def test_a_sessions_turns_all_reach_the_instance_holding_its_claims(
    fleet: Fleet, tmp_path: Path
) -> None:
    """Two sessions, the second started while the first is still open (so the router counts
    the first's load whatever the timing): least loaded spreads them, and each session's four
    turns all reach the instance that holds its claims."""
    async with FleetBackend(fleet.router_url) as backend:
        client = agentclaims.openai_client(backend)

        async def four_turns(session: ClaimedSession, n: int) -> str:
            messages = [{"role": "system", "content": "be brief"}]
            with session.node("agent"):
                for i in range(4):
                    await turn(client, messages, f"session {n} turn {i} run the tests")
                    async with session.tool_call("pytest"):
                        pass
            routed = session.backend
            assert routed.instance in ("A", "B")
            assert session.stats.claims_accepted >= 1
            held = [h.claim_id for h in session.io.held.values()]
            assert held
            for claim_id in held:  # each claim lives on the session's instance
                view = httpx2.get(
                    f"{fleet.url(routed.instance)}/v1/claims/{claim_id}",
                    params={"owner_scope": session.owner_scope},
                )
                assert view.status_code == 200, view.text
            return routed.instance

        async with ClaimedSession(backend, log_dir=tmp_path) as first:
            home = await four_turns(first, 0)
            assert fleet.calls(home) == 4
            async with ClaimedSession(backend, log_dir=tmp_path) as second:
                other = await four_turns(second, 1)
        assert {home, other} == {"A", "B"}  # the second session went to the other instance
        assert fleet.calls("A") == fleet.calls("B") == 4
        await client.close()


async def test_a_refusal_is_rerouted_and_served_on_the_other_instance(
    fleet: Fleet, tmp_path: Path
) -> None:
    async with FleetBackend(fleet.router_url) as backend:
        client = agentclaims.openai_client(backend)
        async with ClaimedSession(backend, reaction="reroute", log_dir=tmp_path) as session:
            messages = [{"role": "system", "content": "be brief " * 10}]
            with session.node("agent"):
                await turn(client, messages, "first turn")
                async with session.tool_call("pytest"):
                    pass
                await turn(client, messages, "second turn")
                first = session.backend.instance
                assert first is not None
                await session.settle()  # the claim round trip runs in the background
                claimed_before = session.stats.claims_accepted
                assert claimed_before >= 1
                async with session.tool_call("pytest"):
                    fill(fleet.url(first), "x")  # another tenant's hard claims take every block
                await turn(client, messages, "third turn " * 8)
                async with session.tool_call("pytest"):
                    pass
                await turn(client, messages, "fourth turn")
                await session.settle()
            assert session.stats.reroutes >= 1
            assert session.backend.instance != first  # served on the other instance
            other = session.backend.instance
            assert session.stats.claims_accepted > claimed_before  # claimed again, there
            held = list(session.io.held.values())
        lines = log_lines(tmp_path / f"{session.workflow_id}.jsonl")
        reroutes = [line for line in lines if line["event"] == "reaction_reroute"]
        assert reroutes
        assert reroutes[0]["outcome"]["blocking_claim_ids"]
        [moved] = [line for line in lines if line["event"] == "llm_call" and line.get("after")]
        assert moved["after"] == "reroute"
        assert moved["instance"] == other
        assert moved["recomputed_tokens"] > 0  # the prefix computed once more, there
        # the claim was re-established on the new instance
        assert held
        assert all(
            httpx2.get(
                f"{fleet.url(other)}/v1/claims/{h.claim_id}",
                params={"owner_scope": session.owner_scope},
            ).status_code
            == 200
            for h in held
        )
        await client.close()


async def test_a_killed_instance_is_failed_over_its_claims_reported_lost(
    fleet: Fleet, tmp_path: Path
) -> None:
    async with FleetBackend(fleet.router_url) as backend:
        client = agentclaims.openai_client(backend)
        async with ClaimedSession(backend, log_dir=tmp_path) as session:
            messages = [{"role": "system", "content": "be brief " * 10}]
            with session.node("agent"):
                first, before = await two_claimed_turns(client, session, messages)
                fleet.kill(first)
                await turn(client, messages, "third turn after the crash")
                async with session.tool_call("pytest"):
                    pass
                await turn(client, messages, "fourth turn")
                await session.settle()
            survivor = session.backend.instance
            assert survivor is not None
            assert survivor != first
            lost = [h for h in session.ended_claims if h.end_reason == "instance_lost"]
            assert {h.claim_id for h in lost} == set(before)
            assert session.io.held  # claims re-established on the survivor
        lines = log_lines(tmp_path / f"{session.workflow_id}.jsonl")
        failovers = [line for line in lines if line["event"] == "reaction_failover"]
        assert failovers
        assert set(failovers[0]["lost_claims"]) == set(before)
        assert failovers[0]["from_instance"] == first
        ended = {
            line["claim_id"]: line["reason"] for line in lines if line["event"] == "claim_ended"
        }
        assert all(ended[c] == "instance_lost" for c in before)
        await client.close()


async def test_refusals_never_trip_the_routers_circuit_breaker(fleet: Fleet) -> None:
    """A dozen refusals on one instance: each is a 409 through the router (not retried, not
    counted), and another session bound to that instance keeps being served there."""
    async with httpx2.AsyncClient(base_url=fleet.router_url, timeout=20) as http:
        body = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
        r = await http.post("/v1/chat/completions", json=body, headers={"X-Session-ID": "keep"})
        home = r.json()["agentclaims"]["instance"]
        fill(fleet.url(home), "cb")
        big = {
            "model": "m",
            "messages": [{"role": "user", "content": " ".join(f"b{i}" for i in range(120))}],
        }
        for _ in range(12):
            r = await http.post(
                "/v1/chat/completions",
                json=big,
                headers={"X-Session-ID": "keep", "X-Agentclaims-Router-Safe": "1"},
            )
            assert r.status_code == 409, r.text
            assert r.json()["error"]["type"] in (
                "active_request_refused",
                "active_request_deferred",
            )
            assert r.json()["error"]["instance"] == home
        calls = fleet.calls(home)
        for _ in range(3):
            r = await http.post("/v1/chat/completions", json=body, headers={"X-Session-ID": "keep"})
            assert r.status_code == 200
            assert r.json()["agentclaims"]["instance"] == home
        assert fleet.calls(home) == calls + 3  # each reached that instance once: no retries


async def test_a_session_the_router_moves_by_itself_reports_its_claims_lost(
    fleet: Fleet, tmp_path: Path
) -> None:
    """The router's health check ejects a killed instance before the session's next call,
    and sends the same key to the survivor: the session sees the new instance in the answer
    and reports its claims on the dead one lost all the same."""
    import asyncio

    async with FleetBackend(fleet.router_url) as backend:
        client = agentclaims.openai_client(backend)
        async with ClaimedSession(backend, log_dir=tmp_path) as session:
            messages = [{"role": "system", "content": "be brief " * 10}]
            with session.node("agent"):
                first, before = await two_claimed_turns(client, session, messages)
                fleet.kill(first)
                await asyncio.sleep(3.0)  # health checks every 1 s, one failure ejects
                await turn(client, messages, "third turn, elsewhere")
                await session.settle()
            assert session.backend.instance not in (None, first)
        lines = log_lines(tmp_path / f"{session.workflow_id}.jsonl")
        [failover] = [line for line in lines if line["event"] == "reaction_failover"]
        assert failover["from_instance"] == first
        assert set(failover["lost_claims"]) == set(before)
        assert failover["to_instance"] == session.backend.instance  # moved by the router
        assert "moved" in failover["reason"]
        await client.close()


async def test_every_session_on_a_killed_instance_reports_its_own_claims_lost(
    fleet: Fleet, tmp_path: Path
) -> None:
    """Six sessions share one FleetBackend; the instance serving the most of them is killed
    with kill -9 while they wait in a tool. Each of its sessions, going on at once, ends every
    claim it had there ``instance_lost`` and names them in its own ``reaction_failover``: the
    first failover does not hide the others' claims. The survivor's sessions lose nothing."""
    n = 6
    placed: dict[int, tuple[str, list[str]]] = {}
    ended: dict[int, tuple[set[str], str]] = {}
    all_placed, killed = asyncio.Event(), asyncio.Event()
    async with FleetBackend(fleet.router_url) as backend:
        client = agentclaims.openai_client(backend)

        async def agent(i: int) -> None:
            chat = [{"role": "system", "content": f"agent {i} " + "be brief " * 10}]
            async with ClaimedSession(backend, log_dir=tmp_path, workflow_id=f"multi-{i}") as s:
                with s.node("agent"):
                    placed[i] = await two_claimed_turns(client, s, chat)
                    if len(placed) == n:
                        all_placed.set()
                    async with s.tool_call("pytest"):
                        await killed.wait()  # the crash happens while every agent is in a tool
                    await turn(client, chat, "a turn after the crash")
                    await s.settle()
            lost = {h.claim_id for h in s.ended_claims if h.end_reason == "instance_lost"}
            ended[i] = (lost, s.workflow_id)

        async def crash() -> str:
            await asyncio.wait_for(all_placed.wait(), 60)
            homes = [placed[i][0] for i in range(n)]
            dead = max(set(homes), key=homes.count)
            fleet.kill(dead)
            killed.set()
            return dead

        *_, dead = await asyncio.wait_for(
            asyncio.gather(*(agent(i) for i in range(n)), crash()), 120
        )
        await client.close()
    on_dead = [i for i in range(n) if placed[i][0] == dead]
    assert len(on_dead) >= 3  # six sessions over two instances
    for i in range(n):
        before = set(placed[i][1])
        lost, workflow = ended[i]
        lines = log_lines(tmp_path / f"{workflow}.jsonl")
        failovers = [line for line in lines if line["event"] == "reaction_failover"]
        if i in on_dead:
            assert lost == before, (i, lost, before)
            assert len(failovers) == 1, (i, failovers)
            assert set(failovers[0]["lost_claims"]) == before, (i, failovers[0])
            assert failovers[0]["from_instance"] == dead
        else:
            assert not lost, (i, lost)
            assert not failovers, (i, failovers)
