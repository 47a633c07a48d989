"""The replay's eviction policies, each its paper's rule (../shared/notes/policies.md), by name.

All are engine :class:`~agentclaims.engine.EvictionPolicy` s over resident, unclaimed blocks,
fed by the replay hooks (:class:`~agentclaims.replay.model.PolicyHooks`) with what a serving
system and the agent SDK know online: arrivals, starts, finishes with their stop reason
(``tool_use`` = a tool runs and the session comes back; ``end_turn`` = the human has the turn),
sub-agents starting and returning, and the clock. Only :class:`OptimalPolicy` reads the future.

The engine parks a request's blocks during ``finish`` (tail first), right after ``on_finish``,
so a block inserted then belongs to the session that just finished (the last user of a shared
block owns it).

This module is the registry (``make_policy``); the rows live by kind: the serving systems'
(LRU, KVFlow, Continuum) in :mod:`agentclaims.replay.baselines`, the session-grouped ones
(ReuseProb, SAGA) in :mod:`agentclaims.replay.grouped`, the optimum in
:mod:`agentclaims.replay.optimal`, the ``agentclaims`` row (its agent side the SDK's session
pipeline, :mod:`agentclaims.replay.pipeline`) in :mod:`agentclaims.replay.agentclaims_policy`,
and the rows on vLLM's pool (``lru-vllm``, ``agentclaims-vllm``) in
:mod:`agentclaims.replay.vllm_pool`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from agentclaims.errors import UnknownNameError
from agentclaims.replay.agentclaims_policy import AgentClaimsPolicy
from agentclaims.replay.baselines import ContinuumPolicy, KVFlowPolicy, LruReplayPolicy
from agentclaims.replay.grouped import ReuseProbPolicy, SagaPolicy
from agentclaims.replay.model import ReplayPolicy, ServiceModel
from agentclaims.replay.optimal import OptimalPolicy
from agentclaims.replay.vllm_rows import AgentClaimsVllmPolicy, LruVllmPolicy

if TYPE_CHECKING:
    from agentclaims.replay.harness import Schedule

__all__ = [
    "FUTURE_POLICIES",
    "ONLINE_POLICIES",
    "POLICY_NAMES",
    "ROW_LABELS",
    "VLLM_POLICIES",
    "VLLM_POLICY_NAMES",
    "AgentClaimsPolicy",
    "ContinuumPolicy",
    "KVFlowPolicy",
    "LruReplayPolicy",
    "OptimalPolicy",
    "ReuseProbPolicy",
    "SagaPolicy",
    "make_policy",
]

ONLINE_POLICIES: dict[str, Callable[[ServiceModel, int], ReplayPolicy]] = {
    "lru": lambda service, bs: LruReplayPolicy(),
    "kvflow": lambda service, bs: KVFlowPolicy(),
    "continuum": lambda service, bs: ContinuumPolicy(service, bs),
    "saga": lambda service, bs: SagaPolicy(bs),
    "reuseprob": lambda service, bs: ReuseProbPolicy(),
    "agentclaims": lambda service, bs: AgentClaimsPolicy(service, bs),
}
POLICY_NAMES = (*ONLINE_POLICIES, "opt")
"""The rows on the reference engine: what a comparison runs by default."""
VLLM_POLICIES: dict[str, Callable[[ServiceModel, int], ReplayPolicy]] = {
    "lru-vllm": lambda service, bs: LruVllmPolicy(),
    "agentclaims-vllm": lambda service, bs: AgentClaimsVllmPolicy(service, bs),
}
"""The rows on a model of vLLM's pool (its LRU free queue; the connector's holds), run when
named. Their timeline can differ from the shared one (held blocks defer requests)."""
VLLM_POLICY_NAMES = tuple(VLLM_POLICIES)
FUTURE_POLICIES = frozenset({"opt"})
"""Policies that read the future (the recorded schedule): reported, labelled, as ceilings."""
ROW_LABELS = {
    "lru-vllm": "LRU on vLLM's pool",
    "agentclaims-vllm": "agentclaims on vLLM's pool",
}
"""What a report calls a row, where its name alone does not say it (the ``-vllm`` rows)."""


def make_policy(
    name: str,
    *,
    service: ServiceModel | None = None,
    block_size: int = 64,
    schedule: Schedule | None = None,
) -> ReplayPolicy:
    """A fresh policy by name; ``opt`` needs the recorded ``schedule``."""
    known = [*POLICY_NAMES, *VLLM_POLICY_NAMES]
    if name == "opt":
        if schedule is None:
            raise UnknownNameError("policy", name, [n for n in known if n != "opt"])
        return OptimalPolicy(schedule)
    factory = ONLINE_POLICIES.get(name) or VLLM_POLICIES.get(name)
    if factory is None:
        raise UnknownNameError("policy", name, known)
    return factory(service or ServiceModel(), block_size)
