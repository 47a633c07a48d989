"""The wire types' JSON codec against plain pydantic v2 models, side by side: what the wire
types cost per claim on the per-call path (issue 25.8).

For a claim as a request carries it (``ClaimSpec`` with its cache identity, mode, TTL and reuse
hint) and for the decision and outcome a completion answers with, it times, in one process:

- ``wire``: agentclaims' wire types (``from_dict``: pydantic's ``TypeAdapter`` over the frozen
  dataclasses, then each type's own rules in ``__post_init__``; ``to_dict``: the few-line
  writer of ``contract/wire.py``);
- ``pydantic``: equivalent pydantic v2 models (strict types, frozen, forbidding unknown
  fields, field constraints instead of ``__post_init__``), ``model_validate`` /
  ``model_dump(mode="json")``.

Before the move (the hand-written codec, 2026-12-02): 44.3 us to read a claim, 4.0 to write it.
It prints the median microseconds per operation over ``--repeats`` runs of ``--n`` operations
each, and the ratio. Run: ``.venv/bin/python benchmarks/bench_wire.py``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentclaims.contract import CacheIdentity, ClaimSpec, ProtectionMode
from agentclaims.protocol import ActiveOutcome, ClaimDecision

CLAIM = {
    "claim_id": "s-1a2b3c4d5e6f-c7",
    "owner_scope": "workflow:wf-0123456789ab",
    "object_id": "pfx-0123456789abcdef-12",
    "cache_identity": {
        "cache_key_domain": "agentclaims-gateway",
        "model_id": "scripted",
        "tokenizer_id": "agentclaims-words",
        "salt_namespace": "default",
        "block_size": 16,
    },
    "footprint_blocks": 12,
    "protection_mode": "demotable",
    "ttl_s": 2.5,
    "reuse_hint": {
        "agent": "researcher",
        "wait_class": "tool",
        "tool": "search",
        "expected_s": 1.8,
    },
}


class _Mode(StrEnum):
    HARD_PROTECTED = "hard_protected"
    EXPIRING = "expiring"
    SOFT_PRIORITY = "soft_priority"
    DEMOTABLE = "demotable"
    OFFLOADABLE = "offloadable"
    BEST_EFFORT = "best_effort"


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class PIdentity(_Strict):
    cache_key_domain: str
    model_id: str
    tokenizer_id: str
    salt_namespace: str
    block_size: int = Field(gt=0)
    adapter_id: str | None = None


class PHint(_Strict):
    agent: str | None = None
    wait_class: Literal["tool", "permission", "user", "subagents", "llm", "unknown"] = "unknown"
    tool: str | None = None
    expected_s: float | None = Field(default=None, ge=0)
    subagents: int | None = Field(default=None, ge=0)
    session: Literal["open", "closed", "interrupted"] = "open"
    keep_blocks: int | None = Field(default=None, ge=0)


class PLeading(_Strict):
    kind: Literal["leading_prefix_at_least"] = "leading_prefix_at_least"
    min_blocks: int = Field(gt=0)


class PClaim(_Strict):
    claim_id: str = Field(min_length=1)
    owner_scope: str = Field(min_length=1)
    object_id: str = Field(min_length=1)
    cache_identity: PIdentity
    footprint_blocks: int = Field(gt=0)
    protection_mode: _Mode = Field(strict=False)
    materialization_predicate: PLeading | None = None
    duration_steps: int | None = Field(default=None, gt=0)
    ttl_s: float | None = Field(default=None, gt=0)
    reuse_hint: PHint | None = None


class POutcome(_Strict):
    request_id: str
    action: str
    feasibility: str
    hit_blocks: int = 0
    restored_blocks: int = 0
    computed_blocks: int = 0
    evicted_blocks: int = 0
    blocking_claim_ids: tuple[str, ...] = ()
    shortfall_blocks: int = 0
    retry_after_s: float | None = None


class PDecision(_Strict):
    claim_id: str
    decision: str
    state: str
    action: str | None = None
    reason: str | None = None
    conditions: dict[str, Any] = Field(default_factory=dict)


def _time(op: Callable[[], object], n: int, repeats: int) -> float:
    """Median microseconds per call of ``op``."""
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(n):
            op()
        runs.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    spec = ClaimSpec.from_dict(CLAIM)
    pspec = PClaim.model_validate(CLAIM)
    assert spec.protection_mode is ProtectionMode.DEMOTABLE
    assert isinstance(spec.cache_identity, CacheIdentity)
    assert pspec.cache_identity.model_dump(exclude_none=True) == spec.cache_identity.to_dict()
    outcome = ActiveOutcome.from_dict(
        {"request_id": "r-1", "action": "serve_active_preserve_resident", "feasibility": "feasible"}
    )
    poutcome = POutcome.model_validate(
        {"request_id": "r-1", "action": "serve_active_preserve_resident", "feasibility": "feasible"}
    )
    decision = ClaimDecision.from_dict(
        {"claim_id": "c1", "decision": "accepted", "state": "materialized"}
    )
    pdecision = PDecision.model_validate(
        {"claim_id": "c1", "decision": "accepted", "state": "materialized"}
    )
    rows = [
        (
            "claim: decode",
            lambda: ClaimSpec.from_dict(CLAIM),
            lambda: PClaim.model_validate(CLAIM),
        ),
        ("claim: encode", spec.to_dict, lambda: pspec.model_dump(mode="json", exclude_none=True)),
        (
            "answer: encode (outcome + 1 decision)",
            lambda: (outcome.to_dict(), decision.to_dict()),
            lambda: (poutcome.model_dump(mode="json"), pdecision.model_dump(mode="json")),
        ),
    ]
    print(f"{'operation':40s} {'wire us':>9s} {'pydantic us':>12s} {'pydantic/wire':>15s}")
    for name, ours, theirs in rows:
        a = _time(ours, args.n, args.repeats)
        b = _time(theirs, args.n, args.repeats)
        print(f"{name:40s} {a:9.2f} {b:12.2f} {b / a:15.2f}")


if __name__ == "__main__":
    main()
