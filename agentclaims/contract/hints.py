"""Reuse hints: what the agent side knows about when a claimed prefix is used next.

A :class:`ReuseHint` travels on a claim (``ClaimSpec.reuse_hint``) and on a renewal
(``Renewal.reuse_hint``). It never protects anything by itself: an engine that ranks resident
blocks by predicted next use reads it to order evictions; one that does not ignores it.

- ``agent``: which agent's next call reuses the prefix (the claim's ``owner_scope`` is the
  workflow; several agents of one workflow rank apart).
- ``wait_class``: what the agent waits on now: ``tool`` (an auto-run tool, ``tool`` names it and
  ``expected_s`` is its predicted duration), ``permission`` (a tool waiting for approval),
  ``user`` (the human has the turn), ``subagents`` (``subagents`` launched, the agent resumes
  when they all return), ``llm`` (another agent runs first), ``unknown``.
- ``expected_s``: expected seconds from now to the next use (the tool-time model's prediction).
- ``session``: ``open``; ``closed`` (the agent is done: its prefix is not used again);
  ``interrupted`` (stopped by the user: reuse unlikely soon).
- ``keep_blocks``: the agent rewrote its context (compaction, thinking stripped) keeping only
  its first ``keep_blocks`` blocks: the rest of what it held is dead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

from agentclaims.contract.wire import Wire
from agentclaims.errors import UnknownNameError, UsageError

__all__ = ["SESSION_STATES", "WAIT_CLASSES", "ReuseHint", "hint_owner"]

WaitClass = Literal["tool", "permission", "user", "subagents", "llm", "unknown"]
SessionState = Literal["open", "closed", "interrupted"]
WAIT_CLASSES: tuple[str, ...] = ("tool", "permission", "user", "subagents", "llm", "unknown")
SESSION_STATES: tuple[str, ...] = ("open", "closed", "interrupted")


@dataclass(frozen=True, slots=True)
class ReuseHint(Wire):
    """When the claimed prefix is expected to be used next, as the agent side knows it."""

    agent: str | None = None
    wait_class: str = "unknown"
    tool: str | None = None
    expected_s: float | None = None
    subagents: int | None = None
    session: str = "open"
    keep_blocks: int | None = None

    wire_name: ClassVar[str] = "reuse_hint"
    wire_prefix: ClassVar[str] = "reuse_hint"
    wire_omit_none: ClassVar[tuple[str, ...]] = (
        "agent",
        "tool",
        "expected_s",
        "subagents",
        "keep_blocks",
    )

    def __post_init__(self) -> None:
        for name in ("agent", "tool"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise UsageError(f"reuse_hint.{name}", f"must be a non-empty string, got {value!r}")
        if self.wait_class not in WAIT_CLASSES:
            raise UnknownNameError("reuse_hint.wait_class", self.wait_class, WAIT_CLASSES)
        if self.session not in SESSION_STATES:
            raise UnknownNameError("reuse_hint.session", self.session, SESSION_STATES)
        e = self.expected_s
        if e is not None and (
            isinstance(e, bool) or not isinstance(e, int | float) or not math.isfinite(e) or e < 0
        ):
            raise UsageError("reuse_hint.expected_s", f"must be a finite number >= 0, got {e!r}")
        for name in ("subagents", "keep_blocks"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                raise UsageError(f"reuse_hint.{name}", f"must be an integer >= 0, got {value!r}")

    @property
    def closed(self) -> bool:
        return self.session == "closed"


def hint_owner(owner_scope: str, agent: str | None) -> str:
    """The key an engine ranks an agent's blocks under: ``owner_scope/agent`` (or the scope)."""
    return owner_scope if agent is None else f"{owner_scope}/{agent}"
