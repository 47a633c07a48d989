"""``agentclaims bench replay``: replay agentic traces under each policy and compare.

Prints a table per capacity point (or, with ``--json``, exactly one JSON object on stdout) and
a progress bar on stderr. Rows on vLLM's pool (``lru-vllm``, ``agentclaims-vllm``) are shown by
their label ("agentclaims on vLLM's pool") and measure their gap from ``lru-vllm``. ``--plot
FILE.png`` sweeps 10%, 25% and 50% of the working set (plus the requested point), prints a table
per point and draws hit ratio against capacity per policy.

Every flag, the plot's file and the trace files are checked before anything runs: bad input is
a ``UsageError`` naming the flag as typed (exit 2), and nothing is written. Each malformed trace
file is named once on stderr with what is wrong in it and left out; a folder without one
readable trace is a usage error.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from agentclaims.errors import UsageError
from agentclaims.replay import (
    Comparison,
    TraceSource,
    compare_policies,
    resolve_policies,
    working_set_blocks,
)
from agentclaims.replay.model import ServiceModel
from agentclaims.replay.policies import ROW_LABELS

__all__ = ["run"]

SWEEP_FRACS = (0.1, 0.25, 0.5)

#: the flag of each field the replay's own checks name in their errors
_FLAGS = {
    "traces": "--traces",
    "limit": "--limit",
    "split": "--split",
    "policy": "--policies",
    "admission": "--admission",
    "sessions": "--sessions",
    "capacity_blocks": "--capacity-blocks",
    "capacity_frac": "--capacity-frac",
}

_COLUMNS = (
    ("policy", "{:<POLICY}"),
    ("hit_ratio", "{:>9.4f}"),
    ("gap_closed", "{:>10}"),
    ("recomputed_tokens", "{:>17,}"),
    ("completion_s_mean", "{:>17.1f}"),
    ("refusals", "{:>8}"),
    ("deferrals", "{:>9}"),
    ("true_harm", "{:>9}"),
    ("peak_protected_blocks", "{:>21}"),
    ("wall_s", "{:>8.1f}"),
    ("cpu_s", "{:>7.1f}"),
)


class _Progress:
    """A small progress bar on stderr (tqdm is not a dependency)."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total = max(1, total)
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.label = ""
        self.started = time.monotonic()
        self._drawn = 0.0

    def step(self, label: str) -> Callable[[int], None]:
        self.label = label

        def tick(_: int) -> None:
            self.done += 1
            now = time.monotonic()
            if now - self._drawn >= 0.5 or self.done >= self.total:
                self._drawn = now
                self.draw()

        return tick

    def draw(self) -> None:
        frac = min(1.0, self.done / self.total)
        bar = "#" * int(frac * 30)
        elapsed = time.monotonic() - self.started
        self.stream.write(f"\r[{bar:<30}] {frac:6.1%} {self.label:<10} {elapsed:6.0f}s")
        self.stream.flush()

    def close(self) -> None:
        self.stream.write("\n")
        self.stream.flush()


def _table(comp: Comparison, out: TextIO) -> None:
    data = comp.to_dict()
    width = max(12, *(len(row["label"]) + 1 for row in data["policies"].values()))
    columns = [(name, fmt.replace("POLICY", str(width))) for name, fmt in _COLUMNS]
    frac = data["capacity_frac"]
    out.write(
        f"\ncapacity {comp.capacity_blocks} blocks"
        f" ({frac:.0%} of the working set {comp.working_set_blocks} blocks),"
        f" {comp.sessions} sessions\n"
    )
    header = [
        fmt.split(":")[0] + ("}" if name != "policy" else f":<{width}}}") for name, fmt in columns
    ]
    out.write(" ".join(header).format(*(name for name, _ in columns)) + "\n")
    vllm = False
    for row in data["policies"].values():
        gap = row["gap_closed"]
        label = f"{row['label']}*" if row["uses_future"] else row["label"]
        vllm = vllm or row["gap_baseline"] != "lru"
        cells = [label, row["hit_ratio"], "n/a" if gap is None else f"{gap:.3f}"]
        cells += [row[c] for c, _ in columns[3:]]
        out.write(" ".join(fmt for _, fmt in columns).format(*cells) + "\n")
    out.write("* uses information from the future (a ceiling, not an online policy)\n")
    if vllm:
        out.write("rows on vLLM's pool: gap closed from LRU on vLLM's pool\n")
    for row in data["policies"].values():
        events = row.get("claim_events")
        if events:
            out.write(
                f"{row['label']}: holds {events.get('resident_claim_materialized', 0):,},"
                f" refused {events.get('resident_claim_rejected', 0):,},"
                f" shed (each a demotion event) {events.get('resident_claim_demoted', 0):,},"
                f" expired or released {events.get('resident_claim_expired', 0):,}\n"
            )
    for name, row in data["policies"].items():
        window = row.get("admission_window")
        if window is not None:
            low, high, final = window
            out.write(
                f"{name}: {row['admission_deferred']} traces waited for admission"
                f" ({row['admission_wait_s']:,.0f} s in all, counted in completion);"
                f" window {low}..{high}, {final} at the end (a timeline of its own)\n"
            )


