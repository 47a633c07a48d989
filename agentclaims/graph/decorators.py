"""Agent Execution Graphs declared with decorators, for agents written as plain functions.

::

    registry = GraphRegistry()

    @registry.agent("planner", next=["search", "writer"], prefixes=["sys"], entry=True)
    async def planner(task: str) -> str: ...

    @registry.tool("search", next=["planner"])
    async def search(query: str) -> str: ...

    @registry.agent("writer", prefixes=["sys"])      # no ``next``: goes to __end__
    def writer(notes: str) -> str: ...

    graph = registry.graph()

One successor in ``next`` is a plain edge; several are a conditional choice (the step picks
one). ``after_all=[...]`` makes a step an AND-join of those steps. The first registered step is
the entry unless some step says ``entry=True``.

The decorated function keeps its behaviour (sync or async, same signature, ``functools.wraps``).
Inside ``with registry.run():`` every call of a decorated function is also recorded as a step
of that run; at the end of the block the run's transitions are learned, so
:meth:`GraphRegistry.graph` returns probabilities from real runs.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from agentclaims.errors import UsageError
from agentclaims.graph.aeg import END, START, AgentExecutionGraph, EdgeKind, NodeKind

__all__ = ["GraphRegistry"]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class _Step:
    name: str
    kind: NodeKind
    next: tuple[str, ...]
    prefixes: tuple[str, ...]
    after_all: tuple[str, ...]
    entry: bool


class GraphRegistry:
    """Collects decorated steps and builds their :class:`AgentExecutionGraph`."""

    __slots__ = ("_counts", "_current", "_smoothing", "_steps")

    def __init__(self, *, smoothing: float = 1.0) -> None:
        AgentExecutionGraph(smoothing=smoothing)  # validates smoothing
        self._smoothing = smoothing
        self._steps: dict[str, _Step] = {}
        self._counts: Counter[tuple[str, str]] = Counter()
        self._current: ContextVar[list[str] | None] = ContextVar(
            f"agentclaims_graph_run_{id(self)}", default=None
        )

    @property
    def names(self) -> list[str]:
        """Registered step names, in registration order."""
        return list(self._steps)

    def agent(
        self,
        name: str | None = None,
        *,
        next: Sequence[str] = (),
        prefixes: Sequence[str] = (),
        after_all: Sequence[str] = (),
        entry: bool = False,
    ) -> Callable[[F], F]:
        """Register an LLM-calling step (default name: the function's ``__name__``)."""
        return self._register("agent", name, next, prefixes, after_all, entry)

    def tool(
        self,
        name: str | None = None,
        *,
        next: Sequence[str] = (),
        after_all: Sequence[str] = (),
        entry: bool = False,
    ) -> Callable[[F], F]:
        """Register a tool step (default name: the function's ``__name__``)."""
        return self._register("tool", name, next, (), after_all, entry)

    @contextlib.contextmanager
    def run(self) -> Iterator[list[str]]:
        """Record the decorated calls made inside the block as one run (yields its path)."""
        path: list[str] = []
        token = self._current.set(path)
        try:
            yield path
        finally:
            self._current.reset(token)
            steps = [START, *path, END]
            self._counts.update(itertools.pairwise(steps))

    def graph(self) -> AgentExecutionGraph:
        """A fresh graph of the registered steps, with the transitions of recorded runs."""
        if not self._steps:
            raise UsageError("registry", "no step is registered")
        for step in self._steps.values():
            for target in (*step.next, *step.after_all):
                if target != END and target not in self._steps:
                    raise UsageError("next", f"step {step.name!r} names unknown step {target!r}")
        graph = AgentExecutionGraph(smoothing=self._smoothing)
        for step in self._steps.values():
            graph.add_node(step.name, step.kind, prefixes=step.prefixes)
        entries = [s.name for s in self._steps.values() if s.entry] or [next(iter(self._steps))]
        entry_kind: EdgeKind = "plain" if len(entries) == 1 else "conditional"
        for name in entries:
            graph.add_edge(START, name, entry_kind)
        for step in self._steps.values():
            targets = step.next or ((END,) if not _feeds_join(step.name, self._steps) else ())
            for target in targets:
                graph.add_edge(step.name, target, "plain" if len(targets) == 1 else "conditional")
            if step.after_all:
                graph.add_join(step.after_all, step.name)
        for (source, target), count in self._counts.items():
            graph.observe_transition(source, target, count=count)
        return graph

    def _register(
        self,
        kind: NodeKind,
        name: str | None,
        next_: Sequence[str],
        prefixes: Sequence[str],
        after_all: Sequence[str],
        entry: bool,
    ) -> Callable[[F], F]:
        if callable(name):
            raise UsageError("name", "call the decorator: use @registry.agent() or .agent('x')")
        for field, values in (("next", next_), ("prefixes", prefixes), ("after_all", after_all)):
            if isinstance(values, str) or not all(isinstance(v, str) and v for v in values):
                raise UsageError(field, "must be a sequence of non-empty names")
        if after_all and len(set(after_all)) < 2:
            raise UsageError("after_all", "an AND-join needs at least two steps")

        def decorate(fn: F) -> F:
            if not callable(fn):
                raise UsageError("fn", f"can only decorate a callable, got {type(fn).__name__}")
            step_name = name if name is not None else getattr(fn, "__name__", None)
            if not isinstance(step_name, str) or not step_name or step_name in (START, END):
                raise UsageError("name", f"invalid step name {step_name!r}")
            if step_name in self._steps:
                raise UsageError("name", f"step {step_name!r} is already registered")
            self._steps[step_name] = _Step(
                step_name, kind, tuple(next_), tuple(prefixes), tuple(after_all), entry
            )
            return self._wrap(fn, step_name)

        return decorate

    def _wrap(self, fn: F, step_name: str) -> F:
        current = self._current

        def record() -> None:
            path = current.get()
            if path is not None:
                path.append(step_name)

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                record()
                return await fn(*args, **kwargs)

            wrapper: Callable[..., Any] = async_wrapper
        else:

            @functools.wraps(fn)
            def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
                record()
                return fn(*args, **kwargs)

            wrapper = sync_wrapper
        wrapper.__agentclaims_step__ = step_name  # type: ignore[attr-defined]
        return cast(F, wrapper)


def _feeds_join(name: str, steps: dict[str, _Step]) -> bool:
    return any(name in s.after_all for s in steps.values())
