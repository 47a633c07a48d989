"""Failover loses nothing silently, as a property (hypothesis) over interleavings: any number
of sessions sharing one FleetBackend on the real reference-engine fleet behind the real
vllm-router, each some turns in when an instance is killed with kill -9, waiting in a tool or
between turns, noticing the loss in any order. Every claim of every session on the dead
instance ends ``instance_lost``, each of those sessions names exactly its own in its one
``reaction_failover``, and the survivor's sessions lose nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from fleetkit import log_lines, running_fleet, turn, two_claimed_turns
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agentclaims
from agentclaims.backends.fleet import FleetBackend
from agentclaims.session import ClaimedSession

pytestmark = pytest.mark.slow

agent_plans = st.lists(
    st.fixed_dictionaries(
        {
            "rounds": st.integers(1, 2),  # claimed turn pairs before the crash
            "in_tool": st.booleans(),  # waiting inside a tool when the instance dies
            "late_s": st.sampled_from([0.0, 0.02, 0.1]),  # when it notices, after the crash
            "after": st.integers(1, 2),  # turns after the crash
        }
    ),
    min_size=2,
    max_size=5,
)


async def _run(plans: list[dict[str, Any]], kill_busiest: bool, logs: Path) -> None:
    n = len(plans)
    placed: dict[int, tuple[str, set[str]]] = {}
    ended: dict[int, tuple[set[str], str]] = {}
    all_placed, killed = asyncio.Event(), asyncio.Event()
    with running_fleet() as fleet:
        async with FleetBackend(fleet.router_url) as backend:
            client = agentclaims.openai_client(backend)

            async def agent(i: int, plan: dict[str, Any]) -> None:
                chat = [{"role": "system", "content": f"agent {i} " + "be brief " * 10}]
                workflow = f"prop-{i}"
                async with ClaimedSession(backend, log_dir=logs, workflow_id=workflow) as s:
                    with s.node("agent"):
                        for _ in range(plan["rounds"]):
                            home, held = await two_claimed_turns(client, s, chat)
                        placed[i] = (home, set(held))
                        if len(placed) == n:
                            all_placed.set()
                        if plan["in_tool"]:
                            async with s.tool_call("pytest"):
                                await killed.wait()
                        else:
                            await killed.wait()
                        await asyncio.sleep(plan["late_s"])
                        for k in range(plan["after"]):
                            await turn(client, chat, f"turn {k} after the crash")
                        await s.settle()
                lost = {h.claim_id for h in s.ended_claims if h.end_reason == "instance_lost"}
                ended[i] = (lost, workflow)

            async def crash() -> str:
                await asyncio.wait_for(all_placed.wait(), 60)
                homes = [placed[i][0] for i in range(n)]
                counts = {name: homes.count(name) for name in fleet.gateways}
                pick = max if kill_busiest else min
                dead = pick(sorted(counts), key=lambda name: counts[name])
                fleet.kill(dead)
                killed.set()
                return dead

            *_, dead = await asyncio.wait_for(
                asyncio.gather(*(agent(i, p) for i, p in enumerate(plans)), crash()), 120
            )
            await client.close()
    for i in range(n):
        home, before = placed[i]
        lost, workflow = ended[i]
        lines = log_lines(logs / f"{workflow}.jsonl")
        failovers = [line for line in lines if line["event"] == "reaction_failover"]
        if home == dead:
            assert lost == before, (i, lost, before)
            assert len(failovers) == 1, (i, failovers)
            assert set(failovers[0]["lost_claims"]) == before, (i, failovers[0], before)
            assert failovers[0]["from_instance"] == dead
        else:
            assert not lost, (i, lost)
            assert not failovers, (i, failovers)


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(plans=agent_plans, kill_busiest=st.booleans())
def test_any_interleaving_of_sessions_and_a_crash_loses_no_claim_silently(
    plans: list[dict[str, Any]], kill_busiest: bool, tmp_path_factory: pytest.TempPathFactory
) -> None:
    asyncio.run(_run(plans, kill_busiest, tmp_path_factory.mktemp("failover")))
