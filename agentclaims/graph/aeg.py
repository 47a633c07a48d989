"""The Agent Execution Graph (AEG): a workflow's steps, its transitions, and what it learned.

A thin typed wrapper around a :class:`networkx.DiGraph`. Nodes are steps:

* ``"agent"``: an LLM-calling step; it may name the ``prefix_id`` s its prompts start with
  (a prefix used by several nodes, such as a shared system prompt, is a *shared prefix*);
* ``"tool"``: a step that calls tools and no LLM;
* ``"start"`` / ``"end"``: the sentinels :data:`START` (``__start__``) and :data:`END`
  (``__end__``), named as in LangGraph and present in every graph.

Edges are transitions, each with a ``kind``:

* ``"plain"``: always taken (LangGraph runs every plain successor of a node);
* ``"conditional"``, ``"send"``, ``"goto"``: one *choice* among the node's choice edges
  (a router, a ``Send`` fan-out, a ``Command(goto=...)``).

Every edge carries an observed ``count``. The choice edges of a node get probabilities by
additive (Laplace) smoothing over the known choice edges, so unobserved choices split
uniformly; plain edges have probability 1. A node may also wait for *all* of a group of
predecessors before it runs (a LangGraph waiting edge): an AND-join, see :meth:`add_join`.

A node whose successors are not known statically (a LangGraph conditional edge without a
``path_map``, a hint or ``destinations``) is marked ``targets_unknown``; its first observed
transition clears the mark, and later ones add the edges they see (online learning, as for the
functional API and dynamic ReAct agents).

Every method that rejects its input raises :class:`~agentclaims.errors.UsageError` naming the
field, before changing anything.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, cast, get_args

import networkx as nx

from agentclaims.errors import UnknownNameError, UsageError

__all__ = [
    "END",
    "START",
    "AgentExecutionGraph",
    "AgentGraphWarning",
    "EdgeKind",
    "GraphWarning",
    "NodeKind",
]

START: Final = "__start__"
"""The entry sentinel, named as in LangGraph."""
END: Final = "__end__"
"""The exit sentinel, named as in LangGraph; absorbing."""

NodeKind = Literal["agent", "tool", "start", "end"]
"""What a node is: an LLM-calling ``agent`` step, a ``tool`` step, or a sentinel."""
EdgeKind = Literal["plain", "conditional", "send", "goto"]
"""How a transition is taken: ``plain`` always, the others as one choice of several."""

NODE_KINDS: Final[tuple[str, ...]] = get_args(NodeKind)
EDGE_KINDS: Final[tuple[str, ...]] = get_args(EdgeKind)
CHOICE_KINDS: Final = frozenset({"conditional", "send", "goto"})
_FORMAT_VERSION: Final = 1


class AgentGraphWarning(UserWarning):
    """Category of the Python warnings the graph code emits (e.g. a conditional edge whose
    targets cannot be seen statically)."""


@dataclass(frozen=True, slots=True)
class GraphWarning:
    """A structured warning recorded on a graph: ``code`` is machine-readable
    (``"targets-unknown"``, ...), ``node`` the node concerned, ``message`` for people."""

    code: str
    node: str
    message: str


class AgentExecutionGraph:
    """Steps of one agent workflow, its transitions and their observed counts.

    ``smoothing`` is the additive constant of the transition probabilities (1.0: Laplace).
    ``version`` changes on every mutation; ``structure_version`` only when nodes, edges,
    prefixes, joins or the ``targets_unknown`` marks change (counts do not change it), so
    caches of steps-to-execution can key on it.
    """

    __slots__ = ("_count_versions", "_g", "_smoothing", "_warnings", "structure_version", "version")

    def __init__(self, *, smoothing: float = 1.0) -> None:
        if not isinstance(smoothing, int | float) or not math.isfinite(smoothing) or smoothing <= 0:
            raise UsageError("smoothing", f"must be a finite number > 0, got {smoothing!r}")
        self._g: nx.DiGraph = nx.DiGraph()
        self._smoothing = float(smoothing)
        self._warnings: list[GraphWarning] = []
        self.version = 0
        self.structure_version = 0
        self._count_versions: dict[str, int] = {}  # node -> changes of its counts
        self._g.add_node(START, **_node_attrs("start", frozenset()))
        self._g.add_node(END, **_node_attrs("end", frozenset()))

    # ------------------------------------------------------------------ reading

    @property
    def nx_graph(self) -> nx.DiGraph:
        """The underlying networkx graph, read-only (a frozen view): mutate through the AEG."""
        return nx.freeze(self._g.copy(as_view=True))

    @property
    def smoothing(self) -> float:
        """The additive smoothing constant of :meth:`transition_probabilities`."""
        return self._smoothing

    @property
    def nodes(self) -> list[str]:
        """Node names, in insertion order (the sentinels first)."""
        return list(self._g.nodes)

    @property
    def warnings(self) -> list[GraphWarning]:
        """The structured warnings recorded so far (a copy)."""
        return list(self._warnings)

    def __contains__(self, node: object) -> bool:
        try:
            return node in self._g._node  # the node attribute dict: no view on the way
        except TypeError:  # unhashable
            return False

    def __len__(self) -> int:
        return int(self._g.number_of_nodes())

    def node_kind(self, node: str) -> NodeKind:
        """The kind of ``node``."""
        return cast(NodeKind, self._node(node)["kind"])

    def prefixes_of(self, node: str) -> frozenset[str]:
        """The ``prefix_id`` s that ``node`` uses."""
        return cast(frozenset[str], self._node(node)["prefixes"])

    def prefix_users(self) -> dict[str, frozenset[str]]:
        """Map each ``prefix_id`` to the nodes that use it."""
        users: dict[str, set[str]] = {}
        for name, prefixes in self._g.nodes(data="prefixes"):
            for prefix in prefixes:
                users.setdefault(prefix, set()).add(name)
        return {p: frozenset(u) for p, u in sorted(users.items())}

    def targets_unknown(self, node: str) -> bool:
        """Whether ``node`` has successors that cannot be seen statically (learn at run time)."""
        return bool(self._node(node)["targets_unknown"])

    def join_groups(self, node: str) -> tuple[frozenset[str], ...]:
        """The AND-join groups of ``node``: each a set of predecessors that must ALL finish."""
        return cast(tuple[frozenset[str], ...], self._node(node)["joins"])

    def is_and_join(self, node: str) -> bool:
        """Whether ``node`` waits for all of some group of predecessors (an AND-join)."""
        return bool(self._node(node)["joins"])

    def is_join_edge(self, source: str, target: str) -> bool:
        """Whether ``source -> target`` only feeds an AND-join of ``target`` (not an OR edge)."""
        return bool(self._edge(source, target)["join"])

    def edges(self) -> list[tuple[str, str, EdgeKind, int]]:
        """All edges as ``(source, target, kind, count)``."""
        return [(u, v, d["kind"], d["count"]) for u, v, d in self._g.edges(data=True)]

    def edge_kind(self, source: str, target: str) -> EdgeKind:
        """The kind of the edge ``source -> target``."""
        return cast(EdgeKind, self._edge(source, target)["kind"])

    def edge_count(self, source: str, target: str) -> int:
        """How many times ``source -> target`` was observed."""
        return cast(int, self._edge(source, target)["count"])

    def has_edge(self, source: str, target: str) -> bool:
        """Whether the edge ``source -> target`` exists."""
        return bool(self._g.has_edge(source, target))

    def successors(self, node: str) -> list[str]:
        """The known successors of ``node``."""
        self._node(node)
        return list(self._g._succ[node])

    def predecessors(self, node: str) -> list[str]:
        """The known predecessors of ``node``."""
        self._node(node)
        return list(self._g.predecessors(node))

    def transition_probabilities(self, node: str) -> dict[str, float]:
        """Probability that each successor of ``node`` runs right after it.

        Plain edges have probability 1 (always taken). The choice edges (conditional, send,
        goto) share probability 1 with additive smoothing over the known choice edges:
        ``(count + smoothing) / (total + smoothing * n_choices)``; with no observations they
        split uniformly. A node with no successors (such as ``__end__``) gives ``{}``.
        """
        plain, choice = self.split_transitions(node)
        return {**dict.fromkeys(plain, 1.0), **choice}

    def split_transitions(self, node: str) -> tuple[list[str], dict[str, float]]:
        """``transition_probabilities`` split in two: the plain successors (all run) and the
        choice successors with their probabilities."""
        self._node(node)
        plain: list[str] = []
        choice: list[tuple[str, int]] = []
        for target, data in self._g._succ[node].items():
            if data["kind"] == "plain":
                plain.append(target)
            else:
                choice.append((target, data["count"]))
        weights = _smoothed([count for _, count in choice], self._smoothing)
        return plain, dict(zip((target for target, _ in choice), weights, strict=True))

    def comeback_probability(self, node: str) -> float | None:
        """Chance that ``node``, once it has handed over to another agent step, makes an LLM
        call again in the same run, learned over the runs observed (``observe_handoffs``);
        ``None`` before ``node`` was seen hand over.

        It is what a first-order transition model cannot say: a supervisor's conditional edge
        may route back to a worker at any time, yet in many graphs a worker that returned is
        done. A Beta(1/8, 1/8) prior on the count of comebacks: one run's handover without a
        comeback gives 0.1, three give under 0.04."""
        data = self._node(node)
        handoffs: int = data.get("handoffs", 0)
        comebacks: int = data.get("comebacks", 0)
        if not handoffs:
            return None
        return (comebacks + _COMEBACK_PRIOR) / (handoffs + 2 * _COMEBACK_PRIOR)

    def _choice_weights(self, node: str) -> list[float]:
        """The probabilities of ``split_transitions`` alone, in the order of its choices, for
        a node known to exist (the STE tracker's hot path: it keeps which successors they
        belong to)."""
        counts = [d["count"] for d in self._g._succ[node].values() if d["kind"] != "plain"]
        return _smoothed(counts, self._smoothing)

    # ------------------------------------------------------------------ building

    def add_node(
        self,
        name: str,
        kind: NodeKind = "agent",
        *,
        prefixes: Iterable[str] = (),
        targets_unknown: bool = False,
    ) -> None:
        """Add a step, or update the kind and add prefixes of an existing one.

        ``prefixes`` are the ``prefix_id`` s the step's prompts start with (agent steps only).
        ``targets_unknown`` marks a step whose successors will be learned at run time.
        """
        _check_name("name", name)
        if kind not in NODE_KINDS:
            raise UnknownNameError("kind", kind, NODE_KINDS)
        if kind in ("start", "end") or name in (START, END):
            raise UsageError("name", f"{name!r}: the sentinels {START}/{END} exist already")
        if isinstance(prefixes, str):
            raise UsageError("prefixes", "must be an iterable of prefix ids, not one string")
        new_prefixes = frozenset(prefixes)
        for prefix in new_prefixes:
            _check_name("prefixes", prefix)
        if new_prefixes and kind != "agent":
            raise UsageError("prefixes", f"only agent nodes use prefixes; {name!r} is a {kind}")
        if name in self._g:
            data = self._g.nodes[name]
            if data["prefixes"] and kind != "agent":
                raise UsageError("kind", f"{name!r} uses prefixes, so it must stay an agent")
            data["kind"] = kind
            data["prefixes"] = data["prefixes"] | new_prefixes
            data["targets_unknown"] = data["targets_unknown"] or targets_unknown
        else:
            self._g.add_node(name, **_node_attrs(kind, new_prefixes, targets_unknown))
        self._changed(structure=True)

    def add_edge(
        self, source: str, target: str, kind: EdgeKind = "plain", *, count: int = 0
    ) -> None:
        """Add the transition ``source -> target`` (both must exist), or change its kind and
        add ``count`` observations to an existing one (an AND-join edge stays one)."""
        self._check_edge(source, target)
        if kind not in EDGE_KINDS:
            raise UnknownNameError("kind", kind, EDGE_KINDS)
        _check_count(count)
        if self._g.has_edge(source, target):
            data = self._g.edges[source, target]
            data["kind"] = kind
            data["count"] += count
        else:
            self._g.add_edge(source, target, kind=kind, count=count, join=False)
        self._changed(structure=True)

    def add_join(self, sources: Sequence[str], target: str) -> None:
        """Make ``target`` wait for ALL of ``sources`` (an AND-join, a LangGraph waiting edge).

        Adds a plain edge from each source to ``target`` (marked as a join edge, so it does not
        trigger ``target`` on its own), and the group to ``target``'s joins.
        """
        if isinstance(sources, str) or len(sources) < 2:
            raise UsageError("sources", "an AND-join needs at least two source nodes")
        for source in sources:
            self._check_edge(source, target, source_field="sources")
        group = frozenset(sources)
        data = self._g.nodes[target]
        if group not in data["joins"]:
            data["joins"] = (*data["joins"], group)
        for source in sources:
            if not self._g.has_edge(source, target):
                self._g.add_edge(source, target, kind="plain", count=0, join=True)
        self._changed(structure=True)

    def mark_targets_unknown(self, node: str, unknown: bool = True) -> None:
        """Mark (or unmark) ``node`` as having successors that must be learned at run time."""
        data = self._node(node)
        if data["kind"] == "end":
            raise UsageError("node", f"{END} has no successors")
        data["targets_unknown"] = bool(unknown)
        self._changed(structure=True)

    def add_warning(self, code: str, node: str, message: str) -> GraphWarning:
        """Record a structured warning (callers also emit a Python warning if they wish)."""
        _check_name("code", code)
        warning = GraphWarning(code=code, node=node, message=message)
        self._warnings.append(warning)
        return warning

    # ------------------------------------------------------------------ learning

    def observe_transition(self, source: str, target: str, *, count: int = 1) -> None:
        """Learn that ``target`` ran right after ``source``.

        Unknown nodes are added (as ``"agent"`` steps); an unseen edge is added as a
        ``"conditional"`` choice. A ``targets_unknown`` mark on ``source`` is cleared: from
        then on its observed successors are its known ones.
        """
        _check_name("source", source)
        _check_name("target", target)
        _check_count(count)
        self._check_transition(source, target)
        structure = False
        for name in (source, target):
            if name not in self._g:
                self._g.add_node(name, **_node_attrs("agent", frozenset()))
                structure = True
        edge = self._g._succ.get(source, {}).get(target)
        if edge is not None:
            edge["count"] += count
        else:
            self._g.add_edge(source, target, kind="conditional", count=count, join=False)
            structure = True
        if self._g.nodes[source]["targets_unknown"]:
            self._g.nodes[source]["targets_unknown"] = False
            structure = True
        if not structure:
            self._count_versions[source] = self._count_versions.get(source, 0) + 1
        self._changed(structure=structure)

    def observe_handoffs(self, node: str, handoffs: int, comebacks: int) -> None:
        """Learn from one finished run that ``node`` handed over to another agent step
        ``handoffs`` times and called again after ``comebacks`` of them."""
        data = self._node(node)
        _check_count(handoffs, "handoffs")
        _check_count(comebacks, "comebacks")
        if comebacks > handoffs:
            raise UsageError(
                "comebacks", f"{comebacks} comebacks after only {handoffs} handoffs of {node!r}"
            )
        data["handoffs"] = data.get("handoffs", 0) + handoffs
        data["comebacks"] = data.get("comebacks", 0) + comebacks
        self._changed(structure=False)

    def observe_run(self, path: Sequence[str]) -> None:
        """Learn one complete run: each consecutive pair of ``path`` is a transition.

        ``__start__`` is put in front and ``__end__`` behind when missing, so entry and exit
        are learned too. The whole path is checked before anything is learned.
        """
        if isinstance(path, str) or not isinstance(path, Sequence):
            raise UsageError("path", "must be a sequence of node names")
        steps = list(path)
        for step in steps:
            _check_name("path", step)
        if not steps or steps[0] != START:
            steps.insert(0, START)
        if steps[-1] != END:
            steps.append(END)
        pairs = list(itertools.pairwise(steps))
        for source, target in pairs:
            self._check_transition(source, target, field="path")
        for source, target in pairs:
            self.observe_transition(source, target)

    # ------------------------------------------------------------------ copy / serialise

    def copy(self) -> AgentExecutionGraph:
        """An independent copy (warnings included)."""
        other = AgentExecutionGraph(smoothing=self._smoothing)
        other._g = self._g.copy()
        other._warnings = list(self._warnings)
        return other

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description, read back by :meth:`from_dict`."""
        return _described(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AgentExecutionGraph:
        """Rebuild a graph written by :meth:`to_dict`."""
        return _rebuilt(cls, data)

    def __repr__(self) -> str:
        return (
            f"AgentExecutionGraph(nodes={self._g.number_of_nodes()}, "
            f"edges={self._g.number_of_edges()}, warnings={len(self._warnings)})"
        )

    # ------------------------------------------------------------------ internals

    def _node(self, node: str) -> dict[str, Any]:
        # the hot reads (here, ``successors``, ``split_transitions``, ``observe_transition``)
        # go to the DiGraph's own dicts (``_node``, ``_succ``), not through its views
        try:
            return cast(dict[str, Any], self._g._node[node])
        except (KeyError, TypeError):
            raise UsageError("node", f"unknown node {node!r}") from None

    def _edge(self, source: str, target: str) -> dict[str, Any]:
        try:
            return cast(dict[str, Any], self._g.edges[source, target])
        except (KeyError, TypeError):
            raise UsageError("edge", f"no edge {source!r} -> {target!r}") from None

    def _check_edge(self, source: str, target: str, *, source_field: str = "source") -> None:
        _check_name(source_field, source)
        _check_name("target", target)
        if source not in self._g:
            raise UsageError(source_field, f"unknown node {source!r}")
        if target not in self._g:
            raise UsageError("target", f"unknown node {target!r}")
        self._check_transition(source, target, field=source_field)

    def _check_transition(self, source: str, target: str, *, field: str | None = None) -> None:
        if source == END:
            raise UsageError(field or "source", f"{END} has no successors")
        if target == START:
            raise UsageError(field or "target", f"{START} has no predecessors")

    def count_version(self, node: str) -> int:
        """How many times ``node``'s out-edge counts changed without a structure change.
        With ``structure_version``, this tells a cache whether ``node``'s
        ``transition_probabilities`` are still the ones it holds."""
        self._node(node)
        return self._count_versions.get(node, 0)

    def _changed(self, *, structure: bool) -> None:
        self.version += 1
        if structure:
            self.structure_version += 1


_COMEBACK_PRIOR = 0.125
"""Each of the Beta prior's two pseudo-counts in ``comeback_probability``."""


def _described(graph: AgentExecutionGraph) -> dict[str, Any]:
    """``graph`` as ``AgentExecutionGraph.to_dict`` describes it."""
    return {
        "version": _FORMAT_VERSION,
        "smoothing": graph._smoothing,
        "nodes": [
            {
                "name": name,
                "kind": data["kind"],
                "prefixes": sorted(data["prefixes"]),
                "targets_unknown": data["targets_unknown"],
                "joins": [sorted(g) for g in data["joins"]],
                **(
                    {"handoffs": data["handoffs"], "comebacks": data["comebacks"]}
                    if data.get("handoffs")
                    else {}
                ),
            }
            for name, data in graph._g.nodes(data=True)
        ],
        "edges": [
            {
                "source": u,
                "target": v,
                "kind": d["kind"],
                "count": d["count"],
                "join": d["join"],
            }
            for u, v, d in graph._g.edges(data=True)
        ],
        "warnings": [
            {"code": w.code, "node": w.node, "message": w.message} for w in graph._warnings
        ],
    }


def _rebuilt(cls: type[AgentExecutionGraph], data: Mapping[str, Any]) -> AgentExecutionGraph:
    """The graph ``AgentExecutionGraph.from_dict`` rebuilds from ``data``."""
    if not isinstance(data, Mapping) or data.get("version") != _FORMAT_VERSION:
        raise UsageError("data", f"expected a mapping with version {_FORMAT_VERSION}")
    try:
        graph = cls(smoothing=data.get("smoothing", 1.0))
        nodes = data["nodes"]
        for node in nodes:
            if node["kind"] not in ("start", "end"):
                graph.add_node(
                    node["name"],
                    node["kind"],
                    prefixes=node.get("prefixes", ()),
                    targets_unknown=node.get("targets_unknown", False),
                )
        for node in nodes:
            if node.get("handoffs"):
                graph.observe_handoffs(node["name"], node["handoffs"], node["comebacks"])
        for edge in data["edges"]:
            source, target = edge["source"], edge["target"]
            graph.add_edge(source, target, edge["kind"], count=edge["count"])
            graph._g.edges[source, target]["join"] = bool(edge.get("join", False))
        for node in nodes:  # the join edges exist already and keep their flag
            for group in node.get("joins", ()):
                graph.add_join(group, node["name"])
        for w in data.get("warnings", ()):
            graph.add_warning(w["code"], w["node"], w["message"])
    except (KeyError, TypeError) as exc:
        raise UsageError("data", f"malformed graph description: {exc!r}") from exc
    return graph


def _node_attrs(
    kind: str, prefixes: frozenset[str], targets_unknown: bool = False
) -> dict[str, Any]:
    return {"kind": kind, "prefixes": prefixes, "targets_unknown": targets_unknown, "joins": ()}


def _smoothed(counts: list[int], alpha: float) -> list[float]:
    """Additive smoothing: ``(count + alpha) / (total + alpha * n)`` for each count."""
    denominator = sum(counts) + alpha * len(counts)
    return [(count + alpha) / denominator for count in counts]


def _check_name(field: str, name: object) -> None:
    if not isinstance(name, str) or not name.strip():
        raise UsageError(field, f"must be a non-empty string, got {name!r}")


def _check_count(count: object, field: str = "count") -> None:
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise UsageError(field, f"must be an integer >= 0, got {count!r}")
