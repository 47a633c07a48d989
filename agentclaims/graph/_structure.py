"""The compiled structure of an Agent Execution Graph, shared by the STE, reuse and tracker code.

The hot paths work on node indices rather than names: the OR successors of every node, the
AND-join groups (their target, size and members), the nodes of unknown targets, the users of
every prefix and every node's predecessors. :func:`_compile_structure` builds it from the
graph; it depends on the structure only (not on the counts), so callers rebuild it when the
graph's ``structure_version`` changes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from agentclaims.errors import UsageError
from agentclaims.graph.aeg import START, AgentExecutionGraph

INF: Final = math.inf


@dataclass(slots=True)
class _Structure:
    """Index-based adjacency for the hot path, rebuilt when the graph's structure changes."""

    names: list[str]
    index: dict[str, int]
    or_succ: list[tuple[int, ...]]
    group_target: list[int]
    group_size: list[int]
    group_members: list[frozenset[int]]
    member_groups: list[tuple[int, ...]]
    group_of: dict[tuple[int, frozenset[int]], int]
    wildcard: list[bool]
    prefix_users: dict[str, frozenset[int]]
    start: int
    preds: list[tuple[int, ...]]
    """Predecessors over every edge kind (for searches backwards from reuse targets)."""


def _compile_structure(graph: AgentExecutionGraph) -> _Structure:
    names = graph.nodes
    index = {n: i for i, n in enumerate(names)}
    or_succ: list[list[int]] = [[] for _ in names]
    preds: list[list[int]] = [[] for _ in names]
    for u, v, _kind, _count in graph.edges():
        preds[index[v]].append(index[u])
        if not graph.is_join_edge(u, v):
            or_succ[index[u]].append(index[v])
    group_target: list[int] = []
    group_size: list[int] = []
    group_members: list[frozenset[int]] = []
    member_groups: list[list[int]] = [[] for _ in names]
    group_of: dict[tuple[int, frozenset[int]], int] = {}
    for name in names:
        for group in graph.join_groups(name):
            gid = len(group_target)
            members = frozenset(index[m] for m in group)
            group_target.append(index[name])
            group_size.append(len(members))
            group_members.append(members)
            group_of[(index[name], members)] = gid
            for m in members:
                member_groups[m].append(gid)
    return _Structure(
        names=names,
        index=index,
        or_succ=[tuple(s) for s in or_succ],
        group_target=group_target,
        group_size=group_size,
        group_members=group_members,
        member_groups=[tuple(g) for g in member_groups],
        group_of=group_of,
        wildcard=[graph.targets_unknown(n) for n in names],
        prefix_users={p: frozenset(index[u] for u in us) for p, us in graph.prefix_users().items()},
        start=index[START],
        preds=[tuple(p) for p in preds],
    )


def _frontier_indices(s: _Structure, frontier: Iterable[str]) -> frozenset[int]:
    if isinstance(frontier, str):
        raise UsageError("frontier", "must be an iterable of node names, not one string")
    try:
        return frozenset(s.index[n] for n in frontier)
    except (KeyError, TypeError) as exc:
        raise UsageError("frontier", f"unknown node {exc.args[0]!r}") from None


def _satisfied_pairs(
    s: _Structure, satisfied: Mapping[str, Iterable[str]] | None
) -> frozenset[tuple[int, int]]:
    """(group id, member index) pairs already finished, from {join target: finished members}."""
    if not satisfied:
        return frozenset()
    pairs: set[tuple[int, int]] = set()
    for target, members in satisfied.items():
        if target not in s.index:
            raise UsageError("satisfied", f"unknown node {target!r}")
        t = s.index[target]
        done = set()
        for m in members:
            if m not in s.index:
                raise UsageError("satisfied", f"unknown node {m!r}")
            done.add(s.index[m])
        for (gt, group), gid in s.group_of.items():
            if gt == t:
                pairs.update((gid, m) for m in group & done)
    return frozenset(pairs)


def _update_satisfied(
    s: _Structure,
    old: frozenset[int],
    new: frozenset[int],
    satisfied: frozenset[tuple[int, int]],
) -> frozenset[tuple[int, int]]:
    """The finished join members once the frontier moves from ``old`` to ``new``: the nodes
    that left it count as finished inputs of the joins they feed, until those joins run."""
    pairs = set(satisfied)
    for u in old - new:
        for gid in s.member_groups[u]:
            pairs.add((gid, u))
    if pairs:  # a join that runs now consumed its inputs
        pairs = {(g, m) for g, m in pairs if s.group_target[g] not in new}
    return frozenset(pairs)
