"""``ClaimedSession``: one workflow run's claim scope.

A session follows the workflow (which node calls the LLM, which tool runs), plans a claim on
each agent's conversation prefix after every LLM call, holds it across tool calls, reacts to
what the backend says about it as it happens, and releases everything when the workflow ends,
also on exceptions and cancellation. It is a pipeline of two parts:

    what the agent did --> WorkflowModel (no I/O: graph, steps-to-execution, tool times,
                                          planner)  --> ClaimPlan
                       --> ClaimIO (claim round trips through the claims protocol, events
                                    taken after every call) --> reactions --> outcome log
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from agentclaims.contract import OwnerScope, PrefixId, ReuseHint, prefix_blocks
from agentclaims.errors import (
    BackendUnavailable,
    ClaimHarmed,
    ClaimOutcomeError,
    UnknownNameError,
    UsageError,
)
from agentclaims.graph import AgentExecutionGraph, ToolTimeModel
from agentclaims.planner import ClaimPlan, ClaimPlanner, PlannerPolicy, PrefixContext, relax_mode
from agentclaims.protocol import SEQUENCE_OBJECT, ActiveOutcome
from agentclaims.session.claims import (
    PIN_MODES,
    ClaimIO,
    EventOutcomes,
    HeldClaim,
    protects_at_least,
)
from agentclaims.session.options import (
    AUTO_PLANNER,
    UNRANKED,
    SessionOptions,
    Sleep,
    check_options,
)
from agentclaims.session.reactions import ReactionPolicy
from agentclaims.session.riding import Riding, RidingCalls
from agentclaims.session.route import SessionRoute
from agentclaims.session.toolhold import Wanted, hold_for_tool
from agentclaims.session.workflow import WorkflowModel, wait_key

if TYPE_CHECKING:
    from opentelemetry.context import Context
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
    "current_session",
]

END_REASONS = ("completed", "error", "cancelled", "closed")
"""How a session's run ended (``ClaimedSession.end_reason``, ``session_ended.reason``)."""

_RANKED, _HELD, _UNRANKED = "ranked", "held", UNRANKED
"""What ``auto`` plans on a backend that ranks by reuse hints, on one that sheds holds by
their hints and takes claims riding on requests, and on any other."""


_current: ContextVar[ClaimedSession | None] = ContextVar("agentclaims_session", default=None)
_current_node: ContextVar[str | None] = ContextVar("agentclaims_node", default=None)
_in_tool: ContextVar[bool] = ContextVar("agentclaims_in_tool", default=False)


def in_explicit_tool_call() -> bool:
    """Whether the code running is inside ``async with session.tool_call(...)``."""
    return _in_tool.get()


@dataclass(slots=True)
class ToolRun:
    """One tool call in progress (``ClaimedSession.start_tool``)."""

    tool: str
    agent: str
    predicted_s: float
    held: HeldClaim | None
    started: float
    error: str | None = None


def current_session() -> ClaimedSession | None:
    """The session of the running workflow, if any (a context variable: task-local)."""
    return _current.get()


