"""The incremental :class:`SteTracker`: STE and reuse answered as the workflow moves on.

Its caches hold one graph's compiled structure, STE snapshots, hit tables and transition rows;
node STE and reuse queries search only the horizon's ball (:mod:`agentclaims.graph._ball`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, TypeVar

from agentclaims.errors import UsageError
from agentclaims.graph._ball import (
    BallPlan,
    Row,
    _backward_distances,
    _forward_ball,
    _or_ste_within,
    _relevant_ball,
)
from agentclaims.graph._structure import (
    INF,
    _compile_structure,
    _frontier_indices,
    _satisfied_pairs,
    _Structure,
    _update_satisfied,
)
from agentclaims.graph.aeg import END, START, AgentExecutionGraph
from agentclaims.graph.reuse import (
    DEFAULT_HORIZON,
    Reuse,
    _Chain,
    _check_horizon,
    _combine,
    _compile_chain,
    _hit_table,
    _step_reuse,
)
from agentclaims.graph.ste import SteSnapshot, _satisfied_lowers, _snapshot

__all__ = ["SteTracker"]

K = TypeVar("K")
V = TypeVar("V")

_EMPTY: Final[frozenset[int]] = frozenset()
_NO_PAIRS: Final[frozenset[tuple[int, int]]] = frozenset()


@dataclass(slots=True)
class _Caches:
    structure: _Structure
    chain: _Chain | None = None
    snapshots: dict[tuple[frozenset[int], frozenset[tuple[int, int]]], SteSnapshot] = field(
        default_factory=dict
    )
    tables: dict[tuple[frozenset[int], int], list[list[float]]] = field(default_factory=dict)
    rows: dict[int, tuple[int, Row]] = field(default_factory=dict)  # (count version, row)
    skeletons: dict[int, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = field(
        default_factory=dict
    )
    returns: dict[tuple[int, frozenset[int], int], tuple[frozenset[int], bool]] = field(
        default_factory=dict
    )
    join_targets: frozenset[int] = frozenset()
    any_wildcard: bool = False
    backward: dict[frozenset[int], tuple[int, dict[int, int]]] = field(default_factory=dict)
    plans: dict[tuple[frozenset[int], int, frozenset[int]], BallPlan] = field(default_factory=dict)


class SteTracker:
    """Holds a graph and the workflow's frontier; answers STE and reuse queries cheaply.

    STE snapshots are cached by ``(frontier, satisfied join members)`` until the graph's
    structure changes (finished join members that bring no join closer reuse the plain
    frontier's snapshot). Reuse queries read what is structure from caches kept until the
    structure changes: which steps follow a node and whether any walk from them comes back
    within the horizon, backward searches, and the plan of each query's hit table over its
    ball (:class:`~agentclaims.graph._ball.BallPlan`), which reads the choice weights again
    only for nodes whose counts changed (``AgentExecutionGraph.count_version``); whole-chain
    tables (a graph with a node of unknown targets) are cached until any count changes.
    :meth:`precompute` warms the STE cache (by default every single-node frontier), so a hot
    loop of :meth:`advance` + lookups costs dictionary hits.

    ``advance`` records the nodes that left the frontier as finished members of the AND-joins
    they feed, so a join that already got some of its inputs is not reported unreachable.
    """

    __slots__ = (
        "_c",
        "_cache_size",
        "_frontier",
        "_graph",
        "_horizon",
        "_satisfied",
        "_snapshot",
        "_structure_version",
        "_version",
    )

    def __init__(
        self,
        graph: AgentExecutionGraph,
        frontier: Iterable[str] = (START,),
        *,
        horizon: int = DEFAULT_HORIZON,
        cache_size: int = 8192,
    ) -> None:
        if not isinstance(graph, AgentExecutionGraph):
            raise UsageError("graph", f"must be an AgentExecutionGraph, got {type(graph).__name__}")
        self._horizon = _check_horizon(horizon)
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 1:
            raise UsageError("cache_size", f"must be an integer >= 1, got {cache_size!r}")
        self._graph = graph
        self._cache_size = cache_size
        self._structure_version = -1
        self._version = -1
        self._c = self._caches()
        self._frontier = _frontier_indices(self._c.structure, frontier)
        self._satisfied: frozenset[tuple[int, int]] = frozenset()
        self._snapshot: SteSnapshot | None = None  # computed when first asked for

    @property
    def graph(self) -> AgentExecutionGraph:
        """The graph this tracker follows (mutating it invalidates the caches)."""
        return self._graph

    @property
    def horizon(self) -> int:
        """The default horizon of the reuse queries."""
        return self._horizon

    @property
    def frontier(self) -> frozenset[str]:
        """The nodes about to run or running."""
        self._fresh()
        names = self._c.structure.names
        return frozenset(names[i] for i in self._frontier)

    @property
    def snapshot(self) -> SteSnapshot:
        """STE of every node and prefix for the current frontier."""
        self._fresh()
        if self._snapshot is None:
            self._snapshot = self._lookup()
        return self._snapshot

    @property
    def cached_snapshots(self) -> int:
        """How many STE snapshots the cache holds (one per frontier and join state seen)."""
        return len(self._c.snapshots)

    def advance(self, frontier: Iterable[str]) -> SteSnapshot:
        """Move to a new frontier; returns its STE snapshot.

        Nodes that were in the frontier and are not any more count as finished inputs of the
        AND-joins they feed, until those joins run.
        """
        self.move(frontier)
        return self.snapshot

    def move(self, frontier: Iterable[str]) -> None:
        """``advance`` without building the snapshot (for callers that ask about few nodes)."""
        self._fresh()
        self._move_to(_frontier_indices(self._c.structure, frontier))

    def _move_to(self, new: frozenset[int]) -> None:
        s = self._c.structure
        if s.group_target and (self._satisfied or self._frontier):
            self._satisfied = _update_satisfied(s, self._frontier, new, self._satisfied)
        self._frontier = new
        self._snapshot = None

    def node_ste(self, node: str) -> float:
        """STE of ``node`` for the current frontier.

        Without a snapshot at hand, a search bounded by the horizon answers when it can (no
        AND-join and no node of unknown targets on the way); otherwise the full snapshot does."""
        quick = self._quick_ste(node)
        return self.snapshot.node(node) if quick is None else quick

    def near_ste(self, node: str) -> float:
        """STE of ``node`` if it is at most the horizon, else ``horizon + 1`` (meaning "farther
        than the horizon, or unreachable"): exact where decisions depend on it, and never
        more than a bounded search on a graph without joins or unknown targets. A snapshot at
        hand is used as it is (then values beyond the horizon are exact)."""
        quick = self._quick_ste(node)
        if quick is not None:
            return quick
        if self._c.any_wildcard or self._c.join_targets:
            return self.snapshot.node(node)  # the search gave up early: answer exactly
        return float(self._horizon + 1)

    def _quick_ste(self, node: str) -> float | None:
        """STE from a snapshot at hand or cached, else from the bounded search (``None``: not
        found within the horizon, or the search could not decide)."""
        self._fresh()
        if self._snapshot is None and not self._satisfied:
            self._snapshot = self._c.snapshots.get((self._frontier, _NO_PAIRS))
        if self._snapshot is not None:
            return self._snapshot.node(node)
        s = self._c.structure
        if node not in s.index:
            raise UsageError("node", f"unknown node {node!r}")
        return self._bounded_ste(s.index[node])

    def _bounded_ste(self, target: int) -> float | None:
        if target in self._frontier:
            return 0.0
        if not self._c.any_wildcard and not self._c.join_targets:
            # only OR steps: STE is the shortest walk, read off the cached backward search
            back = self._backward(frozenset((target,)), self._horizon)
            horizon = self._horizon
            near = [d for f in self._frontier if (d := back.get(f, INF)) <= horizon]
            return float(min(near)) if near else None
        s, joins = self._c.structure, self._c.join_targets
        return _or_ste_within(s, self._frontier, target, self._horizon, joins)

    def prefix_ste(self, prefix_id: str) -> float:
        """STE of ``prefix_id`` for the current frontier."""
        return self.snapshot.prefix(prefix_id)

    def reuse(self, prefix_id: str, horizon: int | None = None) -> Reuse:
        """Probability that ``prefix_id`` is used within ``horizon`` steps, and how soon."""
        h = self._horizon if horizon is None else _check_horizon(horizon)
        self._fresh()
        users = self._c.structure.prefix_users.get(prefix_id, _EMPTY)
        return self._reuse(users, h)

    def node_reuse(self, node: str, horizon: int | None = None) -> Reuse:
        """Probability that ``node`` runs within ``horizon`` steps, and how soon."""
        h = self._horizon if horizon is None else _check_horizon(horizon)
        self._fresh()
        s = self._c.structure
        if node not in s.index:
            raise UsageError("node", f"unknown node {node!r}")
        return self._reuse(frozenset((s.index[node],)), h)

    def return_reuse(
        self, node: str, *, exclude: Iterable[str] = (), horizon: int | None = None
    ) -> Reuse:
        """Probability that ``node``, which has just run, runs again within ``horizon`` steps.

        Its successors are weighted as the graph says (plain ones all run, one choice is
        taken), without the successors in ``exclude`` (steps known not to come next, e.g. the
        tool step after a reply that called no tool). Moves the frontier to what may come next.
        """
        h = self._horizon if horizon is None else _check_horizon(horizon)
        self._fresh()
        s = self._c.structure
        if node not in s.index:
            raise UsageError("node", f"unknown node {node!r}")
        u = s.index[node]
        if s.wildcard[u]:  # successors unknown until observed: assume it may come right back
            self._move_to(frozenset((u,)))
            return Reuse(1.0, 1.0, h)
        skip = frozenset(s.index[n] for n in exclude if n in s.index)
        # which steps come next, and whether any walk from them can come back within the
        # horizon, is structure (smoothing gives every choice a weight): cached per query
        key = (u, skip, h)
        known = self._c.returns.get(key)
        if known is None:
            _, _, every = self._skeleton(u)
            nxt = frozenset(v for v in every if v not in skip)
            back = h > 0 and bool(nxt) and not self._out_of_reach(frozenset((u,)), h - 1, nxt)
            known = self._put(self._c.returns, key, (nxt, back))
        starts, back = known
        self._move_to(starts or frozenset((s.index[END],)))
        if not back:
            return Reuse(0.0, INF, h)
        # a walk from each next step, with h - 1 steps left, must reach ``node``
        plain, choice, _ = self._row(u)
        plain = tuple(v for v in plain if v not in skip)
        kept = [(v, q) for v, q in choice if v not in skip]
        total = sum(q for _, q in kept)
        kept = [(v, q / total) for v, q in kept]
        table, position = self._bounded_table(frozenset((u,)), h - 1, starts)
        if position is not None:
            plain = tuple(position[v] for v in plain)
            kept = [(position[v], q) for v, q in kept]
        return _step_reuse(plain, kept, table, h)

    def precompute(self, frontiers: Iterable[Iterable[str]] | None = None) -> int:
        """Warm the STE cache for ``frontiers`` (default: every single-node frontier) and the
        reuse tables of every prefix; returns the number of snapshots computed."""
        self._fresh()
        s = self._c.structure
        keys = (
            [frozenset((i,)) for i in range(len(s.names))]
            if frontiers is None
            else [_frontier_indices(s, f) for f in frontiers]
        )
        computed = 0
        for key in keys:
            cache_key = (key, _NO_PAIRS)
            if cache_key not in self._c.snapshots:
                self._put(self._c.snapshots, cache_key, _snapshot(s, key, cache_key[1]))
                computed += 1
        for users in s.prefix_users.values():
            self._table(users, self._horizon)
        return computed

    def __repr__(self) -> str:
        return f"SteTracker(frontier={sorted(self.frontier)}, horizon={self._horizon})"

    # ------------------------------------------------------------------ internals

    def _fresh(self) -> None:
        if self._graph.structure_version != self._structure_version:
            self._refresh()

    def _caches(self) -> _Caches:
        self._structure_version = self._graph.structure_version
        self._version = self._graph.version
        structure = _compile_structure(self._graph)
        return _Caches(
            structure=structure,
            join_targets=frozenset(structure.group_target),
            any_wildcard=any(structure.wildcard),
        )

    def _refresh(self) -> None:
        names = [self._c.structure.names[i] for i in self._frontier]
        satisfied = [
            (self._c.structure.group_target[g], self._c.structure.names[m])
            for g, m in self._satisfied
        ]
        old = self._c.structure
        self._c = self._caches()
        s = self._c.structure
        self._frontier = frozenset(s.index[n] for n in names if n in s.index)
        by_target: dict[str, set[str]] = {}
        for t, m in satisfied:
            by_target.setdefault(old.names[t], set()).add(m)
        self._satisfied = _satisfied_pairs(s, by_target)
        self._snapshot = None

    def _lookup(self) -> SteSnapshot:
        snapshots = self._c.snapshots
        base_key = (self._frontier, _NO_PAIRS)
        base = snapshots.get(base_key)
        if base is None:
            base = _snapshot(self._c.structure, self._frontier, _NO_PAIRS)
            self._put(snapshots, base_key, base)
        if not self._satisfied:
            return base
        key = (self._frontier, self._satisfied)
        snap = snapshots.get(key)
        if snap is None:
            snap = (
                _snapshot(self._c.structure, self._frontier, self._satisfied)
                if _satisfied_lowers(self._c.structure, self._satisfied, base)
                else base
            )
            self._put(snapshots, key, snap)
        return snap

    def _put(self, cache: dict[K, V], key: K, value: V) -> V:
        """``cache[key] = value``, the oldest entry dropped first if a new key would take the
        cache past ``cache_size``; returns ``value``."""
        if key not in cache and len(cache) >= self._cache_size:
            del cache[next(iter(cache))]
        cache[key] = value
        return value

    def _table(self, targets: frozenset[int], horizon: int) -> list[list[float]]:
        if self._graph.version != self._version:
            self._version = self._graph.version
            self._c.chain = None
            self._c.tables.clear()
        key = (targets, horizon)
        table = self._c.tables.get(key)
        if table is None:
            if self._c.chain is None:
                self._c.chain = _compile_chain(self._graph, self._c.structure)
            table = _hit_table(self._c.chain, targets, horizon)
            self._c.tables[key] = table
        return table

    def _reuse(self, targets: frozenset[int], horizon: int) -> Reuse:
        if not self._frontier.isdisjoint(targets):
            return Reuse(1.0, 0.0, horizon)
        if self._out_of_reach(targets, horizon, self._frontier):
            return Reuse(0.0, INF, horizon)
        table, position = self._bounded_table(targets, horizon, self._frontier)
        frontier = self._frontier if position is None else [position[f] for f in self._frontier]
        return _combine(table, frontier, horizon)

    def _row(self, u: int) -> Row:
        """Node ``u``'s plain successors, choice successors with probabilities, and all of
        them: cached with the node's count version, so a row whose counts changed since is
        built again (rows of plain successors only never change). Which successors are plain
        and which a choice is structure (``_skeleton``): a new row only reweighs its choices."""
        name = self._c.structure.names[u]
        version = self._graph._count_versions.get(name, 0)  # the hot path: no method call
        cached = self._c.rows.get(u)
        if cached is not None and (cached[0] == version or not cached[1][1]):
            return cached[1]
        plain, targets, every = self._skeleton(u)
        weights = self._graph._choice_weights(name)
        row = (plain, tuple(zip(targets, weights, strict=True)), every)
        self._c.rows[u] = (version, row)
        return row

    def _successors(self, u: int) -> tuple[int, ...]:
        """Every successor of ``u`` (structure: what the searches walk)."""
        return self._skeleton(u)[2]

    def _skeleton(self, u: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """Node ``u``'s plain successors, its choice successors, and all of them (cached until
        the structure changes)."""
        skeleton = self._c.skeletons.get(u)
        if skeleton is None:
            index = self._c.structure.index
            plain_names, probs = self._graph.split_transitions(self._c.structure.names[u])
            plain = tuple(index[v] for v in plain_names)
            targets = tuple(index[v] for v in probs)
            skeleton = self._c.skeletons[u] = (plain, targets, (*plain, *targets))
        return skeleton

    def _backward(self, targets: frozenset[int], horizon: int) -> dict[int, int]:
        """Distance to ``targets`` of every node within ``horizon`` steps of them (cached until
        the structure changes). One search per target set serves every horizon up to the one
        it ran to (the tracker's, or a deeper one asked for), so the map may also hold nodes
        farther than ``horizon``: readers compare the distances with their horizon."""
        cached = self._c.backward.get(targets)
        if cached is None or cached[0] < horizon:
            depth = max(horizon, self._horizon)
            back = _backward_distances(self._c.structure.preds, targets, depth)
            cached = self._put(self._c.backward, targets, (depth, back))
        return cached[1]

    def _out_of_reach(
        self, targets: frozenset[int], horizon: int, frontier: frozenset[int]
    ) -> bool:
        """Whether no walk of at most ``horizon`` steps leads from ``frontier`` to ``targets``
        (read off the cached backward search): every hit probability the frontier would read
        is then exactly 0, whatever the counts, and no table needs computing. Never on a graph
        with a node of unknown targets (it may go anywhere)."""
        if self._c.any_wildcard:
            return False
        back = self._backward(targets, horizon)
        return all(back.get(f, INF) > horizon for f in frontier)

    def _bounded_table(
        self, targets: frozenset[int], horizon: int, frontier: frozenset[int]
    ) -> tuple[Sequence[Sequence[float]], Mapping[int, int] | None]:
        """Hit table of ``targets`` as a walk from ``frontier`` reads it, and the positions of
        the nodes in it: over the horizon's ball (its own positions), or over the whole chain
        (``None``: a node's index is its position) where a node with unknown targets may go
        anywhere."""
        names, versions = self._c.structure.names, self._graph._count_versions
        if self._c.any_wildcard:
            ball = _forward_ball(frontier, horizon, self._c.structure.wildcard, self._successors)
            if ball is None:
                return self._table(targets, horizon), None
            once = BallPlan(ball, targets, horizon, self._row, None)
            return once.table(names, versions, self._row), once.position
        # the ball and its plan depend on which edges exist, never on their counts: cached
        # until the structure changes
        key = (targets, horizon, frontier)
        plan = self._c.plans.get(key)
        if plan is None:
            back = self._backward(targets, horizon)
            ball = _relevant_ball(back, frontier, horizon, self._successors)
            plan = BallPlan(ball, targets, horizon, self._row, back)
            self._put(self._c.plans, key, plan)
        return plan.table(names, versions, self._row), plan.position
