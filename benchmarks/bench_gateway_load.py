"""The gateway under load: N concurrent sessions against `agentclaims serve` on the reference
engine, on loopback, for a fixed time after a ramp (a script that prints figures; no test
times anything). Figures are over the steady window: requests started after the ramp.

Each session is a small agent loop, as the SDK sends it: three chat turns on a growing
context, each claiming its prompt (soft_priority), then a release of every claim. Sessions
start again as soon as they end, so N stay open the whole time. The gateway runs as a real
process with tenants (--api-keys, four tenants) and a durable ledger (--ledger), and again
without either, side by side in one run. It prints requests/s, latency p50/p99 per kind,
explicit refusals and deferrals, every other error (goal: none), and the ledger's write cost
per claim operation (from the gateway's own /v1/stats). Run::

    .venv/bin/python benchmarks/bench_gateway_load.py [--sessions 1000] [--duration 60]
        [--ramp 10] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx2

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from servers import free_port, stop, wait_healthy  # noqa: E402

TENANTS = 4
OPS = "ak-bench-ops-0123456789abcdef"


def _key(i: int) -> str:
    return f"ak-bench-tenant{i}-0123456789abcdef"


def _keys_file(folder: Path) -> Path:
    path = folder / "keys.toml"
    rows = [
        f'[[key]]\nkey = "{_key(i)}"\ntenant = "t{i}"\nquota_blocks = 20000\n'
        for i in range(TENANTS)
    ]
    rows.append(f'[[key]]\nkey = "{OPS}"\ntenant = "ops"\nadmin = true\n')
    path.write_text("\n".join(rows))
    return path


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def _session(
    url: str, n: int, key: str | None, deadline: float, out: dict[str, Any], delay: float
) -> None:
    """One agent's loop, with its own client and connection (as each agent process has),
    started after ``delay`` (sessions ramp up rather than connect all at once)."""
    await asyncio.sleep(delay)
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    limits = httpx2.Limits(max_connections=1, max_keepalive_connections=1)
    async with httpx2.AsyncClient(
        base_url=url, limits=limits, timeout=httpx2.Timeout(120.0)
    ) as http:
        await _loop(http, n, headers, deadline, out)


async def _loop(
    http: httpx2.AsyncClient,
    n: int,
    headers: dict[str, str],
    deadline: float,
    out: dict[str, Any],
) -> None:
    while time.monotonic() < deadline:
        n += 1_000_000
        owner = f"s{n}"
        messages = [{"role": "system", "content": "you are a careful coding agent " * 6}]
        claims = []
        for turn in range(3):
            messages.append({"role": "user", "content": f"turn {turn} of session {n}: run tests"})
            claim_id = f"{owner}-c{turn}"
            body = {
                "model": "scripted",
                "messages": messages,
                "agentclaims": {
                    "session_id": owner,
                    "claims": [
                        {
                            "claim_id": claim_id,
                            "object_id": "@prompt",
                            "protection_mode": "soft_priority",
                        }
                    ],
                },
            }
            started = time.perf_counter()
            try:
                r = await http.post("/v1/chat/completions", json=body, headers=headers)
            except httpx2.TransportError as exc:
                out["errors"][f"transport:{type(exc).__name__}"] += 1
                continue
            out["latency"]["chat"].append((started, time.perf_counter() - started))
            if r.status_code == 200:
                data = r.json()
                messages.append(data["choices"][0]["message"])
                if data["agentclaims"]["decisions"][0]["decision"] == "accepted":
                    claims.append(claim_id)
                out["status"]["200"] += 1
            elif r.status_code in (409, 503) and r.json()["error"]["type"].startswith("active_"):
                out["status"][r.json()["error"]["type"]] += 1
            else:
                out["errors"][f"HTTP {r.status_code}"] += 1
        for claim_id in claims:
            started = time.perf_counter()
            try:
                r = await http.post(
                    f"/v1/claims/{claim_id}/release", json={"owner_scope": owner}, headers=headers
                )
            except httpx2.TransportError as exc:
                out["errors"][f"transport:{type(exc).__name__}"] += 1
                continue
            out["latency"]["release"].append((started, time.perf_counter() - started))
            if r.status_code != 200:
                out["errors"][f"release HTTP {r.status_code}"] += 1


def run_one(
    label: str, sessions: int, duration: float, service: bool, ramp: float
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="agentclaims-load-") as tmp:
        folder = Path(tmp)
        port = free_port()
        args = ["--blocks", "65536", "--block-size", "16", "--decode-ms", "0.05"]
        if service:
            args += ["--api-keys", str(_keys_file(folder)), "--ledger", str(folder / "l.sqlite")]
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentclaims.cli.main", "serve", "--port", str(port), *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, timeout_s=60)
            out: dict[str, Any] = {
                "status": Counter(),
                "errors": Counter(),
                "latency": {"chat": [], "release": []},
            }

            async def main() -> tuple[float, float]:
                started = time.perf_counter()
                deadline = time.monotonic() + ramp + duration
                await asyncio.gather(
                    *(
                        _session(
                            url,
                            i,
                            _key(i % TENANTS) if service else None,
                            deadline,
                            out,
                            ramp * i / sessions,
                        )
                        for i in range(sessions)
                    )
                )
                return started + ramp, started + ramp + duration

            window = asyncio.run(main())
            elapsed = duration
            headers = {"Authorization": f"Bearer {OPS}"} if service else {}
            stats = httpx2.get(f"{url}/v1/stats", headers=headers, timeout=30).json()
        finally:
            stop(proc)
    # the steady window: requests started after the ramp and before the deadline
    steady = {
        kind: [dt for at, dt in rows if window[0] <= at < window[1]]
        for kind, rows in out["latency"].items()
    }
    requests = sum(len(v) for v in steady.values())
    ledger = stats.get("ledger") or {}
    engine = stats.get("engine", {})
    claim_ops = (
        engine.get("claims_accepted", 0)
        + engine.get("claims_rejected", 0)
        + len(out["latency"]["release"])
    )
    return {
        "setup": label,
        "sessions": sessions,
        "seconds": round(elapsed, 1),
        "ramp_s": ramp,
        "requests": requests,
        "requests_per_s": round(requests / elapsed, 1),
        **{
            f"{kind}_{name}_ms": round(_pct(lat, q) * 1000, 2)
            for kind, lat in steady.items()
            for name, q in (("p50", 0.5), ("p99", 0.99))
        },
        "served": out["status"]["200"],
        "refused_or_deferred": {k: v for k, v in out["status"].items() if k != "200"},
        "errors": dict(out["errors"]),
        "ledger_writes": ledger.get("writes"),
        "ledger_ms_per_claim_op": round(1000 * ledger["write_s"] / claim_ops, 4)
        if ledger and claim_ops
        else None,
        "ledger_ms_per_write": round(1000 * ledger["write_s"] / ledger["writes"], 4)
        if ledger and ledger.get("writes")
        else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--ramp", type=float, default=10.0, help="seconds to start them all")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = [
        run_one("tenants + ledger", args.sessions, args.duration, True, args.ramp),
        run_one("plain (no keys, no ledger)", args.sessions, args.duration, False, args.ramp),
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        print(f"== {row['setup']}: {row['sessions']} concurrent sessions, {row['seconds']} s")
        for key, value in row.items():
            if key not in ("setup", "sessions", "seconds"):
                print(f"  {key:24} {value}")
    a, b = rows
    if b["requests_per_s"]:
        print(
            f"throughput with tenants + ledger / without: {a['requests_per_s'] / b['requests_per_s']:.2f}x"
        )
    print(
        "median chat latency with / without: "
        f"{a['chat_p50_ms']} / {b['chat_p50_ms']} ms = {a['chat_p50_ms'] / b['chat_p50_ms']:.2f}x"
    )
    return 0 if not a["errors"] and not b["errors"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
