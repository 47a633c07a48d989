"""How much code a plain call runs through the gateway, beside the bare pass-through proxy
(benchmarks/passthrough_proxy.py): Python function calls per call, counted by cProfile, and
CPU per call, both apps in this one process over the same real vLLM. A script that prints
figures; no test times anything.

What a request touches decides its CPU here more than any one hotspot: between two calls the
gateway waits on vLLM, whose model run sweeps the shared cache, so its code runs cold
(docs/vllm.md). The call count is the steady figure of that path's length; the CPU figures
are this process's, the client's share of the work included, the two apps alternating in
rounds. Run::

    .venv/bin/python benchmarks/bench_gateway_calls.py [--calls 200] [--rounds 3] [--sdk] [--functions 30] [--json]

(needs the vLLM environment: `make vllm-env`).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vllm import KEY, layout, serve_vllm, tiny_model
from passthrough_proxy import make_app
from servers import free_port, stop

App = Callable[..., Any]


async def call(app: App, body: bytes) -> None:
    """One plain chat completion through ``app``, as uvicorn would hand it over."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "server": ("127.0.0.1", 80),
        "client": ("127.0.0.1", 1),
        "state": {},
    }
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop() if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    if not sent or sent[0].get("status") != 200:
        raise SystemExit(f"the app did not answer 200: {sent[:2]}")


async def measure(url: str, args: Any) -> dict[str, Any]:
    from agentclaims.gateway.app import create_app
    from agentclaims.vllm.kv import VllmKV

    kv = VllmKV(url, KEY)
    apps: dict[str, App] = {"gateway": create_app(kv), "bare proxy": make_app(url)}

    def body(i: int, front: str = "bare proxy") -> bytes:
        content = f"probe {i} " * 20
        payload = {"model": args.model, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
        payload["messages"] = [{"role": "user", "content": content}]
        if args.sdk and front == "gateway":  # the SDK's object: an owner scope, an events cursor
            payload["agentclaims"] = {"owner_scope": "bench", "events_since": 0}
        return json.dumps(payload).encode()

    out: dict[str, Any] = {"calls_per_request": {}, "cpu_ms_per_request": {}}
    for name, app in apps.items():  # warm: connections, the gateway's start, first paths
        for i in range(20):
            await call(app, body(i, name))
    for name, app in apps.items():
        profile = cProfile.Profile()
        profile.enable()
        for i in range(args.calls):
            await call(app, body(10_000 + i, name))
        profile.disable()
        stats = pstats.Stats(profile)
        out["calls_per_request"][name] = round(stats.total_calls / args.calls, 1)  # type: ignore[attr-defined]
        if args.top:
            out.setdefault("top", {})[name] = by_module(stats, args.calls, args.top)
        if args.functions and name == "gateway":
            out["functions"] = by_function(stats, args.calls, args.functions)
    for r in range(args.rounds):
        for name, app in apps.items():
            cpu = time.process_time()
            for i in range(args.calls):
                await call(app, body(20_000 + r * args.calls + i, name))
            ms = (time.process_time() - cpu) / args.calls * 1e3
            out["cpu_ms_per_request"].setdefault(name, []).append(round(ms, 3))
    await kv.aclose()
    await lifespan_end(apps["bare proxy"])
    return out


def by_module(stats: pstats.Stats, calls: int, top: int) -> list[tuple[str, float, float]]:
    """Where a request's calls go: per source file, its calls and its own CPU (ms) per
    request, the ``top`` files with the most calls."""
    files: dict[str, list[float]] = {}
    raw = stats.stats  # type: ignore[attr-defined]
    for (path, _, func), (_, ncalls, own_s, _, _) in raw.items():
        key = "/".join(Path(path).parts[-2:]) if path != "~" else func  # a builtin: its own
        entry = files.setdefault(key, [0.0, 0.0])
        entry[0] += ncalls
        entry[1] += own_s
    ranked = sorted(files.items(), key=lambda kv: -kv[1][0])[:top]
    return [(k, round(n / calls, 1), round(s / calls * 1e3, 4)) for k, (n, s) in ranked]


def by_function(stats: pstats.Stats, calls: int, top: int) -> list[tuple[str, float, float]]:
    """The ``top`` functions of agentclaims by their own CPU: each one's calls and own CPU
    (ms, under cProfile) per request."""
    rows = []
    raw = stats.stats  # type: ignore[attr-defined]
    for (path, line, func), (_, ncalls, own_s, _, _) in raw.items():
        if "agentclaims" in path:
            rows.append((f"{'/'.join(Path(path).parts[-2:])}:{line} {func}", ncalls, own_s))
    rows.sort(key=lambda row: -row[2])
    return [(k, round(n / calls, 1), round(s / calls * 1e3, 4)) for k, n, s in rows[:top]]


async def lifespan_end(app: App) -> None:
    """The proxy's lifespan, started and ended: it closes its HTTP client."""
    messages = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        pass

    await app({"type": "lifespan"}, receive, send)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="calls per app and round")
    parser.add_argument("--rounds", type=int, default=3, help="CPU rounds, the apps alternating")
    parser.add_argument("--layout", choices=("pinned", "shared"), default="pinned")
    parser.add_argument(
        "--top", type=int, default=0, help="also print the N source files with the most calls"
    )
    parser.add_argument(
        "--functions", type=int, default=0, help="also print agentclaims' N costliest functions"
    )
    parser.add_argument(
        "--sdk",
        action="store_true",
        help="the gateway's calls carry the SDK's agentclaims object (no claim)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if min(args.calls, args.rounds) < 1:
        parser.error("--calls and --rounds must be >= 1")
    args.model = tiny_model()
    on_vllm, _ = layout(args.layout)  # vLLM on the last core; this process on the others
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(serve_vllm(args.model, port, "--claims-key", KEY, on=on_vllm))
        out = asyncio.run(measure(url, args))
    finally:
        for proc in reversed(procs):
            stop(proc, group=True, timeout_s=30)
    if args.json:
        print(json.dumps(out))
        return
    calls, cpu = out["calls_per_request"], out["cpu_ms_per_request"]
    what = "the SDK's chat calls" if args.sdk else "plain chat calls"
    print(f"{what}, {args.calls} per app (and per round); one process, real vLLM\n")
    print(f"{'':12}{'calls/request':>15}{'CPU ms/request, per round':>30}")
    for name in calls:
        print(f"{name:12}{calls[name]:>15}{'  '.join(map(str, cpu[name])):>30}")
    print(f"\ngateway / bare proxy: {calls['gateway'] / calls['bare proxy']:.2f}x the calls")
    if out.get("functions"):
        print(
            "\ngateway: agentclaims' functions, calls and own CPU (ms, under cProfile) per request"
        )
        for where, n, ms in out["functions"]:
            print(f"  {where:72}{n:>8}{ms:>10}")
    for name, rows in out.get("top", {}).items():
        print(f"\n{name}: source file, calls and own CPU (ms, under cProfile) per request")
        for path, n, ms in rows:
            print(f"  {path:48}{n:>8}{ms:>10}")


if __name__ == "__main__":
    main()
