"""What an operator meets on the real vLLM: a gateway given the wrong claims key or a KV events
endpoint nothing publishes on says so; a claim's view carries its expiry; vLLM's API server
killed outright leaves no vLLM process behind and is named; a start past
``--ready-timeout-s`` is stopped and said."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from conftest import VllmServer, serve_vllm
from servers import free_port, gateway_process

from agentclaims.vllm import vllm_python
from agentclaims.vllm.supervise import descendants

pytestmark = pytest.mark.vllm


def _complete(url: str, prompt: list[int], **agentclaims: Any) -> dict[str, Any]:
    body = {"model": "any", "prompt": prompt, "max_tokens": 2, "temperature": 0}
    answer = httpx2.post(
        f"{url}/v1/completions", json={**body, "agentclaims": agentclaims}, timeout=60
    )
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()["agentclaims"]
    return result


def _prompt(start: int) -> list[int]:
    return [3 + (start + i) % 2000 for i in range(70)]  # two full blocks of 32


def test_a_gateway_with_the_wrong_claims_key_says_so(vllm_server: VllmServer) -> None:
    args = ("--kv", "vllm", "--upstream", vllm_server.url, "--claims-key", "not-the-key")
    with gateway_process(*args) as url:
        claim = {"claim_id": "wk-c1", "object_id": "@prompt", "protection_mode": "hard_protected"}
        answer = _complete(url, _prompt(7001), session_id="wk", claims=[claim])
        (decision,) = answer["decisions"]
        assert decision["decision"] == "rejected"
        assert "refuses this gateway's signed claim operations" in decision["reason"]
        assert "--claims-key" in decision["reason"]
        fault = httpx2.get(f"{url}/v1/descriptor").json()["fault"]
        assert fault is not None
        assert "--claims-key" in fault


@pytest.fixture(scope="module")
def gateway(vllm_server: VllmServer) -> Iterator[str]:
    args = ("--kv", "vllm", "--upstream", vllm_server.url, "--claims-key", vllm_server.key)
    with gateway_process(*args, "--kv-events", vllm_server.events) as url:
        yield url


def test_a_claim_view_on_vllm_carries_its_expiry_and_its_renewal(gateway: str) -> None:
    claim = {
        "claim_id": "ex-c1",
        "object_id": "@prompt",
        "protection_mode": "expiring",
        "ttl_s": 60,
    }
    before = time.time_ns()
    answer = _complete(gateway, _prompt(8001), session_id="ex", claims=[claim])
    assert answer["decisions"][0]["decision"] == "accepted", answer
    view = httpx2.get(f"{gateway}/v1/claims/ex-c1", params={"owner_scope": "ex"}).json()
    first = view["expires_at_ns"]
    assert first is not None
    assert before + 59 * 10**9 < first <= time.time_ns() + 60 * 10**9
    renewed = httpx2.post(
        f"{gateway}/v1/claims/ex-c1/renew", json={"owner_scope": "ex", "ttl_s": 100}
    ).json()
    assert renewed["expires_at_ns"] > first + 39 * 10**9
    # beyond the connector's --max-ttl-s: refused naming ttl_s, the claim as it was
    too_long = httpx2.post(
        f"{gateway}/v1/claims/ex-c1/renew", json={"owner_scope": "ex", "ttl_s": 10**6}
    )
    assert too_long.status_code == 400
    assert too_long.json()["error"]["field"] == "ttl_s", too_long.text
    view = httpx2.get(f"{gateway}/v1/claims/ex-c1", params={"owner_scope": "ex"}).json()
    assert view["expires_at_ns"] == renewed["expires_at_ns"]
    assert view["state"] == "materialized"
    httpx2.post(f"{gateway}/v1/claims/ex-c1/release", json={"owner_scope": "ex"})


def test_kv_events_where_nothing_publishes_are_said_not_silent(
    vllm_server: VllmServer, tmp_path: Path
) -> None:
    nowhere = f"ipc://{tmp_path}/nothing.kv"
    args = ("--kv", "vllm", "--upstream", vllm_server.url, "--claims-key", vllm_server.key)
    with gateway_process(*args, "--kv-events", nowhere) as url:
        _complete(url, _prompt(9001))
        events = httpx2.get(f"{url}/v1/descriptor").json()["kv_events"]
    (notice,) = [n for n in events["notices"] if n.get("notice") == "silent"]
    assert notice["endpoint"] == nowhere
    assert f"there is no socket at {tmp_path}/nothing.kv" in notice["detail"]


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])


def _group_left(pgid: int) -> list[int]:
    """The processes still in ``pgid`` (vLLM's, started in a session of their own)."""
    left = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            left.append(int(entry.name))
    return left


def _wait_gone(pgid: int, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := _group_left(pgid)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


@contextlib.contextmanager
def _no_leftovers(server: VllmServer) -> Iterator[None]:
    """Whatever the test finds, no process of that vLLM outlives it."""
    try:
        yield
    finally:
        if _group_left(server.pid):
            os.killpg(server.pid, signal.SIGKILL)


def test_vllms_api_server_killed_outright_is_named_and_leaves_nothing_running(
    tiny_model: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with serve_vllm(tiny_model, tmp_path_factory, "api-killed") as server, _no_leftovers(server):
        below = descendants(server.pid)
        (api,) = [pid for pid in below if _parent(pid) == server.pid]  # vLLM's API server
        assert len(below) > 1  # its engine core and worker below it
        os.kill(api, signal.SIGKILL)
        assert server.process.wait(timeout=120) == 1
        left = _wait_gone(server.pid, 60)
        log = server.log.read_text()
        assert left == [], (left, log[-3000:])
        assert f"vLLM's API server (pid {api}) was killed by SIGKILL" in log, log[-3000:]


def test_a_start_past_the_ready_timeout_is_stopped_and_said(
    tiny_model: str, tmp_path: Path
) -> None:
    log = tmp_path / "late.log"
    events = f"ipc://{tmp_path}/events.kv"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "agentclaims.cli.main", "vllm", "serve"),
                *("--model", tiny_model, "--port", str(free_port()), "--claims-key", "k"),
                *("--python", vllm_python(), "--kv-events", events, "--ready-timeout-s", "2"),
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        assert proc.wait(timeout=180) == 1, log.read_text()[-3000:]
        assert _wait_gone(proc.pid, 60) == [], log.read_text()[-3000:]
    finally:
        if _group_left(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert "vLLM was not healthy within 2 s (--ready-timeout-s)" in text, text[-3000:]
    assert "agentclaims vllm: ready" not in text
    state = (tmp_path / "events.kv.state.json").read_text()
    assert '"state": "dead"' in state
    assert "--ready-timeout-s" in state
