"""``ClaimRecord``: the engine's record of one claim (which of its blocks survive, its state).

The pool reads it to place a claimed block in a tier and to count the blocks a hard claim holds;
the arbiter (``claims.py``) moves it through its lifecycle; the event log numbers its events.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentclaims.contract import ClaimSpec, ContiguousRange
from agentclaims.contract.ids import BlockHash
from agentclaims.kernel.record import Claim

__all__ = ["ClaimRecord"]


class ClaimRecord(Claim):
    """Engine-side record of one claim. Positions are the claimed prefix's blocks."""

    __slots__ = (
        "deadline_ns",
        "deadline_step",
        "hashes",
        "held",
        "missing_in_span",
        "pos_of",
        "present",
        "span_end",
        "span_start",
    )

    def __init__(self, spec: ClaimSpec, hashes: Sequence[BlockHash]) -> None:
        super().__init__(spec)
        self.hashes = tuple(hashes)
        self.pos_of = {h: i for i, h in enumerate(self.hashes)}
        self.present = bytearray(len(self.hashes))
        pred = spec.materialization_predicate
        self.span_start = pred.start if isinstance(pred, ContiguousRange) else 0
        self.span_end = pred.span
        self.missing_in_span = self.span_end - self.span_start
        self.deadline_step: int | None = None
        self.deadline_ns: int | None = None
        self.held = 0
        """Blocks of a hard/expiring claim parked in a held tier (it blocks others while > 0)."""

    @property
    def holds(self) -> bool:
        return self.missing_in_span == 0

    def mark(self, h: BlockHash, present: bool) -> bool:
        """Set position of ``h`` present/absent; return whether anything changed."""
        pos = self.pos_of[h]
        if self.present[pos] == present:
            return False
        self.present[pos] = present
        if self.span_start <= pos < self.span_end:
            self.missing_in_span += -1 if present else 1
        return True
