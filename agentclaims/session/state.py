"""``SessionState``: what the parts of one session share, and each other.

``ClaimedSession`` is the public face of a session; the work is done by its parts
(``SessionCalls``, ``ClaimKeeper``, ``ClaimOutcomes``, ``SessionMoves``, ``SessionTools``,
``SessionLifecycle`` and the tool-hold reactions). They share this record, never the facade:
the run's identity and policies, the state they keep together (the claims and what each call
carries, the workflow model, the route, the log, the counts), and the few steps of other parts
they take (the keeper's lock and ``hold``, the outcomes' ``react``, the tools' deferrals,
the calls' ``settle``), each part typed by the protocol of what the others use of it. The
parts import this module and the protocols, never each other: no import circle, and each
part's reach is written down here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from agentclaims.contract import OwnerScope, PrefixId, ReuseHint
from agentclaims.graph import EngineCosts
from agentclaims.planner import ClaimPlan, ClaimPlanner, PrefixContext
from agentclaims.session.claims import ClaimIO
from agentclaims.session.events import EventOutcomes
from agentclaims.session.held import HeldClaim, SessionStats, Wanted
from agentclaims.session.reactions import ReactionPolicy
from agentclaims.session.riding import Riding, RidingCalls
from agentclaims.session.route import SessionRoute
from agentclaims.session.workflow import WorkflowModel

if TYPE_CHECKING:
    from agentclaims.backends.base import Backend
    from agentclaims.observability import WorkflowLog
    from agentclaims.observability.otel import SessionTracer

__all__ = [
    "CallsPart",
    "KeeperPart",
    "LifecyclePart",
    "MovesPart",
    "OutcomesPart",
    "SessionState",
    "ToolsPart",
]


class CallsPart(Protocol):
    """What other parts use of ``SessionCalls``."""

    async def settle(self) -> None: ...


class KeeperPart(Protocol):
    """What other parts use of ``ClaimKeeper``."""

    @property
    def lock(self) -> asyncio.Lock:
        """Held while the claims on the nodes' prefixes change."""
        ...

    async def follow_backend(self) -> None: ...

    async def after_call(
        self,
        node: str,
        riding: Riding | None,
        extension: Mapping[str, Any],
        sequence: str | None,
        tool_names: Sequence[str],
    ) -> None: ...

    async def hold(
        self,
        node: str,
        prefix_id: PrefixId,
        plan: ClaimPlan,
        ctx: PrefixContext,
        hint: ReuseHint | None = None,
    ) -> None: ...

    async def relax_one(
        self, node: str, held: HeldClaim, ttl_s: float | None, why: str, **fields: Any
    ) -> HeldClaim | None: ...


class OutcomesPart(Protocol):
    """What other parts use of ``ClaimOutcomes``."""

    async def take_events(self) -> None: ...

    async def react(self, taken: EventOutcomes, *, lapses: bool = True) -> None: ...


class MovesPart(Protocol):
    """What other parts use of ``SessionMoves``."""

    def follow_instance(self) -> None: ...


class ToolsPart(Protocol):
    """What other parts use of ``SessionTools``."""

    async def cancel_deferrals(self) -> None: ...


class LifecyclePart(Protocol):
    """What other parts use of ``SessionLifecycle``."""

    @property
    def entered(self) -> bool: ...

    async def release_all(self, reason: str = "session_end") -> None: ...


class SessionState:
    """One session's shared state. The facade builds it, then its parts over it, and names
    each part here (``calls``, ``keeper``, ``outcomes``, ``moves``, ``tools``,
    ``lifecycle``) for the others."""

    calls: CallsPart
    keeper: KeeperPart
    outcomes: OutcomesPart
    moves: MovesPart
    tools: ToolsPart
    lifecycle: LifecyclePart

    def __init__(
        self,
        *,
        workflow_id: str,
        session_id: str,
        thread_id: str | None,
        planner: ClaimPlanner,
        reaction: ReactionPolicy,
        sleep: Callable[[float], Awaitable[Any]],
        clock: Callable[[], float],
        workflow: WorkflowModel,
        engine_costs: EngineCosts | None,
        route: SessionRoute,
    ) -> None:
        self.workflow_id = workflow_id
        self.session_id = session_id
        self.thread_id = thread_id
        self.owner_scope = OwnerScope(f"workflow:{workflow_id}")
        self.planner = planner
        self.reaction = reaction
        self.sleep = sleep
        self.clock = clock
        self.stats = SessionStats()
        self.workflow = workflow
        self.engine_costs = engine_costs
        self.route = route
        self.log: WorkflowLog | None = None
        self.tracer: SessionTracer | None = None
        self.io = ClaimIO(
            session_id,
            self.owner_scope,
            planner.policy,
            reaction,
            self.stats,
            clock,
            lambda: self.log,
        )
        self.riding = RidingCalls(self.io, workflow)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.end_reason: str | None = None
        self.wanted: dict[str, Wanted] = {}
        self.last_agent: str | None = None

    @property
    def backend(self) -> Backend:
        """The backend this session's calls go to now (fixed, or the pool's affinity choice)."""
        return self.route.backend

    @property
    def claims(self) -> dict[str, HeldClaim]:
        """The claims held now, by the node whose next call they are for."""
        return self.io.held

    def log_reaction(self, kind: str, **fields: Any) -> None:
        """Write a reaction to the outcome log, if any."""
        self.io.log_reaction(kind, **fields)
