"""Replay agentic traces on the reference engine under workflow-aware eviction policies."""

from __future__ import annotations

from agentclaims.replay.bench import Comparison, compare_policies, gap_closed, resolve_policies
from agentclaims.replay.harness import ReplayResult, Schedule, run_replay, working_set_blocks
from agentclaims.replay.model import PolicyHooks, ReplayPolicy, ServiceModel, SessionState
from agentclaims.replay.policies import (
    FUTURE_POLICIES,
    POLICY_NAMES,
    AgentClaimsPolicy,
    ContinuumPolicy,
    KVFlowPolicy,
    LruReplayPolicy,
    OptimalPolicy,
    ReuseProbPolicy,
    SagaPolicy,
    make_policy,
)
from agentclaims.replay.traces import (
    MalformedTrace,
    SessionScript,
    SubAgentGroup,
    Trace,
    TraceRequest,
    TraceSource,
    parse_trace,
)

__all__ = [
    "FUTURE_POLICIES",
    "POLICY_NAMES",
    "AgentClaimsPolicy",
    "Comparison",
    "ContinuumPolicy",
    "KVFlowPolicy",
    "LruReplayPolicy",
    "MalformedTrace",
    "OptimalPolicy",
    "PolicyHooks",
    "ReplayPolicy",
    "ReplayResult",
    "ReuseProbPolicy",
    "SagaPolicy",
    "Schedule",
    "ServiceModel",
    "SessionScript",
    "SessionState",
    "SubAgentGroup",
    "Trace",
    "TraceRequest",
    "TraceSource",
    "compare_policies",
    "gap_closed",
    "make_policy",
    "parse_trace",
    "resolve_policies",
    "run_replay",
    "working_set_blocks",
]
