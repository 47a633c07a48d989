"""The claim planner: which prefixes to claim, in which mode, for how long."""

from agentclaims.planner.planner import (
    HOLDS_KEPT_LEAST,
    POOL_KEEPS,
    RELAX_ORDER,
    SAVES_LESS,
    ClaimPlan,
    ClaimPlanner,
    PlannerPolicy,
    PrefixContext,
    Revision,
    claim_down_the_ladder,
    relax_ladder,
    relax_mode,
    run_now,
    update_pressure,
)

__all__ = [
    "HOLDS_KEPT_LEAST",
    "POOL_KEEPS",
    "RELAX_ORDER",
    "SAVES_LESS",
    "ClaimPlan",
    "ClaimPlanner",
    "PlannerPolicy",
    "PrefixContext",
    "Revision",
    "claim_down_the_ladder",
    "relax_ladder",
    "relax_mode",
    "run_now",
    "update_pressure",
]
