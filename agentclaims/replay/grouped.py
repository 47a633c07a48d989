"""The replay's session-grouped eviction rows: workload-aware ReuseProb and SAGA's WA-LRU.

Each groups resident blocks by the session that owns them and evicts from the group it scores
worst, deepest block first (../shared/notes/policies.md). Registered by name in
:mod:`agentclaims.replay.policies`.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import TYPE_CHECKING

from agentclaims.engine import Block
from agentclaims.replay.model import PolicyHooks, SessionState

if TYPE_CHECKING:
    from agentclaims.replay.traces import TraceRequest

__all__ = ["ReuseProbPolicy", "SagaPolicy"]


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
