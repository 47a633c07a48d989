"""Build an :class:`~agentclaims.graph.AgentExecutionGraph` from a compiled LangGraph graph.

The structure is read from the graph's builder (``StateGraph.nodes``, ``edges``,
``waiting_edges``, ``branches``), not from ``get_graph()``: the drawing simulates a run and
drops what it cannot reach, and it hides what matters here:

* a conditional edge with neither a ``path_map``, nor a ``Literal`` return hint, nor
  ``destinations=`` has invisible targets; ``get_graph()`` then draws a false
  ``src -> __end__`` and nothing else. This module does not copy that edge: it warns
  (:class:`~agentclaims.graph.AgentGraphWarning`), records a ``"targets-unknown"`` warning on
  the graph and marks the node ``targets_unknown``, so steps-to-execution treats it as able to
  reach any node until :meth:`~agentclaims.graph.AgentExecutionGraph.observe_transition`
  learns its real targets at run time;
* waiting edges (``add_edge(["a", "b"], "c")``) become AND-joins;
* a branch that returns ``Send`` objects (seen from a return hint naming ``Send`` or from its
  code using ``langgraph.types.Send``) gives ``"send"`` edges; ``Command[Literal[...]]`` hints
  and ``destinations=`` give ``"goto"`` edges; other branches ``"conditional"`` ones;
* with ``xray``, a node that is itself a compiled graph is replaced by its inner nodes, named
  ``sub:inner`` as LangGraph's drawing names them; edges into the subgraph go to its entry
  nodes, edges out of it leave from its exit nodes.

The functional API (``@entrypoint`` / ``@task``) has no static graph: its entrypoint is marked
``targets_unknown`` and the graph is learned from runs, e.g. with :func:`task_path` on a
``stream_mode="tasks"`` stream.

LangGraph is imported only in this module.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, get_args, get_type_hints

from agentclaims.errors import UnknownNameError, UsageError
from agentclaims.graph import END, START, AgentExecutionGraph, AgentGraphWarning, EdgeKind, NodeKind

__all__ = ["aeg_from_langgraph", "task_path"]

_SEP = ":"
_CHOICE_ORDER: dict[str, int] = {"plain": 3, "goto": 2, "send": 1, "conditional": 0}


@dataclass
class _Raw:
    """What the walk over the builders found, before pseudo nodes are contracted."""

    kinds: dict[str, NodeKind] = field(default_factory=dict)
    edges: dict[tuple[str, str], EdgeKind] = field(default_factory=dict)
    joins: list[tuple[tuple[str, ...], str]] = field(default_factory=list)
    unknown: set[str] = field(default_factory=set)
    notes: list[tuple[str, str, str]] = field(default_factory=list)

    def add_edge(self, source: str, target: str, kind: EdgeKind) -> None:
        old = self.edges.get((source, target))
        if old is None or _CHOICE_ORDER[kind] > _CHOICE_ORDER[old]:
            self.edges[(source, target)] = kind


def aeg_from_langgraph(
    compiled: Any,
    *,
    xray: bool | int = True,
    kinds: Mapping[str, NodeKind] | None = None,
    prefixes: Mapping[str, Iterable[str]] | None = None,
    smoothing: float = 1.0,
) -> AgentExecutionGraph:
    """The Agent Execution Graph of a compiled LangGraph graph.

    ``xray``: expand subgraphs (``True``: all levels, an int: that many levels, ``False``: none).
    ``kinds``: override node kinds by (xray) node name, e.g. ``{"search": "tool"}``; by default
    a node whose runnable is a ``ToolNode`` or that is named ``tools`` is a tool, the rest
    agents. ``prefixes``: the ``prefix_id`` s each agent node uses.
    """
    from langgraph.pregel import Pregel

    if not isinstance(compiled, Pregel):
        raise UsageError("compiled", f"expected a compiled LangGraph graph, got {compiled!r}")
    if isinstance(xray, bool):
        depth: int | None = None if xray else 0
    elif isinstance(xray, int) and xray >= 0:
        depth = xray
    else:
        raise UsageError("xray", f"must be a bool or an int >= 0, got {xray!r}")
    raw = _Raw()
    if _builder(compiled) is None:
        _walk_functional(compiled, raw)
    else:
        _walk(compiled, "", depth, raw)
    _contract(raw)
    graph = _assemble(raw, kinds or {}, prefixes or {}, smoothing)
    for code, node, message in raw.notes:
        graph.add_warning(code, node, message)
        warnings.warn(message, AgentGraphWarning, stacklevel=2)
    return graph


def task_path(chunks: Iterable[Any]) -> list[str]:
    """Node names in start order from a LangGraph ``stream_mode="tasks"`` (or ``"debug"``)
    stream; subgraph chunks (``subgraphs=True``) are named ``sub:inner``.

    Feed the result to :meth:`~agentclaims.graph.AgentExecutionGraph.observe_run`. Tasks that
    run in parallel in one step come out one after the other.
    """
    path: list[str] = []
    for chunk in chunks:
        namespace: tuple[str, ...] = ()
        if isinstance(chunk, tuple) and len(chunk) == 2 and isinstance(chunk[0], tuple):
            namespace, chunk = chunk
        if isinstance(chunk, Mapping) and chunk.get("type") in ("task", "task_result"):
            if chunk["type"] != "task":
                continue
            chunk = chunk.get("payload", {})
        if not isinstance(chunk, Mapping) or "name" not in chunk:
            continue
        if "result" in chunk or "error" in chunk or "input" not in chunk:
            continue  # a task's result, not its start
        outer = [part.split(_SEP, 1)[0] for part in namespace]
        path.append(_SEP.join([*outer, str(chunk["name"])]))
    return path


# ---------------------------------------------------------------------- the walk


def _builder(compiled: Any) -> Any:
    builder = getattr(compiled, "builder", None)
    return builder if hasattr(builder, "branches") and hasattr(builder, "nodes") else None


def _walk(compiled: Any, ns: str, depth: int | None, raw: _Raw) -> None:
    """Add the nodes and edges of ``compiled`` (names prefixed by ``ns``) to ``raw``.

    Inner ``__start__``/``__end__`` of a subgraph, and an expanded subgraph node, appear as
    pseudo nodes (``sub:__start__`` on the way in, ``sub:__end__`` on the way out) that
    :func:`_contract` removes.
    """
    builder = _builder(compiled)
    expand = depth is None or depth > 0
    subgraphs = dict(compiled.get_subgraphs()) if expand else {}
    expanded: set[str] = set()
    for name, spec in builder.nodes.items():
        sub = subgraphs.get(name)
        if sub is not None and _builder(sub) is not None:
            expanded.add(name)
            _walk(sub, f"{ns}{name}{_SEP}", None if depth is None else depth - 1, raw)
        else:
            raw.kinds[ns + name] = _classify(name, spec.runnable)

    def src(node: str) -> str:
        if node == START:
            return f"{ns}{START}" if ns else START
        return f"{ns}{node}{_SEP}{END}" if node in expanded else ns + node

    def dst(node: str) -> str:
        if node == END:
            return f"{ns}{END}" if ns else END
        return f"{ns}{node}{_SEP}{START}" if node in expanded else ns + node

    for source, target in builder.edges:
        raw.add_edge(src(source), dst(target), "plain")
    for sources, target in builder.waiting_edges:
        raw.joins.append((tuple(src(s) for s in sources), dst(target)))
    for source, branches in builder.branches.items():
        for branch_name, branch in branches.items():
            if branch.ends is None:
                node = src(source)
                raw.unknown.add(node)
                raw.notes.append(
                    (
                        "targets-unknown",
                        node,
                        f"conditional edge {branch_name!r} of node {node!r} has no path_map, "
                        "Literal return hint or destinations: LangGraph cannot see its targets "
                        f"(get_graph() shows a false {node!r} -> {END!r}); they will be learned "
                        "at run time, and until then steps-to-execution assumes it may lead "
                        "anywhere",
                    )
                )
                continue
            sends = _returns_send(branch.path)
            for target in branch.ends.values():
                kind: EdgeKind = "send" if sends and target != END else "conditional"
                raw.add_edge(src(source), dst(target), kind)
    for name, spec in builder.nodes.items():
        ends = spec.ends or ()
        for target in ends.keys() if isinstance(ends, Mapping) else ends:
            raw.add_edge(src(name), dst(target), "goto")


def _walk_functional(compiled: Any, raw: _Raw) -> None:
    """A graph without a StateGraph builder (the functional API): its drawing, marked unknown."""
    drawn = compiled.get_graph()
    for node_id in drawn.nodes:
        if node_id not in (START, END):
            raw.kinds[node_id] = "agent"
            raw.unknown.add(node_id)
            raw.notes.append(
                (
                    "no-static-graph",
                    node_id,
                    f"{node_id!r} has no static graph (functional API?): its steps will be "
                    "learned from observed runs",
                )
            )
    for edge in drawn.edges:
        raw.add_edge(edge.source, edge.target, "conditional" if edge.conditional else "plain")


def _classify(name: str, runnable: Any) -> NodeKind:
    try:
        from langgraph.prebuilt import ToolNode
    except ImportError:  # pragma: no cover - langgraph-prebuilt ships with langgraph
        return "tool" if name == "tools" else "agent"
    return "tool" if name == "tools" or isinstance(runnable, ToolNode) else "agent"


def _returns_send(path: Any) -> bool:
    """Whether a branch's path function returns ``Send`` objects (hint or code)."""
    from langgraph.types import Send

    func = getattr(path, "func", None) or getattr(path, "afunc", None) or path
    try:
        hint = get_type_hints(func).get("return")
    except Exception:  # unresolvable hints: fall back to the code
        hint = None
    if hint is not None and _mentions(hint, Send):
        return True
    code = getattr(func, "__code__", None)
    globals_ = getattr(func, "__globals__", {})
    return code is not None and any(globals_.get(name) is Send for name in code.co_names)


