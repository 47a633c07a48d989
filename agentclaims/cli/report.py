"""``agentclaims report LOG... [--json] [--plot FILE.png] [--brief]``: per-workflow outcomes
from the outcome logs.

Prints a table per workflow and a totals row, then each workflow's claims by protection mode and
final state, the workflows that did not complete (failed, cancelled, left early), the runs of
each conversation thread, each claim's timeline (not with ``--brief``), then where malformed
lines are. ``--plot`` also draws the claims' timelines to a PNG (matplotlib, the ``plot``
extra). ``--json`` prints one JSON object
``{"workflows": {...}, "totals": {...}, "malformed_lines": N}`` on stdout (malformed positions
go to stderr). A missing log, logs with no workflow in them, or a ``--plot`` file that cannot
be written: a message on stderr, nothing on stdout, and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping
from typing import Any

from agentclaims.errors import UsageError
from agentclaims.observability import summarise

__all__ = ["format_table", "run"]


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


#: (heading, how to show one summary's value); workflows and totals share the columns.
_COLUMNS: tuple[tuple[str, Callable[[Mapping[str, Any]], str]], ...] = (
    ("claims", lambda s: str(s["claims"])),
    ("harm", lambda s: str(s["true_harm"])),
    ("refusals", lambda s: str(s["refusals"])),
    ("deferrals", lambda s: f"{s['deferrals']} ({s['deferral_s']:.2f}s)"),
    ("reroutes", lambda s: str(s["reroutes"])),
    ("relaxed", lambda s: str(s["relaxations"])),
    ("failed", lambda s: str(s["fails"])),
    ("hit ratio", lambda s: _num(s["hit_ratio"], 3)),
    ("recomputed", lambda s: str(s["recomputed_tokens"])),
    ("llm calls", lambda s: str(s["llm_calls"])),
    ("tool calls", lambda s: str(s["tool_calls"])),
    ("duration", lambda s: _num(s.get("duration_s", s.get("max_duration_s")), 3) + "s"),
)


def _counts(counts: Mapping[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in counts.items()) or "-"


def _not_completed(workflows: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The workflows whose session did not complete: failed, cancelled, left early."""
    rows = [
        f"  {wf}: {s['status']}" + (f" ({s['error']})" if s.get("error") else "")
        for wf, s in workflows.items()
        if s.get("status") not in (None, "completed")
    ]
    return ["", "workflows that did not complete", *rows] if rows else []


def _timelines(workflows: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Each claim's story: what happened to it, when (seconds after its session started)."""
    out = ["", "claim timelines (seconds after the session started)"]
    for wf, s in workflows.items():
        for claim_id, line in (s.get("claim_timelines") or {}).items():
            out.append(
                f"  {wf} {claim_id} node={line['node'] or '-'} mode={line['mode'] or '-'} "
                f"end={line['end_reason'] or 'not ended in the log'}"
            )
            for step in line["events"]:
                at = "?" if step["t_s"] is None else f"{step['t_s']:.3f}"
                extra = " ".join(
                    f"{k}={v}" for k, v in step.items() if k not in ("t_s", "event", "node")
                )
                out.append(f"    +{at}s {step['event']} {extra}".rstrip())
    return out


def format_table(summary: Mapping[str, Any], *, timelines: bool = True) -> str:
    """The human-readable report of a ``summarise`` result (``timelines``: with each
    claim's timeline)."""
    workflows: Mapping[str, Mapping[str, Any]] = summary["workflows"]
    totals: Mapping[str, Any] = summary["totals"]
    rows = [["workflow", *(head for head, _ in _COLUMNS)]]
    rows += [[wf, *(show(s) for _, show in _COLUMNS)] for wf, s in workflows.items()]
    rows.append(["total", *(show(totals) for _, show in _COLUMNS)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = [
        f"{len(workflows)} workflow(s), {totals['lines']} lines, "
        f"{summary['malformed_lines']} malformed",
        "",
    ]
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        out.append("  ".join(cells).rstrip())
    out += ["", "claims by protection mode | by final state"]
    name_width = max(len(name) for name in (*workflows, "total"))
    for wf, s in [*workflows.items(), ("total", totals)]:
        out.append(
            f"  {wf.ljust(name_width)}  {_counts(s['claims_by_mode'])} | "
            f"{_counts(s['claims_by_state'])}"
        )
    for wf, s in workflows.items():
        out += [f"  {wf}: claim {problem}" for problem in s["claim_problems"]]
        if len(s["files"]) > 1:
            out.append(f"  note: {wf} is in {len(s['files'])} files; copies of one log count twice")
    out += _not_completed(workflows)
    threads: Mapping[str, list[str]] = summary.get("threads") or {}
    if threads:
        out += ["", "threads (the runs of one conversation, in start order)"]
        out += [f"  {thread}: {', '.join(wfs)}" for thread, wfs in sorted(threads.items())]
    if timelines:
        out += _timelines(workflows)
    if summary["malformed_lines"]:
        out += ["", f"malformed lines ({summary['malformed_lines']}):"]
        out += [f"  {m['file']}:{m['line']}: {m['error']}" for m in summary["malformed"]]
        hidden = summary["malformed_lines"] - len(summary["malformed"])
        if hidden:
            out.append(f"  ... and {hidden} more")
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    try:
        summary = summarise(args.logs)
    except UsageError as exc:
        print(f"agentclaims report: {exc.message}", file=sys.stderr)
        return 2
    if not summary["workflows"] and not summary["malformed_lines"]:
        print(
            f"agentclaims report: no workflow logs found in {', '.join(args.logs)} (a folder's "
            "*.jsonl files are read, not its subfolders)",
            file=sys.stderr,
        )
        return 2
    plot = getattr(args, "plot", None)
    if plot:
        try:
            from agentclaims.observability.plot import plot_timelines
        except ImportError as exc:  # pragma: no cover - matplotlib is the `plot` extra
            print(f"agentclaims report: --plot needs matplotlib ({exc})", file=sys.stderr)
            return 3
        try:
            plot_timelines(summary, plot)
        except (OSError, ValueError) as exc:  # no such folder, no permission, no such format
            error = UsageError("--plot", f"cannot write {plot}: {exc}")
            print(f"agentclaims report: {error}", file=sys.stderr)
            return 2
    if args.json:
        for m in summary["malformed"]:
            print(f"malformed line {m['file']}:{m['line']}: {m['error']}", file=sys.stderr)
        keys = ("workflows", "threads", "totals", "malformed_lines")
        print(json.dumps({k: summary[k] for k in keys}, sort_keys=True))
    else:
        print(format_table(summary, timelines=not getattr(args, "brief", False)))
        if plot:
            print(f"\ntimeline plot: {plot}")
    return 0
