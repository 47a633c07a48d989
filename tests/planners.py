"""Planners the tests share: one that asks for the same mode (and TTL) on every prefix."""

from __future__ import annotations

from agentclaims.contract import ProtectionMode
from agentclaims.planner import ClaimPlan, ClaimPlanner, PrefixContext


class Always(ClaimPlanner):
    """A planner that asks for one mode (and TTL) on every prefix."""

    def __init__(self, mode: ProtectionMode, ttl_s: float | None = None) -> None:
        super().__init__()
        self.mode, self.ttl_s = mode, ttl_s

    def plan(self, ctx: PrefixContext) -> ClaimPlan:
        return ClaimPlan(self.mode, self.ttl_s, f"test: always {self.mode.value}")
