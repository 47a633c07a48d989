"""The serving systems' eviction rows of the replay: stock LRU, KVFlow and Continuum.

Engine :class:`~agentclaims.engine.EvictionPolicy` s over resident, unclaimed blocks, fed by
the replay hooks (:class:`~agentclaims.replay.model.PolicyHooks`) with what a serving system
knows online (../shared/notes/policies.md). Registered by name in
:mod:`agentclaims.replay.policies`.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING

from agentclaims.engine import Block, BlockHash, LRUPolicy, PriorityPolicy
from agentclaims.graph import ToolTimeModel
from agentclaims.replay.model import PolicyHooks, ServiceModel, SessionState
from agentclaims.replay.traces import _NAMESPACE_SHIFT

if TYPE_CHECKING:
    from agentclaims.replay.traces import TraceRequest

__all__ = ["ContinuumPolicy", "KVFlowPolicy", "LruReplayPolicy"]


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
        ns = h >> _NAMESPACE_SHIFT
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
