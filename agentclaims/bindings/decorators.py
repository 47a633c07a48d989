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
import contextlib
import copy
import functools
import inspect
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterator,
    Mapping,
    Sequence,
)
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    Generic,
    Literal,
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
from agentclaims.session import ClaimedSession, SessionStats
from agentclaims.session.options import SessionOptions, check_option_names, check_options
from agentclaims.session.portal import iterate_sync, run_sync

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langchain_core.runnables.graph import Graph as DrawableGraph
    from langgraph.pregel import Pregel
    from langgraph.types import Command, StateSnapshot
    from langgraph.typing import StateT as InputT  # Pregel's InputT has a default mypy rejects

    from agentclaims.backends.base import Backend
    from agentclaims.backends.pool import BackendPool

__all__ = ["ClaimedGraph", "ClaimedRun", "SessionDecorator", "claimed_session"]

P = ParamSpec("P")
T = TypeVar("T")
G = TypeVar("G", bound="Pregel[Any, Any, Any, Any]")
"""A compiled LangGraph graph: a ``StateGraph``'s ``compile()`` or a functional ``@entrypoint``."""
G_co = TypeVar("G_co", bound="Pregel[Any, Any, Any, Any]", covariant=True)


def _is_compiled_graph(obj: object) -> bool:
    """A compiled LangGraph graph: a ``StateGraph``'s or a functional ``@entrypoint``'s."""
    return all(hasattr(obj, name) for name in ("ainvoke", "astream", "get_graph"))


def checked_backend(
    backend: Backend | BackendPool | None, options: SessionOptions, who: str = "claimed_session"
) -> Backend | BackendPool:
    """The backend, once every option is checked: at decoration time, not at the first run."""
    if backend is None:
        raise UsageError("backend", f"{who} needs a backend (a Backend or BackendPool), got None")
    check_options(backend, options)  # the session's own checks
    return backend


class _HistoryOptions(TypedDict, total=False):
    """The keyword options of ``Pregel.get_state_history`` / ``aget_state_history``."""

    filter: dict[str, Any] | None
    before: RunnableConfig | None
    limit: int | None


