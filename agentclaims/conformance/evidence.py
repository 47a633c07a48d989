"""Conformance runs as evidence for a lowering descriptor's ``conformance_run`` anchors.

``self_test()`` runs the suite on a scratch reference engine (about 10 ms; cached per process):
what the reference engine's descriptor cites as ``self_test:reference_engine``.
``evidence_from_json`` reads a saved ``agentclaims conformance --json`` run (for a KV side
the checker cannot test itself, e.g. a vLLM lowering, whose operator ran the suite against it).
The lowering checker (``agentclaims.lowering``) decides what a run supports.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from agentclaims.errors import UsageError

__all__ = ["REFERENCE_RUNTIME", "RunEvidence", "evidence_from_json", "self_test"]

RunEvidence = dict[str, Any]
"""``{"source": ..., "levels": {level: status}, "target": {"runtime", "runtime_version"}}``:
the target is what ran the suite, as its descriptor named it (``None`` when a saved run does
not say: then it supports no descriptor)."""
REFERENCE_RUNTIME = "agentclaims-reference-engine"
"""The runtime the self-test runs on (the reference engine's descriptor names it so)."""


async def self_test(block_size: int = 16) -> RunEvidence:
    """Run L1-L7 and C1 on a scratch reference engine of ``block_size`` (cached)."""
    return dict(await _self_test(block_size))


@functools.cache
def _cached_results() -> dict[int, RunEvidence]:
    return {}


async def _self_test(block_size: int) -> RunEvidence:
    cache = _cached_results()
    if block_size not in cache:
        from agentclaims.conformance.scenarios import run_suite
        from agentclaims.conformance.target import reference_target

        results = await run_suite(reference_target(block_size, run_id="self-test"))
        statuses = {level: r.status.value for level, r in results.items()}
        cache[block_size] = {
            "source": "self_test:reference_engine",
            "levels": statuses,
            "target": {"runtime": REFERENCE_RUNTIME, "runtime_version": None},
        }
    return cache[block_size]


def evidence_from_json(path: str | Path) -> RunEvidence:
    """The evidence of a saved ``agentclaims conformance --json`` run."""
    try:
        doc = json.loads(Path(path).read_text())
        levels = {str(k): str(v["status"]) for k, v in doc["levels"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError("evidence", f"{path}: not a conformance run ({exc})") from None
    target = doc.get("target")
    if isinstance(target, dict) and isinstance(target.get("runtime"), str):
        version = target.get("runtime_version")
        target = {
            "runtime": target["runtime"],
            "runtime_version": version if isinstance(version, str) else None,
        }
    else:
        target = None
    return {
        "source": f"conformance_run:{doc.get('backend', path)}",
        "levels": levels,
        "target": target,
    }
