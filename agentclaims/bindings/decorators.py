"""``@claimed_session``: run a workflow (an async function or a compiled LangGraph graph) inside
its own ``ClaimedSession``, one per run, released when the run ends however it ends.

It sits above the session (it reads a LangGraph graph's structure with
:func:`~agentclaims.bindings.langgraph.aeg_from_langgraph`); LangGraph itself loads only when a
compiled graph is given.


Both entry points keep their target's types: a decorated ``async def f(x: int) -> str`` is
still a function of an ``int`` whose coroutine gives a ``str``, and a claimed graph is a
``ClaimedGraph[G]`` whose ``ainvoke``/``astream``/``invoke`` take the graph's input type.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from typing import (
    TYPE_CHECKING,
    Any,
    Generic,
    ParamSpec,
    Protocol,
    TypedDict,
    TypeVar,
    Unpack,
    overload,
)

from agentclaims.bindings.langgraph import aeg_from_langgraph
from agentclaims.errors import UsageError
from agentclaims.graph import ToolTimeModel
from agentclaims.session import ClaimedSession
from agentclaims.session.options import SessionOptions, check_option_names

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langchain_core.runnables.graph import Graph as DrawableGraph
    from langgraph.pregel import Pregel
    from langgraph.types import Command, StateSnapshot
    from langgraph.typing import StateT as InputT  # Pregel's InputT has a default mypy rejects

    from agentclaims.backends.base import Backend
    from agentclaims.backends.pool import BackendPool

__all__ = ["ClaimedGraph", "SessionDecorator", "claimed_session"]

P = ParamSpec("P")
T = TypeVar("T")
G = TypeVar("G", bound="Pregel[Any, Any, Any, Any]")
"""A compiled LangGraph graph: a ``StateGraph``'s ``compile()`` or a functional ``@entrypoint``."""
G_co = TypeVar("G_co", bound="Pregel[Any, Any, Any, Any]", covariant=True)


def _is_compiled_graph(obj: object) -> bool:
    """A compiled LangGraph graph: a ``StateGraph``'s or a functional ``@entrypoint``'s."""
    return all(hasattr(obj, name) for name in ("ainvoke", "astream", "get_graph"))


def _checked(
    backend: Backend | BackendPool | None, options: SessionOptions
) -> Backend | BackendPool:
    """The backend, once every option is checked: at decoration time, not at the first run."""
    if backend is None:
        raise UsageError("backend", "claimed_session needs backend=... (a Backend or BackendPool)")
    check_option_names(options)
    ClaimedSession(backend, **options)  # its checks are the runtime ones
    return backend


class _HistoryOptions(TypedDict, total=False):
    """The keyword options of ``Pregel.get_state_history`` / ``aget_state_history``."""

    filter: dict[str, Any] | None
    before: RunnableConfig | None
    limit: int | None


