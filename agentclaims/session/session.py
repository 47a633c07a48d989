"""``ClaimedSession``: one workflow run's claim scope.

A session follows the workflow (which node calls the LLM, which tool runs), plans a claim on
each agent's conversation prefix after every LLM call, holds it across tool calls, reacts to
what the backend says about it as it happens, and releases everything when the workflow ends,
also on exceptions and cancellation. It is a pipeline of two parts:

    what the agent did --> WorkflowModel (no I/O: graph, steps-to-execution, tool times,
                                          planner)  --> ClaimPlan
                       --> ClaimIO (claim round trips through the claims protocol, events
                                    taken after every call) --> reactions --> outcome log

``ClaimedSession`` is the public face; each job is a collaborator of its own: entering and
ending (``SessionLifecycle``, ``lifecycle``), the LLM calls (``SessionCalls``, ``calls``), the
claim on each node's prefix revised after its calls (``ClaimKeeper``, ``keeper``), the reactions
to harm and lapses (``ClaimOutcomes``, ``outcomes``), reroutes and failovers (``SessionMoves``,
``moves``) and tool calls (``SessionTools``, ``toolcalls``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast, overload

from agentclaims.contract import OwnerScope
from agentclaims.graph import AgentExecutionGraph, EngineCosts, ToolTimeModel
from agentclaims.planner import ClaimPlan, ClaimPlanner, PlannerPolicy, PrefixContext
from agentclaims.protocol import ActiveOutcome
from agentclaims.session.calls import AnsweredCall, SessionCalls
from agentclaims.session.claims import ClaimIO
from agentclaims.session.held import HeldClaim, SessionStats, Wanted
from agentclaims.session.keeper import ClaimKeeper
from agentclaims.session.lifecycle import END_REASONS, SessionLifecycle, current
from agentclaims.session.moves import SessionMoves
from agentclaims.session.options import (
    AUTO_PLANNER,
    LogStream,
    SessionOptions,
    Sleep,
    check_options,
)
from agentclaims.session.outcomes import ClaimOutcomes
from agentclaims.session.reactions import ReactionPolicy
from agentclaims.session.riding import RidingCalls
from agentclaims.session.route import SessionRoute
from agentclaims.session.state import SessionState
from agentclaims.session.toolcalls import SessionTools, ToolRun, in_explicit_tool_call
from agentclaims.session.workflow import WorkflowModel

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from agentclaims.backends.base import Backend
    from agentclaims.backends.pool import BackendPool
    from agentclaims.observability import WorkflowLog
    from agentclaims.observability.otel import SessionTracer

__all__ = [
    "AUTO_PLANNER",
    "END_REASONS",
    "ClaimedSession",
    "HeldClaim",
    "SessionStats",
    "ToolRun",
    "current_session",
    "in_explicit_tool_call",
]


T = TypeVar("T")


def current_session() -> ClaimedSession | None:
    """The session of the running workflow, if any (a context variable: task-local)."""
    return cast("ClaimedSession | None", current())


class _Shared(Generic[T]):
    """A read-only attribute of the facade that is the session state's of the same name."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, face: None, owner: type) -> _Shared[T]: ...
    @overload
    def __get__(self, face: ClaimedSession, owner: type) -> T: ...
    def __get__(self, face: ClaimedSession | None, owner: type) -> T | _Shared[T]:
        if face is None:
            return self
        return cast("T", getattr(face.state, self._name))

    def __set__(self, face: ClaimedSession, value: T) -> None:
        raise AttributeError(f"ClaimedSession.{self._name} is read-only")


