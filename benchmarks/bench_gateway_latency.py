"""What the gateway adds to a request's latency in front of a real vLLM, beside the floor: a
bare pass-through proxy on the same server stack and HTTP client with none of the gateway's
work (benchmarks/passthrough_proxy.py). A script that prints figures; no test times anything.

One vLLM with the connector (the tiny model, 97 blocks of 32 tokens); in front of it the
gateway (`agentclaims serve --kv vllm`) and the bare proxy, both up at once. Each run sends
``--probes`` rounds of three plain chat requests, one straight to vLLM, one through the
gateway and one through the proxy, in an order that rotates every round, so the two fronts
are measured side by side under the same load. Per run and front: its CPU per request (its
process's CPU-time clock, in nanoseconds: summed over its requests, and over the whole run,
whatever ran between them included), the end-to-end difference from the straight
request of the same round (p50, p99) and, for the gateway, its own time (its
``Server-Timing``: the handler's time less its wait on vLLM); then the ratio of the two
fronts' CPU, per run and its median. With ``--layout pinned`` (the default with two or more
cores) vLLM runs on the last core and the fronts and this client on the others, as
docs/operations.md deploys them. Every call takes the gateway's one completion pipeline
(``CompletionRoutes``): a plain call its lean way, and so does a call with the SDK's
``agentclaims`` object (``--sdk``: an owner scope and an events cursor, as a session sends
them when it carries no claim; the floor and vLLM get the same call without it) while the
pool's figures are under a second old; about one a second goes the general way, with an
envelope. ``--context TOKENS`` sends conversations that grow as an agent's do: each
round's prompt is the last one's and about ``TURN_TOKENS`` more, from half of ``TOKENS`` to
``TOKENS``, then a new conversation (the gateway then hashes a call's new blocks only; every
front and vLLM get the same prompts). ``--ledger`` makes the gateway keep
a ledger, ``--tenants`` serve tenants' keys (the calls carry one). Run::

    .venv/bin/python benchmarks/bench_gateway_latency.py [--probes 300] [--runs 3] [--sdk] [--tenants] [--ledger] [--context TOKENS] [--json]

(needs the vLLM environment: `make vllm-env`).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2

from agentclaims.protocol import EXTENSION_KEY
from agentclaims.vllm.upstream import SseFramer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vllm import KEY, _timing, cli, context, layout, pct, serve_vllm, start, tiny_model
from servers import free_port, stop

FRONTS = ("gateway", "bare proxy")
TURN_TOKENS = 48
"""What each round adds to a conversation (``--context``): about an agent's turn."""
TENANT_KEY = "bench-tenant-key-0123456789abcdef"


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all its threads) one process has used so far: its CPU-time
    clock (``clock_getcpuclockid``, nanoseconds). /proc's counters count in clock ticks
    (10 ms here), about seven of a front's requests: summed over a run they wander by about
    a seventh, so they are only the fallback."""
    clock = _cpu_clock(pid)
    if clock is not None:
        return time.clock_gettime(clock)
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@functools.cache
def _cpu_clock(pid: int) -> int | None:
    """The CPU-time clock of process ``pid`` (None where libc will not give it)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        clock = ctypes.c_int()
        if libc.clock_getcpuclockid(pid, ctypes.byref(clock)) != 0:
            return None
        time.clock_gettime(clock.value)  # readable (the same user's process)
    except (AttributeError, OSError):
        return None
    return clock.value


