"""``ClaimRecord``: the engine's record of one claim (which of its blocks survive, its state).

The pool reads it to place a claimed block in a tier and to count the blocks a hard claim holds;
the arbiter (``claims.py``) moves it through its lifecycle; the event log numbers its events.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentclaims.contract import ClaimSpec, ClaimState, ContiguousRange, ProtectionMode
from agentclaims.contract.ids import BlockHash

__all__ = ["ClaimRecord"]


class ClaimRecord:
    """Engine-side record of one claim. Positions are the claimed prefix's blocks."""

    __slots__ = (
        "deadline_ns",
        "deadline_step",
        "end_reason",
        "hashes",
        "held",
        "missing_in_span",
        "pos_of",
        "present",
        "seq",
        "span_end",
        "span_start",
        "spec",
        "state",
    )

    def __init__(self, spec: ClaimSpec, hashes: Sequence[BlockHash]) -> None:
        self.spec = spec
        self.hashes = tuple(hashes)
        self.pos_of = {h: i for i, h in enumerate(self.hashes)}
        self.present = bytearray(len(self.hashes))
        pred = spec.materialization_predicate
        self.span_start = pred.start if isinstance(pred, ContiguousRange) else 0
        self.span_end = pred.span
        self.missing_in_span = self.span_end - self.span_start
        self.state = ClaimState.SUBMITTED
        self.seq = -1
        """The claim's last ``event_sequence`` (the event log numbers its events)."""
        self.deadline_step: int | None = None
        self.deadline_ns: int | None = None
        self.end_reason: str | None = None
        self.held = 0
        """Blocks of a hard/expiring claim parked in a held tier (it blocks others while > 0)."""

    @property
    def claim_id(self) -> str:
        return self.spec.claim_id

    @property
    def mode(self) -> ProtectionMode:
        return self.spec.protection_mode

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
