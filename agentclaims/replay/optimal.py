"""The replay's ceiling row: Belady's optimum, which reads the recorded future.

Registered by name (``opt``) in :mod:`agentclaims.replay.policies`; it needs the schedule a
replay with the same timeline recorded (``ReplayResult.schedule``).
"""

from __future__ import annotations

import bisect
import heapq
from typing import TYPE_CHECKING

from agentclaims.engine import Block
from agentclaims.replay.model import PolicyHooks, SessionState
from agentclaims.replay.traces import _NAMESPACE_SHIFT

if TYPE_CHECKING:
    from agentclaims.replay.harness import Schedule
    from agentclaims.replay.traces import Trace, TraceRequest

__all__ = ["OptimalPolicy"]

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
            if h >> _NAMESPACE_SHIFT:  # namespaced: no other trace uses it
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
