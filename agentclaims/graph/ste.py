"""Steps-to-execution (STE) and reuse probabilities over an Agent Execution Graph.

Deterministic view, exactly as KVFlow defines it. Given the *frontier* (the nodes about to
run or running):

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
count: :class:`SteTracker` records them as the workflow advances.

A node marked ``targets_unknown`` (a router whose targets LangGraph cannot see) is treated
conservatively: it may lead to *any* node in one step, so it never makes a prefix look farther
away than it may be. Its first observed transition replaces that guess by what it saw.

A prefix takes the smallest STE of the nodes that use it (a shared prefix is as urgent as its
most urgent user).

Probabilistic view: from the learned transition probabilities, the probability that a set of
target nodes (one node, or the users of a prefix) runs within ``horizon`` steps, and the
expected number of steps until it does, given that it does. Per node ``u`` and step budget
``k`` the hitting probability is ``h_k(u) = 1`` for targets, else
``1 - prod_plain(1 - h_{k-1}(v)) * (1 - sum_choice q(v) h_{k-1}(v))``: plain successors all run
(assumed independent), one choice is taken among the conditional ones; ``__end__`` absorbs.
For a frontier ``F``: ``P_k = 1 - prod_{f in F} (1 - h_k(f))``. AND-joins are treated as OR
here (optimistic); a ``targets_unknown`` node picks uniformly among all nodes.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from agentclaims.errors import UsageError
from agentclaims.graph.aeg import END, START, AgentExecutionGraph

__all__ = [
    "Reuse",
    "SteSnapshot",
    "SteTracker",
    "kvflow_priority",
    "prefix_reuse",
    "prefix_steps_to_execution",
    "reuse_within",
    "steps_to_execution",
]

INF: Final = math.inf
_EMPTY: Final[frozenset[int]] = frozenset()
_NO_PAIRS: Final[frozenset[tuple[int, int]]] = frozenset()
DEFAULT_HORIZON: Final = 8


@dataclass(frozen=True, slots=True)
class Reuse:
    """How likely a node (or prefix) runs within ``horizon`` steps, and how soon.

    ``expected_steps`` is the mean number of steps until it runs, *given* that it runs within
    the horizon (``math.inf`` when ``probability`` is 0; 0 when it is in the frontier).
    """

    probability: float
    expected_steps: float
    horizon: int


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


# ---------------------------------------------------------------------- compiled structure


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


# ---------------------------------------------------------------------- Markov chain


@dataclass(slots=True)
class _Chain:
    """Per node: plain successors (all run) and choice successors with probabilities."""

    plain: list[tuple[int, ...]]
    choice: list[tuple[tuple[int, float], ...]]
    wildcard: list[int]
    start: int


def _compile_chain(graph: AgentExecutionGraph, s: _Structure) -> _Chain:
    plain: list[tuple[int, ...]] = []
    choice: list[tuple[tuple[int, float], ...]] = []
    for name in s.names:
        probs = graph.transition_probabilities(name)
        plain.append(tuple(s.index[v] for v in probs if graph.edge_kind(name, v) == "plain"))
        choice.append(
            tuple((s.index[v], p) for v, p in probs.items() if graph.edge_kind(name, v) != "plain")
        )
    return _Chain(
        plain=plain,
        choice=choice,
        wildcard=[i for i, w in enumerate(s.wildcard) if w],
        start=s.start,
    )


def _hit_table(chain: _Chain, targets: frozenset[int], horizon: int) -> list[list[float]]:
    """``table[k][u]``: probability that a walk from ``u`` hits ``targets`` within k steps."""
    n = len(chain.plain)
    current = [1.0 if u in targets else 0.0 for u in range(n)]
    table = [current]
    wildcard = set(chain.wildcard)
    for _ in range(horizon):
        prev = current
        uniform = (sum(prev) - prev[chain.start]) / max(1, n - 1) if wildcard else 0.0
        current = [0.0] * n
        for u in range(n):
            if u in targets:
                current[u] = 1.0
                continue
            miss = 1.0
            for v in chain.plain[u]:
                miss *= 1.0 - prev[v]
            if u in wildcard:
                hit = uniform
            else:
                hit = 0.0
                for v, q in chain.choice[u]:
                    hit += q * prev[v]
            current[u] = 1.0 - miss * (1.0 - hit)
        table.append(current)
    return table


def _combine(
    table: Sequence[Sequence[float]] | Sequence[Mapping[int, float]],
    frontier: frozenset[int],
    horizon: int,
) -> Reuse:
    """Frontier-level reuse from a hit table (independent frontier branches)."""
    cumulative = []
    for k in range(horizon + 1):
        miss = 1.0
        row = table[k]
        for f in frontier:
            miss *= 1.0 - row[f]
        cumulative.append(1.0 - miss)
    p = cumulative[horizon]
    if p <= 0.0:
        return Reuse(0.0, INF, horizon)
    # E[T | T <= H] = sum_{k < H} (P_H - P_k) / P_H
    expected = sum(p - c for c in cumulative[:horizon]) / p
    return Reuse(min(1.0, p), max(0.0, expected), horizon)


def _check_horizon(horizon: object) -> int:
    if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 0:
        raise UsageError("horizon", f"must be an integer >= 0, got {horizon!r}")
    return horizon


# ---------------------------------------------------------------------- one-shot functions


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


def reuse_within(
    graph: AgentExecutionGraph,
    frontier: Iterable[str],
    targets: Iterable[str],
    *,
    horizon: int = DEFAULT_HORIZON,
) -> Reuse:
    """Probability that any of ``targets`` runs within ``horizon`` steps of ``frontier``."""
    horizon = _check_horizon(horizon)
    s = _compile_structure(graph)
    front = _frontier_indices(s, frontier)
    if isinstance(targets, str):
        raise UsageError("targets", "must be an iterable of node names, not one string")
    try:
        target_set = frozenset(s.index[t] for t in targets)
    except KeyError as exc:
        raise UsageError("targets", f"unknown node {exc.args[0]!r}") from None
    table = _hit_table(_compile_chain(graph, s), target_set, horizon)
    return _combine(table, front, horizon)


def prefix_reuse(
    graph: AgentExecutionGraph,
    frontier: Iterable[str],
    prefix_id: str,
    *,
    horizon: int = DEFAULT_HORIZON,
) -> Reuse:
    """Probability that ``prefix_id`` is used (any of its users runs) within ``horizon``."""
    users = graph.prefix_users().get(prefix_id, frozenset())
    return reuse_within(graph, frontier, users, horizon=horizon)


# ---------------------------------------------------------------------- incremental tracker


@dataclass(slots=True)
class _Caches:
    structure: _Structure
    chain: _Chain | None = None
    snapshots: dict[tuple[frozenset[int], frozenset[tuple[int, int]]], SteSnapshot] = field(
        default_factory=dict
    )
    tables: dict[tuple[frozenset[int], int], list[list[float]]] = field(default_factory=dict)
    rows: dict[int, tuple[tuple[int, ...], tuple[tuple[int, float], ...], tuple[int, ...]]] = field(
        default_factory=dict
    )
    log_pos: int = 0
    join_targets: frozenset[int] = frozenset()
    any_wildcard: bool = False
    backward: dict[tuple[frozenset[int], int], dict[int, int]] = field(default_factory=dict)


class SteTracker:
    """Holds a graph and the workflow's frontier; answers STE and reuse queries cheaply.

    STE snapshots are cached by ``(frontier, satisfied join members)`` until the graph's
    structure changes (finished join members that bring no join closer reuse the plain
    frontier's snapshot); hit tables for reuse are cached per (target set, horizon) until any
    count changes. :meth:`precompute` warms the STE cache (by default every single-node
    frontier), so a hot loop of :meth:`advance` + lookups costs dictionary hits.

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
        self._fresh()
        s = self._c.structure
        new = _frontier_indices(s, frontier)
        old = self._frontier
        satisfied = self._satisfied
        if s.group_target and (satisfied or old):
            satisfied = self._update_satisfied(s, old, new, satisfied)
        self._frontier = new
        self._satisfied = satisfied
        self._snapshot = None
        return self.snapshot

    def move(self, frontier: Iterable[str]) -> None:
        """``advance`` without building the snapshot (for callers that ask about few nodes)."""
        self._fresh()
        s = self._c.structure
        new = _frontier_indices(s, frontier)
        if s.group_target and (self._satisfied or self._frontier):
            self._satisfied = self._update_satisfied(s, self._frontier, new, self._satisfied)
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
        s = self._c.structure
        if target in self._frontier:
            return 0.0
        if not self._c.any_wildcard and not self._c.join_targets:
            # only OR steps: STE is the shortest walk, read off the cached backward search
            back = self._backward(frozenset((target,)), self._horizon)
            near = [back[f] for f in self._frontier if f in back]
            return float(min(near)) if near else None
        joins = self._c.join_targets
        seen = set(self._frontier)
        layer = list(self._frontier)
        for depth in range(1, self._horizon + 1):
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
            self.move([node])
            return Reuse(1.0, 1.0, h)
        skip = {s.index[n] for n in exclude if n in s.index}
        self._sync_rows()
        plain, choice, _ = self._row(u)
        plain = tuple(v for v in plain if v not in skip)
        kept = [(v, q) for v, q in choice if v not in skip]
        total = sum(q for _, q in kept)
        kept = [(v, q / total) for v, q in kept] if total > 0 else []
        nxt = [*plain, *(v for v, _ in kept)]
        self.move([s.names[v] for v in nxt] or [END])
        if h == 0 or not nxt:
            return Reuse(0.0, INF, h)
        # a walk from each next step, with h - 1 steps left, must reach ``node``
        targets, starts = frozenset((u,)), frozenset(nxt)
        ball = (
            self._ball(h - 1, starts)
            if self._c.any_wildcard
            else self._relevant(targets, h - 1, starts)
        )
        table: Sequence[Sequence[float]] | Sequence[Mapping[int, float]] = (
            self._table(targets, h - 1) if ball is None else self._ball_table(ball, targets, h - 1)
        )
        reuse_at = {v: [row[v] for row in table] for v in nxt}
        cumulative = [0.0]
        for k in range(h):
            miss = 1.0
            for v in plain:
                miss *= 1.0 - reuse_at[v][k]
            hit = sum(q * reuse_at[v][k] for v, q in kept)
            cumulative.append(1.0 - miss * (1.0 - hit))
        p = cumulative[h]
        if p <= 0.0:
            return Reuse(0.0, INF, h)
        expected = sum(p - c for c in cumulative[:h]) / p
        return Reuse(min(1.0, p), max(0.0, expected), h)

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
                self._store(cache_key, _snapshot(s, key, cache_key[1]))
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
            log_pos=self._graph.counts_changed(2**62)[1],  # rows start fresh: skip the log
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

    def _update_satisfied(
        self,
        s: _Structure,
        old: frozenset[int],
        new: frozenset[int],
        satisfied: frozenset[tuple[int, int]],
    ) -> frozenset[tuple[int, int]]:
        pairs = set(satisfied)
        for u in old - new:
            for gid in s.member_groups[u]:
                pairs.add((gid, u))
        if pairs:  # a join that runs now consumed its inputs
            pairs = {(g, m) for g, m in pairs if s.group_target[g] not in new}
        return frozenset(pairs)

    def _lookup(self) -> SteSnapshot:
        snapshots = self._c.snapshots
        base_key = (self._frontier, _NO_PAIRS)
        base = snapshots.get(base_key)
        if base is None:
            base = _snapshot(self._c.structure, self._frontier, _NO_PAIRS)
            self._store(base_key, base)
        if not self._satisfied:
            return base
        key = (self._frontier, self._satisfied)
        snap = snapshots.get(key)
        if snap is None:
            snap = (
                _snapshot(self._c.structure, self._frontier, self._satisfied)
                if self._satisfied_lowers(base)
                else base
            )
            self._store(key, snap)
        return snap

    def _satisfied_lowers(self, base: SteSnapshot) -> bool:
        """Whether the finished join members bring any join closer than ``base`` says.

        If no join's relaxed candidate ``1 + max(unfinished members)`` beats its base STE,
        the base values are a fixed point of the relaxed equations too, and (the relaxed
        equations being pointwise smaller) their greatest one: the snapshot is unchanged.
        """
        s = self._c.structure
        done: dict[int, set[int]] = {}
        for gid, member in self._satisfied:
            done.setdefault(gid, set()).add(member)
        nodes, names = base.nodes, s.names
        for gid, members in done.items():
            waiting = s.group_members[gid] - members
            candidate = 1 + max((nodes[names[m]] for m in waiting), default=0)
            if candidate < nodes[names[s.group_target[gid]]]:
                return True
        return False

    def _store(
        self, key: tuple[frozenset[int], frozenset[tuple[int, int]]], snap: SteSnapshot
    ) -> None:
        snapshots = self._c.snapshots
        if len(snapshots) >= self._cache_size:
            del snapshots[next(iter(snapshots))]
        snapshots[key] = snap

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
        self._sync_rows()
        ball = self._ball(horizon) if self._c.any_wildcard else self._relevant(targets, horizon)
        if ball is None:  # a node with unknown targets may go anywhere: use the whole chain
            return _combine(self._table(targets, horizon), self._frontier, horizon)
        return _combine(self._ball_table(ball, targets, horizon), self._frontier, horizon)

    def _row(
        self, u: int
    ) -> tuple[tuple[int, ...], tuple[tuple[int, float], ...], tuple[int, ...]]:
        """Node ``u``'s plain successors, choice successors with probabilities, and all of
        them (cached; ``_sync_rows`` drops the rows whose counts changed)."""
        row = self._c.rows.get(u)
        if row is None:
            graph, s = self._graph, self._c.structure
            name = s.names[u]
            plain_names, probs = graph.split_transitions(name)
            plain = tuple(s.index[v] for v in plain_names)
            choice = tuple((s.index[v], p) for v, p in probs.items())
            row = self._c.rows[u] = (plain, choice, (*plain, *(v for v, _ in choice)))
        return row

    def _sync_rows(self) -> None:
        changed, self._c.log_pos = self._graph.counts_changed(self._c.log_pos)
        if changed:
            index, rows = self._c.structure.index, self._c.rows
            for name in changed:
                rows.pop(index[name], None)

    def _ball(self, horizon: int, frontier: frozenset[int] | None = None) -> dict[int, int] | None:
        """Nodes within ``horizon`` steps of the frontier, with their distance (``None`` if a
        node of unknown targets can still move). Nothing farther affects a reuse within the
        horizon."""
        wildcard = self._c.structure.wildcard
        frontier = self._frontier if frontier is None else frontier
        dist = dict.fromkeys(frontier, 0)
        layer = list(frontier)
        for depth in range(1, horizon + 1):
            nxt = []
            for u in layer:
                if wildcard[u]:
                    return None
                for v in self._row(u)[2]:
                    if v not in dist:
                        dist[v] = depth
                        nxt.append(v)
            layer = nxt
        return dist

    def _backward(self, targets: frozenset[int], horizon: int) -> dict[int, int]:
        """Distance to ``targets`` of every node within ``horizon`` steps of them, walking
        edges backwards; depends on the structure only, so it is cached until that changes."""
        back = self._c.backward.get((targets, horizon))
        if back is None:
            preds = self._c.structure.preds
            back = dict.fromkeys(targets, 0)
            layer = list(targets)
            for depth in range(1, horizon + 1):
                nxt = []
                for v in layer:
                    for u in preds[v]:
                        if u not in back:
                            back[u] = depth
                            nxt.append(u)
                layer = nxt
            if len(self._c.backward) >= self._cache_size:
                del self._c.backward[next(iter(self._c.backward))]
            self._c.backward[(targets, horizon)] = back
        return back

    def _relevant(
        self, targets: frozenset[int], horizon: int, frontier: frozenset[int] | None = None
    ) -> dict[int, int]:
        """Nodes on some frontier-to-target walk of at most ``horizon`` steps, with their
        distance from the frontier: a backward search from the targets bounds the forward one.
        Every other node's hit probability is exactly 0 where the frontier could read it."""
        back = self._backward(targets, horizon)
        frontier = self._frontier if frontier is None else frontier
        dist = {f: 0 for f in frontier if f in back}
        layer = list(dist)
        for depth in range(1, horizon + 1):
            nxt = []
            for u in layer:
                for v in self._row(u)[2]:
                    if v not in dist and v in back and depth + back[v] <= horizon:
                        dist[v] = depth
                        nxt.append(v)
            layer = nxt
        for f in frontier:
            dist.setdefault(f, 0)
        return dist

    def _ball_table(
        self, ball: dict[int, int], targets: frozenset[int], horizon: int
    ) -> list[dict[int, float]]:
        """``_hit_table`` restricted to what the frontier can read: with ``k`` steps left,
        only nodes at distance ``<= horizon - k`` (anything else counts as 0, never read)."""
        current = {u: 1.0 if u in targets else 0.0 for u in ball}
        table = [current]
        rows = self._c.rows  # the searches that built ``ball`` loaded every row read below
        for k in range(1, horizon + 1):
            prev = current
            current = {}
            reach = horizon - k
            for u, d in ball.items():
                if d > reach:
                    continue
                if u in targets:
                    current[u] = 1.0
                    continue
                row = rows.get(u)
                plain, choice, _ = row if row is not None else self._row(u)
                miss = 1.0
                for v in plain:
                    miss *= 1.0 - prev.get(v, 0.0)
                hit = 0.0
                for v, q in choice:
                    hit += q * prev.get(v, 0.0)
                current[u] = 1.0 - miss * (1.0 - hit)
            table.append(current)
        return table