@dataclass(slots=True)
class SessionStats:
    llm_calls: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    claims_submitted: int = 0
    claims_accepted: int = 0
    claims_refused: int = 0
    claims_relaxed: int = 0
    claims_renewed: int = 0
    claims_replanned: int = 0
    claims_demoted: int = 0
    claims_expired: int = 0
    claims_harmed: int = 0
    deferrals: int = 0
    deferral_s: float = 0.0
    reroutes: int = 0
    fails: int = 0
    tool_calls: int = 0
    modes: dict[str, int] = field(default_factory=dict)

    @property
    def hit_ratio(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def recomputed_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


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
        log_stream: TextIO | None = None,
        horizon: int = 4,
        reload_s_per_block: float = 0.002,
        queue_delay_s: float = 0.05,
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
                sleep=sleep,
                clock=clock,
                tracing=tracing,
                tracer_provider=tracer_provider,
            ),
        )
        self._auto_planner = o.auto_planner
        """The planner follows the backend: ``ranked`` where it ranks by hints, ``held``
        where it sheds holds by their hints and claims ride on its requests, else ``default``
        (until the backend's descriptor is read, ``default``)."""
        self._ranking: str | None = None
        """With ``auto``: the preset the backend last read called for (``None``: not read)."""
        self.workflow_id = o.workflow_id or f"wf-{uuid.uuid4().hex[:12]}"
        self.session_id = f"s-{uuid.uuid4().hex[:12]}"
        self.thread_id = o.thread_id
        """The conversation the run belongs to (LangGraph's ``configurable.thread_id``): on
        every log line, so the turns of one thread can be linked."""
        self.owner_scope = OwnerScope(f"workflow:{self.workflow_id}")
        self.planner = planner = o.planner
        self.reaction = reaction = o.reaction
        self.sleep = o.sleep
        self.clock = clock = o.clock
        self.stats = SessionStats()
        self.workflow = WorkflowModel(
            o.graph,
            planner,
            o.tool_times,
            horizon=o.horizon,
            reload_s_per_block=o.reload_s_per_block,
            queue_delay_s=o.queue_delay_s,
            clock=clock,
        )
        self.io = ClaimIO(
            self.session_id,
            self.owner_scope,
            planner.policy,
            reaction,
            self.stats,
            clock,
            lambda: self.log,
        )
        self.route = SessionRoute(self.session_id, o.pool, o.backend)
        """Where the session's calls and claims go (its backend, pool or fleet)."""
        self._log_dir = o.log_dir
        self._log_stream = o.log_stream
        self.log: WorkflowLog | None = None
        self._tracing = o.tracing
        self._tracer_provider = o.tracer_provider
        self.tracer: SessionTracer | None = None
        """The run's span builder while tracing (``agentclaims.observability.otel``)."""
        self._trace_token: Token[Context] | None = None
        self._token: Any = None
        self._started = 0.0
        self._closed = False
        self._lock = asyncio.Lock()
        self._background: asyncio.Future[None] | None = None
        self._replanned: dict[str, float] = {}
        """node -> the start of the wait in which its lapsed claim was re-planned (once)."""
        self._requests = itertools.count(1)
        self.riding = RidingCalls(self.io, self.workflow)
        """What each call in flight carries where claims ride on requests."""
        self.loop: asyncio.AbstractEventLoop | None = None
        """The event loop the session runs on (set when it is entered): synchronous code in
        the workflow (a ``def`` node calling ``model.invoke()``) sends its calls there."""
        self.end_reason: str | None = None
        """How the run ended, once it has: ``completed``, ``error``, ``cancelled`` or
        ``closed`` (a stream left early: ``break``, ``aclose()``)."""
        self._ending: str | None = None
        self.wanted: dict[str, Wanted] = {}
        """Per node, the claim the planner wanted and the backend refused (relaxed or none):
        the next tool call of that node reacts to it (``agentclaims.session.toolhold``)."""
        self.tool_defer_odds = 0.5
        """The odds that waiting for a refused claim before a tool ends in the claim (an EWMA
        over this session's such waits, ``agentclaims.session.toolhold``)."""
        self.last_agent: str | None = None
        """The node of the latest LLM call: the agent a tool run by LangGraph serves."""

    # ------------------------------------------------------------------ views
    @property
    def log_path(self) -> Path | None:
        """This run's outcome log file (``<log_dir>/<workflow_id>.jsonl``), with ``log_dir``."""
        return None if self._log_dir is None else self._log_dir / f"{self.workflow_id}.jsonl"

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
    def claims(self) -> dict[str, HeldClaim]:
        """The claims held now, by the node whose next call they are for."""
        return self.io.held

    @property
    def ended_claims(self) -> list[HeldClaim]:
        """The claims this session let go, each with its ``end_reason``."""
        return self.io.ended

    @property
    def backend(self) -> Backend:
        """The backend this session's calls go to now (fixed, or the pool's affinity choice)."""
        return self.route.backend

    @property
    def pool(self) -> BackendPool | None:
        """The pool (or fleet) the session's backend is chosen from, if any."""
        return self.route.pool

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> ClaimedSession:
        if self._token is not None or self._closed:
            raise UsageError("session", "a ClaimedSession can be entered once")
        await self.route.admit()  # a pool with an admission window may make it wait
        try:
            if self._tracing_on():
                from agentclaims.observability.otel import SessionTracer

                self.tracer = SessionTracer(self._tracer_provider)
            if self._log_dir is not None or self._log_stream is not None or self.tracer is not None:
                from agentclaims.observability import WorkflowLog

                self.log = WorkflowLog(
                    self.workflow_id,
                    self.session_id,
                    directory=self._log_dir,
                    stream=self._log_stream,
                    thread_id=self.thread_id,
                    listeners=() if self.tracer is None else (self.tracer,),
                )
        except BaseException:
            self.tracer = None
            self.route.leave()  # not entered after all: its slot goes to the next one
            raise
        self._started = self.clock()
        self.loop = asyncio.get_running_loop()
        self._token = _current.set(self)
        self._log_session("session_started", backend=self.backend.name)
        if self.tracer is not None:  # spans the workflow starts nest in the session's
            self._trace_token = self.tracer.activate()
        return self

    def _tracing_on(self) -> bool:
        """Whether this run is traced: ``tracing`` as given, or (``None``) when a tracer
        provider was given or the application set a global one. Nothing is imported to find
        out: without ``opentelemetry.trace`` loaded, no provider can have been set."""
        if self._tracing is not None:
            return self._tracing
        if self._tracer_provider is not None:
            return True
        if "opentelemetry.trace" not in sys.modules:
            return False
        from agentclaims.observability.otel import provider_is_configured

        return provider_is_configured()

    def ending(self, reason: str) -> None:
        """Say why the run is about to end, before cancelling it (``closed``: its stream was
        left early); ``session_ended`` then logs this reason instead of ``cancelled``."""
        if reason not in END_REASONS:
            raise UnknownNameError("reason", reason, END_REASONS)
        self._ending = reason

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if self._closed:
            return  # ended once already
        self._closed = True
        if exc is None:
            reason = "completed"
        elif isinstance(exc, GeneratorExit):
            reason = "closed"
        elif isinstance(exc, asyncio.CancelledError):
            reason = self._ending or "cancelled"
        else:
            reason = self._ending if self._ending == "closed" else "error"
        self.end_reason = reason
        try:
            # release even when the workflow was cancelled: shield the cleanup
            await asyncio.shield(self.release_all())
        finally:
            with contextlib.suppress(ValueError):
                # a stream closed later runs this in another context (the token is not its
                # own there): nothing is set in that context, so nothing needs resetting
                _current.reset(self._token)
            self.route.leave()  # its affinity no longer counts as load
            self._log_session(
                "session_ended",
                reason=reason,
                duration_s=round(self.clock() - self._started, 6),
                error=None if exc is None or reason == "closed" else type(exc).__name__,
                hit_ratio=round(self.stats.hit_ratio, 6),
                llm_calls=self.stats.llm_calls,
                tool_calls=self.stats.tool_calls,
                claims_submitted=self.stats.claims_submitted,
            )
            if self.log is not None:
                self.log.close()
            if self.tracer is not None:
                self.tracer.close()  # ended with session_ended already; anything left now
                self.tracer.deactivate(self._trace_token)
                self._trace_token = None
        cause = _claim_error_in(exc)
        if cause is not None and cause is not exc:
            raise cause from exc

    async def release_all(self, reason: str = "session_end") -> None:
        """Release every claim this session holds (idempotent), after claim work in flight.
        Events are taken before (what happened to the claims while held: harm still counts
        and, under ``fail``, is raised once everything is released) and after (the release
        and any loss that follows it)."""
        harmed: ClaimHarmed | None = None
        try:
            await self.settle()
        finally:
            try:
                await self._react(await self.io.take_events(self.route.backends()), lapses=False)
            except ClaimHarmed as exc:
                harmed = exc
            except BackendUnavailable:
                pass  # a backend gone away tells no events; its claims are still let go below
            finally:
                held = list(self.io.held.values())
                self.io.held.clear()
                for claim in held:
                    await self.io.release(self.route.named(claim.backend), claim, reason)
                waiting, self.io.releasing = self.io.releasing, []
                for claim in waiting:  # no call of this session will carry them now
                    await self.io.release(
                        self.route.named(claim.backend), claim, claim.end_reason or reason
                    )
                with contextlib.suppress(BackendUnavailable):
                    await self.io.take_events(self.route.backends())
        if harmed is not None:
            raise harmed

    # ------------------------------------------------------------------ the workflow
    @contextlib.contextmanager
    def activated(self) -> Iterator[ClaimedSession]:
        """Make this entered session the current one inside the block, in the caller's context:
        for code that runs the workflow's calls in a context the session was not entered in
        (LangChain agent middleware, whose hooks run in a LangGraph node each)."""
        if self._token is None or self._closed:
            raise UsageError("session", "only an entered session that has not ended is activated")
        token = _current.set(self)
        try:
            yield self
        finally:
            _current.reset(token)

    @contextlib.contextmanager
    def node(self, name: str) -> Iterator[None]:
        """Name the agent node making LLM calls inside this block (outside LangGraph)."""
        if not isinstance(name, str) or not name:
            raise UsageError("node", f"must be a non-empty string, got {name!r}")
        token = _current_node.set(name)
        try:
            yield
        finally:
            _current_node.reset(token)

    def current_node(self, metadata: Mapping[str, Any] | None = None) -> str:
        """The node making a call: explicit ``node()``, else LangGraph metadata, else ``agent``."""
        explicit = _current_node.get()
        if explicit is not None:
            return explicit
        if metadata and "langgraph_node" in metadata:
            name = str(metadata["langgraph_node"])
            ns = str(metadata.get("langgraph_checkpoint_ns") or "")
            parents = [part.split(":", 1)[0] for part in ns.split("|")[:-1] if part]
            return ":".join([*parents, name])
        return "agent"

    def before_call(self, node: str, step: int | None = None) -> dict[str, Any]:
        """Bookkeeping before an LLM call by ``node``; returns the request's extension object."""
        self.last_agent = node
        request_id = f"{self.session_id}-r{next(self._requests)}"
        self.io.calling = node
        self.io.request_nodes[request_id] = node
        return {
            "session_id": self.session_id,
            "workflow_id": self.workflow_id,
            "owner_scope": self.owner_scope,
            "node": node,
            "step": self.workflow.before_call(node, step),
            "request_id": request_id,
        }

    async def prepare_call(self, node: str, step: int | None = None) -> dict[str, Any]:
        """``before_call``, and where the backend takes claims riding on requests
        (``claims_ride_on_requests``: vLLM with the connector), what the call carries in its
        extension object: the claim on what it leaves cached (``@sequence``), planned from what
        is known before it (the graph, the tools the node's last reply called, the learned
        waits; revised once the reply is in), and the releases waiting for this call. Neither
        costs an engine request of its own."""
        ext = self.before_call(node, step)
        backend = self.backend
        try:
            if not await self.io.rides(backend):
                return ext
            await self._follow_backend()
        except BackendUnavailable:
            return ext  # the call itself meets the outage (and fails over)
        await self.riding.plan(ext, node, backend)
        return ext

    def call_failed(self, request_id: str) -> None:
        """The call ``request_id`` got no answer: what it carried is forgotten."""
        self.riding.failed(request_id)

    def riding_to(self, request_id: str | None, backend: Backend) -> bool:
        """Whether the releases the call ``request_id`` carries still go to ``backend``."""
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
        answered = getattr(self.backend, "answered_by", None)
        if callable(answered):  # a fleet: the instance the answer names (streamed ones too)
            answered(extension)
            self._follow_instance()
        prompt = int(usage.get("prompt_tokens") or 0)
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        completion = usage.get("completion_tokens")
        st = self.stats
        st.llm_calls += 1
        st.prompt_tokens += prompt
        st.cached_tokens += cached
        held_back = float(extension.get("deferred_s") or 0.0)
        if held_back > 0:  # deferred inside the engine (a vLLM connector's admission hook)
            st.deferrals += 1
            st.deferral_s += held_back
        pressed = retried or held_back > 0
        self.note_call(retried=pressed)
        prefix_ids = extension.get("prefix_ids") or {}
        sequence = prefix_ids.get("sequence") or prefix_ids.get("prompt")
        self.route.observe_call(
            prompt_tokens=prompt, cached_tokens=min(cached, prompt), pressed=pressed
        )
        ste = self.workflow.near_ste(node)
        step = self.workflow.after_call(node, tool_names)
        if self.log is not None:
            covering = self.io.held.get(node)  # the claim that held this call's prefix
            self.log.llm_call(
                claim_id=None if covering is None else covering.claim_id,
                node=node,
                request_id=request_id or "",
                backend=self.backend.name,
                prompt_tokens=prompt,
                cached_tokens=cached,
                recomputed_tokens=prompt - cached,
                latency_s=round(latency_s, 6),
                step=step,
                ste=ste,
                model=model if isinstance(model, str) and model else None,
                completion_tokens=completion if isinstance(completion, int) else None,
                **({"deferred_s": round(held_back, 6)} if held_back > 0 else {}),
                **self.route.hop_fields(),
            )
        previous = self._background
        riding = self.riding.answered(call_id, node, sequence)

        async def replan() -> None:
            if previous is not None:
                await previous
            async with self._lock:
                if riding is None:
                    await self._replan(node, sequence, tool_names)
                else:
                    await self._after_riding(node, riding, extension, sequence, tool_names)
                await self._revise_others(node)
                await self._take_events()

        # the claim round trips overlap with what the workflow does next (tools, other nodes);
        # the next LLM call waits for them (``settle``)
        self._background = asyncio.ensure_future(replan())

    async def settle(self) -> None:
        """Wait for claim work still in flight; re-raises its error (e.g. ``ClaimRefused``)."""
        task, self._background = self._background, None
        if task is not None:
            await task

    def note_call(self, *, retried: bool) -> None:
        """Record an answered LLM call; one that needed a retry met memory pressure."""
        self.workflow.note_call(retried=retried)

    def plan_after_call(
        self, node: str, prefix_id: str, tool_names: Sequence[str] = ()
    ) -> tuple[PrefixContext, ClaimPlan]:
        """The claim to hold on ``node``'s prefix after its call (pure planning, no I/O)."""
        return self.workflow.plan_after_call(node, prefix_id, tool_names)

    # ------------------------------------------------------------------ claims
    async def _follow_backend(self) -> None:
        """With the default planner (``"auto"``): plan ``ranked`` (soft: every prefix claimed
        ``best_effort`` with its reuse hint, ranked by the backend, never harmed) on a backend
        whose descriptor states ``ranks_by_hints``; ``held`` (every likely prefix held
        ``demotable`` with its hint, shed farthest next use first) on one that states
        ``sheds_by_hints`` and ``claims_ride_on_requests`` (vLLM with the connector: a hold
        rides on the call, so holding costs no request); ``default`` on any other. The
        descriptor is the one the claims read anyway (once per backend, again after a
        reroute)."""
        if not self._auto_planner:
            return
        try:
            if await self.io.ranks_by_hints(self.backend):
                name = _RANKED
            elif await self.io.holds_by_hints(self.backend):
                name = _HELD
            else:
                name = _UNRANKED
        except BackendUnavailable:
            return  # keep planning as before; a claim to submit meets the outage itself
        if name != self._ranking:  # per call: only a change of backend changes it
            self._ranking = name
            policy = PlannerPolicy.named(name)
            self.planner.policy = policy
            self.io.policy = policy

    async def _replan(self, node: str, prefix_id: str | None, tool_names: Sequence[str]) -> None:
        await self._follow_backend()
        old = self.io.held.pop(node, None)
        if prefix_id:
            ctx, plan = self.workflow.plan_after_call(node, prefix_id, tool_names)
            hint = self.workflow.reuse_hint(node, ctx, tool=wait_key(node, tool_names))
            await self._hold(node, PrefixId(prefix_id), plan, ctx, hint)
        if old is not None:
            await self.io.release(self.route.named(old.backend), old, "superseded")

    async def _after_riding(
        self,
        node: str,
        riding: Riding,
        extension: Mapping[str, Any],
        prefix_id: str | None,
        tool_names: Sequence[str],
    ) -> None:
        """A call that carried its claim and releases is answered: the releases end, the
        claim is held as decided, then revised with what the reply says (its tool calls):
        released when its reuse became unlikely (a pin at once, a soft hold with the next
        call), renewed when the wait now expected is longer than its TTL. A refused one is
        relaxed one mode down and claimed on its own; a call that carried none gets the claim
        its reply calls for on its own (``_replan``)."""
        self.io.released_with_call(riding.releases, extension)
        backend = self.route.named(riding.backend)
        if riding.claim_id is None or riding.plan is None:
            await self._replan(node, prefix_id, tool_names)
            return
        old = self.io.held.pop(node, None)
        if old is not None:
            self.io.let_go(old, "superseded")
        held = self.io.adopt(backend, node, riding.claim_id, riding.plan, extension, prefix_id)
        if held is None:
            await self._riding_refused(node, riding, prefix_id, tool_names)
            return
        self.io.held[node] = held
        self.wanted.pop(node, None)
        made_with_call = getattr(backend, "claimed_with_call", None)
        if callable(made_with_call):  # a fleet: the claim lives where the call was answered
            made_with_call(held.claim_id)
        _, plan = self.workflow.plan_after_call(node, held.prefix_id, tool_names)
        if plan.mode is None:  # its reuse became unlikely (the human is next, say)
            del self.io.held[node]
            if held.plan.mode in PIN_MODES:
                await self.io.release(backend, held, "reuse_unlikely")  # a pin: now
            else:
                self.io.let_go(held, "reuse_unlikely")
        elif (
            plan.ttl_s is not None and held.plan.ttl_s is not None and plan.ttl_s > held.plan.ttl_s
        ):
            await self.io.renew(backend, held, plan.ttl_s)

    async def _riding_refused(
        self,
        node: str,
        riding: Riding,
        prefix_id: str | None,
        tool_names: Sequence[str],
    ) -> None:
        """The claim a call carried was refused: as ``ClaimIO.submit`` does with a refusal,
        fail (``on_refused="fail"``) or relax one mode down and claim that on its own."""
        assert riding.plan is not None
        assert riding.plan.mode is not None
        assert riding.claim_id is not None
        reason = self.io.last_refusal
        weaker = self.io.react_to_refusal(
            riding.claim_id, riding.plan.mode, node, f"{node}'s {SEQUENCE_OBJECT}"
        )
        if not prefix_id:
            return
        ctx, plan = self.workflow.plan_after_call(node, prefix_id, tool_names)
        if weaker is not None and plan.mode is not None:
            hint = self.workflow.reuse_hint(node, ctx, tool=wait_key(node, tool_names))
            weaker_plan = ClaimPlan(weaker, plan.ttl_s, plan.reason)
            await self._hold(node, PrefixId(prefix_id), weaker_plan, ctx, hint)
        else:
            self.wanted[node] = Wanted(PrefixId(prefix_id), plan, ctx, reason)

    async def _hold(
        self,
        node: str,
        prefix_id: PrefixId,
        plan: ClaimPlan,
        ctx: PrefixContext,
        hint: ReuseHint | None = None,
    ) -> None:
        self.wanted.pop(node, None)
        if plan.mode is not None:
            self.io.last_refusal = None
            held = await self.io.submit(self.backend, node, prefix_id, plan, ctx, hint)
            if held is not None:
                self.io.held[node] = held
            if held is None or held.plan.mode is not plan.mode:
                # refused (relaxed, or dropped): a tool call next reacts to it (toolhold)
                self.wanted[node] = Wanted(prefix_id, plan, ctx, self.io.last_refusal)

    async def _revise_others(self, node: str) -> None:
        """Release claims of other nodes whose reuse became unlikely."""
        held = {n: (h.prefix_id, h.plan) for n, h in self.io.held.items()}
        for other in self.workflow.to_release(held, node):
            claim = self.io.held.pop(other)
            backend = self.route.named(claim.backend)
            pin = claim.plan.mode in PIN_MODES
            if not pin and await self.io.rides(backend):
                self.io.let_go(claim, "reuse_unlikely")  # with the next call there
            else:
                await self.io.release(backend, claim, "reuse_unlikely")

    async def _take_events(self) -> None:
        """Take this session's new events and react to what they did to its claims."""
        await self._react(await self.io.take_events(self.route.backends()))

    async def _react(self, taken: EventOutcomes, *, lapses: bool = True) -> None:
        for held, ev in taken.harmed:
            self.route.observe_harm()
            if self.io.held.get(held.node) is held:
                del self.io.held[held.node]
                held.end_reason = "harmed"
                self.io.ended.append(held)
                self.io.log_end(held, "harmed", cause=ev.data.get("cause"))
            cause = ev.data.get("cause")
            if self.reaction.on_harmed == "fail":
                self.stats.fails += 1
                self.log_reaction(
                    "fail", claim_id=held.claim_id, outcome=ev.event.value, cause=cause
                )
                raise ClaimHarmed(
                    f"claim {held.claim_id} on {held.prefix_id} ({held.node}) was harmed: "
                    f"{cause or 'its prefix lost blocks while the claim held'}",
                    claim_id=held.claim_id,
                    event=ev,
                )
        for held, ev in taken.lapsed if lapses else ():
            if self.io.held.get(held.node) is not held:
                continue  # already let go: nothing to do
            await self._lapsed(held, ev.event.value)

    async def _lapsed(self, held: HeldClaim, what: str) -> None:
        """A held claim was demoted or expired while its node still waits on its prefix."""
        backend = self.route.named(held.backend)
        policy = self.reaction.on_lapsed
        if policy == "renew" and held.plan.ttl_s is not None:
            if await self.io.renew(backend, held, held.plan.ttl_s):
                return
            policy = "replan"
        del self.io.held[held.node]
        reason = "demoted" if what.endswith("demoted") else "expired"
        await self.io.release(backend, held, reason)
        # One re-plan per wait: a claim that lapses again before the node's next call would
        # only be claimed again on the same evidence, a pin renewed forever by its heartbeat.
        wait = self.workflow.wait_started(held.node)
        if policy == "replan" and wait is not None and self._replanned.get(held.node) == wait:
            policy = "drop"
        if policy == "drop":
            self.log_reaction("drop", claim_id=held.claim_id, outcome=what, node=held.node)
            return
        if wait is not None:
            self._replanned[held.node] = wait
        ctx = self.workflow.context(held.node, held.prefix_id, ())
        plan = self.planner.plan(ctx)
        if reason == "demoted" and held.plan.mode is not None and plan.mode is not None:
            # the backend shed it for memory: the same mode would be shed again. One step
            # down the ladder (on vLLM a demotable hold goes to best effort, which it only
            # watches: no claim, and the reaction says so)
            weaker = relax_mode(held.plan.mode, self.planner.policy.soft_mode)
            if protects_at_least(plan.mode, held.plan.mode):
                plan = ClaimPlan(weaker, plan.ttl_s, f"{plan.reason}; one step below demoted")
        self.stats.claims_replanned += 1
        self.log_reaction(
            "replan",
            claim_id=held.claim_id,
            outcome=what,
            node=held.node,
            to_mode=None if plan.mode is None else plan.mode.value,
        )
        await self._hold(held.node, held.prefix_id, plan, ctx)

    async def reroute(self, outcome: ActiveOutcome) -> bool:
        """Move to another member of the pool (its prefixes resident there first), releasing
        this session's claims on the old one; False without a pool or another member."""
        old = self.backend
        new = await self.route.reroute([h.prefix_id for h in self.io.held.values()])
        if new is None:
            return False
        await self.release_all(reason="rerouted")
        self.stats.reroutes += 1
        self.log_reaction(
            "reroute", outcome=outcome.to_dict(), from_backend=old.name, to_backend=new.name
        )
        return True

    async def failover(self, reason: str) -> bool:
        """The instance serving this session stopped answering (a fleet behind a router):
        report its claims lost (never silently: ``claim_ended`` with reason ``instance_lost``
        and a ``failover`` reaction naming them), then go on under a new routing key, where
        the next calls re-plan them. False without a fleet, or once out of hops."""
        moved = await self.route.failover()
        if moved is None:
            return False
        instance, new = moved
        await self.sleep(min(2.0, 0.25 * new.hop))  # give the router's health check a moment
        self._lose_instance(instance, reason, to_backend=new.name)
        return True

    def _lose_instance(self, instance: str | None, reason: str, **where: Any) -> None:
        """Every claim this session had on ``instance`` (gone) ended ``instance_lost``: those
        it held, and those it let go whose release the instance never confirmed; one
        ``reaction_failover`` line names them."""
        gone = self.route.lost_on(instance)
        lost = [h for h in self.io.held.values() if h.claim_id in gone]
        for held in lost:
            self.io.lose(held, "instance_lost")
        waiting = [h for h in self.io.releasing if h.claim_id in gone]
        self.io.releasing = [h for h in self.io.releasing if h.claim_id not in gone]
        for held in waiting:  # let go, but never released there: gone with it
            held.end_reason, held.state = "instance_lost", "unknown"
            self.io.ended.append(held)
            self.io.log_end(held, "instance_lost")
        lost += waiting
        unconfirmed = [h for h in self.io.ended if h.state == "unknown" and h.claim_id in gone]
        for held in unconfirmed:
            held.end_reason = "instance_lost"
        lost += [h for h in unconfirmed if h not in lost]
        self.io.forget(self.backend.name)  # the next instance's cache identity is its own
        self.stats.reroutes += 1
        self.log_reaction(
            "failover",
            reason=reason,
            from_instance=instance,
            lost_claims=[h.claim_id for h in lost],
            **where,
        )

    def _follow_instance(self) -> None:
        """Behind a router: if the router itself moved this session to another instance (it
        ejected a dead worker and kept the key), its claims there are lost: say so."""
        move = self.route.take_move()
        if move is not None:
            old, new = move
            self._lose_instance(
                old, "the router moved the session to another instance", to_instance=new
            )

    async def relax_claims(self, claim_ids: Sequence[str]) -> int:
        """Downgrade this session's claims among ``claim_ids`` one mode each; how many."""
        relaxed = 0
        async with self._lock:
            for node, held in list(self.io.held.items()):
                if held.claim_id not in claim_ids or held.plan.mode is None:
                    continue
                await self.relax_one(node, held, held.plan.ttl_s, "relaxed")
                relaxed += 1
        return relaxed

    async def relax_one(
        self, node: str, held: HeldClaim, ttl_s: float | None, why: str, **fields: Any
    ) -> HeldClaim | None:
        """Let ``held`` (``node``'s claim) go and hold its prefix one mode weaker (with
        ``ttl_s``), logged ``reaction_relax``; the new claim, if any."""
        assert held.plan.mode is not None
        weaker = relax_mode(held.plan.mode, self.io.policy.soft_mode)
        del self.io.held[node]
        await self.io.release(self.route.named(held.backend), held, "relaxed")
        self.stats.claims_relaxed += 1
        self.log_reaction(
            "relax",
            claim_id=held.claim_id,
            from_mode=held.plan.mode.value,
            to_mode=None if weaker is None else weaker.value,
            node=node,
            **fields,
        )
        if weaker is None:
            return None
        ctx = PrefixContext(held.prefix_id, prefix_blocks(held.prefix_id))
        await self._hold(node, held.prefix_id, ClaimPlan(weaker, ttl_s, why), ctx)
        return self.io.held.get(node)

    # ------------------------------------------------------------------ tools
    @contextlib.asynccontextmanager
    async def tool_call(self, tool: str, *, node: str | None = None) -> AsyncIterator[None]:
        """Hold the calling agent's prefix claim across a tool call; record its real duration.
        Tools LangGraph runs (``ToolNode``) inside a claimed graph are recorded the same way
        without this (``agentclaims.bindings.tools``); inside this block they are not counted
        twice."""
        run = await self.start_tool(tool, node=node)
        token = _in_tool.set(True)
        try:
            yield
        except BaseException as exc:
            run.error = type(exc).__name__
            raise
        finally:
            _in_tool.reset(token)
            self.finish_tool(run)

    async def start_tool(
        self, tool: str, *, node: str | None = None, step_node: str | None = None
    ) -> ToolRun:
        """A tool call starts: wait for claim work in flight, renew the agent's claim to the
        predicted tool time when it is shorter, and, when the claim was refused or cannot be
        renewed, apply the session's reaction before the tool runs (``toolhold``: defer,
        reroute, relax, or fail with ``ClaimRefused``). ``node`` is the agent whose prefix waits
        (default: the last LLM caller), ``step_node`` the graph node running the tool (a
        LangGraph ``ToolNode``), if any. Pair with ``finish_tool``."""
        if not isinstance(tool, str) or not tool:
            raise UsageError("tool", f"must be a non-empty string, got {tool!r}")
        await self.settle()
        agent = self.workflow.agent_of_tool(node or self.last_agent)
        predicted = self.workflow.tool_started(tool, agent, step_node)
        async with self._lock:
            held = await hold_for_tool(self, tool, agent, predicted)
        return ToolRun(tool, agent, predicted, held, self.clock())

    def finish_tool(self, run: ToolRun) -> None:
        """A tool call ended (``run.error`` names its exception, if any): record its real
        duration in the wait model, count it, log it."""
        duration = max(0.0, self.clock() - run.started)
        self.workflow.tool_finished(run.tool, run.agent, duration)
        self.stats.tool_calls += 1
        if self.log is not None:
            held = run.held
            self.log.tool_call(
                tool=run.tool,
                duration_s=round(duration, 6),
                predicted_s=round(run.predicted_s, 6),
                ttl_s=None if held is None else held.plan.ttl_s,
                claim_ids=[] if held is None else [held.claim_id],
                node=run.agent,
                error=run.error,
            )

    # ------------------------------------------------------------------ logging
    def _log_session(self, event: str, **fields: Any) -> None:
        if self.log is not None:
            self.log.session(event, **fields)

    def log_reaction(self, kind: str, **fields: Any) -> None:
        """Write a reaction (defer, reroute, relax, fail, ...) to the outcome log, if any."""
        self.io.log_reaction(kind, **fields)


def _claim_error_in(exc: BaseException | None) -> ClaimOutcomeError | BackendUnavailable | None:
    """A ClaimOutcomeError or BackendUnavailable raised below the OpenAI client arrives
    wrapped: find it."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, ClaimOutcomeError | BackendUnavailable):
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None