def _mentions(hint: Any, target: type) -> bool:
    if hint is target:
        return True
    return any(_mentions(arg, target) for arg in get_args(hint))


# ---------------------------------------------------------------------- contraction, assembly


def _is_pseudo(node: str) -> bool:
    return node.endswith((f"{_SEP}{START}", f"{_SEP}{END}"))


def _combine(outer: EdgeKind, inner: EdgeKind) -> EdgeKind:
    return outer if outer != "plain" else inner


def _contract(raw: _Raw) -> None:
    """Remove the pseudo nodes, joining each predecessor to each successor."""
    while True:
        pseudo = next(
            (n for edge in raw.edges for n in edge if _is_pseudo(n)),
            next((t for _, t in raw.joins if _is_pseudo(t)), None),
        )
        if pseudo is None:
            break
        ins = [(a, k) for (a, b), k in raw.edges.items() if b == pseudo and a != pseudo]
        outs = [(b, k) for (a, b), k in raw.edges.items() if a == pseudo and b != pseudo]
        raw.edges = {e: k for e, k in raw.edges.items() if pseudo not in e}
        for a, k1 in ins:
            for b, k2 in outs:
                raw.add_edge(a, b, _combine(k1, k2))
        if pseudo in raw.unknown:
            raw.unknown.discard(pseudo)
            raw.unknown.update(a for a, _ in ins)
        joins: list[tuple[tuple[str, ...], str]] = []
        for members, target in raw.joins:
            targets = [b for b, _ in outs] if target == pseudo else [target]
            if pseudo in members:
                if len(ins) == 1:
                    members = tuple(ins[0][0] if m == pseudo else m for m in members)
                else:
                    members = tuple(m for m in members if m != pseudo)
                    raw.notes.append(
                        (
                            "join-subgraph-member",
                            target,
                            f"join into {target!r} waits for a subgraph with several exits; "
                            "it is dropped from the join (a conservative simplification)",
                        )
                    )
            joins.extend((members, t) for t in targets)
        raw.joins = joins


def _assemble(
    raw: _Raw,
    kinds: Mapping[str, NodeKind],
    prefixes: Mapping[str, Iterable[str]],
    smoothing: float,
) -> AgentExecutionGraph:
    for name, kind in kinds.items():
        if name not in raw.kinds:
            raise UsageError("kinds", f"no node {name!r} in the graph")
        if kind not in ("agent", "tool"):
            raise UnknownNameError("kinds", kind, ("agent", "tool"))
    for name in prefixes:
        if name not in raw.kinds:
            raise UsageError("prefixes", f"no node {name!r} in the graph")
    graph = AgentExecutionGraph(smoothing=smoothing)
    for name, kind in raw.kinds.items():
        graph.add_node(name, kinds.get(name, kind), prefixes=prefixes.get(name, ()))
    for (source, target), edge_kind in raw.edges.items():
        graph.add_edge(source, target, edge_kind)
    for members, target in raw.joins:
        unique = tuple(dict.fromkeys(members))
        if len(unique) >= 2:
            graph.add_join(unique, target)
        else:
            for member in unique:
                graph.add_edge(member, target, "plain")
    for node in sorted(raw.unknown):
        graph.mark_targets_unknown(node)
    return graph
