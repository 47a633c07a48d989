"""The session's part without I/O: what the agent did, turned into claim plans.

``WorkflowModel`` keeps the Agent Execution Graph current (learning transitions and the tool
steps it cannot see run), counts this run's steps, times the waits between an agent's calls
(tool time, learned by ``ToolTimeModel``), builds the ``PrefixContext`` of each agent's next
call (steps-to-execution, reuse probability, expected wait, TTL, memory pressure) and asks the
planner. It never touches a backend, so the replay and the benchmarks drive it on a virtual
clock exactly as a session does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from agentclaims.contract import ProtectionMode, ReuseHint, prefix_blocks
from agentclaims.graph import END, START, AgentExecutionGraph, SteTracker, ToolTimeModel
from agentclaims.planner import (
    ClaimPlan,
    ClaimPlanner,
    PrefixContext,
    update_pressure,
)
from agentclaims.session.poolshare import DENSER_HOLDS, QUIET_WINDOW_S, PoolShare, pool_survival

__all__ = ["QUIET_WINDOW_S", "WorkflowModel", "renews_claim", "wait_key"]


def wait_key(node: str, tool_names: Sequence[str]) -> str:
    """What the gap until ``node``'s next call is learned under: its tools, or the node."""
    return "+".join(sorted(set(tool_names))) if tool_names else f"node:{node}"


TOOL_STEP = "tool:"
"""The prefix of the step a tool called outside a tool node is given (``tool:<tool>``)."""


def renews_claim(held_blocks: int, shared_blocks: int) -> bool:
    """Whether a claim held on ``held_blocks`` leading blocks of an agent's context still
    serves its new context (``shared_blocks`` in common with them): renew it with the new
    reuse hint (one round trip, nothing per block) instead of claiming the new context.

    It does while the held prefix is wholly kept: the claim then covers the stable leading run
    (system prompt and early history) that every later call reuses, and the hint, which names
    the agent, ranks all the agent's blocks. A rewrite that cuts into it takes a new claim."""
    return 0 < held_blocks <= shared_blocks


