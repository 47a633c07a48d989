"""A fleet behind the real vllm-router vs one bigger instance (a script that prints figures;
no test times anything).

The multi-agent workload of benchmarks/bench_vllm.py (a supervisor routing to two tool-using
workers, W workflows at once) runs through the SDK, side by side in one run, on:

    fleet     two vLLM servers (the connector, B blocks each), a gateway beside each
              (--behind-router), vllm-router in front (sticky_least_loaded); the SDK's
              FleetBackend with reaction "reroute"
    single    one vLLM server with 2 x B blocks and its gateway; HTTPBackend

The SDK plans as users get it (``planner="auto"``: ``held`` on vLLM, each call's claim riding
on the call). It prints each one's cached-token ratio, recomputed prompt tokens, workflow
completion, the agents' LLM-call time and time to first token (p50, p99), claims, refusals,
deferrals and reroutes. Run::

    .venv/bin/python benchmarks/bench_fleet.py [--workflows 4] [--json]

(needs the vLLM environment, `make vllm-env`, and the `fleet` extra.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_vllm import KEY, cli, start, tiny_model, workflows  # noqa: E402
from servers import free_port, start_router, stop  # noqa: E402

BLOCKS = 97
MAX_LEN = ("--max-model-len", "1024")


def _vllm(model_dir: str, blocks: int) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = cli(
        "vllm",
        "serve",
        "--model",
        model_dir,
        "--port",
        str(port),
        "--blocks",
        str(blocks),
        *MAX_LEN,
        "--claims-key",
        KEY,
    )
    return start(argv, url), url


def _gateway(upstream: str, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = cli(
        "serve",
        "--port",
        str(port),
        "--kv",
        "vllm",
        "--upstream",
        upstream,
        "--claims-key",
        KEY,
        *extra,
    )
    return start(argv, url), url


async def _fleet(router: str, n: int) -> dict[str, Any]:
    import agentclaims

    backend = agentclaims.FleetBackend(router, timeout_s=300)
    try:
        return await workflows(backend, n, "auto", "fleet", reaction="reroute")
    finally:
        await backend.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workflows", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    model_dir = tiny_model()
    out: dict[str, Any] = {}
    procs: list[tuple[subprocess.Popen[bytes], bool]] = []
    try:
        servers = [_vllm(model_dir, BLOCKS) for _ in range(2)]
        procs += [(p, True) for p, _ in servers]
        gateways = [
            _gateway(url, "--instance-id", f"v{i}", "--behind-router")
            for i, (_, url) in enumerate(servers)
        ]
        procs += [(p, True) for p, _ in gateways]
        router, router_url = start_router(*(url for _, url in gateways))
        procs.append((router, True))
        out["fleet"] = asyncio.run(_fleet(router_url, args.workflows))
    finally:
        for proc, group in reversed(procs):
            stop(proc, group=group, timeout_s=30)
    procs = []
    try:
        vllm, vurl = _vllm(model_dir, 2 * BLOCKS)
        procs.append((vllm, True))
        gateway, gurl = _gateway(vurl)
        procs.append((gateway, True))
        out["single"] = asyncio.run(workflows(gurl, args.workflows, "auto", "single"))
    finally:
        for proc, group in reversed(procs):
            stop(proc, group=group, timeout_s=30)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    keys = list(out["fleet"])
    print(
        f"{'':22} {'fleet (2 x ' + str(BLOCKS) + ')':>18} {'single (' + str(2 * BLOCKS) + ')':>14}"
    )
    for key in keys:
        print(f"{key:22} {out['fleet'][key]!s:>18} {out['single'][key]!s:>14}")


if __name__ == "__main__":
    main()
