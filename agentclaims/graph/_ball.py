"""The horizon's ball: the few nodes a query within the horizon can read.

A reuse query within ``horizon`` steps of the frontier reads the hit probability of a node only
if it is at most ``horizon`` steps away, and gets a non-zero value only from the nodes on some
frontier-to-target walk of at most ``horizon`` steps. The tracker
(:class:`~agentclaims.graph.tracker.SteTracker`) computes its hit tables over that ball rather
than over the whole chain (the same values where they are read), and answers a node's STE by a
search over OR steps bounded by the horizon when it can. Searches walk a node's successors as the
tracker caches them and give up (``None``) where a node of unknown targets may go anywhere; a
:class:`BallPlan` holds what a ball's hit table needs that only the structure decides.
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
    frontier: frozenset[int],
    horizon: int,
    wildcard: Sequence[bool],
    successors: Callable[[int], Sequence[int]],
) -> dict[int, int] | None:
    """Nodes within ``horizon`` steps of ``frontier``, with their distance (``None`` if a
    node of unknown targets can still move). Nothing farther affects a reuse within the
    horizon."""
    return _search(frontier, horizon, successors, wildcard)


def _backward_distances(
    preds: Sequence[Sequence[int]], targets: frozenset[int], horizon: int
) -> dict[int, int]:
    """Distance to ``targets`` of every node within ``horizon`` steps of them, walking the
    edges backwards (it depends on the structure only)."""
    back = _search(targets, horizon, preds.__getitem__)
    assert back is not None  # only a ``stop`` ends a search early
    return back


def _relevant_ball(
    back: Mapping[int, int],
    frontier: frozenset[int],
    horizon: int,
    successors: Callable[[int], Sequence[int]],
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
            for v in successors(u):
                if v not in dist and v in back and depth + back[v] <= horizon:
                    dist[v] = depth
                    nxt.append(v)
        layer = nxt
    for f in frontier:
        dist.setdefault(f, 0)
    return dist


class _Step:
    """One node of a ball plan: its position, its successors' positions in the ball (plain;
    choices as ``(position, index in the row's choices)``), the choice weights last read and
    the count version they were read at."""

    __slots__ = ("choice_at", "choice_from", "i", "plain_at", "u", "version")

    def __init__(
        self, u: int, i: int, plain_at: list[int], choice_from: list[tuple[int, int]]
    ) -> None:
        self.u, self.i, self.plain_at, self.choice_from = u, i, plain_at, choice_from
        self.choice_at: list[tuple[int, float]] = []
        self.version = -1  # weights never read


class BallPlan:
    """What a hit table over one ball needs that only the structure decides: the ball's
    positions, the level-0 values, and which nodes each level computes (a node ``d`` steps
    from the frontier and ``b`` from the targets is read with at most ``horizon - d`` steps
    left and is not 0 with fewer than ``b``: it is computed at those levels alone, and counts
    as 0 at the others). Only the choice weights change with the counts; ``table`` reads them
    again for the nodes whose counts changed since."""

    __slots__ = ("base", "levels", "position", "weighted")

    def __init__(
        self,
        ball: Mapping[int, int],
        targets: frozenset[int],
        horizon: int,
        row: Callable[[int], Row],
        back: Mapping[int, int] | None,
    ) -> None:
        order = sorted(ball.items(), key=_distance)
        position = {u: i for i, (u, _) in enumerate(order)}
        self.position = position
        self.base = [1.0 if u in targets else 0.0 for u, _ in order]
        self.levels: list[list[_Step]] = [[] for _ in range(horizon + 1)]
        self.weighted: list[_Step] = []
        for i, (u, d) in enumerate(order):
            if d >= horizon:  # out of reach at every level
                break
            first = 1 if back is None else max(1, back.get(u, horizon + 1))
            if u in targets or first > horizon - d:
                continue  # 1.0 (a target) or 0.0 at every level it is read, as in ``base``
            plain, choice, _ = row(u)
            step = _Step(
                u,
                i,
                [position[v] for v in plain if v in position],
                [(position[v], j) for j, (v, _) in enumerate(choice) if v in position],
            )
            if step.choice_from:
                self.weighted.append(step)
            for k in range(first, horizon - d + 1):
                self.levels[k].append(step)

    def table(
        self, names: Sequence[str], versions: Mapping[str, int], row: Callable[[int], Row]
    ) -> list[list[float]]:
        """``table[k][position[u]]``: the probability that a walk from ``u`` hits the
        targets within ``k`` steps, with the counts as they are now (``versions``: each
        node's count version; ``row`` gives a node's row)."""
        for step in self.weighted:
            version = versions.get(names[step.u], 0)
            if version != step.version:
                choice = row(step.u)[1]
                step.choice_at = [(at, choice[j][1]) for at, j in step.choice_from]
                step.version = version
        base = self.base
        table = [base]
        prev = base
        for level in self.levels[1:]:
            current = base.copy()
            for step in level:
                miss = 1.0
                for v in step.plain_at:
                    miss *= 1.0 - prev[v]
                hit = 0.0
                for v, q in step.choice_at:
                    hit += q * prev[v]
                current[step.i] = 1.0 - miss * (1.0 - hit)
            table.append(current)
            prev = current
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
