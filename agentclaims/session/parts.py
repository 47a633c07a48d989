"""``SessionParts``: what a session's parts use of it, and of each other.

``ClaimedSession`` is a facade over parts (``SessionCalls``, ``ClaimKeeper``,
``ClaimOutcomes``, ``SessionMoves``, ``SessionTools``, ``SessionLifecycle`` and the tool-hold
reactions). Each part is handed the session typed as this protocol: the state they share (the
claims, the workflow model, the route, the log, the counts) and the few steps of other parts
they take (the keeper's lock and ``hold``, the outcomes' ``react``, the tools' deferrals). The
parts import this module, never the facade's: no import circle, and each part's reach is
written down here.
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

__all__ = ["KeeperPart", "MovesPart", "OutcomesPart", "SessionParts", "ToolsPart"]


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


class SessionParts(Protocol):
    """The session as its parts see it (``ClaimedSession`` is one)."""

    log: WorkflowLog | None
    tracer: SessionTracer | None
    loop: asyncio.AbstractEventLoop | None
    end_reason: str | None
    last_agent: str | None

    @property
    def workflow_id(self) -> str: ...
    @property
    def session_id(self) -> str: ...
    @property
    def thread_id(self) -> str | None: ...
    @property
    def owner_scope(self) -> OwnerScope: ...
    @property
    def planner(self) -> ClaimPlanner: ...
    @property
    def reaction(self) -> ReactionPolicy: ...
    @property
    def sleep(self) -> Callable[[float], Awaitable[Any]]: ...
    @property
    def clock(self) -> Callable[[], float]: ...
    @property
    def stats(self) -> SessionStats: ...
    @property
    def workflow(self) -> WorkflowModel: ...
    @property
    def engine_costs(self) -> EngineCosts | None: ...
    @property
    def io(self) -> ClaimIO: ...
    @property
    def route(self) -> SessionRoute: ...
    @property
    def riding(self) -> RidingCalls: ...
    @property
    def wanted(self) -> dict[str, Wanted]: ...
    @property
    def backend(self) -> Backend: ...
    @property
    def claims(self) -> dict[str, HeldClaim]: ...
    @property
    def keeper(self) -> KeeperPart: ...
    @property
    def outcomes(self) -> OutcomesPart: ...
    @property
    def moves(self) -> MovesPart: ...
    @property
    def tools(self) -> ToolsPart: ...

    def before_call(self, node: str, step: int | None = None) -> dict[str, Any]: ...

    def note_call(self, *, retried: bool, latency_s: float | None = None) -> None: ...

    async def settle(self) -> None: ...

    async def release_all(self, reason: str = "session_end") -> None: ...

    async def relax_one(
        self, node: str, held: HeldClaim, ttl_s: float | None, why: str, **fields: Any
    ) -> HeldClaim | None: ...

    def log_reaction(self, kind: str, **fields: Any) -> None: ...
