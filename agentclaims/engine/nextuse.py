"""Rank resident blocks by predicted next use: the engine's side of reuse hints.

``NextUsePolicy`` is an :class:`~agentclaims.engine.EvictionPolicy` that groups resident blocks
by the agent that used them last (the ``owner`` the engine names when a request finishes) and
evicts, in order:

1. dead blocks: those of a closed agent (``ReuseHint.session == "closed"``) and what a context
   rewrite left behind (``ReuseHint.keep_blocks``), oldest first;
2. then the group whose next use is predicted farthest: the median of the *remaining* wait
   given the time already waited, ``median(T - w | T > w)``, from the waits seen so far in the
   agent's wait class (:class:`WaitModel`; a class that also holds "never came back" samples
   gives ``inf`` once those dominate). Inside a group the deepest block goes first, so the
   leading run a prefix cache can reuse is kept longest.

Blocks of running requests are never in the policy (the engine holds them), so they are never
victims. Waits are learned online from the owners' own uses (the time from a finish to the
owner's next ``begin``) and may start from a prior learned on other traces
(``WaitModel.prior``); a class with few samples borrows the pooled ones.
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping

from agentclaims.contract.hints import ReuseHint
from agentclaims.engine.blocks import Block

__all__ = ["NextUsePolicy", "WaitModel", "wait_class_key"]

_INF = math.inf
_POOLED = "*"


def wait_class_key(hint: ReuseHint | None) -> str:
    """The class a wait is learned under: the wait class, refined by the tool and by how many
    sub-agents run."""
    if hint is None:
        return "unknown"
    if hint.wait_class == "tool" and hint.tool:
        return f"tool:{hint.tool}"
    if hint.wait_class == "subagents" and hint.subagents:
        return f"subagents:{min(hint.subagents, 4)}"
    return hint.wait_class


class WaitModel:
    """Per wait class, a bounded sorted sample of waits (``inf`` = never came back)."""

    __slots__ = ("_fifo", "_sorted", "history", "min_samples", "quantile")

    def __init__(
        self,
        *,
        history: int = 3000,
        min_samples: int = 30,
        quantile: float = 0.5,
        prior: Mapping[str, Iterable[float]] | None = None,
    ) -> None:
        self.history = history
        self.min_samples = min_samples
        self.quantile = quantile
        self._sorted: dict[str, list[float]] = {}
        self._fifo: dict[str, deque[float]] = {}
        for key, waits in (prior or {}).items():
            for w in waits:
                self.observe(key, w)

    def observe(self, key: str, seconds: float) -> None:
        for k in (key, _POOLED) if key != _POOLED else (key,):
            fifo = self._fifo.get(k)
            if fifo is None:
                fifo = self._fifo[k] = deque()
                self._sorted[k] = []
            srt = self._sorted[k]
            if len(fifo) >= self.history:
                old = fifo.popleft()
                del srt[bisect.bisect_left(srt, old)]
            fifo.append(seconds)
            bisect.insort(srt, seconds)

    def samples(self, key: str) -> int:
        return len(self._sorted.get(key, ()))

    def remaining(self, key: str, waited: float) -> float:
        """Predicted seconds until the next use, given ``waited`` seconds already waited."""
        srt = self._sorted.get(key)
        if srt is None or len(srt) < self.min_samples:
            srt = self._sorted.get(_POOLED)
            if not srt:
                return 0.0
        i = bisect.bisect_right(srt, waited)
        n = len(srt) - i
        if n <= 0:
            return _INF  # waited longer than anything seen: the tail is unknown
        v = srt[i + int(self.quantile * n)]
        return v - waited if v != _INF else _INF


class _Agent:
    __slots__ = ("blocks", "closed", "key", "last_use", "rewrite", "running", "score_key")

    def __init__(self, key: str) -> None:
        self.blocks: OrderedDict[int, Block] = OrderedDict()
        self.last_use = 0.0
        self.key = "unknown"
        """Wait class of the agent's current wait."""
        self.score_key = "unknown"
        self.closed = False
        self.rewrite = False
        self.running = False