class ClaimedGraph(Generic[G_co]):
    """A compiled LangGraph graph (``graph``) whose every run happens inside a claimed session.

    ``ainvoke``/``astream`` behave and are typed like the graph's (``Pregel``'s); ``invoke``
    runs ``ainvoke`` on a fresh event loop (call it from synchronous code only). The graph's
    state and drawing methods (``get_graph``, ``get_state``, ``update_state``, ...) pass through
    unchanged; anything else is reached on ``graph`` itself. ``aeg`` is the Agent Execution
    Graph extracted from the graph and ``tool_times`` the waits learned so far: both are shared
    by every run, so transition probabilities and tool times are learned across runs.
    """

    def __init__(
        self,
        graph: G_co,
        /,
        *,
        backend: Backend | BackendPool,
        **options: Unpack[SessionOptions],
    ) -> None:
        self._graph = graph
        self.backend = _checked(backend, options)
        self.aeg = aeg_from_langgraph(graph)
        self.tool_times = options.pop("tool_times", None) or ToolTimeModel(prior_mean_s=0.1)
        self.options = options
        """The options every run's session gets (besides ``backend``, ``graph=aeg`` and
        ``tool_times``)."""
        self.last_session: ClaimedSession | None = None

    @property
    def graph(self) -> G_co:
        """The wrapped compiled graph."""
        return self._graph

    compiled = graph
    """The wrapped compiled graph (an alias of ``graph``)."""

    def session(
        self, *, backend: Backend | BackendPool | None = None, **overrides: Unpack[SessionOptions]
    ) -> ClaimedSession:
        """A new session for one run of the graph: this graph's options and ``overrides``."""
        check_option_names(overrides)
        options: SessionOptions = {
            "graph": self.aeg,
            "tool_times": self.tool_times,
            **self.options,
            **overrides,
        }
        session = ClaimedSession(self.backend if backend is None else backend, **options)
        self.last_session = session
        return session

    # ------------------------------------------------------------------ claimed runs
    async def ainvoke(
        self: ClaimedGraph[Pregel[Any, Any, InputT, Any]],
        input: InputT | Command[Any] | None,
        config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> dict[str, Any] | Any:
        """``graph.ainvoke(input, config, **kwargs)`` inside a new session."""
        async with self.session():
            return await self.graph.ainvoke(input, config, **kwargs)

    async def astream(
        self: ClaimedGraph[Pregel[Any, Any, InputT, Any]],
        input: InputT | Command[Any] | None,
        config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[dict[str, Any] | Any]:
        """``graph.astream(input, config, **kwargs)`` inside a new session."""
        async with self.session():
            async for chunk in self.graph.astream(input, config, **kwargs):
                yield chunk

    def invoke(
        self: ClaimedGraph[Pregel[Any, Any, InputT, Any]],
        input: InputT | Command[Any] | None,
        config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> dict[str, Any] | Any:
        """``ainvoke`` on a fresh event loop; ``UsageError`` inside a running one."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.ainvoke(input, config, **kwargs))
        raise UsageError(
            "invoke", "called inside a running event loop: use `await graph.ainvoke(...)`"
        )

    def with_config(
        self, config: RunnableConfig | None = None, **kwargs: Any
    ) -> ClaimedGraph[G_co]:
        """This claimed graph over ``graph.with_config(config, **kwargs)``: its runs are claimed
        too and share this one's AEG, wait model and options (not its ``last_session``)."""
        clone = copy.copy(self)
        clone._graph = self._graph.with_config(config, **kwargs)
        clone.last_session = None
        return clone

    # ------------------------------------------------------------------ pass-throughs
    def get_graph(
        self, config: RunnableConfig | None = None, *, xray: int | bool = False
    ) -> DrawableGraph:
        return self._graph.get_graph(config, xray=xray)

    async def aget_graph(
        self, config: RunnableConfig | None = None, *, xray: int | bool = False
    ) -> DrawableGraph:
        return await self._graph.aget_graph(config, xray=xray)

    def get_state(self, config: RunnableConfig, *, subgraphs: bool = False) -> StateSnapshot:
        return self._graph.get_state(config, subgraphs=subgraphs)

    async def aget_state(self, config: RunnableConfig, *, subgraphs: bool = False) -> StateSnapshot:
        return await self._graph.aget_state(config, subgraphs=subgraphs)

    def get_state_history(
        self, config: RunnableConfig, **options: Unpack[_HistoryOptions]
    ) -> Iterator[StateSnapshot]:
        return self._graph.get_state_history(config, **options)

    def aget_state_history(
        self, config: RunnableConfig, **options: Unpack[_HistoryOptions]
    ) -> AsyncIterator[StateSnapshot]:
        return self._graph.aget_state_history(config, **options)

    def update_state(
        self,
        config: RunnableConfig,
        values: dict[str, Any] | Any | None,
        as_node: str | None = None,
        task_id: str | None = None,
    ) -> RunnableConfig:
        return self._graph.update_state(config, values, as_node, task_id)

    async def aupdate_state(
        self,
        config: RunnableConfig,
        values: dict[str, Any] | Any,
        as_node: str | None = None,
        task_id: str | None = None,
    ) -> RunnableConfig:
        return await self._graph.aupdate_state(config, values, as_node, task_id)


class SessionDecorator(Protocol):
    """What ``claimed_session(backend=...)`` returns: apply it to an ``async def`` workflow or
    to a compiled LangGraph graph."""

    @overload
    def __call__(
        self, target: Callable[P, Awaitable[T]], /
    ) -> Callable[P, Coroutine[Any, Any, T]]: ...
    @overload
    def __call__(self, target: G, /) -> ClaimedGraph[G]: ...


@overload
def claimed_session(
    target: None = None, /, *, backend: Backend | BackendPool, **options: Unpack[SessionOptions]
) -> SessionDecorator: ...
@overload
def claimed_session(
    target: Callable[P, Awaitable[T]],
    /,
    *,
    backend: Backend | BackendPool,
    **options: Unpack[SessionOptions],
) -> Callable[P, Coroutine[Any, Any, T]]: ...
@overload
def claimed_session(
    target: G, /, *, backend: Backend | BackendPool, **options: Unpack[SessionOptions]
) -> ClaimedGraph[G]: ...


def claimed_session(
    target: object = None,
    /,
    *,
    backend: Backend | BackendPool | None = None,
    **options: Unpack[SessionOptions],
) -> Any:
    """Run each call of ``target`` in its own ``ClaimedSession(backend, **options)``.

    ``options`` are ``ClaimedSession``'s (``SessionOptions``); they are checked now, so a bad
    one raises ``UsageError`` (an unknown name ``UnknownNameError``) at decoration time.
    ``target`` is an async function (the workflow: it reaches its session with
    ``current_session()``; the result keeps its signature) or a compiled LangGraph graph
    (returns a ``ClaimedGraph``). Used bare or with arguments::

        @claimed_session(backend=backend)
        async def research(topic: str) -> str: ...

        graph = claimed_session(builder.compile(), backend=backend)
    """
    checked = _checked(backend, options)

    def decorate(fn: Any) -> Any:
        if _is_compiled_graph(fn):
            return ClaimedGraph(fn, backend=checked, **options)
        if not callable(fn):
            raise UsageError(
                "target", f"expected an async function or a compiled LangGraph graph, got {fn!r}"
            )
        if inspect.isasyncgenfunction(fn) or not inspect.iscoroutinefunction(fn):
            raise UsageError(
                "target",
                f"{getattr(fn, '__qualname__', fn)!r} is not an async function: a claimed workflow "
                "must be `async def` (or a compiled LangGraph graph)",
            )
        return _claimed_workflow(fn, checked, options)

    return decorate if target is None else decorate(target)


def _claimed_workflow(
    fn: Callable[P, Awaitable[T]], backend: Backend | BackendPool, options: SessionOptions
) -> Callable[P, Coroutine[Any, Any, T]]:
    @functools.wraps(fn)
    async def run(*args: P.args, **kwargs: P.kwargs) -> T:
        async with ClaimedSession(backend, **options):
            return await fn(*args, **kwargs)

    return run