async def one_run(urls: dict[str, str], pids: dict[str, int], args: Any) -> dict[str, Any]:
    """``args.probes`` rounds (and 5 unmeasured first): each sends the same kind of request
    straight to vLLM and through each front, the order rotating."""
    body = {"model": args.model, "max_tokens": args.stream or 4, "temperature": 0}
    body |= {"ignore_eos": True, **({"stream": True} if args.stream else {})}
    names = ("vllm", *FRONTS)
    elapsed: dict[str, list[float]] = {name: [] for name in names}
    own: list[float] = []
    cpu = dict.fromkeys(FRONTS, 0.0)
    seen = 0  # the session's events cursor (--sdk)
    async with httpx2.AsyncClient(timeout=60) as http:
        for i in range(args.probes + 5):
            order = names[i % 3 :] + names[: i % 3]
            if i == 5:  # the measured rounds begin: each front's CPU from here on, all of it
                whole = {front: process_cpu_s(pids[front]) for front in FRONTS}
            for name in order:
                payload = {**body, "messages": [{"role": "user", "content": prompt(i, args)}]}
                headers = {}
                if name == "gateway":
                    if args.sdk:
                        payload[EXTENSION_KEY] = {"owner_scope": "bench", "events_since": seen}
                    if args.tenants:
                        headers["authorization"] = f"Bearer {TENANT_KEY}"
                c0 = process_cpu_s(pids[name]) if name in pids else 0.0
                t = time.perf_counter()
                r = await http.post(
                    f"{urls[name]}/v1/chat/completions", json=payload, headers=headers
                )
                took = time.perf_counter() - t
                assert r.status_code == 200, r.text[:300]
                if name == "gateway":
                    seen = _answer(r.content, streamed=bool(args.stream))[EXTENSION_KEY][
                        "events_seq"
                    ]
                if i < 5:
                    continue  # warm-up: connections, first-request paths
                if name in pids:
                    cpu[name] += process_cpu_s(pids[name]) - c0
                elapsed[name].append(took)
                timing = _timing(r.headers.get("server-timing", ""))
                if "gateway" in timing:  # the bare proxy says nothing
                    own.append(timing["gateway"])
    whole = {front: process_cpu_s(pids[front]) - c for front, c in whole.items()}
    ms = 1e3
    out: dict[str, Any] = {}
    for front in FRONTS:
        added = [b - a for a, b in zip(elapsed["vllm"], elapsed[front], strict=True)]
        out[front] = {
            "cpu_ms_per_request": round(cpu[front] / args.probes * ms, 3),
            "run_cpu_ms_per_request": round(whole[front] / args.probes * ms, 3),
            "added_p50_ms": round(statistics.median(added) * ms, 2),
            "added_p99_ms": round(pct(added, 0.99) * ms, 2),
            "own_p50_ms": round(statistics.median(own), 3) if front == "gateway" else None,
            "own_p99_ms": round(pct(own, 0.99), 3) if front == "gateway" else None,
        }
    floor = out["bare proxy"]["cpu_ms_per_request"]
    out["cpu_ratio"] = round(out["gateway"]["cpu_ms_per_request"] / floor, 3) if floor else None
    return out