class NextUsePolicy:
    """Evict dead blocks first, then the agent whose next use is predicted farthest."""

    ranks_hints = True

    def __init__(self, waits: WaitModel | None = None, *, name: str = "nextuse") -> None:
        self.name = name
        self.waits = waits or WaitModel()
        self.now = 0.0
        self._agents: dict[str | None, _Agent] = {}
        self._dead = _Agent("")
        self._dead.closed = True
        self._anon = _Agent("")
        self._home: dict[int, _Agent] = {}  # block id -> the agent (or dead queue) it waits in
        self._parking: _Agent | None = None
        self._victim: _Agent | None = None
        self._size = 0

    # ------------------------------------------------------------------ engine hooks
    def _agent(self, owner: str | None) -> _Agent:
        if owner is None:
            return self._anon
        agent = self._agents.get(owner)
        if agent is None:
            agent = self._agents[owner] = _Agent(owner)
        return agent

    def note_time(self, now_s: float) -> None:
        if now_s != self.now:
            self.now = now_s
            self._victim = None

    def note_begin(self, owner: str, now_s: float) -> None:
        """``owner`` starts a request (after its hits left the policy): learn its wait."""
        self.note_time(now_s)
        agent = self._agents.get(owner)
        if agent is None:
            self._agent(owner).running = True
            return
        if not agent.running:
            self.waits.observe(agent.key, max(0.0, now_s - agent.last_use))
        agent.running = True
        if agent.rewrite:
            agent.rewrite = False
            self._kill(agent)

    def note_finish(self, owner: str, now_s: float) -> None:
        """``owner``'s request ended: the blocks parked until ``note_parked`` are its own."""
        agent = self._agent(owner)
        agent.running = False
        agent.last_use = now_s
        self._parking = self._dead if agent.closed else agent
        self._victim = None

    def note_parked(self) -> None:
        self._parking = None

    def note_hint(self, owner: str, hint: ReuseHint, now_s: float) -> None:
        """A claim (or a renewal) of ``owner`` said what it knows about the next use."""
        self.note_time(now_s)
        agent = self._agent(owner)
        if hint.keep_blocks is not None:
            agent.rewrite = True  # what its next request does not reuse is dead
            return
        agent.key = wait_class_key(hint)
        agent.score_key = (
            agent.key
            if self.waits.samples(agent.key) >= self.waits.min_samples
            else hint.wait_class
        )
        if hint.closed and not agent.closed:
            agent.closed = True
            self._kill(agent)
            del self._agents[owner]  # blocks that come home later park as dead
        self._victim = None

    def _kill(self, agent: _Agent) -> None:
        """Move the agent's resident blocks to the dead queue."""
        blocks = agent.blocks
        if not blocks:
            return
        dead, home = self._dead, self._home
        for bid, block in blocks.items():
            dead.blocks[bid] = block
            home[bid] = dead
        blocks.clear()
        if self._victim is agent:
            self._victim = None

    # ------------------------------------------------------------------ EvictionPolicy
    def insert(self, block: Block) -> None:
        bid = block.block_id
        agent = self._parking
        if agent is None:  # parked again after a claim change: back where it waited
            agent = self._home.get(bid) or self._anon
            if agent.closed:
                agent = self._dead
        self._home[bid] = agent
        agent.blocks[bid] = block
        self._size += 1

    def insert_many(self, blocks: list[Block]) -> None:
        agent = self._parking
        if agent is None:
            for block in blocks:
                self.insert(block)
            return
        home, queue = self._home, agent.blocks
        for block in blocks:
            bid = block.block_id
            home[bid] = agent
            queue[bid] = block
        self._size += len(blocks)

    def remove_many(self, blocks: list[Block]) -> None:
        home = self._home
        for block in blocks:
            bid = block.block_id
            del home[bid].blocks[bid]
        self._size -= len(blocks)

    def remove(self, block: Block) -> None:
        del self._home[block.block_id].blocks[block.block_id]
        self._size -= 1

    def score(self, agent: _Agent) -> float:
        """Predicted seconds to the agent's next use (higher = evict first)."""
        waits = self.waits
        key = agent.key if waits.samples(agent.key) >= waits.min_samples else agent.score_key
        return waits.remaining(key, max(0.0, self.now - agent.last_use))

    def pop_victim(self) -> Block | None:
        agent = self._victim
        if agent is not None and agent.blocks and not self._dead.blocks:  # the common case
            bid, block = agent.blocks.popitem(last=False)
            del self._home[bid]
            self._size -= 1
            return block
        if not self._size:
            return None
        dead = self._dead.blocks
        if dead:
            bid, block = dead.popitem(last=False)
        else:
            if agent is None or not agent.blocks:
                best = (-1.0, 0.0)
                for cand in self._agents.values():
                    if cand.blocks:
                        rank = (self.score(cand), -cand.last_use)
                        if rank > best:
                            best, agent = rank, cand
                if self._anon.blocks and (agent is None or not agent.blocks):
                    agent = self._anon
                self._victim = agent
            assert agent is not None
            bid, block = agent.blocks.popitem(last=False)
        del self._home[bid]
        self._size -= 1
        return block

    def __len__(self) -> int:
        return self._size
