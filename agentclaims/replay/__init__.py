"""Replay agentic traces on the reference engine under workflow-aware eviction policies, and on
a model of vLLM's pool (its LRU free queue, the agentclaims connector's holds)."""

from __future__ import annotations

from agentclaims.replay.bench import Comparison, compare_policies, gap_closed, resolve_policies
from agentclaims.replay.harness import ReplayResult, Schedule, run_replay, working_set_blocks
from agentclaims.replay.model import (
    PolicyHooks,
    ReplayEngine,
    ReplayPolicy,
    ServiceModel,
    SessionState,
)
from agentclaims.replay.policies import (
    FUTURE_POLICIES,
    POLICY_NAMES,
    VLLM_POLICY_NAMES,
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
from agentclaims.replay.vllm_pool import VllmPoolEngine
from agentclaims.replay.vllm_rows import AgentClaimsVllmPolicy, LruVllmPolicy

__all__ = [
    "FUTURE_POLICIES",
    "POLICY_NAMES",
    "VLLM_POLICY_NAMES",
    "AgentClaimsPolicy",
    "AgentClaimsVllmPolicy",
    "Comparison",
    "ContinuumPolicy",
    "KVFlowPolicy",
    "LruReplayPolicy",
    "LruVllmPolicy",
    "MalformedTrace",
    "OptimalPolicy",
    "PolicyHooks",
    "ReplayEngine",
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
    "VllmPoolEngine",
    "compare_policies",
    "gap_closed",
    "make_policy",
    "parse_trace",
    "resolve_policies",
    "run_replay",
    "working_set_blocks",
]