def _plot(points: list[Comparison], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    names = list(points[0].results)
    for name in names:
        xs = [p.capacity_blocks / p.working_set_blocks for p in points]
        ys = [p.results[name].hit_ratio for p in points]
        style = "--" if name == "opt" else "-"
        ax.plot(xs, ys, style, marker="o", label=ROW_LABELS.get(name, name))
    ax.set_xlabel("KV capacity (fraction of the working set)")
    ax.set_ylabel("hit-token ratio")
    ax.set_title(f"Replay, {points[0].sessions} sessions")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _usage(exc: UsageError) -> int:
    """Print a usage error, naming the flag as typed; the exit status 2."""
    if exc.field in _FLAGS:
        exc = UsageError(_FLAGS[exc.field], exc.message)
    print(f"agentclaims bench replay: {exc}", file=sys.stderr)
    return 2


def _check_flags(args: argparse.Namespace) -> None:
    """Each number's bounds, checked before anything is read or run."""
    if args.sessions < 1:
        raise UsageError("--sessions", f"must be an integer >= 1, got {args.sessions}")
    if args.capacity_blocks is not None and args.capacity_blocks < 1:
        raise UsageError(
            "--capacity-blocks", f"must be an integer >= 1, got {args.capacity_blocks}"
        )
    frac = args.capacity_frac
    if frac is not None and not 0 < frac <= 10:  # NaN too
        raise UsageError("--capacity-frac", f"must be in (0, 10], got {frac:g}")
    if args.plot is not None:
        _check_plot(args.plot)


def _check_plot(path: str) -> None:
    """``--plot``'s file can be written, in a format matplotlib writes (checked before the
    replay runs, writing nothing)."""
    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot", "needs matplotlib: install the `plot` extra")
    target = Path(path)
    folder = target.parent
    if target.is_dir():
        raise UsageError("--plot", f"{path!r} is a folder, not a file")
    if not folder.is_dir():
        raise UsageError("--plot", f"no such folder: {str(folder)!r}")
    if not os.access(folder, os.W_OK | os.X_OK) or (
        target.exists() and not os.access(target, os.W_OK)
    ):
        raise UsageError("--plot", f"cannot write {path!r}: permission denied")
    suffix = target.suffix.lower().removeprefix(".")
    if suffix:
        from matplotlib.figure import Figure

        formats = Figure().canvas.get_supported_filetypes()
        if suffix not in formats:
            raise UsageError(
                "--plot", f"cannot draw a .{suffix} file; expected one of .{', .'.join(formats)}"
            )


def _readable(source: TraceSource, args: argparse.Namespace) -> TraceSource:
    """The source without its malformed files, each named once on stderr with what is wrong
    in it; a usage error when no trace is left to replay."""
    split = getattr(args, "split", None)
    if not source.paths:
        raise UsageError("--split", f"no trace file of {args.traces!r} is in the {split!r} half")
    readable = source.readable(lambda line: print(line, file=sys.stderr))
    skipped = readable.skipped
    if not readable.paths:
        files = (
            "its one trace file is" if len(skipped) == 1 else f"all {len(skipped)} trace files are"
        )
        half = "" if split is None else f" (the {split!r} half)"
        raise UsageError(
            "--traces", f"no readable trace in {args.traces!r}{half}: {files} malformed"
        )
    return readable


def run(args: argparse.Namespace) -> int:
    try:
        _check_flags(args)
        admission = getattr(args, "admission", "none")
        names = resolve_policies(args.policies, admission)
        source = TraceSource.from_dir(args.traces, args.limit, getattr(args, "split", None))
        source = _readable(source, args)
    except UsageError as exc:
        return _usage(exc)
    service = ServiceModel()
    ws = working_set_blocks(source, args.sessions, service)
    if ws == 0:
        return _usage(UsageError("--traces", f"the traces in {args.traces!r} make no request"))
    if args.capacity_blocks is not None:
        points: list[dict[str, Any]] = [{"capacity_blocks": args.capacity_blocks}]
    else:
        frac = 0.1 if args.capacity_frac is None else args.capacity_frac
        points = [{"capacity_frac": frac}]
    if args.plot is not None:
        main_frac = points[0].get("capacity_frac")
        points += [{"capacity_frac": f} for f in SWEEP_FRACS if f != main_frac]
    rows = len(names) + (admission == "aimd")
    progress = _Progress(len(source) * rows * len(points))
    comparisons: list[Comparison] = []
    try:
        for point in points:
            comparisons.append(
                compare_policies(
                    source,
                    names,
                    sessions=args.sessions,
                    service=service,
                    working_set=ws,
                    on_run=progress.step,
                    admission=admission,
                    **point,
                )
            )
    except UsageError as exc:
        progress.close()
        return _usage(exc)
    progress.close()
    main = comparisons[0].to_dict()
    if args.plot is not None:
        ordered = sorted(comparisons, key=lambda c: c.capacity_blocks)
        _plot(ordered, args.plot)
    if args.json:
        main["skipped"] = list(source.skipped)
        main["traces_dir"] = str(Path(args.traces))
        main["split"] = getattr(args, "split", None)
        main["service_model"] = {
            "prefill_tokens_per_s": service.prefill_tokens_per_s,
            "decode_tokens_per_s": service.decode_tokens_per_s,
        }
        main["sweep"] = [c.to_dict() for c in comparisons[1:]]
        json.dump(main, sys.stdout)
        sys.stdout.write("\n")
        return 0
    for comp in comparisons:
        _table(comp, sys.stdout)
    if source.skipped:
        print(f"skipped malformed files: {', '.join(source.skipped)}")
    return 0
