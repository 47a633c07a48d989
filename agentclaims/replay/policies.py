"""The replay's eviction policies, each its paper's rule (../shared/notes/policies.md).

All are engine :class:`~agentclaims.engine.EvictionPolicy` s over resident, unclaimed blocks,
fed by the replay hooks (:class:`~agentclaims.replay.model.PolicyHooks`) with what a serving
system and the agent SDK know online: arrivals, starts, finishes with their stop reason
(``tool_use`` = a tool runs and the session comes back; ``end_turn`` = the human has the turn),
sub-agents starting and returning, and the clock. Only :class:`OptimalPolicy` reads the future.

The engine parks a request's blocks during ``finish`` (tail first), right after ``on_finish``,
so a block inserted then belongs to the session that just finished (the last user of a shared
block owns it).

The ``agentclaims`` row's agent side is the SDK's session pipeline
(:mod:`agentclaims.replay.pipeline`); the rows on vLLM's pool (``lru-vllm``,
``agentclaims-vllm``) live in :mod:`agentclaims.replay.vllm_pool` and are registered here.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from agentclaims.contract import ClaimSpec, ProtectionMode, ReuseHint
from agentclaims.engine import (
    Block,
    BlockHash,
    KVEngine,
    LRUPolicy,
    NextUsePolicy,
    PriorityPolicy,
    WaitModel,
    prefix_id_of,
)
from agentclaims.errors import UnknownNameError
from agentclaims.graph import ToolTimeModel
from agentclaims.planner import ClaimPlan, ClaimPlanner, PlannerPolicy, PrefixContext, relax_ladder
from agentclaims.replay.model import (
    PolicyHooks,
    ReplayEngine,
    ReplayPolicy,
    ServiceModel,
    SessionState,
)
from agentclaims.replay.pipeline import HeldClaim, SessionPipeline, TraceWorkflow, shared_blocks
from agentclaims.replay.vllm_pool import AgentClaimsVllmPolicy, LruVllmPolicy
from agentclaims.session.workflow import renews_claim

if TYPE_CHECKING:
    from agentclaims.replay.harness import Schedule
    from agentclaims.replay.traces import Trace, TraceRequest

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

_NS_SHIFT = 40  # must match agentclaims.replay.traces._NAMESPACE_SHIFT


class LruReplayPolicy(PolicyHooks, LRUPolicy):
    """Stock vLLM prefix caching: the engine's LRU free-block queue."""


# ---------------------------------------------------------------------------- KVFlow
class KVFlowPolicy(PolicyHooks, PriorityPolicy):
    """KVFlow: priority from steps-to-execution, ``prio = min(H + 1, STE)``, farthest level
    evicted first, LRU inside a level (the engine's :class:`PriorityPolicy`).

    A session's STE, from what is known online: running = 0; its last response ended in
    ``tool_use`` = 1 (the tool's result comes back next step); stop unknown = 2; ``end_turn``
    = 3 (a human turn first); waiting for sub-agents = 1 + max over them (AND-join); finished
    sub-agent = H + 1. A block takes the smallest STE over the live sessions of its trace whose
    context holds it (a shared prefix is as urgent as its most urgent user).
    """

    H = 4

    def __init__(self) -> None:
        PriorityPolicy.__init__(self, self._priority, name="kvflow")
        self._ste: dict[int, int] = {}
        self._ctx: dict[int, frozenset[int]] = {}
        self._live: dict[int, dict[int, SessionState]] = {}
        self._by_hash: dict[int, Block] = {}

    def _session_ste(self, s: SessionState) -> int:
        if s.done:
            return self.H + 1
        if s.running:
            return 0
        if s.waiting_subagents:
            kids = [
                self._ste.get(c.sid, 1) for c in self._live[s.ordinal].values() if c.parent is s
            ]
            return min(self.H + 1, 1 + max(kids, default=1))
        return {"tool_use": 1, "end_turn": 3}.get(s.last_stop, 2)

    def _priority(self, h: BlockHash) -> int:
        ns = h >> _NS_SHIFT
        users: Iterable[SessionState] = (
            self._live.get(ns - 1, {}).values()
            if ns
            else (s for group in self._live.values() for s in group.values())
        )
        ste = min(
            (self._ste.get(u.sid, self.H + 1) for u in users if h in self._ctx.get(u.sid, ())),
            default=self.H + 1,
        )
        return self.H + 1 - min(self.H + 1, ste)

    def _refresh(self, s: SessionState) -> None:
        ste = self._session_ste(s)
        if self._ste.get(s.sid) == ste:
            return
        self._ste[s.sid] = ste
        by_hash = self._by_hash
        for h in self._ctx.get(s.sid, ()):
            block = by_hash.get(h)
            if block is not None:
                self.reprioritize(block)
        if s.parent is not None and not s.parent.done:
            self._refresh(s.parent)

    def insert(self, block: Block) -> None:
        PriorityPolicy.insert(self, block)
        assert block.block_hash is not None
        self._by_hash[block.block_hash] = block

    def remove(self, block: Block) -> None:
        PriorityPolicy.remove(self, block)
        self._by_hash.pop(block.block_hash, None)  # type: ignore[arg-type]

    def pop_victim(self) -> Block | None:
        block = PriorityPolicy.pop_victim(self)
        if block is not None:
            self._by_hash.pop(block.block_hash, None)  # type: ignore[arg-type]
        return block

    def on_begin(self, session: SessionState, request: TraceRequest, now: float) -> None:
        self._live.setdefault(session.ordinal, {})[session.sid] = session
        self._ctx[session.sid] = frozenset(request.block_hashes)
        self._refresh(session)

    def on_finish(
        self, session: SessionState, request: TraceRequest, now: float, next_seq: int
    ) -> None:
        self._refresh(session)

    def on_wait(self, session: SessionState, now: float) -> None:
        self._refresh(session)

    def on_session_end(self, session: SessionState, now: float) -> None:
        self._refresh(session)
        self._live.get(session.ordinal, {}).pop(session.sid, None)
        self._ctx.pop(session.sid, None)
        self._ste.pop(session.sid, None)

    def on_trace_end(self, ordinal: int) -> None:
        # the trace's root is done from the engine's view only once the human never returns;
        # it stays at its stop-based level (an online system cannot know the trace ended)
        return None


