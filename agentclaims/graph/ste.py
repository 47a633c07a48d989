"""Steps-to-execution (STE) over an Agent Execution Graph, exactly as KVFlow defines it.

Given the *frontier* (the nodes about to run or running):

* a frontier node has STE 0;
* an OR node (plain, conditional, send or goto predecessors) has ``1 + min`` over its
  predecessors' STE;
* an AND-join has ``1 + max`` over the predecessors of a join group (LangGraph waiting edge);
  a node with both plain in-edges and join groups takes the smallest of those candidates;
* a node that cannot be reached is ``math.inf``.

Cycles (ReAct loops) are fine: the values are the least fixed point, computed by a
Dijkstra-like relaxation from the frontier (Knuth's generalisation to AND/OR graphs; with unit
steps a FIFO queue pops values in non-decreasing order, so a join's last finished member gives
its max). Join members that already finished since the join last ran (``satisfied``) do not
count: :class:`~agentclaims.graph.tracker.SteTracker` records them as the workflow advances.

A node marked ``targets_unknown`` (a router whose targets LangGraph cannot see) is treated
conservatively: it may lead to *any* node in one step, so it never makes a prefix look farther
away than it may be. Its first observed transition replaces that guess by what it saw.

A prefix takes the smallest STE of the nodes that use it (a shared prefix is as urgent as its
most urgent user).

:func:`steps_to_execution` and :func:`prefix_steps_to_execution` answer once for a graph and a
frontier; :class:`SteSnapshot` holds the STE of every node and prefix for one frontier.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from agentclaims.errors import UsageError
from agentclaims.graph._structure import (
    INF,
    _compile_structure,
    _frontier_indices,
    _satisfied_pairs,
    _Structure,
)
from agentclaims.graph.aeg import AgentExecutionGraph

__all__ = [
    "SteSnapshot",
    "kvflow_priority",
    "prefix_steps_to_execution",
    "steps_to_execution",
]


@dataclass(frozen=True, slots=True)
class SteSnapshot:
    """STE of every node and every prefix for one frontier (immutable, shared by caches)."""

    frontier: frozenset[str]
    nodes: Mapping[str, float]
    prefixes: Mapping[str, float]

    def node(self, name: str) -> float:
        """STE of node ``name``."""
        try:
            return self.nodes[name]
        except KeyError:
            raise UsageError("node", f"unknown node {name!r}") from None

    def prefix(self, prefix_id: str) -> float:
        """STE of ``prefix_id`` (``math.inf`` for a prefix no node uses)."""
        return self.prefixes.get(prefix_id, INF)


def kvflow_priority(ste: float, levels: int) -> int:
    """KVFlow's eviction priority level: ``min(levels + 1, ste)`` (lower = keep longer)."""
    if isinstance(levels, bool) or not isinstance(levels, int) or levels < 1:
        raise UsageError("levels", f"must be an integer >= 1, got {levels!r}")
    if math.isnan(ste) or ste < 0:
        raise UsageError("ste", f"must be >= 0, got {ste!r}")
    return levels + 1 if ste > levels else int(ste)


def _ste(
    s: _Structure, frontier: frozenset[int], satisfied: frozenset[tuple[int, int]]
) -> list[float]:
    """Least fixed point of the KVFlow STE equations, by FIFO relaxation from the frontier."""
    n = len(s.names)
    dist = [INF] * n
    queue: deque[int] = deque()
    for f in frontier:
        dist[f] = 0
        queue.append(f)
    remaining = list(s.group_size)
    for gid, _member in satisfied:
        remaining[gid] -= 1
    for gid, left in enumerate(remaining):  # every member already finished: runs next step
        t = s.group_target[gid]
        if left == 0 and dist[t] == INF:
            dist[t] = 1
            queue.append(t)
    wildcard_done = False
    or_succ, member_groups, group_target = s.or_succ, s.member_groups, s.group_target
    while queue:
        u = queue.popleft()
        nxt = dist[u] + 1
        for v in or_succ[u]:
            if dist[v] == INF:
                dist[v] = nxt
                queue.append(v)
        for gid in member_groups[u]:
            if satisfied and (gid, u) in satisfied:
                continue
            remaining[gid] -= 1
            if remaining[gid] == 0:
                t = group_target[gid]
                if dist[t] == INF:
                    dist[t] = nxt
                    queue.append(t)
        if s.wildcard[u] and not wildcard_done:
            wildcard_done = True  # later wildcard pops cannot improve anything
            for v in range(n):
                if dist[v] == INF and v != s.start:
                    dist[v] = nxt
                    queue.append(v)
    return dist


def _snapshot(
    s: _Structure, frontier: frozenset[int], satisfied: frozenset[tuple[int, int]]
) -> SteSnapshot:
    dist = _ste(s, frontier, satisfied)
    return SteSnapshot(
        frontier=frozenset(s.names[i] for i in frontier),
        nodes=dict(zip(s.names, dist, strict=True)),
        prefixes={p: min(dist[u] for u in users) for p, users in s.prefix_users.items()},
    )


def steps_to_execution(
    graph: AgentExecutionGraph,
    frontier: Iterable[str],
    *,
    satisfied: Mapping[str, Iterable[str]] | None = None,
) -> dict[str, float]:
    """STE of every node for ``frontier``.

    ``satisfied`` maps a join node to the members of its join groups that already finished
    since it last ran (they no longer delay it).
    """
    s = _compile_structure(graph)
    dist = _ste(s, _frontier_indices(s, frontier), _satisfied_pairs(s, satisfied))
    return dict(zip(s.names, dist, strict=True))


def prefix_steps_to_execution(
    graph: AgentExecutionGraph,
    frontier: Iterable[str],
    *,
    satisfied: Mapping[str, Iterable[str]] | None = None,
) -> dict[str, float]:
    """STE of every prefix for ``frontier``: the smallest STE of the nodes using it."""
    s = _compile_structure(graph)
    return dict(
        _snapshot(s, _frontier_indices(s, frontier), _satisfied_pairs(s, satisfied)).prefixes
    )


def _satisfied_lowers(
    s: _Structure, satisfied: frozenset[tuple[int, int]], base: SteSnapshot
) -> bool:
    """Whether the finished join members ``satisfied`` bring any join closer than ``base``
    (the snapshot without them) says.

    If no join's relaxed candidate ``1 + max(unfinished members)`` beats its base STE,
    the base values are a fixed point of the relaxed equations too, and (the relaxed
    equations being pointwise smaller) their greatest one: the snapshot is unchanged.
    """
    done: dict[int, set[int]] = {}
    for gid, member in satisfied:
        done.setdefault(gid, set()).add(member)
    nodes, names = base.nodes, s.names
    for gid, members in done.items():
        waiting = s.group_members[gid] - members
        candidate = 1 + max((nodes[names[m]] for m in waiting), default=0)
        if candidate < nodes[names[s.group_target[gid]]]:
            return True
    return False