class WorkflowModel:
    """The workflow as the session sees it, and the claim each agent's prefix deserves."""

    def __init__(
        self,
        graph: AgentExecutionGraph,
        planner: ClaimPlanner,
        tool_times: ToolTimeModel,
        *,
        horizon: int,
        reload_s_per_block: float,
        queue_delay_s: float,
        clock: Callable[[], float],
    ) -> None:
        self.graph = graph
        self.planner = planner
        self.tool_times = tool_times
        self.horizon = horizon
        self.reload_s_per_block = reload_s_per_block
        self.queue_delay_s = queue_delay_s
        self.clock = clock
        self.pressure = 0.0
        """Recent share of LLM calls the backend deferred or refused (EWMA, 0..1)."""
        self.call_latency_s = 0.0
        """Recent LLM-call latency, send to answer (EWMA; 0 before any): how long a next call
        may take to reach its prefix in a busy engine (``PrefixContext.admission_s``)."""
        self.pool_survival_s: float | None = None
        """How long an unheld block freed now survives the engine's evictions, as its last
        answer said (``inf``: it evicts nothing lately; ``None``: unknown)."""
        self.share: PoolShare | None = None
        """The engine's pool as this process's sessions share it (its figures, the holds
        made, the room left), set by the session before each call; ``None``: planned alone."""
        self.owner = ""
        """The session the holds recorded in ``share`` are under."""
        self.run_ends_when_done = False
        """The session is one run of a graph (``ClaimedGraph``, ``ClaimsMiddleware``): a reply
        after which nothing but the human may follow ends it (``done_after_reply``)."""
        self.last_node: str = START
        self._tracker: SteTracker | None = None
        self._step_base: dict[str, int] = {}  # graph level -> first LangGraph step seen
        self._last_step: int | None = None  # LangGraph step of the last call
        self._steps: dict[str, int | None] = {}  # node -> relative step of its call in flight
        self._waiting: dict[str, tuple[str, float]] = {}  # node -> (wait key, since)
        self._asked_tools: dict[str, bool] = {}  # node -> did its last reply call tools
        self._last_tools: dict[str, tuple[str, ...]] = {}  # node -> its last reply's tools
        self._tools_without_calls: set[str] = set()  # nodes seen running tools unasked
        self._after_reply_cache: dict[tuple[str, bool], tuple[tuple[str, ...], str]] = {}
        self._after_reply_of: tuple[AgentExecutionGraph, int] | None = None
        self._caller: str | None = None  # the node that made the last LLM call
        self._handed_over: set[str] = set()  # nodes that handed over and have not called since
        self._handoffs: dict[str, list[int]] = {}  # node -> [handoffs, comebacks] this run

    # ------------------------------------------------------------------ the graph
    @property
    def tracker(self) -> SteTracker:
        if self._tracker is None or self._tracker.graph is not self.graph:
            self._tracker = SteTracker(self.graph, horizon=self.horizon)
        return self._tracker

    def near_ste(self, node: str) -> float:
        return self.tracker.near_ste(node) if node in self.graph else float("inf")

    def enter_node(self, node: str, kind: str = "agent") -> None:
        graph = self.graph
        if node not in graph:
            graph.add_node(node, kind=kind)  # type: ignore[arg-type]
        last = self.last_node
        if last != node or kind == "agent":
            if last not in graph:
                graph.add_node(last, kind="tool")
            via = self._tool_step_between(last, node)
            if via is not None:
                graph.observe_transition(last, via)
                last = via
            graph.observe_transition(last, node)
        self.last_node = node

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

    # ------------------------------------------------------------------ LLM calls
    def before_call(self, node: str, step: int | None = None) -> int | None:
        """Bookkeeping before an LLM call by ``node``; its step relative to this run."""
        waited = self._waiting.pop(node, None)
        if waited is not None:
            key, since = waited
            self.tool_times.observe(key, max(0.0, self.clock() - since))
        # a call of the node that just called, unanswered or in the same LangGraph step, is a
        # parallel task (a Send fan-out), not a transition
        same_step = step is not None and step == self._last_step
        if node != self.last_node or (waited is not None and not same_step):
            self.enter_node(node)
        self._hand_over(node, same_step)
        self._last_step = step
        if not self.graph.prefixes_of(node):
            self.graph.add_node(node, kind="agent", prefixes=[f"node:{node}"])
        self.tracker.move({node})
        self._steps[node] = self._relative_step(node, step)
        return self._steps[node]

    def _hand_over(self, node: str, same_step: bool) -> None:
        """Count ``node``'s call as a handover from the last caller (another agent step, not
        one running beside it: in the same step of the same graph level, as a ``Send``
        fan-out does), and as a comeback if ``node`` had handed over."""
        last, self._caller = self._caller, node
        if node in self._handed_over:
            self._handed_over.discard(node)
            self._handoffs[node][1] += 1
        if last is None or last == node or last not in self.graph:
            return
        beside = same_step and last.rpartition(":")[0] == node.rpartition(":")[0]
        if not beside:
            self._handed_over.add(last)
            self._handoffs.setdefault(last, [0, 0])[0] += 1

    def finish(self) -> None:
        """The run completed: teach the graph how often each step that handed over called
        again (``AgentExecutionGraph.comeback_probability``). A run cut short teaches
        nothing (its steps might have come back)."""
        for node, (handoffs, comebacks) in self._handoffs.items():
            if node in self.graph:
                self.graph.observe_handoffs(node, handoffs, comebacks)
        self._handoffs.clear()

    def reuse_probability(self, node: str) -> float:
        """Chance that ``node`` calls again within the horizon: the transition model's, and
        no more than the graph learned of steps like it that handed over (``node`` has)."""
        p = self.tracker.node_reuse(node).probability
        if node in self._handed_over:
            learned = self.graph.comeback_probability(node)
            if learned is not None:
                return min(p, learned)
        return p

    def _relative_step(self, node: str, step: object) -> int | None:
        """``step`` counted from this run's first step at ``node``'s graph level: LangGraph's
        ``langgraph_step`` counts on across runs of one thread and restarts in subgraphs."""
        if isinstance(step, bool) or not isinstance(step, int):
            return None
        base = self._step_base.setdefault(node.rpartition(":")[0], step)
        return max(0, step - base)

    def after_call(self, node: str, tool_names: Sequence[str]) -> int | None:
        """An answered call: its wait until ``node``'s next call starts now. Returns the
        call's relative step."""
        self._waiting[node] = (wait_key(node, tool_names), self.clock())
        self._asked_tools[node] = bool(tool_names)
        self._last_tools[node] = tuple(tool_names)
        if tool_names:  # a reply that called no tool ends the node's turn, not its habit
            self.tool_times.note_node_tools(node, tool_names)
        return self._steps.pop(node, None)

    def wait_started(self, node: str) -> float | None:
        """When ``node``'s current wait (since its last answered call) began, if it waits."""
        waiting = self._waiting.get(node)
        return None if waiting is None else waiting[1]

    def note_pool(self, pool: object) -> None:
        """The engine's pool pressure from an answer (its ``agentclaims.pool``: evicted
        blocks per second and ``survival_s``); an answer without it leaves it unknown. A pool
        that evicted nothing over its window (``window_s``) kept every block that long, and
        vouches for no longer: an engine that idled through the window says nothing of the
        tenant that starts next. Its survival is the window (unknown without one)."""
        self.pool_survival_s = pool_survival(pool)

    def note_call(self, *, retried: bool, latency_s: float | None = None) -> None:
        """Record an answered LLM call (``latency_s``: send to answer); one that needed a
        retry (deferred or refused first) met memory pressure. ``pressure`` is the recent
        share of such calls."""
        self.pressure = update_pressure(self.pressure, retried)
        if latency_s is not None and math.isfinite(latency_s) and latency_s >= 0:
            last = self.call_latency_s
            self.call_latency_s = latency_s if not last else last + 0.3 * (latency_s - last)

    # ------------------------------------------------------------------ tools
    def agent_of_tool(self, node: str | None) -> str:
        """The agent whose prefix a tool call waits on: ``node``, else the last caller."""
        return node or (self.last_node if self.last_node not in (START, END) else "agent")

    def tool_started(self, tool: str, agent: str, step_node: str | None = None) -> float:
        """A tool call starts (in the graph node ``step_node``, e.g. a ``ToolNode``, else a
        step of its own, ``tool:<tool>``); returns its predicted duration."""
        if not self._asked_tools.get(agent, True):
            self._tools_without_calls.add(agent)
        predicted = self.tool_times.predict(tool)
        self.enter_node(step_node or f"{TOOL_STEP}{tool}", kind="tool")
        return predicted

    def tool_finished(self, tool: str, agent: str, duration_s: float) -> None:
        self.tool_times.observe(tool, duration_s)
        self._waiting.pop(agent, None)  # measured here; not again as a gap at the next call

    # ------------------------------------------------------------------ planning
    def expected_tools(self, node: str) -> tuple[str, ...]:
        """The tools ``node``'s coming reply is expected to call, before it is known: those
        its last reply called; before it has replied in this run, those it called in an
        earlier run sharing the wait model (the tools of a claimed graph's node seldom
        change); else its graph's tool step, if it has one (an agent wired to tools calls
        them first): a step of its own for one tool (``tool:<tool>``, ``tool_started``)
        stands for that tool, whose waits are learned under its name; else none."""
        known = self._last_tools.get(node)
        if known is None:
            known = self.tool_times.node_tools(node)
        if known is not None:
            return known
        graph = self.graph
        if node in graph:
            for succ in graph.successors(node):
                if succ != END and graph.node_kind(succ) == "tool":
                    return (succ.removeprefix(TOOL_STEP),)
        return ()

    def context(
        self,
        node: str,
        prefix_id: str,
        tool_names: Sequence[str],
        *,
        footprint: int | None = None,
        mid_wait: bool = False,
        sized: bool = True,
    ) -> PrefixContext:
        """What we know about ``node``'s next call, seen from the step after this call
        (``footprint``: the prefix's blocks, when ``prefix_id`` does not say: a claim planned
        before the call, on what it will leave cached). ``mid_wait``: seen now, while
        ``node`` waits after its last reply (its tools are that reply's; the wait and the TTL
        are what remains of a wait that already lasted this long). ``sized=False``: the
        footprint is a placeholder (a node's first call: what it leaves is unknown), so the
        plan is not weighed by time."""
        tracker = self.tracker
        if footprint is None:
            footprint = prefix_blocks(prefix_id)
        reload_s = footprint * self.reload_s_per_block
        waited = 0.0
        waiting_since = self._waiting.get(node) if mid_wait else None
        if waiting_since is not None:
            tool_names = self._last_tools.get(node, ())
            waited = max(0.0, self.clock() - waiting_since[1])
        key = wait_key(node, tool_names)
        wait: float | None = None
        ttl: float | None = None
        seen = self.tool_times.count(key)
        if tool_names or seen:  # a tool's prior until it has a history
            wait, ttl = self.tool_times.forecast(
                key, queue_delay_s=self.queue_delay_s, reload_s=reload_s, waited_s=waited
            )
        if tool_names:
            waiting = "tool"
            reuse_p, ste = 1.0, 1.0  # the tool result comes back to this very agent
        else:
            tools_next, waiting = self._after_reply(node)
            reuse_p = tracker.return_reuse(node, exclude=tools_next).probability
            ste = tracker.near_ste(node)
        share = self.share
        if share is not None and sized:
            share.note_footprint((self.owner, node), footprint)
        return PrefixContext(
            prefix_id=prefix_id,
            footprint_blocks=footprint,
            ste=ste,
            reuse_probability=reuse_p,
            waiting_on=waiting,  # type: ignore[arg-type]
            expected_wait_s=wait,
            wait_learned=bool(seen),  # a prior alone grounds no pin (fail closed)
            ttl_s=ttl,
            pressure=self.pressure,
            # its own last answer's, else what the engine last told any session here (a
            # session's first call plans with the pool as the process knows it)
            pool_survival_s=self.pool_survival_s
            if self.pool_survival_s is not None or share is None
            else share.pool_survival_s,
            admission_s=self.call_latency_s,
            reload_s=reload_s if sized else None,
            evicted_per_s=None if share is None else share.evicted_per_s,
            pool_room=None if share is None else share.room((self.owner, node), footprint),
            displaced_reuse_p=None if share is None else share.displaced_reuse_p,
            hold_kept_p=None if share is None else share.hold_kept_p,
        )

    def done_after_reply(
        self, node: str, prefix_id: str, tools: Sequence[str], *, footprint: int, sized: bool
    ) -> bool:
        """Whether nothing uses ``node``'s prefix (``prefix_id``, ``footprint`` blocks) after a
        reply of it that calls no tool, its call's claim planned with ``tools`` expected: only
        the human may follow it, and the run ends there (``run_ends_when_done``) or the planner
        would claim nothing for that wait. The call then asks ``release_when_done``."""
        if self._after_reply(node)[1] != "human":
            return False
        if self.run_ends_when_done:
            return True
        if not tools:
            return False  # the claim the call carries is the plan for such a reply
        ctx = self.context(node, prefix_id, (), footprint=footprint, sized=sized)
        return self.planner.plan(ctx).mode is None

    def _after_reply(self, node: str) -> tuple[tuple[str, ...], str]:
        """After a reply of ``node`` that called no tool: the tool steps that cannot come next
        and what the wait is for (``"human"`` where nothing else may follow, else ``"llm"``).
        No tool step comes next unless this agent's code is seen running tools without the
        model asking (then anything may follow). Cached until the graph's structure changes."""
        graph = self.graph
        if self._after_reply_of != (graph, graph.structure_version):
            self._after_reply_cache.clear()
            self._after_reply_of = (graph, graph.structure_version)
        unasked = node in self._tools_without_calls
        known = self._after_reply_cache.get((node, unasked))
        if known is None:
            succ = [s for s in graph.successors(node) if s != END] if node in graph else []
            tools = () if unasked else tuple(v for v in succ if graph.node_kind(v) == "tool")
            waiting = "llm" if any(v not in tools for v in succ) else "human"
            known = self._after_reply_cache[(node, unasked)] = (tools, waiting)
        return known

    def plan_after_call(
        self,
        node: str,
        prefix_id: str,
        tool_names: Sequence[str] = (),
        *,
        footprint: int | None = None,
        sized: bool = True,
    ) -> tuple[PrefixContext, ClaimPlan]:
        """The claim to hold on ``node``'s prefix after its call: the planner's, where the
        pool has room for it beside the holds worth more per block-second (``PoolShare``)."""
        ctx = self.context(node, prefix_id, tool_names, footprint=footprint, sized=sized)
        plan = self.planner.plan(ctx)
        share = self.share
        if share is None:
            return ctx, plan
        key = (self.owner, node)
        if plan.mode is None or plan.mode is ProtectionMode.BEST_EFFORT:
            share.drop(key)  # a hint holds nothing
            return ctx, plan
        blocks = max(1, ctx.footprint_blocks)
        held_s = max(ctx.expected_wait_s or 0.0, 0.1) + ctx.admission_s
        saved = (plan.saving_s or 0.0) - (plan.cost_s or 0.0)
        density = saved / (blocks * held_s) if plan.saving_s is not None else math.inf
        if share.fits(key, blocks, density):
            share.hold(key, blocks, density, held_s)
            return ctx, plan
        share.drop(key)
        return ctx, ClaimPlan(None, reason=DENSER_HOLDS, saving_s=plan.saving_s, cost_s=plan.cost_s)

    # ------------------------------------------------------------------ reuse hints
    def reuse_hint(
        self, node: str, ctx: PrefixContext, *, subagents: int = 0, tool: str | None = None
    ) -> ReuseHint:
        """What the engine should know about ``node``'s next call, from the context just
        planned: the wait class (a tool, sub-agents launched, the human, another agent), the
        tool's predicted duration."""
        if subagents:
            return ReuseHint(agent=node, wait_class="subagents", subagents=subagents)
        if ctx.waiting_on == "tool":
            return ReuseHint(
                agent=node, wait_class="tool", tool=tool, expected_s=ctx.expected_wait_s
            )
        wait_class = {"human": "user", "llm": "llm"}.get(ctx.waiting_on, "unknown")
        return ReuseHint(agent=node, wait_class=wait_class, expected_s=ctx.expected_wait_s)

    @staticmethod
    def closed_hint(node: str) -> ReuseHint:
        """``node`` is done (it returned, or the session closed): its prefix is dead."""
        return ReuseHint(agent=node, session="closed")

    @staticmethod
    def rewrite_hint(node: str, keep_blocks: int) -> ReuseHint:
        """``node``'s next call rewrote its context, keeping ``keep_blocks`` leading blocks."""
        return ReuseHint(agent=node, wait_class="llm", keep_blocks=keep_blocks)

    def to_release(self, held: Mapping[str, tuple[str, ClaimPlan]], node: str) -> list[str]:
        """The other nodes whose held claims (``node -> (prefix_id, plan)``) became unlikely
        to pay for themselves."""
        tracker = self.tracker
        out = []
        for other, (prefix_id, plan) in held.items():
            if other == node or other not in self.graph:
                continue
            ctx = PrefixContext(
                prefix_id=prefix_id,
                footprint_blocks=prefix_blocks(prefix_id),
                ste=tracker.near_ste(other),
                reuse_probability=self.reuse_probability(other),
                waiting_on="llm",
            )
            if self.planner.revise(ctx, plan, None) == "release":
                out.append(other)
        return out
