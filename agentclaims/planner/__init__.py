"""The claim planner: which prefixes to claim, in which mode, for how long."""

from agentclaims.planner.planner import (
    RELAX_ORDER,
    ClaimPlan,
    ClaimPlanner,
    PlannerPolicy,
    PrefixContext,
    Revision,
    relax_ladder,
    relax_mode,
    update_pressure,
)

__all__ = [
    "RELAX_ORDER",
    "ClaimPlan",
    "ClaimPlanner",
    "PlannerPolicy",
    "PrefixContext",
    "Revision",
    "relax_ladder",
    "relax_mode",
    "update_pressure",
]
