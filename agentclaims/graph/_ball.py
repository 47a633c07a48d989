"""The horizon's ball: the few nodes a query within the horizon can read.

A reuse query within ``horizon`` steps of the frontier reads the hit probability of a node only
if it is at most ``horizon`` steps away, and gets a non-zero value only from the nodes on some
frontier-to-target walk of at most ``horizon`` steps. The tracker
(:class:`~agentclaims.graph.tracker.SteTracker`) computes its hit tables over that ball rather
than over the whole chain (the same values where they are read), and answers a node's STE by a
search over OR steps bounded by the horizon when it can. A node's successors come from the
tracker's cached :data:`Row`; searches give up (``None``) where a node of unknown targets may go
anywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeAlias

from agentclaims.graph._structure import _Structure

Row: TypeAlias = tuple[tuple[int, ...], tuple[tuple[int, float], ...], tuple[int, ...]]
"""A node's plain successors, its choice successors with probabilities, and all of them."""


def _search(
    starts: frozenset[int],
    horizon: int,
    neighbours: Callable[[int], Iterable[int]],
    stop: Sequence[bool] | None = None,
) -> dict[int, int] | None:
    """Distance from ``starts`` of every node within ``horizon`` steps (breadth first),
    or ``None`` if a node marked in ``stop`` is to be expanded."""
    dist = dict.fromkeys(starts, 0)
    layer = list(starts)
    for depth in range(1, horizon + 1):
        nxt = []
        for u in layer:
            if stop is not None and stop[u]:
                return None
            for v in neighbours(u):
                if v not in dist:
                    dist[v] = depth
                    nxt.append(v)
        layer = nxt
    return dist


def _forward_ball(
    frontier: frozenset[int], horizon: int, wildcard: Sequence[bool], row: Callable[[int], Row]
) -> dict[int, int] | None:
    """Nodes within ``horizon`` steps of ``frontier``, with their distance (``None`` if a
    node of unknown targets can still move). Nothing farther affects a reuse within the
    horizon."""
    return _search(frontier, horizon, lambda u: row(u)[2], wildcard)


def _backward_distances(
    preds: Sequence[Sequence[int]], targets: frozenset[int], horizon: int
) -> dict[int, int]:
    """Distance to ``targets`` of every node within ``horizon`` steps of them, walking the
    edges backwards (it depends on the structure only)."""
    back = _search(targets, horizon, preds.__getitem__)
    assert back is not None  # only a ``stop`` ends a search early
    return back


def _relevant_ball(
    back: Mapping[int, int], frontier: frozenset[int], horizon: int, row: Callable[[int], Row]
) -> dict[int, int]:
    """Nodes on some frontier-to-target walk of at most ``horizon`` steps, with their
    distance from the frontier: the backward distances ``back`` bound the forward search.
    Every other node's hit probability is exactly 0 where the frontier could read it.
    ``back`` may hold nodes farther than ``horizon`` from the targets (a deeper search)."""
    dist = {f: 0 for f in frontier if back.get(f, horizon + 1) <= horizon}
    layer = list(dist)
    for depth in range(1, horizon + 1):
        nxt = []
        for u in layer:
            for v in row(u)[2]:
                if v not in dist and v in back and depth + back[v] <= horizon:
                    dist[v] = depth
                    nxt.append(v)
        layer = nxt
    for f in frontier:
        dist.setdefault(f, 0)
    return dist


def _ball_table(
    ball: Mapping[int, int],
    targets: frozenset[int],
    horizon: int,
    rows: Mapping[int, Row],
    row: Callable[[int], Row],
) -> list[dict[int, float]]:
    """``_hit_table`` restricted to what the frontier can read: with ``k`` steps left,
    only nodes at distance ``<= horizon - k`` (anything else counts as 0, never read).

    ``rows`` holds the rows the searches that built ``ball`` loaded (every row read here);
    ``row`` loads one that is missing. Each node's row is looked up once, and the nodes are
    visited nearest first, so each level stops at the first one out of its reach."""
    steps: list[tuple[int, int, tuple[int, ...], tuple[tuple[int, float], ...]]] = []
    for u, d in sorted(ball.items(), key=_distance):
        if d >= horizon:  # out of reach at every level
            break
        if u in targets:
            steps.append((d, u, (), ()))
            continue
        cached = rows.get(u)
        plain, choice, _ = cached if cached is not None else row(u)
        steps.append((d, u, plain, choice))
    current = {u: 1.0 if u in targets else 0.0 for u in ball}
    table = [current]
    for k in range(1, horizon + 1):
        prev = current
        current = {}
        reach = horizon - k
        for d, u, plain, choice in steps:
            if d > reach:
                break
            if u in targets:
                current[u] = 1.0
                continue
            miss = 1.0
            for v in plain:
                miss *= 1.0 - prev.get(v, 0.0)
            hit = 0.0
            for v, q in choice:
                hit += q * prev.get(v, 0.0)
            current[u] = 1.0 - miss * (1.0 - hit)
        table.append(current)
    return table


def _distance(item: tuple[int, int]) -> int:
    return item[1]


def _or_ste_within(
    s: _Structure, frontier: frozenset[int], target: int, horizon: int, joins: frozenset[int]
) -> float | None:
    """STE of ``target`` (not in ``frontier``) by a search over OR steps bounded by the
    horizon (``None``: not found within it, or an AND-join or a node of unknown targets on the
    way makes the search unable to decide)."""
    seen = set(frontier)
    layer = list(frontier)
    for depth in range(1, horizon + 1):
        nxt = []
        for u in layer:
            if s.wildcard[u]:
                return None
            for v in s.or_succ[u]:
                if v in joins:
                    return None
                if v not in seen:
                    if v == target:
                        return float(depth)
                    seen.add(v)
                    nxt.append(v)
        layer = nxt
    return None
