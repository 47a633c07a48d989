"""The durable claim ledger, on a real SQLite file behind real `agentclaims serve` processes:
a real `kill -9` mid-workflow and a restart on the same file account for every claim accepted
before (by state or by an explicit event), event sequence numbers never go back, and tenants
stay bound; SIGTERM finishes the request in flight, refuses new ones, and flushes the ledger."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx2
from servers import start_gateway, stop

from agentclaims.gateway.ledger import RESTART_CAUSE, Ledger

ALPHA = "ak-alpha-0123456789abcdef"
BETA = "ak-beta-0123456789abcdef"
OPS = "ak-ops-0123456789abcdef"
KEYS = f"""
[[key]]
key = "{ALPHA}"
tenant = "alpha"

[[key]]
key = "{BETA}"
tenant = "beta"

[[key]]
key = "{OPS}"
tenant = "ops"
admin = true
"""


def turn(http: httpx2.Client, session: str, text: str, claim_id: str) -> dict[str, Any]:
    r = http.post(
        "/v1/chat/completions",
        json={
            "model": "m",
            "messages": [{"role": "user", "content": text}],
            "agentclaims": {
                "session_id": session,
                "claims": [
                    {
                        "claim_id": claim_id,
                        "object_id": "@prompt",
                        "protection_mode": "hard_protected",
                    }
                ],
            },
        },
    )
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()["agentclaims"]
    return body


def all_events(http: httpx2.Client, since: int = 0) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    while True:
        page = http.get("/v1/events", params={"since": since, "limit": 50}).json()
        events += page["events"]
        since = page["next_since"]
        if not page["more"]:
            return events


def test_kill_9_mid_workflow_loses_no_accepted_claim_silently(tmp_path: Path) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text(KEYS)
    ledger = tmp_path / "ledger.sqlite"
    args = (
        "--api-keys",
        str(keys),
        "--ledger",
        str(ledger),
        "--blocks",
        "256",
        "--block-size",
        "4",
    )
    auth = {"Authorization": f"Bearer {ALPHA}"}
    proc, url = start_gateway(*args)
    try:
        with httpx2.Client(base_url=url, headers=auth, timeout=10) as alpha:
            accepted: list[str] = []
            context = "plan the work"
            for i in range(4):  # a workflow of four turns, each claiming its prompt
                context += f" then step {i} of the task with its tool output"
                out = turn(alpha, "wf-1", context, f"wf-1-c{i}")
                assert out["decisions"][0]["decision"] == "accepted"
                accepted.append(f"wf-1-c{i}")
            alpha.post("/v1/claims/wf-1-c0/release", json={"owner_scope": "wf-1"})
            before = all_events(alpha)
            cursor = before[-1]["seq"]
            assert out["events_seq"] <= cursor
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # no shutdown, no flush: a crash
        proc.wait(timeout=10)
        if proc.stderr:
            proc.stderr.close()

    proc, url = start_gateway(*args)
    try:
        with httpx2.Client(base_url=url, headers=auth, timeout=10) as alpha:
            after = all_events(alpha, since=cursor)
            # the stream goes on from where it was: no number again, none backwards
            seqs = [e["seq"] for e in before + after]
            assert seqs == sorted(set(seqs))
            assert all(e["seq"] > cursor for e in after)
            ended_before = {e["claim_id"] for e in before if e["event"] == "resident_claim_expired"}
            assert ended_before == {"wf-1-c0"}
            ended_after = {
                e["claim_id"]: e
                for e in after
                if e["event"] in ("resident_claim_harmed", "resident_claim_expired")
            }
            # every claim accepted and not released is ended with an explicit event
            assert set(ended_after) == set(accepted) - ended_before
            for e in ended_after.values():
                assert e["event"] == "resident_claim_harmed"  # they were materialized
                assert e["cause"] == RESTART_CAUSE
            health = alpha.get("/health").json()
            assert health["ledger"]["live_claims"] == 0
            assert health["ledger"]["durable"]
            # alpha's ids are alpha's alone: to beta, its claim is one never issued
            with httpx2.Client(base_url=url, headers={"Authorization": f"Bearer {BETA}"}) as beta:
                r = beta.get("/v1/claims/wf-1-c1", params={"owner_scope": "wf-1"})
                never = beta.get("/v1/claims/never-c1", params={"owner_scope": "wf-1"})
                assert r.status_code == never.status_code == 404
                assert r.json()["error"]["message"] == never.json()["error"]["message"].replace(
                    "never-c1", "wf-1-c1"
                )
                assert "alpha" not in r.text
            out = turn(alpha, "wf-1", "a new turn after the restart", "wf-1-c9")
            assert out["decisions"][0]["decision"] == "accepted"
            assert out["events_seq"] > max(seqs)
            # the harm is alpha's in the metrics, by cause (not tenant "-")
            with httpx2.Client(base_url=url, headers={"Authorization": f"Bearer {OPS}"}) as ops:
                metrics = ops.get("/metrics").text
            harmed = len(set(accepted) - ended_before)
            line = f'agentclaims_claims_harmed_total{{cause="{RESTART_CAUSE}",tenant="alpha"}}'
            assert f"{line} {float(harmed)}" in metrics, metrics
            assert 'tenant="-"' not in metrics
            alpha.post("/v1/claims/wf-1-c9/release", json={"owner_scope": "wf-1"})
            with httpx2.Client(base_url=url, headers={"Authorization": f"Bearer {OPS}"}) as ops:
                metrics = ops.get("/metrics").text
            assert (
                'agentclaims_claims_expired_total{reason="released",tenant="alpha"} 1.0' in metrics
            )
    finally:
        stop(proc)


def test_sigterm_finishes_the_request_in_flight_and_flushes_the_ledger(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.sqlite"
    # 300 ms per reply token: the request below is in flight for seconds
    proc, url = start_gateway(
        "--ledger", str(ledger), "--decode-ms", "300", "--grace-s", "20", "--block-size", "4"
    )
    results: dict[str, Any] = {}

    def in_flight() -> None:
        with httpx2.Client(base_url=url, timeout=30) as http:
            results["slow"] = turn(http, "term", "a slow request in flight", "term-c1")

    thread = threading.Thread(target=in_flight)
    try:
        thread.start()
        time.sleep(1.0)  # the request is being served (about 4 s of modelled decode)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        try:  # a new request is refused explicitly: no connection, or a 503 naming why
            r = httpx2.post(f"{url}/v1/chat/completions", json={}, timeout=5)
            assert r.status_code == 503
            assert r.json()["error"]["type"] == "unavailable"
        except httpx2.TransportError:
            pass
        thread.join(timeout=30)
        assert proc.wait(timeout=30) == 0  # a clean stop: what a service manager expects
    finally:
        if proc.poll() is None:
            stop(proc)
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    assert "stopping" in stderr, stderr
    assert "ledger flushed" in stderr, stderr
    assert results["slow"]["decisions"][0]["decision"] == "accepted"
    wal = Path(f"{ledger}-wal")
    assert not wal.exists() or wal.stat().st_size == 0  # checkpointed into the file
    book = Ledger(ledger)
    try:
        assert "term-c1" in book.claims  # told to the client, so in the ledger
        page = book.page(0)
        assert any(
            e.claim_id == "term-c1" and e.event.value == "resident_claim_accepted"
            for e in page.events
        )
    finally:
        book.close()


def test_an_unusable_ledger_path_is_a_clear_error_at_start(tmp_path: Path) -> None:
    bad = tmp_path / "no-such-folder" / "ledger.sqlite"
    proc = subprocess.run(
        ["agentclaims", "serve", "--port", "0", "--ledger", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
    )
    assert proc.returncode == 2
    assert "claim ledger" in proc.stderr
    assert str(bad) in proc.stderr
