"""Reuse probabilities over an Agent Execution Graph: the probabilistic view of STE.

From the learned transition probabilities, the probability that a set of target nodes (one
node, or the users of a prefix) runs within ``horizon`` steps, and the expected number of
steps until it does, given that it does. Per node ``u`` and step budget ``k`` the hitting
probability is ``h_k(u) = 1`` for targets, else
``1 - prod_plain(1 - h_{k-1}(v)) * (1 - sum_choice q(v) h_{k-1}(v))``: plain successors all run
(assumed independent), one choice is taken among the conditional ones; ``__end__`` absorbs.
For a frontier ``F``: ``P_k = 1 - prod_{f in F} (1 - h_k(f))``. AND-joins are treated as OR
here (optimistic); a ``targets_unknown`` node picks uniformly among all nodes.

:func:`reuse_within` and :func:`prefix_reuse` answer once for a graph and a frontier; the
incremental :class:`~agentclaims.graph.tracker.SteTracker` caches the hit tables.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from agentclaims.errors import UsageError
from agentclaims.graph._structure import (
    INF,
    _compile_structure,
    _frontier_indices,
    _Structure,
)
from agentclaims.graph.aeg import AgentExecutionGraph

__all__ = ["Reuse", "prefix_reuse", "reuse_within"]

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
    table: Sequence[Sequence[float]],
    frontier: Iterable[int],
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
    return _from_cumulative(cumulative, horizon)


def _step_reuse(
    plain: Sequence[int],
    choice: Sequence[tuple[int, float]],
    table: Sequence[Sequence[float]],
    horizon: int,
) -> Reuse:
    """Reuse one step ahead: the ``plain`` next steps all run, one of ``choice`` is taken with
    its probability, and ``table`` (``horizon - 1`` steps) says how likely each of them goes
    on to hit the targets."""
    cumulative = [0.0]
    for k in range(horizon):
        row = table[k]
        miss = 1.0
        for v in plain:
            miss *= 1.0 - row[v]
        hit = 0.0
        for v, q in choice:
            hit += q * row[v]
        cumulative.append(1.0 - miss * (1.0 - hit))
    return _from_cumulative(cumulative, horizon)


def _from_cumulative(cumulative: Sequence[float], horizon: int) -> Reuse:
    """Reuse from ``cumulative[k]``, the probability of a run within ``k`` steps."""
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