class ClaimedGraph(Generic[G_co]):
    """A compiled LangGraph graph (``graph``) whose every run happens inside a claimed session.

    ``ainvoke``/``astream`` behave and are typed like the graph's (``Pregel``'s); ``invoke``,
    ``stream`` and ``batch`` run them on the process's background event loop
    (``agentclaims.session.portal``; from synchronous code only). The graph's
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
        self.backend = checked_backend(backend, options)
        self.aeg = aeg_from_langgraph(graph)
        tool_times = options.pop("tool_times", None)
        self.tool_times = ToolTimeModel(prior_mean_s=0.1) if tool_times is None else tool_times
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
        session.workflow.run_ends_when_done = True  # one run of the graph
        self.last_session = session
        return session

    def run(self, **overrides: Unpack[SessionOptions]) -> ClaimedRun[G_co]:
        """A handle on one run: call one of its run methods (``ainvoke``, ``astream``,
        ``astream_events``, ``invoke``, ``stream``) once; ``session``, ``stats`` and
        ``log_path`` are that run's, also while other runs of this graph go on."""
        return ClaimedRun(self, self.session(**overrides))

    def _open(self, config: RunnableConfig | None) -> ClaimedSession:
        """The session of the run about to start with ``config``: its ``thread_id`` is the
        config's (or the bound config's) ``configurable.thread_id``."""
        overrides: SessionOptions = {}
        thread = _thread_id(config) or _thread_id(getattr(self._graph, "config", None))
        if thread is not None and self.options.get("thread_id") is None:
            overrides["thread_id"] = thread
        return self.session(**overrides)

    # ------------------------------------------------------------------ claimed runs
    async def ainvoke(
        self: ClaimedGraph[Pregel[Any, Any, InputT, Any]],
        input: InputT | Command[Any] | None,
        config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> dict[str, Any] | Any:
        """``graph.ainvoke(input, config, **kwargs)`` inside a new session."""
        async with self._open(config):
            return await self.graph.ainvoke(input, _recorded(config), **kwargs)

    def astream(
        self: ClaimedGraph[Pregel[Any, Any, InputT, Any]],
        input: InputT | Command[Any] | None,
        config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[dict[str, Any] | Any]:
        """``graph.astream(input, config, **kwargs)`` inside a new session, every stream mode
        (``stream_mode=`` one or several, ``subgraphs=``). Leaving it early (``break``,
        ``aclose()``) or cancelling it ends the session at once (reason ``closed`` or
        ``cancelled``) and releases its claims."""
        session = self._open(config)
        return _claimed_iter(
            session, lambda: self.graph.astream(input, _recorded(config), **kwargs)
        )

    def astream_events(
        self: ClaimedGraph[Pregel[Any, Any, InputT, Any]],
        input: InputT | Command[Any] | None,
        config: RunnableConfig | None = None,
        *,
        version: Literal["v1", "v2"] = "v2",
        **kwargs: Any,
    ) -> AsyncIterator[Any]:
        """``graph.astream_events(input, config, version=..., **kwargs)`` inside a new
        session (token streaming: ``on_chat_model_stream`` events), ended like ``astream``."""
        session = self._open(config)
        return _claimed_iter(
            session,
            lambda: self.graph.astream_events(input, _recorded(config), version=version, **kwargs),
        )

    def invoke(
        self: ClaimedGraph[Pregel[Any, Any, InputT, Any]],
        input: InputT | Command[Any] | None,
        config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> dict[str, Any] | Any:
        """``ainvoke`` from synchronous code (on the process's background loop,
        ``agentclaims.session.portal``); ``UsageError`` inside a running event loop."""
        return run_sync(self.ainvoke(input, config, **kwargs), what="invoke")

    def stream(
        self: ClaimedGraph[Pregel[Any, Any, InputT, Any]],
        input: InputT | Command[Any] | None,
        config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> Iterator[dict[str, Any] | Any]:
        """``astream`` from synchronous code; leaving the ``for`` early ends the session."""
        return iterate_sync(self.astream(input, config, **kwargs), what="stream")

    async def abatch(
        self: ClaimedGraph[Pregel[Any, Any, InputT, Any]],
        inputs: Sequence[InputT | Command[Any] | None],
        config: RunnableConfig | Sequence[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[Any]:
        """``ainvoke`` of each input, concurrently, each in a session of its own (its own
        log and stats); at most ``config["max_concurrency"]`` at a time when given."""
        configs = _configs(config, len(inputs))
        limit = next((c.get("max_concurrency") for c in configs if c.get("max_concurrency")), None)
        gate = asyncio.Semaphore(limit) if limit else None

        async def one(item: Any, cfg: RunnableConfig) -> Any:
            if gate is None:
                return await self.ainvoke(item, cfg, **kwargs)
            async with gate:
                return await self.ainvoke(item, cfg, **kwargs)

        return await asyncio.gather(
            *(one(item, cfg) for item, cfg in zip(inputs, configs, strict=True)),
            return_exceptions=return_exceptions,
        )

    def batch(
        self: ClaimedGraph[Pregel[Any, Any, InputT, Any]],
        inputs: Sequence[InputT | Command[Any] | None],
        config: RunnableConfig | Sequence[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[Any]:
        """``abatch`` from synchronous code: each input in a session of its own."""
        return run_sync(
            self.abatch(inputs, config, return_exceptions=return_exceptions, **kwargs),
            what="batch",
        )

    async def abatch_as_completed(
        self: ClaimedGraph[Pregel[Any, Any, InputT, Any]],
        inputs: Sequence[InputT | Command[Any] | None],
        config: RunnableConfig | Sequence[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> AsyncIterator[tuple[int, Any]]:
        """``(index, output)`` of each input as it completes, each in a session of its own."""
        configs = _configs(config, len(inputs))

        async def one(i: int) -> tuple[int, Any]:
            try:
                return i, await self.ainvoke(inputs[i], configs[i], **kwargs)
            except Exception as exc:
                if not return_exceptions:
                    raise
                return i, exc

        tasks = [asyncio.ensure_future(one(i)) for i in range(len(inputs))]
        try:
            for next_done in asyncio.as_completed(tasks):
                yield await next_done
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def batch_as_completed(
        self: ClaimedGraph[Pregel[Any, Any, InputT, Any]],
        inputs: Sequence[InputT | Command[Any] | None],
        config: RunnableConfig | Sequence[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> Iterator[tuple[int, Any]]:
        """``abatch_as_completed`` from synchronous code."""
        return iterate_sync(
            self.abatch_as_completed(inputs, config, return_exceptions=return_exceptions, **kwargs),
            what="batch_as_completed",
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

    if not TYPE_CHECKING:  # at run time only: a type checker still flags unknown attributes

        def __getattr__(self, name: str) -> Any:
            raise AttributeError(
                f"ClaimedGraph has no attribute {name!r}: reach it on `.graph` (a run started "
                "there is not claimed), or see docs/session.md for the claimed methods"
            )

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


class ClaimedRun(ClaimedGraph[G_co]):
    """One run of a claimed graph (``ClaimedGraph.run()``): its run methods use ``session``,
    once. ``stats`` and ``log_path`` are this run's, whatever else runs meanwhile."""

    def __init__(self, claimed: ClaimedGraph[G_co], session: ClaimedSession) -> None:
        self.__dict__.update(claimed.__dict__)
        self.session_of_run = session
        self._used = False

    @property
    def stats(self) -> SessionStats:
        """This run's counters (``ClaimedSession.stats``)."""
        return self.session_of_run.stats

    @property
    def log_path(self) -> Path | None:
        """This run's outcome log file (with ``log_dir``), else ``None``."""
        return self.session_of_run.log_path

    def _open(self, config: RunnableConfig | None) -> ClaimedSession:
        if self._used:
            raise UsageError("run", "a ClaimedRun runs once: start another with claimed.run()")
        self._used = True
        return self.session_of_run

    async def abatch(self, *args: Any, **kwargs: Any) -> list[Any]:
        raise UsageError("run", "a ClaimedRun is one run: batch on the ClaimedGraph itself")

    def abatch_as_completed(self, *args: Any, **kwargs: Any) -> AsyncIterator[tuple[int, Any]]:
        raise UsageError("run", "a ClaimedRun is one run: batch on the ClaimedGraph itself")


def _recorded(config: RunnableConfig | None) -> RunnableConfig:
    """``config`` with a recorder of the tool calls LangGraph runs (``bindings.tools``)."""
    from agentclaims.bindings.tools import with_tool_recorder

    return with_tool_recorder(config)


def _thread_id(config: Mapping[str, Any] | None) -> str | None:
    thread = ((config or {}).get("configurable") or {}).get("thread_id")
    return None if thread is None or thread == "" else str(thread)


def _configs(
    config: RunnableConfig | Sequence[RunnableConfig] | None, n: int
) -> list[RunnableConfig]:
    """One config per input: a list as given (one each), else the same one for all."""
    if isinstance(config, Sequence):
        if len(config) != n:
            raise UsageError("config", f"{len(config)} configs for {n} inputs")
        return list(config)
    return [config or {} for _ in range(n)]


async def _claimed_iter(
    session: ClaimedSession, open_stream: Callable[[], AsyncIterator[T]]
) -> AsyncIterator[T]:
    """The items of ``open_stream()``, produced by one task of their own that runs inside
    ``session``: the graph's nodes see the session whatever task the consumer iterates from,
    and leaving early, closing or cancelling ends the session at once, in that task (never a
    context variable reset in another context)."""
    loop = asyncio.get_running_loop()
    asks: asyncio.Queue[asyncio.Future[tuple[bool, Any]]] = asyncio.Queue()

    async def produce() -> None:
        async with session:
            stream = open_stream()
            try:
                while True:
                    answer = await asks.get()
                    try:
                        item = await stream.__anext__()
                    except StopAsyncIteration:
                        answer.set_result((False, None))
                        return
                    answer.set_result((True, item))
            finally:
                aclose = getattr(stream, "aclose", None)
                if aclose is not None:
                    await aclose()

    producer: asyncio.Future[Any] = asyncio.ensure_future(produce())
    finished = False
    reason = "closed"
    try:
        while True:
            answer: asyncio.Future[tuple[bool, Any]] = loop.create_future()
            asks.put_nowait(answer)
            waits: set[asyncio.Future[Any]] = {answer, producer}
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if not answer.done():
                finished = True
                producer.result()  # it ended without an answer: its error
                return
            more, item = answer.result()
            if not more:
                finished = True
                await producer  # the session has ended (and raised, if it does) before we stop
                return
            yield item
    except asyncio.CancelledError:
        reason = "cancelled"  # the consumer was cancelled while the graph ran
        raise
    finally:
        if not finished and not producer.done():
            session.ending(reason)
            producer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await producer


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
    checked = checked_backend(backend, options)

    def decorate(fn: Any) -> Any:
        if isinstance(fn, ClaimedGraph):
            raise UsageError(
                "target",
                "this graph is claimed already: claim the compiled graph once (its `.graph`), "
                "or start a run with other options with `claimed.run(**options)`",
            )
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
