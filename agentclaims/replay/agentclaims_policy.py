"""The ``agentclaims`` row of the replay: the SDK's session pipeline on the reference engine.

The agent side (:class:`~agentclaims.replay.pipeline.SessionPipeline`) claims each agent's
prefix through the engine's claims API; the engine ranks resident blocks by predicted next use
(:class:`~agentclaims.engine.NextUsePolicy`). The row on vLLM's pool is
:mod:`agentclaims.replay.vllm_rows`'s. Registered by name in :mod:`agentclaims.replay.policies`.
"""

from __future__ import annotations

from agentclaims.contract import ClaimSpec, ProtectionMode, ReuseHint
from agentclaims.engine import KVEngine, NextUsePolicy, WaitModel, prefix_id_of
from agentclaims.planner import (
    ClaimPlan,
    ClaimPlanner,
    PlannerPolicy,
    PrefixContext,
    claim_down_the_ladder,
    run_now,
)
from agentclaims.replay.model import ReplayEngine, ServiceModel, SessionState
from agentclaims.replay.pipeline import HeldClaim, SessionPipeline, TraceWorkflow, shared_blocks
from agentclaims.session.workflow import renews_claim

__all__ = ["AgentClaimsPolicy"]


class AgentClaimsPolicy(SessionPipeline):
    """The SDK's session pipeline against an engine that ranks by predicted next use.

    Engine side (``engine_policy``, the engine's own and nothing else): a
    :class:`~agentclaims.engine.NextUsePolicy` (dead blocks first, then the agent whose next
    use is farthest, from waits conditioned on the time already waited). The agent side below
    reaches it only through the engine's claims API.

    Agent side, per trace: the session pipeline (:class:`~agentclaims.replay.pipeline.
    SessionPipeline`: the SDK's ``WorkflowModel`` and ``ClaimPlanner`` on the replay's virtual
    clock). Each plan becomes a claim (``ClaimSpec`` with the workflow's
    :class:`~agentclaims.contract.ReuseHint`) on the agent's stable leading run, submitted to
    the engine, or, while the held claim still covers the context (``renews_claim``), a
    renewal carrying the new hint. Session signals go the same way: sub-agents launched, an
    agent done (``closed``), a context rewritten keeping N blocks (seen when the next request
    arrives).
    """

    def __init__(
        self,
        service: ServiceModel | None = None,
        block_size: int = 64,
        planner: ClaimPlanner | None = None,
        waits: WaitModel | None = None,
        *,
        close_root: bool = True,
    ) -> None:
        super().__init__(
            "agentclaims",
            service,
            block_size,
            planner or ClaimPlanner(PlannerPolicy.named("ranked")),
            close_root=close_root,
        )
        self.ranking = NextUsePolicy(waits, name=self.name)
        """The engine's eviction policy."""
        self._engine: KVEngine | None = None

    def engine_policy(self) -> NextUsePolicy:
        return self.ranking

    def attach(self, engine: ReplayEngine) -> None:
        assert isinstance(engine, KVEngine), "the agentclaims row runs on the reference engine"
        self._engine = engine

    # ------------------------------------------------------------------ claims round trips
    def _renew(self, wf: TraceWorkflow, node: str, hint: ReuseHint) -> bool:
        """Send ``hint`` on ``node``'s held claim; a claim that ended by its TTL (a hard
        claim) is replaced by a best-effort one carrying the hint."""
        held = wf.held.get(node)
        engine = self._engine
        if held is None or engine is None:
            return False
        if held.mode is ProtectionMode.BEST_EFFORT:
            engine.renew_claim(held.claim_id, wf.scope, reuse_hint=hint)
            self._planned("renewed")
            return True
        self._release(wf, node)
        self._submit(wf, node, held.hashes, ProtectionMode.BEST_EFFORT, None, hint)
        return True

    def _release(self, wf: TraceWorkflow, node: str, *, done: bool = False) -> None:
        # ``done`` changes nothing here: the closed hint already ranks a finished agent's blocks
        held = wf.held.pop(node, None)
        if held is not None and self._engine is not None:
            self._engine.release_claim(held.claim_id, wf.scope)

    def _claimed(self, session: SessionState, hashes: tuple[int, ...]) -> tuple[int, ...]:
        # the claim covers the stable leading run (system prompt and tool definitions); the
        # hint, naming the agent, ranks all of its blocks
        return hashes[: max(1, min(len(hashes), session.script.system_tokens // self.block_size))]

    def _claim(
        self,
        wf: TraceWorkflow,
        node: str,
        hashes: tuple[int, ...],
        plan: ClaimPlan,
        ctx: PrefixContext,
        hint: ReuseHint,
    ) -> None:
        engine = self._engine
        assert engine is not None
        held = wf.held.get(node)
        if (
            held is not None
            and plan.mode is ProtectionMode.BEST_EFFORT
            and held.mode is ProtectionMode.BEST_EFFORT
            and renews_claim(len(held.hashes), shared_blocks(held.hashes, hashes))
        ):
            self._renew(wf, node, hint)
            return
        self._release(wf, node)
        self._submit(wf, node, hashes, plan.mode, plan.ttl_s, hint)

    def _submit(
        self,
        wf: TraceWorkflow,
        node: str,
        hashes: tuple[int, ...],
        first: ProtectionMode | None,
        ttl_s: float | None,
        hint: ReuseHint,
    ) -> None:
        """Claim ``hashes`` for ``node``, one mode weaker after each rejection (the
        session's relax loop, on the engine's synchronous claims API)."""
        engine = self._engine
        assert engine is not None

        async def attempt(mode: ProtectionMode) -> bool:
            cid = self._next_claim_id()
            spec = ClaimSpec(
                claim_id=cid,
                owner_scope=wf.scope,
                object_id=prefix_id_of(hashes),
                cache_identity=engine.cache_identity,
                footprint_blocks=len(hashes),
                protection_mode=mode,
                ttl_s=ttl_s if mode is not ProtectionMode.BEST_EFFORT else None,
                reuse_hint=hint,
            )
            if not engine.submit_claim(spec, hashes).accepted:  # type: ignore[arg-type]
                return False
            self._planned(mode)
            wf.held[node] = HeldClaim(cid, hashes, mode)
            return True

        run_now(claim_down_the_ladder(first, attempt, soft=self.planner.policy.soft_mode))

    # ------------------------------------------------------------------ session signals
    def _on_call(
        self, wf: TraceWorkflow, node: str, old: tuple[int, ...], new: tuple[int, ...]
    ) -> None:
        if old:
            keep = shared_blocks(old, new)
            if keep < len(old):  # the context was rewritten: say what is kept
                self._renew(wf, node, wf.model.rewrite_hint(node, keep))

    def _on_wait(self, wf: TraceWorkflow, node: str, subagents: int) -> None:
        ctx = PrefixContext(prefix_id=node, footprint_blocks=0, waiting_on="subagent")
        self._renew(wf, node, wf.model.reuse_hint(node, ctx, subagents=subagents))

    def _close(self, wf: TraceWorkflow, node: str) -> None:
        self._renew(wf, node, wf.model.closed_hint(node))
        self._release(wf, node)
