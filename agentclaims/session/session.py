"""``ClaimedSession``: one workflow run's claim scope.

A session follows the workflow (which node calls the LLM, which tool runs), keeps the Agent
Execution Graph and its steps-to-execution current, plans a claim on each agent's conversation
prefix after every LLM call, holds it across tool calls, and releases everything when the
workflow ends, also on exceptions and cancellation. Every claim event and every reaction goes to
the workflow's outcome log.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import structlog

from agentclaims.contract import CacheIdentity, ClaimSpec, ProtectionMode
from agentclaims.engine import prefix_blocks
from agentclaims.errors import BackendUnavailable, ClaimOutcomeError, ClaimRefused, UsageError
from agentclaims.graph import END, START, AgentExecutionGraph, SteTracker, ToolTimeModel
from agentclaims.planner import (
    ClaimPlan,
    ClaimPlanner,
    PlannerPolicy,
    PrefixContext,
    relax_mode,
    update_pressure,
)
from agentclaims.session.reactions import Outcome, ReactionPolicy

if TYPE_CHECKING:
    from agentclaims.backends.base import Backend
    from agentclaims.backends.pool import BackendPool
    from agentclaims.observability import WorkflowLog

__all__ = ["ClaimedSession", "HeldClaim", "SessionStats", "current_session"]

_log = structlog.get_logger("agentclaims.session")
_current: ContextVar[ClaimedSession | None] = ContextVar("agentclaims_session", default=None)
_current_node: ContextVar[str | None] = ContextVar("agentclaims_node", default=None)

Sleep = Callable[[float], Awaitable[None]]


def current_session() -> ClaimedSession | None:
    """The session of the running workflow, if any (a context variable: task-local)."""
    return _current.get()


@dataclass(slots=True)
class HeldClaim:
    """A claim this session holds on one agent node's prefix."""

    claim_id: str
    node: str
    prefix_id: str
    plan: ClaimPlan
    backend: str
    since: float
    state: str = "accepted"
    """The claim's state as the backend last reported it (``unknown`` if it could not say)."""
    end_reason: str | None = None
    """Why the session let it go: ``superseded``, ``reuse_unlikely``, ``relaxed``, ``session_end``."""


