"""``agentclaims bench engine``: block operations per second and arbiter decision time.

Two measurements of the reference engine, on one core, in this process:

* **block ops/s**: a mix of agent-like requests (a shared system prompt, per-session histories
  that grow turn by turn, a few tenants' claims) run through ``begin``/``finish`` on a pool too
  small for all of them, so requests hit, miss and evict. One *block op* is one block reused from
  the prefix cache, allocated for a request, evicted from the cache, or released at ``finish``.
* **decision time**: 1,000 live claims over a 100k-block pool; the time of single
  ``submit_claim`` decisions and of ``begin`` decisions on the refusal/deferral path and on the
  serve path (median and p99, microseconds).

Figures are printed (a table, or one JSON object with ``--json``); nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from agentclaims.contract import ArbiterAction, CacheIdentity, ClaimSpec, ProtectionMode
from agentclaims.engine import BlockHash, KVEngine, prefix_id_of

__all__ = ["BlockOpsResult", "DecisionResult", "bench_block_ops", "bench_decisions", "run"]

BLOCK_OPS_GOAL = 1_000_000
DECISION_GOAL_US = 1_000.0
_BLOCK_SIZE = 16
_SESSIONS = 400
T = TypeVar("T")


def _identity() -> CacheIdentity:
    return CacheIdentity("bench", "scripted", "agentclaims-bytes", "default", _BLOCK_SIZE)


def _chain(rng: random.Random, n: int) -> list[BlockHash]:
    """``n`` distinct stand-ins for chained block hashes (hashing is not what is measured)."""
    return [BlockHash(rng.getrandbits(63)) for _ in range(n)]


def _claim(
    claim_id: str, owner: str, hashes: list[BlockHash], mode: ProtectionMode, **kw: Any
) -> ClaimSpec:
    return ClaimSpec(
        claim_id=claim_id,
        owner_scope=owner,
        object_id=prefix_id_of(hashes),
        cache_identity=_identity(),
        footprint_blocks=len(hashes),
        protection_mode=mode,
        **kw,
    )


@dataclass(frozen=True, slots=True)
class BlockOpsResult:
    """One run of the block-operation mix."""

    ops: int
    seconds: float
    requests: int
    reused: int
    allocated: int
    evicted: int
    released: int

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.seconds


def bench_block_ops(requests: int, *, seed: int = 0) -> BlockOpsResult:
    """Run ``requests`` agent-like requests through a pressured engine and count block ops."""
    rng = random.Random(seed)
    engine = KVEngine(2_048, _BLOCK_SIZE, clock=lambda: 0, event_buffer=10_000)
    system = _chain(rng, 24)
    sessions = [system + _chain(rng, rng.randint(4, 40)) for _ in range(_SESSIONS)]
    for i, hashes in enumerate(sessions[:12]):  # a few tenants protect their sessions
        mode = (ProtectionMode.SOFT_PRIORITY, ProtectionMode.BEST_EFFORT)[i % 2]
        engine.submit_claim(_claim(f"c{i}", f"t{i}", hashes[:24], mode), hashes[:24])
    plan: list[tuple[int, int]] = [
        (min(int(rng.paretovariate(0.3)) - 1, _SESSIONS - 1), rng.randint(1, 6))
        for _ in range(requests)
    ]
    window: list[str] = []
    reused = allocated = evicted = released = 0
    begin, finish = engine.begin, engine.finish
    start = time.perf_counter()
    for i, (s, grow) in enumerate(plan):
        hashes = sessions[s]
        if len(hashes) < 160:
            hashes.extend(_chain(rng, grow))
        rid = f"r{i}"
        out = begin(rid, hashes, extra_blocks=2)
        if out.served:
            used = len(hashes) + 2
            reused += out.hit_blocks
            allocated += used - out.hit_blocks
            evicted += out.evicted_blocks
            released += used
            window.append(rid)
        if len(window) > 6:
            finish(window.pop(0))
    for rid in window:
        finish(rid)
    seconds = time.perf_counter() - start
    engine.check_invariants()
    return BlockOpsResult(
        ops=reused + allocated + evicted + released,
        seconds=seconds,
        requests=requests,
        reused=reused,
        allocated=allocated,
        evicted=evicted,
        released=released,
    )


@dataclass(frozen=True, slots=True)
class DecisionResult:
    """Latencies (microseconds) of one kind of arbiter decision."""

    name: str
    samples: list[float]

    @property
    def median_us(self) -> float:
        return statistics.median(self.samples)

    @property
    def p99_us(self) -> float:
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def _timed(fn: Callable[..., T], *args: Any, **kwargs: Any) -> tuple[float, T]:
    """Microseconds one call of ``fn(*args, **kwargs)`` takes, and what it returned."""
    start = time.perf_counter_ns()
    out = fn(*args, **kwargs)
    return (time.perf_counter_ns() - start) / 1_000, out


def _expect(ok: bool, what: str, got: object) -> None:
    """Guard the measurement: a decision of the wrong kind would time the wrong path."""
    if not ok:
        raise RuntimeError(f"bench engine: expected {what}, got {got!r}")


def bench_decisions(
    *, pool_blocks: int = 100_000, live_claims: int = 1_000, samples: int = 300, seed: int = 0
) -> list[DecisionResult]:
    """Time submit/refuse-or-defer/serve decisions with ``live_claims`` claims on the pool."""
    rng = random.Random(seed)
    engine = KVEngine(pool_blocks, _BLOCK_SIZE, clock=lambda: 0, event_buffer=10_000)
    per_claim = max(1, int(pool_blocks * 0.8) // live_claims)
    modes = (
        ProtectionMode.HARD_PROTECTED,
        ProtectionMode.HARD_PROTECTED,
        ProtectionMode.SOFT_PRIORITY,
        ProtectionMode.DEMOTABLE,
        ProtectionMode.BEST_EFFORT,
    )
    for i in range(live_claims):
        hashes = _chain(rng, per_claim)
        engine.begin(f"warm{i}", hashes)
        engine.finish(f"warm{i}")
        mode = modes[i % len(modes)]
        engine.submit_claim(_claim(f"live{i}", f"tenant{i % 50}", hashes, mode), hashes)
    holder = _chain(rng, pool_blocks // 20)  # active work that a deferral waits for
    engine.begin("holder", holder)

    submit: list[float] = []
    for i in range(samples):
        hashes = _chain(rng, per_claim)
        spec = _claim(f"probe{i}", "prober", hashes, modes[i % len(modes)])
        us, decision = _timed(engine.submit_claim, spec, hashes)
        _expect(decision.accepted, "an accepted claim", decision)
        submit.append(us)
        engine.release_claim(spec.claim_id, "prober")

    hard_total = engine.protected_resident_blocks
    refuse: list[float] = []
    for i in range(samples):
        # alternate: too big even after the holder drains (refuse) / fits after it (defer)
        size = pool_blocks - hard_total + (1 if i % 2 else -len(holder) // 2)
        hashes = _chain(rng, size)
        us, out = _timed(engine.begin, f"big{i}", hashes)
        want = ArbiterAction.REFUSE_ACTIVE if i % 2 else ArbiterAction.DEFER_ACTIVE
        _expect(out.action is want, want.value, out)
        refuse.append(us)

    serve: list[float] = []
    prefix = _chain(rng, 32)
    for i in range(samples):
        hashes = prefix + _chain(rng, 8)
        us, out = _timed(engine.begin, f"small{i}", hashes, extra_blocks=2)
        _expect(out.served, "a served request", out)
        serve.append(us)
        engine.finish(f"small{i}")
    engine.check_invariants()
    return [
        DecisionResult("submit_claim", submit),
        DecisionResult("begin: refuse/defer", refuse),
        DecisionResult("begin: serve", serve),
    ]


def run(args: argparse.Namespace) -> int:
    """Entry point of ``agentclaims bench engine``."""
    quick = bool(getattr(args, "quick", False))
    repeats = 3 if quick else 5
    requests = 2_000 if quick else 20_000
    runs = [bench_block_ops(requests, seed=r) for r in range(repeats)]
    best = sorted(runs, key=lambda r: r.ops_per_s)[len(runs) // 2]
    pool, claims, samples = (20_000, 200, 100) if quick else (100_000, 1_000, 400)
    decisions = bench_decisions(pool_blocks=pool, live_claims=claims, samples=samples)
    result: dict[str, Any] = {
        "block_ops": {
            "counted": "blocks reused (prefix hits) + allocated + evicted + released at finish",
            "repeats": repeats,
            "requests_per_repeat": requests,
            "median_ops_per_s": round(best.ops_per_s),
            "all_ops_per_s": [round(r.ops_per_s) for r in runs],
            "reused": best.reused,
            "allocated": best.allocated,
            "evicted": best.evicted,
            "released": best.released,
            "goal_ops_per_s": BLOCK_OPS_GOAL,
            "meets_goal": best.ops_per_s >= BLOCK_OPS_GOAL,
        },
        "decisions": {
            "pool_blocks": pool,
            "live_claims": claims,
            "samples": samples,
            "goal_us": DECISION_GOAL_US,
            **{
                d.name: {
                    "median_us": round(d.median_us, 1),
                    "p99_us": round(d.p99_us, 1),
                    "meets_goal": d.p99_us <= DECISION_GOAL_US,
                }
                for d in decisions
            },
        },
    }
    if getattr(args, "json", False):
        print(json.dumps(result, indent=2))
        return 0
    ops = result["block_ops"]
    print(f"block ops/s (one core; {ops['counted']})")
    print(f"  median of {repeats}: {ops['median_ops_per_s']:>12,}   goal >= {BLOCK_OPS_GOAL:,}")
    print(f"  runs: {', '.join(f'{x:,}' for x in ops['all_ops_per_s'])}")
    print(
        f"  per run: reused {best.reused:,}  allocated {best.allocated:,}  "
        f"evicted {best.evicted:,}  released {best.released:,}"
    )
    print(
        f"\narbiter decision time ({claims:,} live claims, {pool:,}-block pool, {samples} samples)"
    )
    print(
        f"  {'decision':<22}{'median µs':>12}{'p99 µs':>12}   goal p99 <= {DECISION_GOAL_US:g} µs"
    )
    for d in decisions:
        print(f"  {d.name:<22}{d.median_us:>12.1f}{d.p99_us:>12.1f}")
    return 0