# ---------------------------------------------------------------------------- Continuum
class ContinuumPolicy(PolicyHooks):
    """Continuum: pin a program's KV across a tool call for ``tau*`` seconds.

    ``tau*`` is :meth:`ToolTimeModel.ttl` (cost-benefit over the empirical CDF of past tool
    durations; exponential prior at cold start) with ``T`` = the recent queueing delay, ``eta``
    = 1 and ``PrefillReload`` = the context's prefill time. Tool durations are observed when
    the next request arrives; the traces carry no tool names, so the "tool" is the agent kind.
    A pin ends when its deadline passes unless the next turn arrived first; unpinned blocks
    join the LRU queue; under pressure whole programs are unpinned, latest pin first.
    """

    def __init__(
        self, service: ServiceModel | None = None, block_size: int = 64, eta: float = 1.0
    ) -> None:
        self.name = "continuum"
        self.service = service or ServiceModel()
        self.block_size = block_size
        self.eta = eta
        self.tools = ToolTimeModel(prior_mean_s=10.0)
        self._lru: OrderedDict[int, Block] = OrderedDict()
        self._pins: dict[int, OrderedDict[int, Block]] = {}
        self._pin_of: dict[int, int] = {}
        self._deadlines: list[tuple[float, int]] = []
        self._deadline_of: dict[int, float] = {}
        self._pinning: int | None = None
        self._queue_delay = 0.0
        self._arrived: dict[int, float] = {}
        self.protected_blocks = 0

    def ttl(self, session: SessionState) -> float:
        reload_s = self.service.prefill_s(len(session.hashes) * self.block_size)
        return self.tools.ttl(
            session.kind, queue_delay_s=self._queue_delay, eta=self.eta, reload_s=reload_s
        )

    def insert(self, block: Block) -> None:
        sid = self._pinning
        if sid is None:
            self._lru[block.block_id] = block
            return
        self._pins[sid][block.block_id] = block
        self._pin_of[block.block_id] = sid
        self.protected_blocks += 1

    def remove(self, block: Block) -> None:
        sid = self._pin_of.pop(block.block_id, None)
        if sid is None:
            del self._lru[block.block_id]
            return
        del self._pins[sid][block.block_id]
        self.protected_blocks -= 1

    def _unpin(self, sid: int) -> None:
        blocks = self._pins.pop(sid, None)
        self._deadline_of.pop(sid, None)
        if not blocks:
            return
        for bid, block in blocks.items():
            del self._pin_of[bid]
            self._lru[bid] = block
        self.protected_blocks -= len(blocks)

    def pop_victim(self) -> Block | None:
        while not self._lru and self._pins:
            latest = max(self._pins, key=lambda sid: self._deadline_of.get(sid, 0.0))
            self._unpin(latest)
        if not self._lru:
            return None
        return self._lru.popitem(last=False)[1]

    def __len__(self) -> int:
        return len(self._lru) + self.protected_blocks

    def advance(self, now: float) -> None:
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            deadline, sid = heapq.heappop(heap)
            if self._deadline_of.get(sid) == deadline:
                self._unpin(sid)

    def on_arrive(self, session: SessionState, request: TraceRequest, now: float) -> None:
        if session.turn and session.last_stop == "tool_use":
            self.tools.observe(session.kind, max(0.0, now - session.last_finish))
        self._arrived[session.sid] = now

    def on_begin(self, session: SessionState, request: TraceRequest, now: float) -> None:
        wait = now - self._arrived.pop(session.sid, now)
        self._queue_delay = 0.9 * self._queue_delay + 0.1 * wait
        self._unpin(session.sid)  # the next turn arrived: its pin is consumed

    def on_finish(
        self, session: SessionState, request: TraceRequest, now: float, next_seq: int
    ) -> None:
        self._pinning = None
        if request.stop != "tool_use":
            return
        tau = self.ttl(session)
        if tau <= 0:
            return
        self._pinning = session.sid
        self._pins.setdefault(session.sid, OrderedDict())
        self._deadline_of[session.sid] = now + tau
        heapq.heappush(self._deadlines, (now + tau, session.sid))

    def on_session_end(self, session: SessionState, now: float) -> None:
        self._unpin(session.sid)


