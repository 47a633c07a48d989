"""A ``BackendPool`` member killed with ``kill -9`` while a session runs on it: the session
goes on on a member that answers, and the claims it held on the dead one end
``instance_lost``, named in one ``reaction_failover`` line, as behind a router (docs/fleet.md,
"Without a router"). Real gateways on loopback, the real OpenAI client, a real ``kill -9``."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from servers import start_gateway, stop

import agentclaims
from agentclaims.backends import HTTPBackend
from agentclaims.backends.pool import BackendPool
from agentclaims.errors import BackendUnavailable
from agentclaims.session import ClaimedSession

PROMPT = [{"role": "system", "content": "you research " * 40}]


def _kill9(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_a_member_killed_mid_session_is_failed_over_its_claims_reported_lost(
    tmp_path: Path,
) -> None:
    procs = dict(zip("ab", (start_gateway("--blocks", "256") for _ in "ab"), strict=True))
    pool = BackendPool([HTTPBackend(url, name=name) for name, (_, url) in procs.items()])
    try:
        client = agentclaims.openai_client(pool.backends[0])
        async with ClaimedSession(pool, workflow_id="wf-kill", log_dir=tmp_path) as session:
            first = session.backend.name
            for turn in range(2):  # the second call carries the claim held across the tool
                await client.chat.completions.create(
                    model="m", messages=[*PROMPT, {"role": "user", "content": f"find {turn}"}]
                )
                async with session.tool_call("search"):
                    await asyncio.sleep(0.01)
            held = {h.claim_id for h in session.io.held.values() if h.backend == first}
            async with session.tool_call("search"):
                _kill9(procs[first][0])
            answer = await client.chat.completions.create(
                model="m", messages=[*PROMPT, {"role": "user", "content": "go on"}]
            )
            assert answer.choices[0].message.content
            assert session.backend.name != first
        lines = _lines(tmp_path / "wf-kill.jsonl")
        [failover] = [line for line in lines if line["event"] == "reaction_failover"]
        assert failover["from_instance"] == first
        assert failover["to_backend"] == session.backend.name
        assert held  # the claim held across the tool
        assert set(failover["lost_claims"]) >= held  # type: ignore[arg-type]
        ended = {
            line["claim_id"]: line["reason"] for line in lines if line["event"] == "claim_ended"
        }
        assert all(ended.get(cid) == "instance_lost" for cid in held), ended
        calls = [line["backend"] for line in lines if line["event"] == "llm_call"]
        assert calls == [first, first, session.backend.name]
        assert session.stats.reroutes == 1
        assert lines[-1]["event"] == "session_ended"
    finally:
        await pool.aclose()
        for proc, _ in procs.values():
            stop(proc)


async def test_with_every_member_killed_the_session_ends_unavailable(tmp_path: Path) -> None:
    """No member answers: the failover finds none and the call raises
    ``BackendUnavailable`` at once, not a hang."""
    procs = [start_gateway("--blocks", "64") for _ in range(2)]
    pool = BackendPool([HTTPBackend(url, name=f"m{i}") for i, (_, url) in enumerate(procs)])
    try:
        client = agentclaims.openai_client(pool.backends[0])
        async with ClaimedSession(pool, workflow_id="wf-all", log_dir=tmp_path):
            for proc, _ in procs:
                _kill9(proc)
            with pytest.raises(BackendUnavailable):
                await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "anyone?"}]
                )
        events = [line["event"] for line in _lines(tmp_path / "wf-all.jsonl")]
        assert "reaction_failover" not in events
        assert events[-1] == "session_ended"
    finally:
        await pool.aclose()
        for proc, _ in procs:
            stop(proc)
