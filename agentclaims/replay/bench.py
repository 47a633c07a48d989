"""Compare policies on one workload: every online policy, then the optimum on the recorded
schedule, and the share of the LRU-to-optimum gap each policy closes.

The rows on vLLM's pool (``-vllm``, :mod:`agentclaims.replay.vllm_pool`) measure their gap from
``lru-vllm``, the LRU of their own pool (stock vLLM), which joins them; the others from the
reference engine's ``lru``. The optimum is one ceiling for both (Belady on the same request
order)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentclaims.backends.admission import AdmissionWindow
from agentclaims.errors import UnknownNameError, UsageError
from agentclaims.replay.harness import ReplayResult, TraceInput, run_replay, working_set_blocks
from agentclaims.replay.model import ServiceModel
from agentclaims.replay.policies import FUTURE_POLICIES, POLICY_NAMES, ROW_LABELS, make_policy

__all__ = [
    "ADMISSION_MODES",
    "ADMITTED_ROW",
    "VLLM_LRU",
    "Comparison",
    "aimd_window",
    "baseline_of",
    "compare_policies",
    "gap_closed",
    "resolve_policies",
]

ADMISSION_MODES = ("none", "aimd")
"""``--admission``: ``aimd`` adds the row ``agentclaims+aimd``, the agentclaims policy with the
SDK's AIMD admission window on the number of traces running at once."""
ADMITTED_ROW = "agentclaims+aimd"
VLLM_LRU = "lru-vllm"
"""The LRU row of vLLM's pool: the baseline of every ``-vllm`` row's gap."""


def baseline_of(name: str) -> str:
    """The LRU row a row's gap is measured from: ``lru-vllm`` on vLLM's pool, else ``lru``."""
    return VLLM_LRU if name.endswith("-vllm") else "lru"


def aimd_window(sessions: int) -> AdmissionWindow:
    """The admission window of the ``agentclaims+aimd`` row: it starts with every slot open
    (``sessions``, as without admission), halves on pressure (requests that waited for memory,
    harm, a hit-ratio collapse, running requests filling the pool) and grows back by one per
    healthy period of 32 requests, between 1 and ``sessions``."""
    return AdmissionWindow(initial=sessions, min_window=1, max_window=sessions)


def resolve_policies(names: Sequence[str] | None, admission: str = "none") -> list[str]:
    """Check names (unknown -> ``UnknownNameError``); default: every row on the reference
    engine (the rows on vLLM's pool run when named); ``lru`` and ``opt`` are
    always added (the gap needs both), ``lru-vllm`` with any row on vLLM's pool (its gap's
    baseline), and with ``admission="aimd"`` ``agentclaims`` too (the row its admitted variant
    is compared with)."""
    if admission not in ADMISSION_MODES:
        raise UnknownNameError("admission", admission, ADMISSION_MODES)
    chosen = list(POLICY_NAMES) if not names else list(dict.fromkeys(names))
    for name in chosen:
        make_policy(name, schedule={})  # raises UnknownNameError on a bad name
    for must in ("lru", "opt"):
        if must not in chosen:
            chosen.append(must)
    on_vllm = [i for i, n in enumerate(chosen) if baseline_of(n) == VLLM_LRU]
    if on_vllm and VLLM_LRU not in chosen:
        chosen.insert(on_vllm[0], VLLM_LRU)
    if admission == "aimd" and "agentclaims" not in chosen:
        chosen.insert(-1, "agentclaims")
    return chosen


def gap_closed(hit: float, lru: float, opt: float) -> float | None:
    """``(hit - lru) / (opt - lru)``; ``None`` when LRU already reaches the optimum."""
    if opt - lru <= 1e-12:
        return None
    return (hit - lru) / (opt - lru)


@dataclass
class Comparison:
    """Results of one capacity point."""

    capacity_blocks: int
    working_set_blocks: int
    sessions: int
    results: dict[str, ReplayResult]

    def to_dict(self) -> dict[str, Any]:
        opt = self.results["opt"].hit_ratio
        policies = {}
        for name, res in self.results.items():
            data = res.to_dict()
            base = baseline_of(name) if baseline_of(name) in self.results else "lru"
            lru = self.results[base].hit_ratio
            data["label"] = ROW_LABELS.get(name, name)
            data["gap_closed"] = gap_closed(res.hit_ratio, lru, opt)
            data["gap_baseline"] = base
            data["uses_future"] = name in FUTURE_POLICIES
            policies[name] = data
        return {
            "capacity_blocks": self.capacity_blocks,
            "working_set_blocks": self.working_set_blocks,
            "capacity_frac": self.capacity_blocks / self.working_set_blocks
            if self.working_set_blocks
            else None,
            "sessions": self.sessions,
            "policies": policies,
        }


def compare_policies(
    traces: TraceInput,
    policies: Sequence[str] | None = None,
    *,
    sessions: int = 32,
    capacity_blocks: int | None = None,
    capacity_frac: float | None = None,
    block_size: int = 64,
    service: ServiceModel | None = None,
    working_set: int | None = None,
    on_run: Callable[[str], Callable[[int], None] | None] | None = None,
    admission: str = "none",
) -> Comparison:
    """Replay ``traces`` under each policy at one capacity (blocks, or a fraction of the
    working set). ``on_run(name)`` may return a per-trace progress callback. ``admission=
    "aimd"`` adds the row ``agentclaims+aimd`` (the agentclaims policy behind the SDK's AIMD
    admission window, :func:`aimd_window`) next to ``agentclaims`` without it."""
    names = resolve_policies(policies, admission)
    service = service or ServiceModel()
    ws = working_set if working_set is not None else working_set_blocks(traces, sessions, service)
    if capacity_blocks is None:
        frac = 0.1 if capacity_frac is None else capacity_frac
        if not 0 < frac <= 10:
            raise UsageError("capacity_frac", f"must be in (0, 10], got {frac!r}")
        capacity_blocks = max(1, int(ws * frac))
    results: dict[str, ReplayResult] = {}
    ordered = ["lru", *(n for n in names if n not in ("lru", "opt")), "opt"]
    if admission == "aimd":
        ordered.insert(ordered.index("agentclaims") + 1, ADMITTED_ROW)
    for name in ordered:
        admitted = name == ADMITTED_ROW
        policy = make_policy(
            "agentclaims" if admitted else name,
            service=service,
            block_size=block_size,
            schedule=results["lru"].schedule if name == "opt" else None,
        )
        results[name] = run_replay(
            traces,
            policy,
            capacity_blocks=capacity_blocks,
            sessions=sessions,
            block_size=block_size,
            service=service,
            record=name == "lru",
            progress=on_run(name) if on_run else None,
            admission=aimd_window(sessions) if admitted else None,
        )
        results[name].policy = name
    results["lru"].schedule = None
    return Comparison(capacity_blocks, ws, sessions, results)
