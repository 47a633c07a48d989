"""Pluggable eviction policies for ordinary resident blocks.

The arbiter keeps claimed blocks in tiers of their own; everything unclaimed (or whose claim has
ended) waits in one ``EvictionPolicy``. A policy sees a block when it becomes resident
(``insert``: its last active user finished and it holds a hashed block), forgets it when it is
reused or claimed (``remove``), and names the next victim (``pop_victim``). Stock vLLM's
behaviour is ``LRUPolicy``. Replays plug in other rules (priority by steps-to-execution,
workload-aware scores, Belady's optimum) through the same four methods.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Protocol, runtime_checkable

from agentclaims.contract.hints import ReuseHint
from agentclaims.engine.blocks import Block, BlockHash

__all__ = ["EvictionPolicy", "LRUPolicy", "PriorityPolicy", "RankingPolicy"]


@runtime_checkable
class EvictionPolicy(Protocol):
    """Orders resident, unclaimed blocks for eviction."""

    name: str

    def insert(self, block: Block) -> None:
        """``block`` became resident (hashed, no active user): it may be evicted from now on."""

    def remove(self, block: Block) -> None:
        """``block`` is no longer a candidate (reused, claimed). It was inserted before."""

    def pop_victim(self) -> Block | None:
        """Remove and return the next victim, or ``None`` if there is no candidate."""

    def __len__(self) -> int: ...

    # Optional: ``insert_first(block)``, ``insert`` as the next victim (the blocks of a prefix
    # nothing will use again, a ``done`` release's). A policy without it takes them as any.


@runtime_checkable
class RankingPolicy(EvictionPolicy, Protocol):
    """An eviction policy that ranks by what claims' reuse hints say (``NextUsePolicy``).

    The engine tells it when an owner's request starts (``note_begin``) and ends
    (``note_finish``: the blocks parked until ``note_parked`` are that owner's), and every hint
    a claim or a renewal carries. It then also ranks best-effort claimed blocks (a hint only)
    with the ordinary ones.
    """

    def note_time(self, now_s: float) -> None: ...
    def note_begin(self, owner: str, now_s: float) -> None: ...
    def note_finish(self, owner: str, now_s: float) -> None: ...
    def note_parked(self) -> None: ...
    def insert_many(self, blocks: list[Block]) -> None:
        """``insert`` each of ``blocks`` in order (one call for a finishing request's blocks)."""

    def remove_many(self, blocks: list[Block]) -> None:
        """``remove`` each of ``blocks`` (one call for a starting request's hits)."""

    def note_hint(self, owner: str, hint: ReuseHint, now_s: float) -> None: ...


class LRUPolicy:
    """Least recently used first, as vLLM's free block queue does it.

    ``OrderedDict`` is a C-implemented linked hash map: O(1) insert, removal from the middle and
    pop from the head, with no Python-level node objects, which is why it beats a hand-written
    linked list here.
    """

    __slots__ = ("_queue", "name")

    def __init__(self) -> None:
        self.name = "lru"
        self._queue: OrderedDict[int, Block] = OrderedDict()

    def insert(self, block: Block) -> None:
        self._queue[block.block_id] = block

    def insert_first(self, block: Block) -> None:
        """``block`` as the next victim (a prefix nothing will use again)."""
        self._queue[block.block_id] = block
        self._queue.move_to_end(block.block_id, last=False)

    def remove(self, block: Block) -> None:
        del self._queue[block.block_id]

    def pop_victim(self) -> Block | None:
        if not self._queue:
            return None
        return self._queue.popitem(last=False)[1]

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Block]:
        """Blocks in eviction order (first victim first)."""
        return iter(self._queue.values())


class PriorityPolicy:
    """Evict the lowest priority level first, LRU inside a level.

    ``priority_of(block_hash)`` is read when a block is inserted (higher = keep longer), so a
    caller that changes priorities re-inserts the blocks it cares about (``reprioritize``).
    This is KVFlow's scheme when the priority is ``H + 1 - min(H + 1, STE)``.
    """

    __slots__ = ("_levels", "_where", "name", "priority_of")

    def __init__(self, priority_of: Callable[[BlockHash], int], name: str = "priority") -> None:
        self.name = name
        self.priority_of = priority_of
        self._levels: dict[int, OrderedDict[int, Block]] = {}
        self._where: dict[int, int] = {}

    def insert(self, block: Block) -> None:
        assert block.block_hash is not None
        level = self.priority_of(block.block_hash)
        queue = self._levels.get(level)
        if queue is None:
            queue = self._levels[level] = OrderedDict()
        queue[block.block_id] = block
        self._where[block.block_id] = level

    def insert_first(self, block: Block) -> None:
        """``block`` as its level's next victim."""
        self.insert(block)
        self._levels[self._where[block.block_id]].move_to_end(block.block_id, last=False)

    def remove(self, block: Block) -> None:
        level = self._where.pop(block.block_id)
        del self._levels[level][block.block_id]

    def reprioritize(self, block: Block) -> None:
        """Move a waiting block to the level ``priority_of`` gives it now (keeps LRU order
        inside the new level as most recent)."""
        if block.block_id in self._where:
            self.remove(block)
            self.insert(block)

    def pop_victim(self) -> Block | None:
        for level in sorted(self._levels):
            queue = self._levels[level]
            if queue:
                block = queue.popitem(last=False)[1]
                del self._where[block.block_id]
                return block
        return None

    def __len__(self) -> int:
        return len(self._where)
