"""A fleet of two real vLLM servers with the agentclaims connector, a gateway beside each
(`agentclaims serve --kv vllm --behind-router`), the real vllm-router in front: a session's
turns all reach the instance whose connector holds its claims, and a killed instance's claims
are reported lost and re-established on the survivor, and with four sessions on the fleet every
session on a killed instance reports its own. (Reroute on refusal is tested on the
reference engine behind the same router: tests/fleet; on vLLM the connector's cap keeps one
max-length request always admissible, so a refusal cannot be forced the same way.)"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from conftest import ALWAYS_HELD, VllmServer, serve_vllm
from servers import start_gateway, start_router, stop

import agentclaims
from agentclaims.backends.fleet import FleetBackend
from agentclaims.session import ClaimedSession

pytestmark = pytest.mark.vllm


class VllmFleet:
    def __init__(self) -> None:
        self.gateways: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
        self.router_url = ""
        self.servers: list[VllmServer] = []


@pytest.fixture(scope="module")
def fleet(
    vllm_server: VllmServer, tiny_model: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmFleet]:
    out = VllmFleet()
    router = None
    with serve_vllm(tiny_model, tmp_path_factory, "fleet-b") as second:
        out.servers = [vllm_server, second]
        try:
            for name, server in (("vA", vllm_server), ("vB", second)):
                out.gateways[name] = start_gateway(
                    *("--kv", "vllm", "--upstream", server.url, "--claims-key", server.key),
                    *("--instance-id", name, "--behind-router"),
                )
            router = start_router(*(url for _, url in out.gateways.values()))
            out.router_url = router[1]
            yield out
        finally:
            if router is not None:
                stop(router[0], group=True)
            for proc, _ in out.gateways.values():
                stop(proc)


def words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


async def turn(client: Any, messages: list[dict[str, Any]], text: str) -> None:
    messages.append({"role": "user", "content": text})
    reply = await client.chat.completions.create(
        model="m", messages=messages, max_tokens=4, temperature=0
    )
    messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})


async def test_a_fleet_session_keeps_affinity_then_fails_over_on_vllm(
    fleet: VllmFleet, tmp_path: Path
) -> None:
    async with FleetBackend(fleet.router_url) as backend:
        client = agentclaims.openai_client(backend)
        async with ClaimedSession(backend, planner=ALWAYS_HELD, log_dir=tmp_path) as session:
            messages = [{"role": "system", "content": words("sys", 12)}]
            with session.node("agent"):
                for i in range(3):
                    await turn(client, messages, words(f"t{i}w", 3))
                    async with session.tool_call("pytest"):
                        pass
                await session.settle()
                home = session.backend.instance
                assert home in fleet.gateways
                held = [h.claim_id for h in session.io.held.values()]
                assert held, "the planner held the agent's prefix on vLLM"
                url = fleet.gateways[home][1]
                for claim_id in held:  # held by that instance's connector
                    view = httpx2.get(
                        f"{url}/v1/claims/{claim_id}",
                        params={"owner_scope": session.owner_scope},
                        timeout=30,
                    ).json()
                    assert view["state"] == "materialized", view
                proc, _ = fleet.gateways[home]
                os.kill(proc.pid, signal.SIGKILL)  # the instance dies
                proc.wait(timeout=10)
                await turn(client, messages, words("after", 3))
                async with session.tool_call("pytest"):
                    pass
                await turn(client, messages, words("again", 3))
                await session.settle()
            story = (tmp_path / f"{session.workflow_id}.jsonl").read_text()[-6000:]
            survivor = session.backend.instance
            assert survivor is not None, story
            assert survivor != home, story
            lost = {h.claim_id for h in session.ended_claims if h.end_reason == "instance_lost"}
            assert lost == set(held), story
            again = [h.claim_id for h in session.io.held.values()]
            assert again, story  # re-established on the survivor's connector
        lines = [json.loads(x) for x in (tmp_path / f"{session.workflow_id}.jsonl").open()]
        [failover] = [x for x in lines if x["event"] == "reaction_failover"]
        assert failover["from_instance"] == home
        assert set(failover["lost_claims"]) == set(held)
        await client.close()


async def test_every_session_on_a_killed_vllm_instance_reports_its_own_claims_lost(
    fleet: VllmFleet, tmp_path: Path
) -> None:
    """Four sessions share one FleetBackend through the real router on the two real vLLM
    servers (fresh gateways in front of them); the gateway serving the most of them is killed
    with kill -9 while every session waits in a tool. Each of its sessions ends every claim it
    held there ``instance_lost`` and names exactly those in its own ``reaction_failover``; the
    survivor's sessions lose nothing."""
    n = 4
    gateways = {
        name: start_gateway(
            *("--kv", "vllm", "--upstream", server.url, "--claims-key", server.key),
            *("--instance-id", name, "--behind-router"),
        )
        for name, server in zip(("wA", "wB"), fleet.servers, strict=True)
    }
    router = start_router(*(url for _, url in gateways.values()))
    placed: dict[int, tuple[str, set[str]]] = {}
    ended: dict[int, tuple[set[str], str]] = {}
    all_placed, killed = asyncio.Event(), asyncio.Event()
    try:
        async with FleetBackend(router[1]) as backend:
            client = agentclaims.openai_client(backend)

            async def agent(i: int) -> None:
                messages = [{"role": "system", "content": words(f"a{i}s", 12)}]
                workflow = f"vmulti-{i}"
                async with ClaimedSession(
                    backend, planner=ALWAYS_HELD, log_dir=tmp_path, workflow_id=workflow
                ) as s:
                    with s.node("agent"):
                        for k in range(2):
                            await turn(client, messages, words(f"a{i}t{k}w", 3))
                            async with s.tool_call("pytest"):
                                pass
                        await s.settle()
                        held = {h.claim_id for h in s.io.held.values()}
                        assert held, "the planner held the agent's prefix on vLLM"
                        assert s.backend.instance is not None
                        placed[i] = (s.backend.instance, held)
                        if len(placed) == n:
                            all_placed.set()
                        async with s.tool_call("pytest"):
                            await killed.wait()  # the crash comes while every agent waits
                        await turn(client, messages, words(f"a{i}after", 3))
                        await s.settle()
                lost = {h.claim_id for h in s.ended_claims if h.end_reason == "instance_lost"}
                ended[i] = (lost, workflow)

            async def crash() -> str:
                await asyncio.wait_for(all_placed.wait(), 180)
                homes = [placed[i][0] for i in range(n)]
                dead = max(sorted(set(homes)), key=homes.count)
                proc, _ = gateways[dead]
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
                killed.set()
                return dead

            *_, dead = await asyncio.wait_for(
                asyncio.gather(*(agent(i) for i in range(n)), crash()), 300
            )
            await client.close()
    finally:
        stop(router[0], group=True)
        for proc, _ in gateways.values():
            stop(proc)
    on_dead = [i for i in range(n) if placed[i][0] == dead]
    assert len(on_dead) >= 2  # four sessions over two instances
    for i in range(n):
        home, before = placed[i]
        lost, workflow = ended[i]
        lines = [json.loads(x) for x in (tmp_path / f"{workflow}.jsonl").open()]
        failovers = [x for x in lines if x["event"] == "reaction_failover"]
        if home == dead:
            assert lost == before, (i, lost, before)
            assert len(failovers) == 1, (i, failovers)
            assert set(failovers[0]["lost_claims"]) == before, (i, failovers[0])
            assert failovers[0]["from_instance"] == dead
        else:
            assert not lost, (i, lost)
            assert not failovers, (i, failovers)
