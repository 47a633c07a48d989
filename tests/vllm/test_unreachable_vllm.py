"""A gateway on the vLLM side whose vLLM cannot be reached (never started, or gone): every
call is answered 503 ``unavailable`` in words, as docs/vllm.md says, not a 500; the SDK
outside a session raises ``ServiceUnavailable``. Real ``agentclaims serve`` on loopback,
stopped by PID; no vLLM is needed (none listens on the upstream's port)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import httpx2
import pytest
from servers import free_port, stop

import agentclaims
from agentclaims.backends.http import HTTPBackend
from agentclaims.errors import ServiceUnavailable


def test_calls_to_a_gateway_whose_vllm_is_unreachable_are_503_unavailable() -> None:
    port, closed = free_port(), free_port()  # nothing listens on ``closed``
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "agentclaims.cli.main", "serve"),
            *("--host", "127.0.0.1", "--port", str(port), "--kv", "vllm"),
            *("--upstream", f"http://127.0.0.1:{closed}", "--claims-key", "k" * 32),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:  # up: /health answers (503: its engine is not there)
            assert proc.poll() is None
            try:
                httpx2.get(f"{url}/health", timeout=0.5)
                break
            except httpx2.TransportError:
                assert time.monotonic() < deadline, "the gateway did not come up"
                time.sleep(0.05)
        body = {"model": "m", "messages": [{"role": "user", "content": "hello there"}]}
        for _ in range(2):
            reply = httpx2.post(f"{url}/v1/chat/completions", json=body, timeout=30)
            assert reply.status_code == 503, reply.text
            error = reply.json()["error"]
            assert error["type"] == "unavailable"
            assert f"127.0.0.1:{closed}" in error["message"]
            assert "ConnectionKey(" not in error["message"]  # words, not aiohttp's repr

        async def sdk_call() -> None:
            async with HTTPBackend(url) as backend:
                client = agentclaims.openai_client(backend)
                await client.chat.completions.create(**body)

        with pytest.raises(ServiceUnavailable):
            asyncio.run(sdk_call())
    finally:
        stop(proc)
