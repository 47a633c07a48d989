"""What one batch of vLLM's KV events costs the gateway's loop in ``ClaimMirror``'s join
(``blocks_stored`` then ``blocks_lost``), by how many claims the mirror has made: the join
reads the claims on the batch's blocks (an index by block hash), so its cost should not grow
with the claims made before. A script that prints figures; no vLLM needed. Run::

    .venv/bin/python benchmarks/bench_mirror.py [--claims 1000 10000 100000] [--batches 200]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from agentclaims.contract import BlockHash, CacheIdentity, ClaimSpec, ClaimState, ProtectionMode
from agentclaims.vllm.mirror import ClaimMirror, MirroredClaim

IDENTITY = CacheIdentity("vllm:bench", "m", "t", "default", 16)
BLOCKS = 20
"""Blocks per claim; each claim its own prefix (an agent's sequence)."""


class _Source:
    run_id, policy_name, num_blocks = "bench", "bench", 100_000

    @property
    def clock(self) -> Any:
        return time.monotonic_ns


async def _never() -> Any:
    raise AssertionError("the bench asks the connector nothing")


async def _release(claim_id: str, owner: str) -> None:
    return None


def measure(claims: int, batches: int) -> dict[str, float]:
    """Median seconds per batch of 16 stored and 16 lost blocks, over ``batches`` batches,
    after ``claims`` claims were made (all ended: the usual case), the batches naming blocks
    of the latest claims (what vLLM evicts and stores as agents run)."""
    mirror = ClaimMirror(
        _Source(), asyncio.Lock(), ask=_never, release=_release, max_claims=claims + 1
    )
    for i in range(claims):
        spec = ClaimSpec(
            f"c{i}", "wf", f"pfx-{i:016x}-{BLOCKS}", IDENTITY, BLOCKS, ProtectionMode.DEMOTABLE
        )
        hashes = tuple(BlockHash(i * BLOCKS + j) for j in range(BLOCKS))
        mirror.put(MirroredClaim(spec, ClaimState.EXPIRED, 0, hashes=hashes))
    times = []
    for b in range(batches):
        base = (claims - 1 - b % max(1, claims)) * BLOCKS
        batch = {BlockHash(base + j) for j in range(16)}
        started = time.perf_counter()
        mirror.blocks_stored(batch)
        mirror.blocks_lost(batch, "evicted")
        times.append(time.perf_counter() - started)
    return {"claims": claims, "median_ms": statistics.median(times) * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--claims", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--batches", type=int, default=200)
    args = parser.parse_args()
    print("claims made   ms per KV-event batch (16 stored + 16 lost blocks, median)")
    for n in args.claims:
        row = measure(n, args.batches)
        print(f"{row['claims']:>11,}   {row['median_ms']:.4f}")


if __name__ == "__main__":
    main()
