"""What the gateway adds to a request's latency in front of a real vLLM, beside the floor: a
bare pass-through proxy on the same server stack and HTTP client with none of the gateway's
work (benchmarks/passthrough_proxy.py). A script that prints figures; no test times anything.

One vLLM with the connector (the tiny model, 97 blocks of 32 tokens); in front of it the
gateway (`agentclaims serve --kv vllm`) and the bare proxy, both up at once. Each run sends
``--probes`` chat requests straight to vLLM and as many through the front, interleaved (the
order alternating), for the gateway and the proxy in turn; ``--runs`` runs. Per run: the
front's CPU per request, the end-to-end difference per pair (p50, p99) and, for the gateway,
its own time (its ``Server-Timing``: the handler's time less its wait on vLLM). With
``--layout pinned`` (the default with two or more cores) vLLM runs on the last core and the
fronts and this client on the others, as docs/operations.md deploys them. Run::

    .venv/bin/python benchmarks/bench_gateway_latency.py [--probes 200] [--runs 3] [--json]

(needs the vLLM environment: `make vllm-env`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vllm import KEY, SERVER, cli, latencies, layout, start, tiny_model
from servers import free_port, stop

FRONTS = ("gateway", "bare proxy")


async def measure(urls: dict[str, str], sessions: dict[str, int], args: Any) -> dict[str, Any]:
    body = {"model": args.model, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    runs: dict[str, list[dict[str, Any]]] = {front: [] for front in FRONTS}
    for _ in range(args.runs):
        for front in FRONTS:
            runs[front].append(
                await latencies(urls["vllm"], urls[front], args.probes, body, sessions[front])
            )
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--probes", type=int, default=200, help="interleaved pairs per run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--layout", choices=("pinned", "shared"), default="pinned")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if min(args.probes, args.runs) < 1:
        parser.error("--probes and --runs must be >= 1")
    args.model = tiny_model()
    on_vllm, on_front = layout(args.layout)
    ports = {name: free_port() for name in ("vllm", *FRONTS)}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    procs: list[subprocess.Popen[bytes]] = []
    sessions: dict[str, int] = {}
    try:
        argv = cli("vllm", "serve", "--model", args.model, "--port", str(ports["vllm"]))
        procs.append(start([*on_vllm, *argv, *SERVER, "--claims-key", KEY], urls["vllm"]))
        proxy = str(Path(__file__).with_name("passthrough_proxy.py"))
        fronts = {
            "gateway": [
                *cli("serve", "--port", str(ports["gateway"]), "--kv", "vllm"),
                *("--upstream", urls["vllm"], "--claims-key", KEY),
            ],
            "bare proxy": [
                *(sys.executable, proxy, "--port", str(ports["bare proxy"])),
                *("--upstream", urls["vllm"]),
            ],
        }
        for front, argv in fronts.items():
            procs.append(start([*on_front, *argv], urls[front]))
            sessions[front] = procs[-1].pid
        out = asyncio.run(measure(urls, sessions, args))
    finally:
        for proc in reversed(procs):
            stop(proc, group=True, timeout_s=30)
    report(out, args, "pinned" if on_vllm else "shared")


def report(out: dict[str, list[dict[str, Any]]], args: Any, where: str) -> None:
    if args.json:
        print(json.dumps({"layout": where, "probes": args.probes, "runs": out}))
        return
    print(f"{args.probes} interleaved pairs per run, {args.runs} runs, layout {where}; ms\n")
    head = ("CPU/request", "added p50", "added p99", "own p50", "own p99")
    print(f"{'':14}" + "".join(f"{h:>13}" for h in head))
    keys = ("gateway_cpu_ms_per_request", "added_p50_ms", "added_p99_ms", "own_p50_ms")
    for front, rows in out.items():
        for i, row in enumerate(rows):
            cells = [row[k] for k in (*keys, "own_p99_ms")]
            label = front if i == 0 else ""
            print(f"{label:14}" + "".join(f"{'-' if c is None else c:>13}" for c in cells))


if __name__ == "__main__":
    main()
