"""The SDK's session pipeline, driven by the replay: what both ``agentclaims`` rows share.

Per trace, the SDK's own :class:`~agentclaims.session.workflow.WorkflowModel` (its Agent
Execution Graph, steps-to-execution, the shared :class:`~agentclaims.graph.ToolTimeModel`) and
:class:`~agentclaims.planner.ClaimPlanner` on the replay's virtual clock, driven as a
``ClaimedSession`` drives them: ``before_call`` when a request arrives, ``note_call`` when it
starts, ``after_call`` and ``plan_after_call`` when it finishes. The traces name no tools, so
the tool an agent waits on is its kind.

What becomes of a plan is the backend's: :class:`SessionPipeline` leaves the claims port to a
subclass (which blocks a claim covers, claim, release, what a new call, a wait for sub-agents
and an agent's end say). :class:`~agentclaims.replay.policies.AgentClaimsPolicy` speaks the
reference engine's claims API; :class:`~agentclaims.replay.vllm_rows.AgentClaimsVllmPolicy`
the agentclaims connector's holds on vLLM's pool.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentclaims.contract import ProtectionMode, ReuseHint, hint_owner
from agentclaims.engine import prefix_id_of
from agentclaims.graph import AgentExecutionGraph, ToolTimeModel
from agentclaims.planner import ClaimPlan, ClaimPlanner, PrefixContext
from agentclaims.replay.model import PolicyHooks, ServiceModel, SessionState
from agentclaims.session.workflow import WorkflowModel

if TYPE_CHECKING:
    from agentclaims.replay.traces import Trace, TraceRequest

__all__ = ["HeldClaim", "SessionPipeline", "TraceWorkflow", "shared_blocks"]


def shared_blocks(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Leading blocks ``a`` and ``b`` share. Block ids are chained (a block's id depends on
    every block before it), so equal ids at a position mean equal prefixes up to it: a binary
    search finds the shared run."""
    lo, hi = 0, min(len(a), len(b))
    if hi and a[hi - 1] == b[hi - 1]:
        return hi
    while lo < hi:  # invariant: a[:lo] == b[:lo]; a[hi] != b[hi] (or hi is the end)
        mid = (lo + hi) // 2
        if a[mid] == b[mid]:
            lo = mid + 1
        else:
            hi = mid
    return lo


class HeldClaim:
    """A claim an agent holds on its context: its id, the blocks it covers, its mode."""

    __slots__ = ("claim_id", "hashes", "mode")

    def __init__(self, claim_id: str, hashes: tuple[int, ...], mode: ProtectionMode) -> None:
        self.claim_id = claim_id
        self.hashes = hashes
        self.mode = mode


class TraceWorkflow:
    """One trace's run as the SDK sees it: its ``WorkflowModel`` and the claims it holds."""

    __slots__ = ("held", "model", "scope")

    def __init__(self, model: WorkflowModel, scope: str) -> None:
        self.model = model
        self.scope = scope
        self.held: dict[str, HeldClaim] = {}  # node -> claim on its context