async def measure(urls: dict[str, str], pids: dict[str, int], args: Any) -> list[dict[str, Any]]:
    return [await one_run(urls, pids, args) for _ in range(args.runs)]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--probes", type=int, default=300, help="rounds per run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--layout", choices=("pinned", "shared"), default="pinned")
    parser.add_argument(
        "--ledger",
        action="store_true",
        help="the gateway keeps a ledger (a SQLite file in a temporary folder): every call then "
        "takes the general route, not the plain-call route",
    )
    parser.add_argument(
        "--sdk",
        action="store_true",
        help="the gateway's calls carry the SDK's agentclaims object (an owner scope and an "
        "events cursor; no claim)",
    )
    parser.add_argument(
        "--tenants",
        action="store_true",
        help="the gateway serves tenants' keys (a key file in a temporary folder); its calls "
        "carry one",
    )
    parser.add_argument(
        "--stream",
        type=int,
        default=0,
        metavar="TOKENS",
        help="every call streamed (stream: true), TOKENS tokens each; the proxy passes each "
        "event on parsed and written again",
    )
    parser.add_argument(
        "--context",
        type=int,
        default=0,
        metavar="TOKENS",
        help="conversations growing by an agent's turn a round, from TOKENS/2 to TOKENS tokens "
        "(at most 900: vLLM here takes 1,024)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if min(args.probes, args.runs) < 1 or args.stream < 0 or not 0 <= args.context <= 900:
        parser.error("--probes and --runs must be >= 1, --stream >= 0, --context 0..900")
    args.model = tiny_model()
    on_vllm, on_front = layout(args.layout)
    ports = {name: free_port() for name in ("vllm", *FRONTS)}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    procs: list[subprocess.Popen[bytes]] = []
    pids: dict[str, int] = {}
    ledger_dir = tempfile.TemporaryDirectory(prefix="bench-ledger-")
    try:
        procs.append(serve_vllm(args.model, ports["vllm"], "--claims-key", KEY, on=on_vllm))
        proxy = str(Path(__file__).with_name("passthrough_proxy.py"))
        fronts = {
            "gateway": [
                *cli("serve", "--port", str(ports["gateway"]), "--kv", "vllm"),
                *("--upstream", urls["vllm"], "--claims-key", KEY),
                *(
                    ("--ledger", str(Path(ledger_dir.name) / "ledger.sqlite"))
                    if args.ledger
                    else ()
                ),
                *(("--api-keys", str(keys_file(Path(ledger_dir.name)))) if args.tenants else ()),
            ],
            "bare proxy": [
                *(sys.executable, proxy, "--port", str(ports["bare proxy"])),
                *("--upstream", urls["vllm"]),
            ],
        }
        for front, argv in fronts.items():
            procs.append(start([*on_front, *argv], urls[front]))
            pids[front] = procs[-1].pid
        out = asyncio.run(measure(urls, pids, args))
    finally:
        for proc in reversed(procs):
            stop(proc, group=True, timeout_s=30)
        ledger_dir.cleanup()
    report(out, args, "pinned" if on_vllm else "shared")


def prompt(i: int, args: Any) -> str:
    """Round ``i``'s prompt: a short one of its own, or (``--context``) the round's turn of
    a conversation growing from half of ``args.context`` tokens to all of them."""
    if not args.context:
        return f"probe {i} " * 20
    turns = max(1, args.context // 2 // TURN_TOKENS)
    conversation, turn = divmod(i, turns)
    return context(f"conversation {conversation}", args.context // 2 + turn * TURN_TOKENS)


def _answer(raw: bytes, *, streamed: bool) -> dict[str, Any]:
    """The gateway's answer, or the last chunk of its stream (the one with its object)."""
    if not streamed:
        return dict(json.loads(raw))
    framer = SseFramer()  # the gateway's own reader of a stream's events
    events = framer.feed(raw) + framer.end()
    return next(e for e in reversed(events) if EXTENSION_KEY in e)


def keys_file(folder: Path) -> Path:
    """A key file with one tenant, whose key the gateway's calls carry (``--tenants``)."""
    path = folder / "keys.toml"
    path.write_text(f'[[key]]\nkey = "{TENANT_KEY}"\ntenant = "bench"\n')
    return path


def report(runs: list[dict[str, Any]], args: Any, where: str) -> None:
    ratios = [r["cpu_ratio"] for r in runs if r["cpu_ratio"] is not None]
    median = round(statistics.median(ratios), 3) if ratios else None
    if args.json:
        out = {"layout": where, "ledger": args.ledger, "probes": args.probes, "runs": runs}
        out |= {"sdk": args.sdk, "tenants": args.tenants, "stream": args.stream}
        out |= {"context": args.context}
        print(json.dumps({**out, "ratio": median}))
        return
    calls = "the SDK's calls" if args.sdk else "plain calls"
    calls += f", streamed ({args.stream} tokens)" if args.stream else ""
    calls += f", conversations growing to {args.context} tokens" if args.context else ""
    extra = [name for name, on in (("tenants", args.tenants), ("a ledger", args.ledger)) if on]
    route = calls + (f", with {' and '.join(extra)}" if extra else "")
    print(f"{args.probes} rounds per run, {args.runs} runs, layout {where}, {route}; ms\n")
    head = ("CPU/request", "added p50", "added p99", "own p50", "own p99")
    print(f"{'':8}{'':14}" + "".join(f"{h:>13}" for h in head))
    keys = ("cpu_ms_per_request", "added_p50_ms", "added_p99_ms", "own_p50_ms", "own_p99_ms")
    for i, run in enumerate(runs):
        for front in FRONTS:
            cells = [run[front][k] for k in keys]
            label = f"run {i}" if front == "gateway" else ""
            print(f"{label:8}{front:14}" + "".join(f"{'-' if c is None else c:>13}" for c in cells))
    print(f"\ngateway / bare proxy CPU per request: runs {ratios}, median {median}x")


if __name__ == "__main__":
    main()
