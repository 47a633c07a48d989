"""The reference-engine fleet of the fleet tests: two `agentclaims serve` gateways (real
processes on loopback) behind the real vllm-router, and the turns the tests take through it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
from servers import start_gateway, start_router, stop

from agentclaims.session import ClaimedSession

BLOCKS, BS = 64, 4


class Fleet:
    def __init__(self) -> None:
        self.gateways: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
        self.router: tuple[subprocess.Popen[bytes], str] | None = None

    @property
    def router_url(self) -> str:
        assert self.router is not None
        return self.router[1]

    def url(self, instance: str) -> str:
        return self.gateways[instance][1]

    def calls(self, instance: str) -> int:
        stats = httpx2.get(f"{self.url(instance)}/v1/stats", timeout=10).json()
        return int(stats["gateway"]["calls"].get("POST /v1/chat/completions", 0))

    def kill(self, instance: str) -> None:
        proc, _ = self.gateways[instance]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@contextlib.contextmanager
def running_fleet() -> Iterator[Fleet]:
    """Two gateways (instances ``A`` and ``B``) and the router, started, and stopped by PID
    at the end."""
    out = Fleet()
    try:
        for name in ("A", "B"):
            out.gateways[name] = start_gateway(
                "--blocks", str(BLOCKS), "--block-size", str(BS), "--instance-id", name
            )
        out.router = start_router(*(url for _, url in out.gateways.values()))
        yield out
    finally:
        if out.router is not None:
            stop(out.router[0], group=True)
        for proc, _ in out.gateways.values():
            stop(proc)


async def turn(client: Any, messages: list[dict[str, Any]], text: str) -> str:
    messages.append({"role": "user", "content": text})
    reply = await client.chat.completions.create(model="scripted", messages=messages)
    content = reply.choices[0].message.content or ""
    messages.append({"role": "assistant", "content": content})
    return content


async def two_claimed_turns(
    client: Any, session: ClaimedSession, messages: list[dict[str, Any]]
) -> tuple[str, list[str]]:
    """Two turns with a tool call between, settled: the instance that served them and the
    claims the session holds there (at least one)."""
    await turn(client, messages, "first turn")
    async with session.tool_call("pytest"):
        pass
    await turn(client, messages, "second turn")
    await session.settle()
    first = session.backend.instance
    held = [h.claim_id for h in session.io.held.values()]
    assert first is not None
    assert held
    return first, held


def log_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]
