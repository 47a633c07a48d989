"""Time to first token of streamed completions, straight to vLLM and through the gateway in
front of it, side by side in one run (a script that prints figures; no test times anything).

Each round sends the same streamed chat request (``stream: true``, a fresh prompt per round so
no round hits another's cache) straight to vLLM, through the gateway, and through the gateway
carrying a claim as the SDK sends it (``@sequence``, the previous round's claim released in
``agentclaims.release``: both ride on the request, the decision in the last chunk, read over
the connector's channel), in turn, and times the first content token and the whole answer. It
prints the medians and what the gateway adds to the first token, with and without the claim. Start the two servers as docs/vllm.md says, then::

    .venv/bin/python benchmarks/bench_stream_ttft.py --vllm http://127.0.0.1:8000 \\
        --gateway http://127.0.0.1:8099 [--rounds 40] [--max-tokens 32] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import httpx2


async def _timed(http: httpx2.AsyncClient, url: str, body: dict[str, Any]) -> tuple[float, float]:
    """Seconds to the first content token and to the end of one streamed completion."""
    started = time.perf_counter()
    first: float | None = None
    async with http.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if first is None and line.startswith("data: {") and '"content":"' in line:
                data = json.loads(line[len("data: ") :])
                if any((c.get("delta") or {}).get("content") for c in data.get("choices") or ()):
                    first = time.perf_counter() - started
    total = time.perf_counter() - started
    return (total if first is None else first), total


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm", required=True, help="vLLM's URL")
    parser.add_argument("--gateway", required=True, help="the gateway's URL, in front of it")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    async with httpx2.AsyncClient(timeout=120) as http:
        model = (await http.get(f"{args.vllm}/v1/models")).json()["data"][0]["id"]
        times: dict[str, list[tuple[float, float]]] = {"vllm": [], "gateway": [], "claims": []}
        arms = (("vllm", args.vllm), ("gateway", args.gateway), ("claims", args.gateway))
        for i in range(args.rounds):
            for name, url in arms if i % 2 else arms[::-1]:
                words = " ".join(f"r{i}{name}w{j}" for j in range(30))
                body: dict[str, Any] = {
                    "model": model,
                    "messages": [{"role": "user", "content": words}],
                    "max_tokens": args.max_tokens,
                    "temperature": 0,
                    "ignore_eos": True,
                    "stream": True,
                }
                if name == "claims":
                    claim = {
                        "claim_id": f"ttft-{i}",
                        "object_id": "@sequence",
                        "protection_mode": "expiring",
                        "ttl_s": 30,
                    }
                    body["agentclaims"] = {
                        "owner_scope": "bench-ttft",
                        "claims": [claim],
                        **({"release": [f"ttft-{i - 1}"]} if i else {}),
                    }
                times[name].append(await _timed(http, url, body))
        await http.post(
            f"{args.gateway}/v1/claims/ttft-{args.rounds - 1}/release",
            json={"owner_scope": "bench-ttft"},
        )
    out: dict[str, Any] = {"rounds": args.rounds, "max_tokens": args.max_tokens}
    for name, runs in times.items():
        out[name] = {
            "ttft_p50_ms": round(statistics.median(t for t, _ in runs) * 1e3, 2),
            "total_p50_ms": round(statistics.median(t for _, t in runs) * 1e3, 2),
        }
    for name in ("gateway", "claims"):
        added = [g[0] - v[0] for v, g in zip(times["vllm"], times[name], strict=True)]
        out[f"{name}_added_ttft_p50_ms"] = round(statistics.median(added) * 1e3, 2)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{args.rounds} interleaved rounds, {args.max_tokens} tokens each, streamed")
    for name in ("vllm", "gateway", "claims"):
        f = out[name]
        print(
            f"  {name:8} time to first token p50 {f['ttft_p50_ms']} ms, "
            f"whole answer p50 {f['total_p50_ms']} ms"
        )
    print(
        f"  added to the first token (median of per-round differences): gateway p50 "
        f"{out['gateway_added_ttft_p50_ms']} ms, gateway with a claim riding p50 "
        f"{out['claims_added_ttft_p50_ms']} ms (goal <= 3 ms)"
    )


if __name__ == "__main__":
    asyncio.run(main())
