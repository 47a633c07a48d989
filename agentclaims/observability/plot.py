"""``agentclaims report --plot FILE.png``: each claim's life drawn as a bar on its workflow's
time line (matplotlib, the ``plot`` extra, imported only here).

One row per claim, grouped by workflow; a bar from the claim's first line to its
``claim_ended`` (or to its last line when the log never ends it), coloured by protection mode,
labelled with the node and the end reason; a dot for each tool call held across it; a cross
where it was harmed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

__all__ = ["plot_timelines"]

_COLOURS = {
    "hard_protected": "#b2182b",
    "expiring": "#ef8a62",
    "soft_priority": "#67a9cf",
    "demotable": "#2166ac",
    "best_effort": "#999999",
}


def plot_timelines(summary: Mapping[str, Any], path: str | os.PathLike[str]) -> int:
    """Draw the claim timelines of a ``summarise`` result to ``path``; the claims drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    rows: list[tuple[str, str, dict[str, Any]]] = []
    for wf, s in summary["workflows"].items():
        for claim_id, line in (s.get("claim_timelines") or {}).items():
            if any(step["t_s"] is not None for step in line["events"]):
                rows.append((wf, claim_id, line))
    fig, ax = plt.subplots(figsize=(10, max(2.0, 0.35 * len(rows) + 1)))
    for y, (_, _, line) in enumerate(rows):
        times = [step["t_s"] for step in line["events"] if step["t_s"] is not None]
        start, end = min(times), max(times)
        colour = _COLOURS.get(str(line["mode"]), "#444444")
        ax.barh(y, max(end - start, 1e-4), left=start, color=colour, height=0.6)
        for step in line["events"]:
            if step["t_s"] is None:
                continue
            if step["event"] == "tool_call":
                ax.plot(step["t_s"], y, "ko", markersize=3)
            elif step["event"] == "resident_claim_harmed":
                ax.plot(step["t_s"], y, "rx", markersize=8)
        ax.text(end, y, f" {line['node'] or '-'}: {line['end_reason'] or 'open'}", va="center",
                fontsize=7)  # fmt: skip
    ax.set_yticks(range(len(rows)), [f"{wf} {claim_id}" for wf, claim_id, _ in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds after the session started")
    ax.set_title("claim timelines (bar: planned to ended; dot: tool call; x: harm)")
    handles = [Rectangle((0, 0), 1, 1, color=c) for c in _COLOURS.values()]
    ax.legend(handles, list(_COLOURS), fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return len(rows)
