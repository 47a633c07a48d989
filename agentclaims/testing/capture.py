"""``OutcomeLog``: capture a session's outcome log in memory, as structlog's ``capture_logs``
captures log entries.

Pass it as ``log_stream=`` to ``ClaimedSession`` or ``@claimed_session``; every JSON line the
session's ``WorkflowLog`` writes is parsed as it arrives and kept, also after the stream is
closed. Lines of every session given the same ``OutcomeLog`` land in it, in write order. A
session's log writes its lines from the log thread; every read here waits for the lines logged
before it (``flush_background``), so what a session logged is there when asked.
"""

from __future__ import annotations

import io
import json
from typing import Any

from agentclaims.observability.log import flush_background

__all__ = ["OutcomeLog"]


class OutcomeLog(io.StringIO):
    """A text stream that keeps every JSON line written to it as a dict (``lines``)."""

    def __init__(self) -> None:
        super().__init__()
        self._lines: list[dict[str, Any]] = []
        self._partial = ""
        self.malformed: list[str] = []
        """Lines that were not a JSON object (something else shared the stream)."""

    def write(self, s: str) -> int:
        written = super().write(s)
        *complete, self._partial = (self._partial + s).split("\n")
        for text in complete:
            if not text.strip():
                continue
            try:
                line = json.loads(text)
            except json.JSONDecodeError:
                line = None
            if isinstance(line, dict):
                self._lines.append(line)
            else:
                self.malformed.append(text)
        return written

    @property
    def _written(self) -> list[dict[str, Any]]:
        """The lines, once every line logged before this read is written."""
        flush_background(10.0)
        return self._lines

    @property
    def lines(self) -> list[dict[str, Any]]:
        """Every line so far, parsed, in the order written."""
        return list(self._written)

    @property
    def events(self) -> list[str]:
        """The ``event`` name of every line, in order."""
        return [str(line.get("event")) for line in self._written]

    def of(self, event: str) -> list[dict[str, Any]]:
        """The lines of one event (``"llm_call"``, ``EventName.RESIDENT_CLAIM_HARMED``, ...)."""
        return [line for line in self._written if line.get("event") == event]

    def reactions(self, kind: str | None = None) -> list[dict[str, Any]]:
        """The session's reactions (``reaction_<kind>`` lines), or those of one ``kind``."""
        if kind is not None:
            return self.of(f"reaction_{kind}")
        return [line for line in self._written if str(line.get("event")).startswith("reaction_")]

    def claim_story(self, claim_id: str) -> list[dict[str, Any]]:
        """The lines naming ``claim_id``, in order: planned, its events, reactions, the tool
        calls it was held across, ended."""
        return [
            line
            for line in self._written
            if line.get("claim_id") == claim_id or claim_id in (line.get("claim_ids") or ())
        ]

    def claim_ids(self) -> list[str]:
        """Every claim the lines name, in the order they first appear."""
        seen = dict.fromkeys(
            str(line["claim_id"]) for line in self._written if line.get("claim_id") is not None
        )
        return list(seen)
