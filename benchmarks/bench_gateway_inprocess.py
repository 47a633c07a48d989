"""The gateway's own CPU per call beside a bare proxy's, both in this process: a script that
prints figures; no test times anything.

``bench_gateway_latency.py`` measures the two fronts as servers, each in its process (the
ratio issue 43 sets a bound on); its runs spread by a few percent. This one takes uvicorn out:
it builds the gateway's app as ``agentclaims serve --kv vllm`` builds it
(``create_app(VllmKV(...))``) and the bare proxy's (``benchmarks/passthrough_proxy.py``) in
this process, runs their lifespans, and calls each as an ASGI app in turn against one real
vLLM with the connector (the tiny model, on the last core with ``--layout pinned``). Each
call is timed on this thread's CPU clock (``time.thread_time``), the wait on vLLM included
(the CPU it takes is the HTTP client's, the same in both); ``--sdk`` gives the gateway's
calls the SDK's object (an owner scope and an events cursor). Per run it prints each front's
median and the difference, the gateway's own work: a change to the gateway's call path
moves that difference by what it saves, within about 20 µs from run to run::

    .venv/bin/python benchmarks/bench_gateway_inprocess.py [--calls 300] [--runs 2] [--sdk]

(needs the vLLM environment: `make vllm-env`).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vllm import KEY, layout, serve_vllm, tiny_model
from passthrough_proxy import make_app
from servers import free_port, stop

from agentclaims._json import dumps, loads
from agentclaims.protocol import EXTENSION_KEY

WARM = 10
"""Calls of each front not measured first: connections, first-call paths."""


async def call(app: Any, body: bytes) -> bytes:
    """``POST /v1/chat/completions`` of ``body`` to the ASGI ``app``: its answer's body."""
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
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    if sent[0].get("status") != 200:
        raise RuntimeError(f"answered {sent[0].get('status')}: {sent[1:]}")
    return b"".join(m.get("body", b"") for m in sent[1:])


async def lifespan(app: Any) -> tuple[asyncio.Task[None], asyncio.Queue[dict[str, Any]]]:
    """``app``'s lifespan, started: its task and the queue its shutdown is put on."""
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    await inbox.put({"type": "lifespan.startup"})

    async def send(message: dict[str, Any]) -> None:
        await outbox.put(message)

    scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
    task = asyncio.ensure_future(app(scope, inbox.get, send))
    started = await outbox.get()
    if started["type"] != "lifespan.startup.complete":
        raise RuntimeError(f"the app did not start: {started}")
    return task, inbox


async def one_run(apps: dict[str, Any], model: str, args: Any) -> dict[str, float]:
    """``args.calls`` calls of each front (``WARM`` more first), in turn: medians, µs."""
    cpu: dict[str, list[float]] = {name: [] for name in apps}
    seen = 0  # the SDK's events cursor (--sdk)
    names = list(apps)
    for i in range(args.calls + WARM):
        for name in names if i % 2 else names[::-1]:
            payload: dict[str, Any] = {
                "model": model,
                "max_tokens": 4,
                "temperature": 0,
                "ignore_eos": True,
                "messages": [{"role": "user", "content": f"probe {i} " * 20}],
            }
            if name == "gateway" and args.sdk:
                payload[EXTENSION_KEY] = {"owner_scope": "bench", "events_since": seen}
            body = dumps(payload)
            started = time.thread_time()
            answer = await call(apps[name], body)
            took = time.thread_time() - started
            if name == "gateway" and args.sdk:
                seen = loads(answer)[EXTENSION_KEY]["events_seq"]
            if i >= WARM:
                cpu[name].append(took)
    out = {name: statistics.median(times) * 1e6 for name, times in cpu.items()}
    return {**out, "difference": out["gateway"] - out["bare proxy"]}


async def measure(url: str, model: str, args: Any) -> list[dict[str, float]]:
    from agentclaims.gateway import create_app
    from agentclaims.vllm.kv import VllmKV

    apps = {"gateway": create_app(VllmKV(url, KEY)), "bare proxy": make_app(url)}
    started = [await lifespan(app) for app in apps.values()]
    try:
        return [await one_run(apps, model, args) for _ in range(args.runs)]
    finally:
        for _, inbox in started:
            await inbox.put({"type": "lifespan.shutdown"})
        await asyncio.gather(*(task for task, _ in started), return_exceptions=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="measured calls of each front")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--layout", choices=("pinned", "shared"), default="pinned")
    parser.add_argument(
        "--sdk", action="store_true", help="the gateway's calls carry the SDK's agentclaims object"
    )
    args = parser.parse_args()
    if min(args.calls, args.runs) < 1:
        parser.error("--calls and --runs must be >= 1")
    model = tiny_model()
    on_vllm, _ = layout(args.layout)  # this process on the other cores
    port = free_port()
    proc = serve_vllm(model, port, "--claims-key", KEY, on=on_vllm)
    try:
        runs = asyncio.run(measure(f"http://127.0.0.1:{port}", model, args))
    finally:
        stop(proc, group=True, timeout_s=30)
    calls = "the SDK's calls" if args.sdk else "plain calls"
    print(f"{args.calls} {calls} per front and run, layout {args.layout}; CPU per call, µs\n")
    print(f"{'':8}{'gateway':>10}{'bare proxy':>12}{'difference':>12}")
    for i, run in enumerate(runs):
        print(
            f"run {i:<4}{run['gateway']:>10.0f}{run['bare proxy']:>12.0f}{run['difference']:>12.0f}"
        )
    differences = [run["difference"] for run in runs]
    print(f"\nthe gateway's own work: median {statistics.median(differences):.0f} µs a call")


if __name__ == "__main__":
    main()