class SessionPipeline(PolicyHooks):
    """The SDK's session side of an ``agentclaims`` row (module doc); a subclass is the claims
    port: ``_claimed``, ``_claim``, ``_release``, ``_on_call``, ``_on_wait``, ``_close``."""

    def __init__(
        self,
        name: str,
        service: ServiceModel | None,
        block_size: int,
        planner: ClaimPlanner,
        *,
        close_root: bool = True,
    ) -> None:
        self.name = name
        self.now = 0.0
        """The replay's virtual clock, which the sessions read."""
        self.close_root = close_root
        """Send ``closed`` when a trace's root ends (its session ends then); ``False`` keeps
        only the sub-agent returns (for measuring what the signal is worth)."""
        self.service = service or ServiceModel()
        self.block_size = block_size
        self.planner = planner
        self.tool_times = ToolTimeModel(prior_mean_s=10.0)
        self._workflows: dict[int, TraceWorkflow] = {}
        self._count = 0
        self._arrived: dict[int, float] = {}
        self.plans: dict[str, int] = {}
        """Claims planned, by mode (``renewed`` counts hint renewals)."""

    def advance(self, now: float) -> None:
        self.now = now

    @staticmethod
    def node_of(s: SessionState) -> str:
        return "main" if s.parent is None else f"sub:{s.name}"

    def owner_of(self, session: SessionState) -> str | None:
        return hint_owner(f"t{session.ordinal}", self.node_of(session))

    def on_trace(self, trace: Trace, ordinal: int) -> None:
        model = WorkflowModel(
            AgentExecutionGraph(),
            self.planner,
            self.tool_times,
            horizon=4,
            reload_s_per_block=self.block_size / self.service.prefill_tokens_per_s,
            queue_delay_s=0.0,
            clock=lambda: self.now,
        )
        self._workflows[ordinal] = TraceWorkflow(model, f"t{ordinal}")

    def _next_claim_id(self) -> str:
        self._count += 1
        return f"c{self._count}"

    def _planned(self, mode: ProtectionMode | str) -> None:
        key = mode.value if isinstance(mode, ProtectionMode) else mode
        self.plans[key] = self.plans.get(key, 0) + 1

    # ------------------------------------------------------------------ the claims port
    def _claimed(self, session: SessionState, hashes: tuple[int, ...]) -> tuple[int, ...]:
        """The blocks of a finished call's context its claim covers."""
        raise NotImplementedError

    def _claim(
        self,
        wf: TraceWorkflow,
        node: str,
        hashes: tuple[int, ...],
        plan: ClaimPlan,
        ctx: PrefixContext,
        hint: ReuseHint,
    ) -> None:
        """Claim ``hashes`` for ``node`` as ``plan`` says (``plan.mode`` is not ``None``)."""
        raise NotImplementedError

    def _release(self, wf: TraceWorkflow, node: str, *, done: bool = False) -> None:
        """Release ``node``'s claim, if it holds one (``done``: the agent is finished, as a
        session's release at its end says)."""
        raise NotImplementedError

    def _on_call(
        self, wf: TraceWorkflow, node: str, old: tuple[int, ...], new: tuple[int, ...]
    ) -> None:
        """``node``'s next call arrived, over ``new`` (its previous context: ``old``)."""
        raise NotImplementedError

    def _on_wait(self, wf: TraceWorkflow, node: str, subagents: int) -> None:
        """``node`` launched ``subagents`` sub-agents and waits for them."""
        raise NotImplementedError

    def _close(self, wf: TraceWorkflow, node: str) -> None:
        """``node`` is done (a sub-agent returned, the trace's root ended)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the session's calls
    def on_arrive(self, session: SessionState, request: TraceRequest, now: float) -> None:
        wf = self._workflows[session.ordinal]
        node = self.node_of(session)
        wf.model.before_call(node)
        self._arrived[session.sid] = now
        self._on_call(wf, node, session.hashes, request.block_hashes)

    def on_begin(self, session: SessionState, request: TraceRequest, now: float) -> None:
        wait = now - self._arrived.pop(session.sid, now)
        self._workflows[session.ordinal].model.note_call(retried=wait > 0)

    def on_finish(
        self, session: SessionState, request: TraceRequest, now: float, next_seq: int
    ) -> None:
        hashes = request.block_hashes
        wf = self._workflows[session.ordinal]
        node = self.node_of(session)
        tools = (session.kind,) if request.stop == "tool_use" else ()
        wf.model.after_call(node, tools)
        if not hashes or len(set(hashes)) != len(hashes):
            return
        claimed = self._claimed(session, hashes)
        ctx, plan = wf.model.plan_after_call(node, prefix_id_of(claimed), tools)
        hint = wf.model.reuse_hint(node, ctx, tool=tools[0] if tools else None)
        if plan.mode is None:
            self._release(wf, node)
            return
        self._claim(wf, node, claimed, plan, ctx, hint)

    def on_wait(self, session: SessionState, now: float) -> None:
        self._on_wait(
            self._workflows[session.ordinal], self.node_of(session), session.waiting_subagents
        )

    def on_session_end(self, session: SessionState, now: float) -> None:
        self._close(self._workflows[session.ordinal], self.node_of(session))

    def on_trace_end(self, ordinal: int) -> None:
        wf = self._workflows.pop(ordinal)
        if self.close_root:
            self._close(wf, "main")
        for node in list(wf.held):  # the trace is over: every agent of it is done
            self._release(wf, node, done=True)