class ClaimedSession:
    """The claim scope of one workflow run. Use as ``async with ClaimedSession(backend) as s``.

    ``backend`` is a ``Backend`` or a ``BackendPool`` (session affinity, reroute on refusal).
    ``graph`` is the workflow's Agent Execution Graph (from LangGraph, decorators, or empty:
    then it is learned online from the calls the session sees).

    ``tracing``: OpenTelemetry spans of the run (the session, its LLM calls, claims and tool
    calls; ``agentclaims.observability.otel``): ``None`` (auto) traces when
    ``tracer_provider`` is given or the application set a global tracer provider, ``True``
    always (needs ``opentelemetry-api``: the ``otel`` extra), ``False`` never.
    """

    def __init__(
        self,
        backend: Backend | BackendPool,
        *,
        workflow_id: str | None = None,
        thread_id: str | None = None,
        graph: AgentExecutionGraph | None = None,
        planner: ClaimPlanner | PlannerPolicy | str = "auto",
        reaction: ReactionPolicy | str = "defer",
        tool_times: ToolTimeModel | None = None,
        log_dir: str | Path | None = None,
        log_stream: LogStream | None = None,
        horizon: int = 4,
        reload_s_per_block: float = 0.002,
        queue_delay_s: float = 0.05,
        engine_costs: EngineCosts | None = None,
        sleep: Sleep = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        tracing: bool | None = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        o = check_options(
            backend,
            SessionOptions(
                workflow_id=workflow_id,
                thread_id=thread_id,
                graph=graph,
                planner=planner,
                reaction=reaction,
                tool_times=tool_times,
                log_dir=log_dir,
                log_stream=log_stream,
                horizon=horizon,
                reload_s_per_block=reload_s_per_block,
                queue_delay_s=queue_delay_s,
                engine_costs=engine_costs,
                sleep=sleep,
                clock=clock,
                tracing=tracing,
                tracer_provider=tracer_provider,
            ),
        )
        workflow = WorkflowModel(
            o.graph,
            o.planner,
            o.tool_times,
            horizon=o.horizon,
            reload_s_per_block=o.reload_s_per_block,
            queue_delay_s=o.queue_delay_s,
            clock=o.clock,
        )
        if o.engine_costs is not None:
            workflow.reload_s_per_block = o.engine_costs.reload_s_per_block
        session_id = f"s-{uuid.uuid4().hex[:12]}"
        self.state = state = SessionState(
            workflow_id=o.workflow_id or f"wf-{uuid.uuid4().hex[:12]}",
            session_id=session_id,
            thread_id=o.thread_id,
            planner=o.planner,
            reaction=o.reaction,
            sleep=o.sleep,
            clock=o.clock,
            workflow=workflow,
            engine_costs=o.engine_costs,
            route=SessionRoute(session_id, o.pool, o.backend),
        )
        """What the session's parts share (``agentclaims.session.state``)."""
        state.lifecycle = self.lifecycle = SessionLifecycle(state, o, self)
        """Entering and ending the run (``agentclaims.session.lifecycle``)."""
        state.calls = self.calls = SessionCalls(state)
        """The LLM calls: named, prepared, recorded (``agentclaims.session.calls``)."""
        state.keeper = self.keeper = ClaimKeeper(state, auto_planner=o.auto_planner)
        """The claim on each node's prefix, revised after its calls (``keeper``)."""
        state.outcomes = self.outcomes = ClaimOutcomes(state)
        """The reactions to harmed and lapsed claims (``agentclaims.session.outcomes``)."""
        state.moves = self.moves = SessionMoves(state)
        """Reroutes and failovers (``agentclaims.session.moves``)."""
        state.tools = self.tools = SessionTools(state)
        """The tool calls (``agentclaims.session.toolcalls``)."""

    workflow_id: _Shared[str] = _Shared()
    session_id: _Shared[str] = _Shared()
    thread_id: _Shared[str | None] = _Shared()
    """The conversation the run belongs to (LangGraph's ``configurable.thread_id``): on every
    log line, so the turns of one thread can be linked."""
    owner_scope: _Shared[OwnerScope] = _Shared()
    planner: _Shared[ClaimPlanner] = _Shared()
    reaction: _Shared[ReactionPolicy] = _Shared()
    sleep: _Shared[Sleep] = _Shared()
    clock: _Shared[Callable[[], float]] = _Shared()
    stats: _Shared[SessionStats] = _Shared()
    workflow: _Shared[WorkflowModel] = _Shared()
    engine_costs: _Shared[EngineCosts | None] = _Shared()
    """What calls cost on the engine, learned from its answers (``engine_costs``); the
    workflow plans with its ``reload_s_per_block``."""
    io: _Shared[ClaimIO] = _Shared()
    route: _Shared[SessionRoute] = _Shared()
    """Where the session's calls and claims go (its backend, pool or fleet)."""
    log: _Shared[WorkflowLog | None] = _Shared()
    tracer: _Shared[SessionTracer | None] = _Shared()
    """The run's span builder while tracing (``agentclaims.observability.otel``)."""
    riding: _Shared[RidingCalls] = _Shared()
    """What each call in flight carries where claims ride on requests."""
    loop: _Shared[asyncio.AbstractEventLoop | None] = _Shared()
    """The event loop the session runs on (set when it is entered): synchronous code in the
    workflow (a ``def`` node calling ``model.invoke()``) sends its calls there."""
    end_reason: _Shared[str | None] = _Shared()
    """How the run ended, once it has: ``completed``, ``error``, ``cancelled`` or ``closed``
    (a stream left early: ``break``, ``aclose()``)."""
    wanted: _Shared[dict[str, Wanted]] = _Shared()
    """Per node, the claim the planner wanted and the backend refused (relaxed or none): the
    next tool call of that node reacts to it (``agentclaims.session.toolhold``)."""
    last_agent: _Shared[str | None] = _Shared()
    """The node of the latest LLM call: the agent a tool run by LangGraph serves."""
    claims: _Shared[dict[str, HeldClaim]] = _Shared()
    """The claims held now, by the node whose next call they are for."""
    backend: _Shared[Backend] = _Shared()
    """The backend this session's calls go to now (fixed, or the pool's affinity choice)."""

    # ------------------------------------------------------------------ views
    @property
    def log_path(self) -> Path | None:
        """This run's outcome log file (``<log_dir>/<workflow_id>.jsonl``), with ``log_dir``."""
        log_dir = self.lifecycle.log_dir
        return None if log_dir is None else log_dir / f"{self.workflow_id}.jsonl"

    @property
    def graph(self) -> AgentExecutionGraph:
        return self.workflow.graph

    @property
    def tool_times(self) -> ToolTimeModel:
        return self.workflow.tool_times

    @property
    def pressure(self) -> float:
        """Recent share of LLM calls the backend deferred or refused (EWMA, 0..1)."""
        return self.workflow.pressure

    @property
    def ended_claims(self) -> list[HeldClaim]:
        """The claims this session let go, each with its ``end_reason``."""
        return self.io.ended

    @property
    def pool(self) -> BackendPool | None:
        """The pool (or fleet) the session's backend is chosen from, if any."""
        return self.route.pool

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> ClaimedSession:
        await self.lifecycle.enter()
        return self

    def ending(self, reason: str) -> None:
        """Say why the run is about to end, before cancelling it (``closed``: its stream was
        left early); ``session_ended`` then logs this reason instead of ``cancelled``."""
        self.lifecycle.ending(reason)

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        await self.lifecycle.exit(exc)

    async def release_all(self, reason: str = "session_end") -> None:
        """Release every claim this session holds (idempotent), after claim work in flight.
        Events are taken before (what happened to the claims while held: harm still counts
        and, under ``fail``, is raised once everything is released) and after (the release
        and any loss that follows it)."""
        await self.lifecycle.release_all(reason)

    # ------------------------------------------------------------------ the workflow
    @contextlib.contextmanager
    def activated(self) -> Iterator[ClaimedSession]:
        """Make this entered session the current one inside the block, in the caller's context:
        for code that runs the workflow's calls in a context the session was not entered in
        (LangChain agent middleware, whose hooks run in a LangGraph node each)."""
        with self.lifecycle.activated():
            yield self

    def node(self, name: str) -> contextlib.AbstractContextManager[None]:
        """Name the agent node making LLM calls inside this block (outside LangGraph)."""
        return self.calls.node(name)

    def current_node(self, metadata: Mapping[str, Any] | None = None) -> str:
        """The node making a call: explicit ``node()``, else LangGraph metadata, else ``agent``."""
        return self.calls.current_node(metadata)

    def before_call(self, node: str, step: int | None = None) -> dict[str, Any]:
        """Bookkeeping before an LLM call by ``node``; returns the request's extension object."""
        return self.calls.before_call(node, step)

    async def prepare_call(self, node: str, step: int | None = None) -> dict[str, Any]:
        """``before_call``, and where the backend takes claims riding on requests
        (``claims_ride_on_requests``: vLLM with the connector), what the call carries in its
        extension object: the claim on what it leaves cached (``@sequence``), planned from what
        is known before it (the graph, the tools the node's last reply called, the learned
        waits; revised once the reply is in), and the releases waiting for this call. Neither
        costs an engine request of its own."""
        return await self.calls.prepare_call(node, step)

    def call_failed(self, request_id: str) -> None:
        """The call ``request_id`` got no answer: what it carried is forgotten."""
        self.riding.failed(request_id)

    def riding_to(self, request_id: str | None, backend: Backend) -> bool:
        """Whether the call ``request_id`` still goes where it was planned for; if not, its
        claim goes to ``backend`` now, without the releases planned for the other."""
        return self.riding.still_goes_to(request_id, backend)

    async def after_call(
        self,
        node: str,
        extension: Mapping[str, Any],
        usage: Mapping[str, Any],
        *,
        latency_s: float,
        tool_names: Sequence[str] = (),
        request_id: str | None = None,
        retried: bool = False,
        model: str | None = None,
        call_id: str | None = None,
    ) -> None:
        """Record an answered call and re-plan the claim on ``node``'s conversation prefix
        (``call_id``: the request id ``prepare_call`` gave it, for what it carried).
        ``retried``: the call was deferred or refused first (memory pressure); so was one the
        engine itself held back for claims' blocks (``deferred_s`` in the answer). ``model``:
        the model the call asked for, if known."""
        self.calls.answered(
            AnsweredCall(
                node, extension, usage, latency_s, tool_names, request_id, retried, model, call_id
            )
        )

    async def settle(self) -> None:
        """Wait for claim work still in flight; re-raises its error (e.g. ``ClaimRefused``)."""
        await self.calls.settle()

    def plan_after_call(
        self, node: str, prefix_id: str, tool_names: Sequence[str] = ()
    ) -> tuple[PrefixContext, ClaimPlan]:
        """The claim to hold on ``node``'s prefix after its call (pure planning, no I/O)."""
        return self.workflow.plan_after_call(node, prefix_id, tool_names)

    # ------------------------------------------------------------------ claims
    async def reroute(self, outcome: ActiveOutcome) -> bool:
        """Move to another member of the pool (its prefixes resident there first), releasing
        this session's claims on the old one; False without a pool or another member."""
        return await self.moves.reroute(outcome)

    async def failover(self, reason: str) -> bool:
        """The instance serving this session stopped answering (a fleet behind a router):
        report its claims lost (never silently: ``claim_ended`` with reason ``instance_lost``
        and a ``failover`` reaction naming them), then go on under a new routing key, where
        the next calls re-plan them. False without a fleet, or once out of hops."""
        return await self.moves.failover(reason)

    async def relax_claims(self, claim_ids: Sequence[str]) -> int:
        """Downgrade this session's claims among ``claim_ids`` one mode each; how many."""
        return await self.keeper.relax_claims(claim_ids)

    # ------------------------------------------------------------------ tools
    def tool_call(
        self, tool: str, *, node: str | None = None
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold the calling agent's prefix claim across a tool call; record its real duration.
        Tools LangGraph runs (``ToolNode``) inside a claimed graph are recorded the same way
        without this (``agentclaims.bindings.tools``); inside this block they are not counted
        twice."""
        return self.tools.tool_call(tool, node=node)

    async def start_tool(
        self, tool: str, *, node: str | None = None, step_node: str | None = None
    ) -> ToolRun:
        """A tool call starts: wait for claim work in flight, renew the agent's claim to the
        predicted tool time when it is shorter, and, when the claim was refused or cannot be
        renewed, apply the session's reaction before the tool runs (``toolhold``: defer,
        reroute, relax, or fail with ``ClaimRefused``). ``node`` is the agent whose prefix waits
        (default: the last LLM caller), ``step_node`` the graph node running the tool (a
        LangGraph ``ToolNode``), if any. Pair with ``finish_tool``."""
        return await self.tools.start_tool(tool, node=node, step_node=step_node)

    def finish_tool(self, run: ToolRun) -> None:
        """A tool call ended (``run.error`` names its exception, if any): record its real
        duration in the wait model, count it, log it."""
        self.tools.finish_tool(run)

    # ------------------------------------------------------------------ logging
    def log_reaction(self, kind: str, **fields: Any) -> None:
        """Write a reaction (defer, reroute, relax, fail, ...) to the outcome log, if any."""
        self.io.log_reaction(kind, **fields)
