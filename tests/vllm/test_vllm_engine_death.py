"""Every x86 host, and a vLLM whose engine dies, on the real server.

- The ``agentclaims_amx`` plugin (vLLM's ``vllm.general_plugins``) runs in vLLM's processes and
  says what it did. On a CPU with AMX, vLLM's bf16 attention dies with SIGILL without it
  (``agentclaims vllm serve`` never says ready, exits 1 naming SIGILL) and serves with it. On
  a CPU without AMX it does nothing, and this module says so in the test run's output.
- A worker killed mid-run (SIGILL, as an illegal instruction would; SIGKILL, as the
  out-of-memory killer would): ``agentclaims vllm serve`` exits 1 naming the process and the
  signal, and the gateway answers 503 ``unavailable`` with them, after ending every live
  claim with its event (``resident_claim_harmed``, cause ``backend_restart``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
from conftest import VllmServer, serve_vllm
from servers import gateway_process

from agentclaims.backends import HTTPBackend
from agentclaims.protocol import collect_events
from agentclaims.vllm.supervise import descendants

pytestmark = pytest.mark.vllm


def _host_has_amx() -> bool:
    flags = next(
        (
            line
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("flags")
        ),
        "",
    )
    return "amx_tile" in flags.split()


def _say(capsys: pytest.CaptureFixture[str], line: str) -> None:
    """A line in the test run's own output (not captured)."""
    with capsys.disabled():
        print(f"\n{line}")


def test_the_amx_plugin_ran_in_vllm_and_said_what_it_did(
    vllm_server: VllmServer, capsys: pytest.CaptureFixture[str]
) -> None:
    log = vllm_server.log.read_text()
    if _host_has_amx():
        assert "agentclaims AMX: granted" in log, log[-3000:]
        _say(capsys, "this host's CPU has AMX: the plugin granted vLLM's processes AMX tile data")
    else:
        assert "agentclaims AMX: no_amx: the CPU has no AMX; nothing to do" in log, log[-3000:]
        _say(
            capsys,
            "this host's CPU has no AMX (no amx_tile flag): the AMX plugin did nothing, and "
            "the test of vLLM without it (SIGILL on AMX) has nothing to show here",
        )
    assert log.count("agentclaims AMX:") == 1  # once per server, not once per process


def test_without_the_plugin_an_amx_host_names_sigill_and_with_it_serves(
    vllm_server: VllmServer,
    tiny_model: str,
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The session's server (plugin on) has served; one without the AMX plugin
    (``VLLM_PLUGINS`` names only the watch) dies at its first completion on an AMX CPU."""
    answer = httpx2.post(
        f"{vllm_server.url}/v1/completions",
        json={"model": vllm_server.model, "prompt": [5, 6, 7], "max_tokens": 2},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    if not _host_has_amx():
        _say(capsys, "no AMX on this host: vLLM without the AMX plugin is not started here")
        return
    plugins = {"VLLM_PLUGINS": "agentclaims_watch"}
    with serve_vllm(
        tiny_model, tmp_path_factory, "no-amx-plugin", env=plugins, ready=False
    ) as bare:
        assert bare.process.wait(timeout=300) == 1
        log = bare.log.read_text()
    assert "ready:" not in log
    assert "vLLM died before it was ready" in log, log[-3000:]
    assert "SIGILL" in log, log[-3000:]


def _claim(cid: str) -> dict[str, Any]:
    return {
        "claim_id": cid,
        "object_id": "@prompt",
        "protection_mode": "hard_protected",
        "ttl_s": 100,
    }


def _completion(prompt: list[int], max_tokens: int, **agentclaims: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    if agentclaims:
        body["agentclaims"] = agentclaims
    return body


@pytest.mark.parametrize("sig", [signal.SIGILL, signal.SIGKILL], ids=["SIGILL", "SIGKILL"])
async def test_a_worker_killed_mid_run_is_named_and_every_claim_ends_with_harm(
    sig: signal.Signals, tiny_model: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with serve_vllm(tiny_model, tmp_path_factory, f"dies-{sig.name}") as server:
        args = ("--kv", "vllm", "--upstream", server.url, "--claims-key", server.key)
        with gateway_process(*args, "--kv-events", server.events) as url:
            async with httpx2.AsyncClient(base_url=url, timeout=60) as http:
                held = _completion(
                    list(range(10, 110)), 2, owner_scope="wf-die", claims=[_claim("die-1")]
                )
                first = (await http.post("/v1/completions", json=held)).json()
                assert first["agentclaims"]["decisions"][0]["decision"] == "accepted"
                async with HTTPBackend(url) as backend:
                    deadline = time.monotonic() + 10
                    while (
                        await backend.get_claim("die-1", "wf-die")
                    ).state.value != "materialized":
                        assert time.monotonic() < deadline, "the claim never materialized"
                        await asyncio.sleep(0.1)
                # a long answer in flight, then the worker dies under it
                running = asyncio.ensure_future(
                    http.post("/v1/completions", json=_completion(list(range(300, 340)), 200))
                )
                await asyncio.sleep(0.3)
                [worker] = [p for p, n in descendants(server.pid).items() if n == "VLLM::Worker"]
                os.kill(worker, sig)
                in_flight = await running
                # it was answered before the worker died (a loaded machine) or is the 503
                assert in_flight.status_code in (200, 503), in_flight.text
                if in_flight.status_code == 503:
                    assert in_flight.json()["error"]["type"] == "unavailable"

                assert await asyncio.to_thread(server.process.wait, 60) == 1
                log = server.log.read_text()
                assert f"was killed by {sig.name}" in log, log[-3000:]
                assert "vLLM died while serving" in log

                after = await http.post("/v1/completions", json=_completion([1, 2, 3], 1))
                assert after.status_code == 503
                message = after.json()["error"]["message"]
                assert "vLLM's engine is dead" in message
                assert sig.name in message, message  # the signal, from the supervisor's state
                assert "backend_restart" in message
                health = await http.get("/health")
                assert health.status_code == 503
                assert sig.name in health.json()["kv"]["detail"]

                async with HTTPBackend(url) as backend:
                    events = await collect_events(backend, id_prefix="die-1")
                    view = await backend.get_claim("die-1", "wf-die")
            [harm] = [e for e in events if e.event.value == "resident_claim_harmed"]
            assert harm.data["cause"] == "backend_restart"
            assert sig.name in harm.data["detail"] or "engine is dead" in harm.data["detail"]
            assert harm.data["predicate_before"] is True
            assert harm.data["predicate_after"] is False
            assert view.state.value == "harmed"
