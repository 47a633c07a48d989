"""``agentclaims conformance``: run levels L1-L7 and C1 on a backend and print the results.

``--backend embedded`` runs them through the gateway app in-process (``EmbeddedBackend``) and
``--backend http://HOST:PORT`` through a gateway on the network: the same scenarios over the
same claims protocol, so the same statuses. ``--json`` prints ``{"backend", "target",
"levels"}``: ``target`` is the runtime and version the backend's descriptor names, what a
lowering descriptor citing the run must describe for it to count (docs/lowering.md). Exit
status: 0 when every level passes, 1 otherwise, 2 for an unknown backend name.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agentclaims.conformance import LevelResult, run_suite
from agentclaims.errors import AgentClaimsError, UnknownNameError, UsageError

if TYPE_CHECKING:
    from agentclaims.backends.http import HTTPBackend

__all__ = ["run"]

_KNOWN_BACKENDS = ("embedded", "http://HOST:PORT", "https://HOST")
_MAX_EVIDENCE_SHOWN = 4


def _results_for(backend: str) -> tuple[dict[str, LevelResult], dict[str, Any] | None]:
    if backend == "embedded":
        from agentclaims.backends.embedded import EmbeddedBackend

        return asyncio.run(_run(EmbeddedBackend(1, name="embedded")))
    if backend.startswith(("http://", "https://")):
        from agentclaims.backends.http import HTTPBackend

        return asyncio.run(_run(HTTPBackend(backend)))
    raise UnknownNameError("backend", backend, _KNOWN_BACKENDS)


async def _run(backend: HTTPBackend) -> tuple[dict[str, LevelResult], dict[str, Any] | None]:
    """The levels, and what ran them: the runtime and version its descriptor names (what a
    lowering descriptor citing this run must describe for the run to count)."""
    async with backend:
        target = None
        with contextlib.suppress(AgentClaimsError):
            lowering = (await backend.descriptor()).get("lowering") or {}
            if isinstance(lowering, Mapping) and isinstance(lowering.get("runtime"), str):
                version = lowering.get("runtime_version")
                target = {
                    "runtime": lowering["runtime"],
                    "runtime_version": version if isinstance(version, str) else None,
                }
        return await run_suite(backend), target


def _evidence_text(result: LevelResult) -> str:
    shown = [str(e) for e in result.evidence[:_MAX_EVIDENCE_SHOWN]]
    hidden = len(result.evidence) - len(shown)
    if hidden:
        shown.append(f"+{hidden} more")
    return ", ".join(shown) or "-"


def _table(backend: str, results: Mapping[str, LevelResult]) -> str:
    rows = [("LEVEL", "STATUS", "EVIDENCE", "DETAIL")]
    rows += [(lvl, r.status.value, _evidence_text(r), r.detail) for lvl, r in results.items()]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [f"conformance of backend {backend!r}"]
    for row in rows:
        cells = [cell.ljust(w) for cell, w in zip(row[:3], widths, strict=True)]
        lines.append("  ".join([*cells, row[3]]))
    passed = sum(r.passed for r in results.values())
    lines.append(f"{passed}/{len(results)} levels pass")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Run the suite on ``args.backend``; print a table, or one JSON object with ``--json``."""
    try:
        results, target = _results_for(args.backend)
    except UnknownNameError as exc:
        print(f"agentclaims conformance: {exc}", file=sys.stderr)
        return 2
    except UsageError as exc:  # a URL without a host, say
        print(f"agentclaims conformance: --backend: {exc.message}", file=sys.stderr)
        return 2
    if args.json:
        levels = {level: r.to_dict() for level, r in results.items()}
        print(json.dumps({"backend": args.backend, "target": target, "levels": levels}))
    else:
        print(_table(args.backend, results))
    return 0 if all(r.passed for r in results.values()) else 1
