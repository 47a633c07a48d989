"""``agentclaims bench engine``: block operations per second and arbiter decision time.

Two measurements of the reference engine, on one core, in this process:

* **block ops/s**: a mix of agent-like requests (a shared system prompt, per-session histories
  that grow turn by turn, a few tenants' claims) run through ``begin``/``finish`` on a pool too
  small for all of them, so requests hit, miss and evict. One *block op* is one block reused from
  the prefix cache, allocated for a request, evicted from the cache, or released at ``finish``.
* **decision time**: 1,000 live claims over a 100k-block pool; the time of single
  ``submit_claim`` decisions and of ``begin`` decisions on the refusal/deferral path and on the
  serve path (median and p99, microseconds).

Both are timed by the wall clock and by the CPU time of this thread; the goals are judged on CPU
time, which other processes on a shared machine do not inflate. Figures are printed (a table, or
one JSON object with ``--json``); nothing here asserts a speed.
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
    """Wall-clock seconds of the measured loop."""
    cpu_seconds: float
    """CPU seconds of this thread in the loop (not inflated by other processes)."""
    requests: int
    reused: int
    allocated: int
    evicted: int
    released: int

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.seconds

    @property
    def ops_per_cpu_s(self) -> float:
        return self.ops / self.cpu_seconds


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
    start, cpu_start = time.perf_counter(), time.thread_time()
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
    seconds, cpu_seconds = time.perf_counter() - start, time.thread_time() - cpu_start
    engine.check_invariants()
    return BlockOpsResult(
        ops=reused + allocated + evicted + released,
        seconds=seconds,
        cpu_seconds=cpu_seconds,
        requests=requests,
        reused=reused,
        allocated=allocated,
        evicted=evicted,
        released=released,
    )


def _p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


@dataclass(frozen=True, slots=True)
class DecisionResult:
    """Latencies (microseconds) of one kind of arbiter decision: wall clock, and the CPU time
    of the deciding thread (which other processes on a shared machine do not inflate)."""

    name: str
    wall: list[float]
    cpu: list[float]

    def summary(self) -> dict[str, float]:
        """Median and p99 of the wall and the CPU samples."""
        out: dict[str, float] = {}
        for prefix, samples in (("", self.wall), ("cpu_", self.cpu)):
            out[f"{prefix}median_us"] = statistics.median(samples)
            out[f"{prefix}p99_us"] = _p99(samples)
        return out


class _Timer:
    """Collects wall and thread-CPU microseconds of single calls."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def __call__(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
        out = fn(*args, **kwargs)
        self.wall.append((time.perf_counter_ns() - wall) / 1_000)
        self.cpu.append((time.thread_time_ns() - cpu) / 1_000)
        return out

    def result(self) -> DecisionResult:
        return DecisionResult(self.name, self.wall, self.cpu)


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

    submit = _Timer("submit_claim")
    for i in range(samples):
        hashes = _chain(rng, per_claim)
        spec = _claim(f"probe{i}", "prober", hashes, modes[i % len(modes)])
        decision = submit(engine.submit_claim, spec, hashes)
        _expect(decision.accepted, "an accepted claim", decision)
        engine.release_claim(spec.claim_id, "prober")

    hard_total = engine.protected_resident_blocks
    refuse = _Timer("begin: refuse/defer")
    for i in range(samples):
        # alternate: too big even after the holder drains (refuse) / fits after it (defer)
        size = pool_blocks - hard_total + (1 if i % 2 else -len(holder) // 2)
        hashes = _chain(rng, size)
        out = refuse(engine.begin, f"big{i}", hashes)
        want = ArbiterAction.REFUSE_ACTIVE if i % 2 else ArbiterAction.DEFER_ACTIVE
        _expect(out.action is want, want.value, out)

    serve = _Timer("begin: serve")
    prefix = _chain(rng, 32)
    for i in range(samples):
        hashes = prefix + _chain(rng, 8)
        out = serve(engine.begin, f"small{i}", hashes, extra_blocks=2)
        _expect(out.served, "a served request", out)
        engine.finish(f"small{i}")
    engine.check_invariants()
    return [submit.result(), refuse.result(), serve.result()]


def _decision_summary(runs: list[list[DecisionResult]]) -> dict[str, dict[str, Any]]:
    """Per decision kind: each statistic is the median over the repeats."""
    out: dict[str, dict[str, Any]] = {}
    for kind in zip(*runs, strict=True):
        each = [d.summary() for d in kind]
        stats = {key: statistics.median(s[key] for s in each) for key in each[0]}
        out[kind[0].name] = {k: round(v, 1) for k, v in stats.items()}
        out[kind[0].name]["meets_goal"] = stats["cpu_p99_us"] <= DECISION_GOAL_US
    return out


def run(args: argparse.Namespace) -> int:
    """Entry point of ``agentclaims bench engine``: print the figures (``--json``: as JSON)."""
    quick = bool(getattr(args, "quick", False))
    repeats = 3 if quick else 5
    requests = 2_000 if quick else 20_000
    runs = sorted(
        (bench_block_ops(requests, seed=r) for r in range(repeats)), key=lambda r: r.ops_per_cpu_s
    )
    mid = runs[len(runs) // 2]
    pool, claims, samples, d_repeats = (20_000, 200, 100, 1) if quick else (100_000, 1_000, 400, 3)
    decisions = _decision_summary(
        [
            bench_decisions(pool_blocks=pool, live_claims=claims, samples=samples, seed=r)
            for r in range(d_repeats)
        ]
    )
    block_ops: dict[str, Any] = {
        "counted": "blocks reused (prefix hits) + allocated + evicted + released at finish",
        "repeats": repeats,
        "requests_per_repeat": requests,
        "median_ops_per_cpu_s": round(mid.ops_per_cpu_s),
        "median_run_ops_per_wall_s": round(mid.ops_per_s),
        "all_ops_per_cpu_s": [round(r.ops_per_cpu_s) for r in runs],
        "median_run": {
            "reused": mid.reused,
            "allocated": mid.allocated,
            "evicted": mid.evicted,
            "released": mid.released,
        },
        "goal_ops_per_s": BLOCK_OPS_GOAL,
        "meets_goal": mid.ops_per_cpu_s >= BLOCK_OPS_GOAL,
    }
    setup = {
        "pool_blocks": pool,
        "live_claims": claims,
        "samples": samples,
        "repeats": d_repeats,
        "goal_p99_us": DECISION_GOAL_US,
    }
    if getattr(args, "json", False):
        print(json.dumps({"block_ops": block_ops, "decisions": {**setup, **decisions}}, indent=2))
        return 0
    print(f"block ops/s, one core ({block_ops['counted']})")
    print(
        f"  median of {repeats} runs: {mid.ops_per_cpu_s:>12,.0f} per CPU second "
        f"({mid.ops_per_s:,.0f} per wall second)   goal >= {BLOCK_OPS_GOAL:,}"
    )
    print(f"  runs (per CPU second): {', '.join(f'{x:,}' for x in block_ops['all_ops_per_cpu_s'])}")
    print(
        f"  median run: reused {mid.reused:,}  allocated {mid.allocated:,}  "
        f"evicted {mid.evicted:,}  released {mid.released:,}"
    )
    print(
        f"\narbiter decision time, µs ({claims:,} live claims, {pool:,}-block pool, "
        f"{samples} samples x {d_repeats}; goal p99 <= {DECISION_GOAL_US:g} µs)"
    )
    print(f"  {'decision':<22}{'median':>10}{'p99':>10}{'cpu median':>12}{'cpu p99':>10}")
    for name, d in decisions.items():
        print(
            f"  {name:<22}{d['median_us']:>10.1f}{d['p99_us']:>10.1f}"
            f"{d['cpu_median_us']:>12.1f}{d['cpu_p99_us']:>10.1f}"
        )
    return 0
