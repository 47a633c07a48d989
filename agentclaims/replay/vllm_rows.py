"""The replay's rows on vLLM's block pool (:mod:`agentclaims.replay.vllm_pool`).

:class:`AgentClaimsVllmPolicy` is the SDK side on it: the same session pipeline as the
``agentclaims`` row (:mod:`agentclaims.replay.pipeline`), planning with the ``held`` preset
(what a session picks on vLLM with the connector), each plan a hold on what the call leaves
cached (``@sequence``): ``demotable`` with ``next_use_s`` from the reuse hint, or
``hard_protected``/``expiring`` with their TTL, released when the agent's next call arrives
(superseded: the release rides on that call), when its reuse became unlikely, or when the
agent is done (then ``done``: its blocks go to the head of the free queue).
:class:`LruVllmPolicy` is the same pool without the connector: stock vLLM.
"""

from __future__ import annotations

from collections.abc import Callable

from agentclaims.contract import ProtectionMode, ReuseHint, hint_owner
from agentclaims.engine import EvictionPolicy, LRUPolicy
from agentclaims.planner import (
    ClaimPlan,
    ClaimPlanner,
    PlannerPolicy,
    PrefixContext,
    claim_down_the_ladder,
    run_now,
)
from agentclaims.replay.model import PolicyHooks, ReplayEngine, ServiceModel, SessionState
from agentclaims.replay.pipeline import HeldClaim, SessionPipeline, TraceWorkflow
from agentclaims.replay.vllm_pool import NEVER_S, VllmPoolEngine, max_model_len_for

__all__ = ["AgentClaimsVllmPolicy", "LruVllmPolicy"]


class LruVllmPolicy(PolicyHooks):
    """Stock vLLM: its pool's LRU free queue, no connector (the ``lru-vllm`` row)."""

    def __init__(self) -> None:
        self.name = "lru-vllm"

    def engine_policy(self) -> EvictionPolicy:
        return LRUPolicy()  # what the free queue is; the pool keeps it itself

    def make_engine(
        self, capacity_blocks: int, block_size: int, clock: Callable[[], int]
    ) -> ReplayEngine:
        return VllmPoolEngine(capacity_blocks, block_size, clock=clock, policy_name=self.name)


class AgentClaimsVllmPolicy(SessionPipeline):
    """The SDK on vLLM with the agentclaims connector (the ``agentclaims-vllm`` row): the
    ``agentclaims`` row's session pipeline, planning with the ``held`` preset, each plan a hold
    on everything the call leaves cached (module doc), on :class:`VllmPoolEngine` with the
    connector's claim book."""

    def __init__(
        self,
        service: ServiceModel | None = None,
        block_size: int = 64,
        planner: ClaimPlanner | None = None,
        *,
        close_root: bool = True,
        max_model_len: int | None = None,
    ) -> None:
        super().__init__(
            "agentclaims-vllm",
            service,
            block_size,
            planner or ClaimPlanner(PlannerPolicy.named("held")),
            close_root=close_root,
        )
        self.max_model_len = max_model_len
        """The server's longest request, in tokens (``None``: :func:`max_model_len_for`)."""
        self.engine: VllmPoolEngine | None = None
        self.released_gone = 0
        """Releases of holds the book no longer had (shed or expired before)."""

    def engine_policy(self) -> EvictionPolicy:
        return LRUPolicy()

    def make_engine(
        self, capacity_blocks: int, block_size: int, clock: Callable[[], int]
    ) -> ReplayEngine:
        return VllmPoolEngine(
            capacity_blocks,
            block_size,
            clock=clock,
            policy_name=self.name,
            claims=True,
            max_model_len=self.max_model_len or max_model_len_for(capacity_blocks, block_size),
        )

    def attach(self, engine: ReplayEngine) -> None:
        assert isinstance(engine, VllmPoolEngine), "the agentclaims-vllm row runs on vLLM's pool"
        assert engine.book is not None, "the agentclaims-vllm row needs the connector's book"
        self.engine = engine

    def advance(self, now: float) -> None:
        self.now = now
        if self.engine is not None:
            self.engine.step()

    # ------------------------------------------------------------------ the claims port
    def _claimed(self, session: SessionState, hashes: tuple[int, ...]) -> tuple[int, ...]:
        return hashes  # @sequence: everything the call leaves cached

    def _claim(
        self,
        wf: TraceWorkflow,
        node: str,
        hashes: tuple[int, ...],
        plan: ClaimPlan,
        ctx: PrefixContext,
        hint: ReuseHint,
    ) -> None:
        """Hold the call's blocks in the plan's mode, one mode weaker after each refusal
        (``demotable`` refused: plain prefix caching, nothing held)."""
        engine = self.engine
        assert engine is not None
        self._release(wf, node)  # normally gone already: released as the call arrived
        soft = self.planner.policy.soft_mode
        # the connector sheds soft holds farthest expected next use first
        next_use_s = NEVER_S if hint.closed else hint.expected_s

        def usable(mode: ProtectionMode) -> ProtectionMode | None:
            if mode is ProtectionMode.BEST_EFFORT:
                self._planned(mode)  # plain prefix caching: the connector holds nothing
                return None
            return mode

        async def attempt(mode: ProtectionMode) -> bool:
            ttl = plan.ttl_for(mode, self.planner.policy.default_ttl_s)
            cid = self._next_claim_id()
            decision = engine.hold(
                hint_owner(wf.scope, node),
                cid,
                wf.scope,
                mode.value,
                ttl_s=ttl,
                next_use_s=next_use_s,
            )
            if decision["decision"] != "accepted":
                return False
            self._planned(mode)
            wf.held[node] = HeldClaim(cid, hashes, mode)
            return True

        run_now(claim_down_the_ladder(plan.mode, attempt, soft=soft, usable=usable))

    def _release(self, wf: TraceWorkflow, node: str, *, done: bool = False) -> None:
        held = wf.held.pop(node, None)
        if (
            held is not None
            and self.engine is not None
            and not self.engine.release(held.claim_id, wf.scope, evict_first=done)
        ):
            self.released_gone += 1

    def _on_call(
        self, wf: TraceWorkflow, node: str, old: tuple[int, ...], new: tuple[int, ...]
    ) -> None:
        # the call's own claim supersedes the held one: its release rides on the call, applied
        # as it arrives (the call reuses those blocks as it runs; its claim holds them after)
        self._release(wf, node)

    def _on_wait(self, wf: TraceWorkflow, node: str, subagents: int) -> None:
        return None  # a hold's next use is the one it was taken with: no operation changes it

    def _close(self, wf: TraceWorkflow, node: str) -> None:
        self._release(wf, node, done=True)  # nothing uses a finished agent's context again