@dataclass(slots=True)
class SessionStats:
    llm_calls: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    claims_submitted: int = 0
    claims_accepted: int = 0
    claims_refused: int = 0
    claims_relaxed: int = 0
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
    """

    _ids = itertools.count(1)

    def __init__(
        self,
        backend: Backend | BackendPool,
        *,
        workflow_id: str | None = None,
        graph: AgentExecutionGraph | None = None,
        planner: ClaimPlanner | PlannerPolicy | str = "default",
        reaction: ReactionPolicy | str = "defer",
        tool_times: ToolTimeModel | None = None,
        log_dir: str | Path | None = None,
        log_stream: TextIO | None = None,
        horizon: int = 4,
        reload_s_per_block: float = 0.002,
        queue_delay_s: float = 0.05,
        sleep: Sleep = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from agentclaims.backends.pool import BackendPool

        if isinstance(backend, BackendPool):
            self.pool: BackendPool | None = backend
        elif _looks_like_backend(backend):
            self.pool = None
        else:
            raise UsageError("backend", f"expected a Backend or BackendPool, got {backend!r}")
        if workflow_id is not None and (not isinstance(workflow_id, str) or not workflow_id):
            raise UsageError("workflow_id", f"must be a non-empty string, got {workflow_id!r}")
        if graph is not None and not isinstance(graph, AgentExecutionGraph):
            raise UsageError(
                "graph", f"expected an AgentExecutionGraph, got {type(graph).__name__}"
            )
        if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
            raise UsageError("horizon", f"must be an integer >= 1, got {horizon!r}")
        for name, value in (
            ("reload_s_per_block", reload_s_per_block),
            ("queue_delay_s", queue_delay_s),
        ):
            if not isinstance(value, int | float) or value < 0:
                raise UsageError(name, f"must be a number >= 0, got {value!r}")
        if isinstance(planner, str):
            planner = ClaimPlanner(PlannerPolicy.named(planner))
        elif isinstance(planner, PlannerPolicy):
            planner = ClaimPlanner(planner)
        elif not isinstance(planner, ClaimPlanner):
            raise UsageError(
                "planner", f"expected a policy name, PlannerPolicy or ClaimPlanner, got {planner!r}"
            )
        if isinstance(reaction, str):
            reaction = ReactionPolicy.named(reaction)
        elif not isinstance(reaction, ReactionPolicy):
            raise UsageError(
                "reaction", f"expected a reaction name or ReactionPolicy, got {reaction!r}"
            )

        self.workflow_id = workflow_id or f"wf-{uuid.uuid4().hex[:12]}"
        self.session_id = f"s-{uuid.uuid4().hex[:12]}"
        self.owner_scope = f"workflow:{self.workflow_id}"
        self.planner = planner
        self.reaction = reaction
        self.tool_times = tool_times or ToolTimeModel(prior_mean_s=0.1)
        self.graph = graph if graph is not None else AgentExecutionGraph()
        self.horizon = horizon
        self.reload_s_per_block = reload_s_per_block
        self.queue_delay_s = queue_delay_s
        self.sleep = sleep
        self.clock = clock
        self.stats = SessionStats()
        self.pressure = 0.0
        """Recent share of LLM calls the backend deferred or refused (EWMA, 0..1)."""
        self.claims: dict[str, HeldClaim] = {}  # node -> claim held for its next call
        self.ended_claims: list[HeldClaim] = []
        self._backend: Backend | None = None if self.pool is not None else backend  # type: ignore[assignment]
        self._tracker: SteTracker | None = None
        self._last_node: str = START
        self._step_base: dict[str, int] = {}  # graph level -> first LangGraph step seen
        self._last_step: int | None = None  # LangGraph step of the last call
        self._steps: dict[str, int | None] = {}  # node -> relative step of its call in flight
        self._waiting: dict[str, tuple[str, float]] = {}  # node -> (wait key, since)
        self._log_dir = None if log_dir is None else Path(log_dir)
        self._log_stream = log_stream
        self.log: WorkflowLog | None = None
        self._token: Any = None
        self._started = 0.0
        self._closed = False
        self._lock = asyncio.Lock()
        self._event_cursor: dict[str, int] = {}
        self._background: asyncio.Future[None] | None = None
        self._asked_tools: dict[str, bool] = {}  # node -> did its last reply call tools
        self._tools_without_calls: set[str] = set()  # nodes seen running tools unasked
        self._requests = itertools.count(1)

    # ------------------------------------------------------------------ lifecycle
    @property
    def backend(self) -> Backend:
        """The backend this session's calls go to now (fixed, or the pool's affinity choice)."""
        if self._backend is None:
            assert self.pool is not None
            self._backend = self.pool.assign(self.session_id)
        return self._backend

    async def __aenter__(self) -> ClaimedSession:
        if self._token is not None or self._closed:
            raise UsageError("session", "a ClaimedSession can be entered once")
        if self._log_dir is not None or self._log_stream is not None:
            from agentclaims.observability import WorkflowLog

            self.log = WorkflowLog(
                self.workflow_id, self.session_id, directory=self._log_dir, stream=self._log_stream
            )
        self._started = self.clock()
        self._token = _current.set(self)
        self._log_session("session_started", backend=self.backend.name)
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            # release even when the workflow was cancelled: shield the cleanup
            await asyncio.shield(self.release_all())
        finally:
            self._closed = True
            _current.reset(self._token)
            if self.pool is not None:
                self.pool.release(self.session_id)  # its affinity no longer counts as load
            self._log_session(
                "session_ended",
                duration_s=round(self.clock() - self._started, 6),
                error=None if exc is None else type(exc).__name__,
                hit_ratio=round(self.stats.hit_ratio, 6),
            )
            if self.log is not None:
                self.log.close()
        cause = _claim_error_in(exc)
        if cause is not None and cause is not exc:
            raise cause from exc

    async def release_all(self) -> None:
        """Release every claim this session holds (idempotent), after claim work in flight."""
        try:
            await self.settle()
        finally:
            await self._release_held()

    async def _release_held(self) -> None:
        held = list(self.claims.values())
        self.claims.clear()
        for claim in held:
            await self._release(claim, reason="session_end")
        await self._drain_events()

    # ------------------------------------------------------------------ the workflow
    @contextlib.contextmanager
    def node(self, name: str) -> Any:
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

    def _tracker_for_graph(self) -> SteTracker:
        if self._tracker is None or self._tracker.graph is not self.graph:
            self._tracker = SteTracker(self.graph, horizon=self.horizon)
        return self._tracker

    def _enter_node(self, node: str, kind: str = "agent") -> None:
        graph = self.graph
        if node not in graph:
            graph.add_node(node, kind=kind)  # type: ignore[arg-type]
        last = self._last_node
        if last != node or kind == "agent":
            if last not in graph:
                graph.add_node(last, kind="tool")
            via = self._tool_step_between(last, node)
            if via is not None:
                graph.observe_transition(last, via)
                last = via
            graph.observe_transition(last, node)
        self._last_node = node

    def _tool_step_between(self, source: str, target: str) -> str | None:
        """The tool step an unseen ``source -> target`` went through, if the graph has one.

        Tool steps (a ``ToolNode``) make no LLM call, so the session does not see them run; a
        call of ``target`` right after ``source`` with no edge between them, where the graph has
        ``source -> tool -> target``, went through that tool step.
        """
        graph = self.graph
        if target not in graph or graph.has_edge(source, target):
            return None
        for via in graph.successors(source):
            if graph.node_kind(via) == "tool" and graph.has_edge(via, target):
                return via
        return None

    def before_call(self, node: str, step: int | None = None) -> dict[str, Any]:
        """Bookkeeping before an LLM call by ``node``; returns the request's extension object."""
        waited = self._waiting.pop(node, None)
        if waited is not None:
            key, since = waited
            self.tool_times.observe(key, max(0.0, self.clock() - since))
        # a call of the node that just called, unanswered or in the same LangGraph step, is a
        # parallel task (a Send fan-out), not a transition
        same_step = step is not None and step == self._last_step
        if node != self._last_node or (waited is not None and not same_step):
            self._enter_node(node)
        self._last_step = step
        if not self.graph.prefixes_of(node):
            self.graph.add_node(node, kind="agent", prefixes=[f"node:{node}"])
        self._tracker_for_graph().move({node})
        self._steps[node] = self._relative_step(node, step)
        return {
            "session_id": self.session_id,
            "workflow_id": self.workflow_id,
            "owner_scope": self.owner_scope,
            "node": node,
            "step": self._steps[node],
            "request_id": f"{self.session_id}-r{next(self._requests)}",
        }

    def _relative_step(self, node: str, step: object) -> int | None:
        """``step`` counted from this run's first step at ``node``'s graph level: LangGraph's
        ``langgraph_step`` counts on across runs of one thread and restarts in subgraphs."""
        if isinstance(step, bool) or not isinstance(step, int):
            return None
        base = self._step_base.setdefault(node.rpartition(":")[0], step)
        return max(0, step - base)

    async def after_call(
        self,
        node: str,
        extension: Mapping[str, Any],
        usage: Mapping[str, Any],
        *,
        latency_s: float,
        tool_names: Sequence[str] = (),
        request_id: str | None = None,
    ) -> None:
        """Record an answered call and re-plan the claim on ``node``'s conversation prefix."""
        prompt = int(usage.get("prompt_tokens") or 0)
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        st = self.stats
        st.llm_calls += 1
        st.prompt_tokens += prompt
        st.cached_tokens += cached
        prefix_ids = extension.get("prefix_ids") or {}
        sequence = prefix_ids.get("sequence") or prefix_ids.get("prompt")
        tracker = self._tracker_for_graph()
        ste = tracker.near_ste(node) if node in self.graph else float("inf")
        if self.log is not None:
            self.log.llm_call(
                node=node,
                request_id=request_id or "",
                backend=self.backend.name,
                prompt_tokens=prompt,
                cached_tokens=cached,
                recomputed_tokens=prompt - cached,
                latency_s=round(latency_s, 6),
                step=self._steps.pop(node, None),
                ste=ste,
            )
        self._waiting[node] = (_wait_key(node, tool_names), self.clock())
        self._asked_tools[node] = bool(tool_names)
        previous = self._background

        async def replan() -> None:
            if previous is not None:
                await previous
            async with self._lock:
                await self._replan(node, sequence, tool_names)
                await self._revise_others(node)

        # the claim round trips overlap with what the workflow does next (tools, other nodes);
        # the next LLM call waits for them (``settle``)
        self._background = asyncio.ensure_future(replan())

    async def settle(self) -> None:
        """Wait for claim work still in flight; re-raises its error (e.g. ``ClaimRefused``)."""
        task, self._background = self._background, None
        if task is not None:
            await task

    def _context(self, node: str, prefix_id: str, tool_names: Sequence[str]) -> PrefixContext:
        """What we know about ``node``'s next call, seen from the step after this call."""
        graph = self.graph
        tracker = self._tracker_for_graph()
        succ = [s for s in graph.successors(node) if s != END] if node in graph else []
        footprint = prefix_blocks(prefix_id)
        reload_s = footprint * self.reload_s_per_block
        key = _wait_key(node, tool_names)
        wait = self.tool_times.predict(key) if self.tool_times.count(key) else None
        ttl = (
            self.tool_times.ttl(key, queue_delay_s=self.queue_delay_s, reload_s=reload_s)
            if wait is not None or tool_names
            else None
        )
        if tool_names:
            waiting = "tool"
            if wait is None:
                wait = self.tool_times.predict(key)  # the prior, until the tool has a history
            reuse_p, ste = 1.0, 1.0  # the tool result comes back to this very agent
        else:
            # no tool was called, so no tool step comes next (unless this agent's code is seen
            # running tools without the model asking: then anything may follow)
            tools_next = (
                []
                if node in self._tools_without_calls
                else [v for v in succ if graph.node_kind(v) == "tool"]
            )
            reuse_p = tracker.return_reuse(node, exclude=tools_next).probability
            ste = tracker.near_ste(node)
            waiting = "human" if not [v for v in succ if v not in tools_next] else "llm"
        return PrefixContext(
            prefix_id=prefix_id,
            footprint_blocks=footprint,
            ste=ste,
            reuse_probability=reuse_p,
            waiting_on=waiting,  # type: ignore[arg-type]
            expected_wait_s=wait,
            ttl_s=ttl,
            pressure=self.pressure,
        )

    def note_call(self, *, retried: bool) -> None:
        """Record an answered LLM call; one that needed a retry (deferred or refused first)
        met memory pressure. ``pressure`` is the recent share of such calls."""
        self.pressure = update_pressure(self.pressure, retried)

    def plan_after_call(
        self, node: str, prefix_id: str, tool_names: Sequence[str] = ()
    ) -> tuple[PrefixContext, ClaimPlan]:
        """The claim to hold on ``node``'s prefix after its call (pure planning, no I/O)."""
        ctx = self._context(node, prefix_id, tool_names)
        return ctx, self.planner.plan(ctx)

    async def _replan(self, node: str, prefix_id: str | None, tool_names: Sequence[str]) -> None:
        old = self.claims.pop(node, None)
        if prefix_id:
            ctx, plan = self.plan_after_call(node, prefix_id, tool_names)
            if plan.mode is not None:
                held = await self._submit(node, prefix_id, plan, ctx)
                if held is not None:
                    self.claims[node] = held
        if old is not None:
            await self._release(old, reason="superseded")

    async def _revise_others(self, node: str) -> None:
        """Release or relax claims of other nodes whose reuse became unlikely."""
        tracker = self._tracker_for_graph()
        for other, held in list(self.claims.items()):
            if other == node or other not in self.graph:
                continue
            reuse = tracker.node_reuse(other)
            ctx = PrefixContext(
                prefix_id=held.prefix_id,
                footprint_blocks=prefix_blocks(held.prefix_id),
                ste=tracker.near_ste(other),
                reuse_probability=reuse.probability,
                waiting_on="llm",
            )
            verdict = self.planner.revise(ctx, held.plan, None)
            if verdict == "release":
                del self.claims[other]
                await self._release(held, reason="reuse_unlikely")

    async def _submit(
        self, node: str, prefix_id: str, plan: ClaimPlan, ctx: PrefixContext
    ) -> HeldClaim | None:
        backend = self.backend
        mode: ProtectionMode | None = plan.mode
        while mode is not None:
            claim_id = f"{self.session_id}-c{next(self._ids)}"
            ttl = (
                plan.ttl_s
                if mode in (ProtectionMode.EXPIRING, ProtectionMode.HARD_PROTECTED)
                else None
            )
            if mode is ProtectionMode.EXPIRING and ttl is None:
                ttl = self.planner.policy.default_ttl_s
            spec = ClaimSpec(
                claim_id=claim_id,
                owner_scope=self.owner_scope,
                object_id=prefix_id,
                cache_identity=await self._identity(backend),
                footprint_blocks=ctx.footprint_blocks,
                protection_mode=mode,
                ttl_s=ttl,
            )
            if self.log is not None:
                self.log.claim_planned(
                    claim_id=claim_id,
                    prefix_id=prefix_id,
                    mode=mode.value,
                    ttl_s=ttl,
                    ste=ctx.ste,
                    reuse_probability=round(ctx.reuse_probability, 6),
                    reason=plan.reason,
                )
            self.stats.claims_submitted += 1
            decision = await backend.submit_claim(spec)
            if decision.accepted:
                self.stats.claims_accepted += 1
                self.stats.modes[mode.value] = self.stats.modes.get(mode.value, 0) + 1
                return HeldClaim(
                    claim_id,
                    node,
                    prefix_id,
                    ClaimPlan(mode, ttl, plan.reason),
                    backend.name,
                    self.clock(),
                )
            self.stats.claims_refused += 1
            if self.reaction.on_refused == "fail":
                self.stats.fails += 1
                self.log_reaction("fail", claim_id=claim_id, outcome=decision.reason)
                raise ClaimRefused(
                    f"claim {claim_id} on {prefix_id} refused: {decision.reason}",
                    claim_id=claim_id,
                    outcome=decision.reason,
                )
            if not self.reaction.relax_claims:
                return None
            weaker = relax_mode(mode)
            self.stats.claims_relaxed += 1
            self.log_reaction(
                "relax",
                claim_id=claim_id,
                outcome=decision.reason,
                from_mode=mode.value,
                to_mode=None if weaker is None else weaker.value,
            )
            mode = weaker
        return None

    async def _identity(self, backend: Backend) -> CacheIdentity:
        ident = getattr(backend, "cache_identity", None)
        if isinstance(ident, CacheIdentity):
            return ident
        desc = await backend.descriptor()
        return CacheIdentity.from_dict(desc["cache_identity"])

    async def _release(self, held: HeldClaim, reason: str) -> None:
        backend = self._backend_named(held.backend)
        held.end_reason = reason
        try:
            view = await backend.release_claim(held.claim_id, self.owner_scope)
            held.state = view.state.value
        except ClaimOutcomeError:
            raise
        except Exception as exc:  # a backend gone away must not leak the workflow's error
            _log.warning("claim_release_failed", claim_id=held.claim_id, error=repr(exc))
            held.state = "unknown"
        self.ended_claims.append(held)

    def _backend_named(self, name: str) -> Backend:
        if self.pool is not None:
            return self.pool.get(name)
        return self.backend

    async def _drain_events(self) -> None:
        """Copy this session's claim events from the backend(s) into the outcome log."""
        if self.log is None:
            return
        backends = self.pool.backends if self.pool is not None else [self.backend]
        for backend in backends:
            since = self._event_cursor.get(backend.name, 0)
            for ev in await backend.events(since, id_prefix=self.session_id):
                self._event_cursor[backend.name] = max(
                    self._event_cursor.get(backend.name, 0), ev.seq
                )
                self.log.claim_event(ev, backend=backend.name)

    async def reroute(self, outcome: Outcome) -> bool:
        """Move to another member of the pool (its prefixes resident there first), releasing
        this session's claims on the old one; False without a pool or another member."""
        if self.pool is None:
            return False
        old = self.backend
        new = await self.pool.reroute(self.session_id, [h.prefix_id for h in self.claims.values()])
        if new is None:
            return False
        await self.release_all()
        self._backend = new
        self.stats.reroutes += 1
        self.log_reaction(
            "reroute", outcome=outcome.to_dict(), from_backend=old.name, to_backend=new.name
        )
        return True

    async def relax_claims(self, claim_ids: Sequence[str]) -> int:
        """Downgrade this session's claims among ``claim_ids`` one mode each; how many."""
        relaxed = 0
        async with self._lock:
            for node, held in list(self.claims.items()):
                if held.claim_id not in claim_ids or held.plan.mode is None:
                    continue
                weaker = relax_mode(held.plan.mode)
                del self.claims[node]
                await self._release(held, reason="relaxed")
                self.stats.claims_relaxed += 1
                self.log_reaction(
                    "relax",
                    claim_id=held.claim_id,
                    from_mode=held.plan.mode.value,
                    to_mode=None if weaker is None else weaker.value,
                )
                relaxed += 1
                if weaker is not None:
                    ctx = PrefixContext(held.prefix_id, prefix_blocks(held.prefix_id))
                    new = await self._submit(
                        node, held.prefix_id, ClaimPlan(weaker, held.plan.ttl_s, "relaxed"), ctx
                    )
                    if new is not None:
                        self.claims[node] = new
        return relaxed

    # ------------------------------------------------------------------ tools
    @contextlib.asynccontextmanager
    async def tool_call(self, tool: str, *, node: str | None = None) -> AsyncIterator[None]:
        """Hold the calling agent's prefix claim across a tool call; record its real duration."""
        if not isinstance(tool, str) or not tool:
            raise UsageError("tool", f"must be a non-empty string, got {tool!r}")
        await self.settle()
        agent = node or (self._last_node if self._last_node not in (START, END) else "agent")
        if not self._asked_tools.get(agent, True):
            self._tools_without_calls.add(agent)
        held = self.claims.get(agent)
        predicted = self.tool_times.predict(tool)
        if held is not None and held.plan.ttl_s is not None:
            want = predicted * self.planner.policy.ttl_margin
            if want > held.plan.ttl_s:
                backend = self._backend_named(held.backend)
                with contextlib.suppress(ClaimOutcomeError, UsageError):
                    await backend.renew_claim(held.claim_id, self.owner_scope, ttl_s=want)
                    held.plan = ClaimPlan(held.plan.mode, want, held.plan.reason)
        self._enter_node(f"tool:{tool}", kind="tool")
        started = self.clock()
        try:
            yield
        finally:
            duration = max(0.0, self.clock() - started)
            self.tool_times.observe(tool, duration)
            self._waiting.pop(agent, None)  # measured here; not again as a gap at the next call
            self.stats.tool_calls += 1
            if self.log is not None:
                self.log.tool_call(
                    tool=tool,
                    duration_s=round(duration, 6),
                    predicted_s=round(predicted, 6),
                    ttl_s=None if held is None else held.plan.ttl_s,
                    claim_ids=[] if held is None else [held.claim_id],
                )

    # ------------------------------------------------------------------ logging
    def _log_session(self, event: str, **fields: Any) -> None:
        if self.log is not None:
            self.log.session(event, **fields)

    def log_reaction(self, kind: str, **fields: Any) -> None:
        """Write a reaction (defer, reroute, relax, fail) to the outcome log, if there is one."""
        if self.log is not None:
            self.log.reaction(kind, **fields)


def _wait_key(node: str, tool_names: Sequence[str]) -> str:
    """What the gap until ``node``'s next call is learned under: its tools, or the node."""
    return "+".join(sorted(set(tool_names))) if tool_names else f"node:{node}"


def _looks_like_backend(obj: object) -> bool:
    return all(
        hasattr(obj, name) for name in ("submit_claim", "release_claim", "http_client", "name")
    )


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
