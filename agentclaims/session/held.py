"""What a session's parts share: the claims it holds (``HeldClaim``), the claims it wanted
and did not get (``Wanted``), and its counts (``SessionStats``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from agentclaims.contract import ClaimId, PrefixId
from agentclaims.planner import ClaimPlan, PrefixContext

__all__ = ["HeldClaim", "SessionStats", "Wanted"]


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


@dataclass(slots=True)
class Wanted:
    """The claim the planner wanted on a node's prefix, and why the backend did not give it."""

    prefix_id: PrefixId
    plan: ClaimPlan
    ctx: PrefixContext
    refusal: str | None = None


@dataclass(slots=True)
class SessionStats:
    llm_calls: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    claims_submitted: int = 0
    claims_accepted: int = 0
    claims_refused: int = 0
    claims_relaxed: int = 0
    claims_renewed: int = 0
    claims_replanned: int = 0
    claims_demoted: int = 0
    claims_expired: int = 0
    claims_harmed: int = 0
    deferrals: int = 0
    deferral_s: float = 0.0
    reroutes: int = 0
    fails: int = 0
    tool_calls: int = 0
    modes: dict[str, int] = field(default_factory=dict)

    @property
    def hit_ratio(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def recomputed_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens
