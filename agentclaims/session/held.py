"""``HeldClaim``: one claim a session holds, as the session's parts share it."""

from __future__ import annotations

from dataclasses import dataclass

from agentclaims.contract import ClaimId, PrefixId
from agentclaims.planner import ClaimPlan

__all__ = ["HeldClaim"]


@dataclass(slots=True)
class HeldClaim:
    """A claim this session holds on one agent node's prefix."""

    claim_id: ClaimId
    node: str
    prefix_id: PrefixId
    plan: ClaimPlan
    backend: str
    since: float
    state: str = "accepted"
    """The claim's state as the backend last reported it (``unknown`` if it could not say)."""
    end_reason: str | None = None
    """Why the session let it go: ``superseded``, ``reuse_unlikely``, ``pool_keeps``,
    ``saves_less``, ``capacity``, ``relaxed``,
    ``rerouted``, ``demoted``, ``expired``, ``harmed``, ``session_end``."""