# ---------------------------------------------------------------------------- grouped
class _GroupedPolicy(PolicyHooks):
    """Resident blocks grouped by owning session; the victim group is the one the subclass
    scores worst (cached while the clock stands still); inside a group the deepest block goes
    first (the engine parks tail first), so earlier blocks of a prefix are kept longest."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._groups: dict[int, OrderedDict[int, Block]] = {}
        self._group_of: dict[int, int] = {}
        self._owner: SessionState | None = None
        self.sessions: dict[int, SessionState] = {}
        self.last_access: dict[int, float] = {}
        self.now = 0.0
        self._victim: int | None = None
        self._size = 0

    def score(self, sid: int, blocks: int) -> float:
        """Higher = evict first."""
        raise NotImplementedError

    def insert(self, block: Block) -> None:
        owner = self._owner
        sid = 0 if owner is None else owner.sid
        group = self._groups.get(sid)
        if group is None:
            group = self._groups[sid] = OrderedDict()
        group[block.block_id] = block
        self._group_of[block.block_id] = sid
        self._size += 1

    def remove(self, block: Block) -> None:
        sid = self._group_of.pop(block.block_id)
        group = self._groups[sid]
        del group[block.block_id]
        if not group:
            del self._groups[sid]
        self._size -= 1

    def pop_victim(self) -> Block | None:
        if not self._size:
            return None
        sid = self._victim
        if sid is None or sid not in self._groups:
            sid = max(self._groups, key=lambda g: (self.score(g, len(self._groups[g])), -g))
            self._victim = sid
        block = self._groups[sid].popitem(last=False)[1]
        self.remove_bookkeeping(block, sid)
        return block

    def remove_bookkeeping(self, block: Block, sid: int) -> None:
        del self._group_of[block.block_id]
        if not self._groups[sid]:
            del self._groups[sid]
        self._size -= 1

    def __len__(self) -> int:
        return self._size

    def advance(self, now: float) -> None:
        if now != self.now:
            self.now = now
            self._victim = None

    def on_finish(
        self, session: SessionState, request: TraceRequest, now: float, next_seq: int
    ) -> None:
        self._owner = session
        self.sessions[session.sid] = session
        self.last_access[session.sid] = now
        self._victim = None


def _turn_bucket(turn: int) -> int:
    return min(6, turn.bit_length())


class ReuseProbPolicy(_GroupedPolicy):
    """Workload-aware eviction (KVCache in the wild): per class w = (request type, turn bucket),
    ``ReuseProb_w(t) = p_w * exp(-a_w * t)`` with t the time since last access; evict the lowest.

    The fit uses an earlier window of the same stream: the first ``fit_requests`` reuse
    observations (a session's next request arriving after delay d: reused; a sub-agent that
    returned: never reused); ``p_w`` = reused fraction, ``a_w`` = 1 / mean delay (exponential
    MLE). Request type = agent kind (main / sub-agent) and last stop reason. Before the window
    closes, a class-agnostic prior (p = 0.5, mean 60 s) applies.
    """

    def __init__(self, fit_requests: int = 2000) -> None:
        super().__init__("reuseprob")
        self.fit_requests = fit_requests
        self._obs: dict[tuple[str, str, int], list[float]] = {}
        self._seen = 0
        self._fit: dict[tuple[str, str, int], tuple[float, float]] | None = None
        self._class_at: dict[int, tuple[str, str, int]] = {}

    @staticmethod
    def workload_class(s: SessionState) -> tuple[str, str, int]:
        return ("main" if s.parent is None else "sub", s.last_stop, _turn_bucket(s.turn))

    def _observe(self, w: tuple[str, str, int], reused: bool, delay: float) -> None:
        if self._fit is not None:
            return
        counts = self._obs.setdefault(w, [0.0, 0.0, 0.0])  # reused, not reused, delay sum
        counts[0 if reused else 1] += 1
        counts[2] += delay
        self._seen += 1
        if self._seen >= self.fit_requests:
            self._fit = {
                c: ((r + 1) / (r + n + 2), (r / d) if d > 0 and r else 1 / 60.0)
                for c, (r, n, d) in self._obs.items()
            }

    def params(self, w: tuple[str, str, int]) -> tuple[float, float]:
        """``(p_w, a_w)``; the prior until the fit window closes or for unseen classes."""
        if self._fit is None:
            return 0.5, 1 / 60.0
        return self._fit.get(w, (0.5, 1 / 60.0))

    def score(self, sid: int, blocks: int) -> float:
        p, a = self.params(self._class_at.get(sid, ("main", "", 0)))
        idle = self.now - self.last_access.get(sid, 0.0)
        return -(math.log(p) - a * idle)  # lowest ReuseProb first

    def on_arrive(self, session: SessionState, request: TraceRequest, now: float) -> None:
        if session.turn:
            self._observe(self.workload_class(session), True, now - session.last_finish)

    def on_finish(
        self, session: SessionState, request: TraceRequest, now: float, next_seq: int
    ) -> None:
        super().on_finish(session, request, now, next_seq)
        self._class_at[session.sid] = self.workload_class(session)

    def on_session_end(self, session: SessionState, now: float) -> None:
        self._observe(self.workload_class(session), False, 0.0)
        self._class_at[session.sid] = ("ended", "", 0)


class SagaPolicy(_GroupedPolicy):
    """SAGA WA-LRU: evict the session with the highest
    ``p_evict = a*min(1, idle/tau_max) + b*(1 - P_reuse) + c*min(1, tokens/size_max)``,
    (a, b, c) = (0.3, 0.5, 0.2).

    ``P_reuse(s) = clip(sum_u P(s -> u) * c0 / (c0 + E[obs_tokens(u)]))`` over the session's
    successors, learned online per (agent kind, stop reason): the next LLM call of the same
    session (P = fraction of such stops followed by another request; E[obs_tokens] = mean new
    input tokens it brought), or, for a parent waiting on sub-agents, its resume (P = 1). A
    returned sub-agent has no successor (P_reuse = 0).
    """

    A, B, C = 0.3, 0.5, 0.2

    def __init__(
        self,
        block_size: int = 64,
        tau_max_s: float = 600.0,
        size_max_tokens: int = 200_000,
        c0_tokens: float = 4096.0,
    ) -> None:
        super().__init__("saga")
        self.block_size = block_size
        self.tau_max_s = tau_max_s
        self.size_max_tokens = size_max_tokens
        self.c0 = c0_tokens
        self._edges: dict[tuple[str, str], list[float]] = {}  # continued, ended, new tokens
        self._prev_tokens: dict[int, int] = {}

    def p_reuse(self, s: SessionState) -> float:
        if s.done:
            return 0.0
        if s.waiting_subagents:
            return 1.0
        cont, ended, new = self._edges.get((s.kind, s.last_stop), (1.0, 0.0, 0.0))
        p = cont / (cont + ended) if cont + ended else 1.0
        mean_new = new / cont if cont else 0.0
        return min(1.0, max(0.0, p * self.c0 / (self.c0 + mean_new)))

    def score(self, sid: int, blocks: int) -> float:
        s = self.sessions.get(sid)
        reuse = 0.0 if s is None else self.p_reuse(s)
        idle = self.now - self.last_access.get(sid, 0.0)
        tokens = blocks * self.block_size
        return (
            self.A * min(1.0, idle / self.tau_max_s)
            + self.B * (1.0 - reuse)
            + self.C * min(1.0, tokens / self.size_max_tokens)
        )

    def on_arrive(self, session: SessionState, request: TraceRequest, now: float) -> None:
        if session.turn:
            edge = self._edges.setdefault((session.kind, session.last_stop), [0.0, 0.0, 0.0])
            edge[0] += 1
            edge[2] += max(0, request.input_tokens - self._prev_tokens.get(session.sid, 0))

    def on_finish(
        self, session: SessionState, request: TraceRequest, now: float, next_seq: int
    ) -> None:
        super().on_finish(session, request, now, next_seq)
        self._prev_tokens[session.sid] = request.input_tokens + request.output_tokens

    def on_wait(self, session: SessionState, now: float) -> None:
        self._victim = None

    def on_session_end(self, session: SessionState, now: float) -> None:
        self._edges.setdefault((session.kind, session.last_stop), [0.0, 0.0, 0.0])[1] += 1
        self._prev_tokens.pop(session.sid, None)
        self._victim = None


# ---------------------------------------------------------------------------- optimum
_NEVER = 1 << 62


class OptimalPolicy(PolicyHooks):
    """Belady's optimum: evict the block whose next use is farthest in the future.

    The future is ``schedule`` (each request's start sequence number, recorded by a replay
    with the same timeline). For prefix semantics, ties go to the deepest block: a block's
    parent is used whenever it is, so its next use is never later, and evicting deepest first
    keeps the resident set prefix-closed (no resident block is stranded behind a missing one).
    """

    def __init__(self, schedule: Schedule) -> None:
        self.name = "opt"
        self.schedule = schedule
        self._uses: dict[int, list[int]] = {}
        self._pos: dict[int, int] = {}
        self._keys_of: dict[int, list[int]] = {}
        self._heap: list[tuple[int, int, int]] = []
        self._entry: dict[int, tuple[int, int, int]] = {}
        self._blocks: dict[int, Block] = {}
        self._next_seq = 0

    def on_trace(self, trace: Trace, ordinal: int) -> None:
        uses, pos = self._uses, self._pos
        keys: list[int] = []
        for i, req in enumerate(trace.requests()):
            seq = self.schedule.get((ordinal, i))
            if seq is None:
                continue
            for p, h in enumerate(req.block_hashes):
                lst = uses.get(h)
                if lst is None:
                    lst = uses[h] = []
                    pos[h] = p
                    keys.append(h)
                lst.append(seq)
        for h in keys:
            uses[h].sort()
        self._keys_of[ordinal] = keys

    def on_trace_end(self, ordinal: int) -> None:
        for h in self._keys_of.pop(ordinal, ()):
            if h >> _NS_SHIFT:  # namespaced: no other trace uses it
                self._uses.pop(h, None)
                self._pos.pop(h, None)

    def on_finish(
        self, session: SessionState, request: TraceRequest, now: float, next_seq: int
    ) -> None:
        self._next_seq = next_seq

    def next_use(self, h: int) -> int:
        lst = self._uses.get(h)
        if not lst:
            return _NEVER
        i = bisect.bisect_left(lst, self._next_seq)
        return lst[i] if i < len(lst) else _NEVER

    def insert(self, block: Block) -> None:
        h = block.block_hash
        assert h is not None
        entry = (-self.next_use(h), -self._pos.get(h, 0), block.block_id)
        self._entry[block.block_id] = entry
        self._blocks[block.block_id] = block
        heapq.heappush(self._heap, entry)

    def remove(self, block: Block) -> None:
        del self._entry[block.block_id]
        del self._blocks[block.block_id]

    def pop_victim(self) -> Block | None:
        heap, entries = self._heap, self._entry
        while heap:
            entry = heapq.heappop(heap)
            bid = entry[2]
            if entries.get(bid) is not entry:
                continue  # removed since
            if -entry[0] < self._next_seq:
                # stale: its use passed without touching it (that request bypassed the cache)
                h = self._blocks[bid].block_hash
                assert h is not None
                fresh = (-self.next_use(h), entry[1], bid)
                entries[bid] = fresh
                heapq.heappush(heap, fresh)
                continue
            del entries[bid]
            return self._blocks.pop(bid)
        return None

    def __len__(self) -> int:
        return len(self._entry)


# ---------------------------------------------------------------------------- registry
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


# ---------------------------------------------------------------------------- agentclaims
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

    def _release(self, wf: TraceWorkflow, node: str) -> None:
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
        """Claim ``hashes`` for ``node``, one mode weaker after each rejection."""
        engine = self._engine
        assert engine is not None
        for mode in relax_ladder(first, self.planner.policy.soft_mode):
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
            if engine.submit_claim(spec, hashes).accepted:  # type: ignore[arg-type]
                self._planned(mode)
                wf.held[node] = HeldClaim(cid, hashes, mode)
                return

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
