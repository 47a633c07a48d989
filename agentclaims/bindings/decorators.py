"""``@claimed_session``: run a workflow (an async function or a compiled LangGraph graph) inside
its own ``ClaimedSession``, one per run, released when the run ends however it ends.

It sits above the session (it reads a LangGraph graph's structure with
:func:`~agentclaims.bindings.langgraph.aeg_from_langgraph`); LangGraph itself loads only when a
compiled graph is given."""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar, overload

from agentclaims.bindings.langgraph import aeg_from_langgraph
from agentclaims.errors import UsageError
from agentclaims.graph import ToolTimeModel
from agentclaims.session import ClaimedSession

__all__ = ["ClaimedGraph", "claimed_session"]

T = TypeVar("T")


def _is_compiled_graph(obj: object) -> bool:
    """A compiled LangGraph graph: a ``StateGraph``'s or a functional ``@entrypoint``'s."""
    return all(hasattr(obj, name) for name in ("ainvoke", "astream", "get_graph"))


class ClaimedGraph:
    """A compiled LangGraph graph whose every run happens inside a claimed session.

    ``ainvoke``/``astream`` behave like the graph's; ``invoke`` runs ``ainvoke`` on a fresh
    event loop (call it from synchronous code only). ``aeg`` is the Agent Execution Graph
    extracted from the graph and ``tool_times`` the waits learned so far: both are shared by
    every run, so transition probabilities and tool times are learned across runs.
    """

    def __init__(self, compiled: Any, options: dict[str, Any]) -> None:
        self.compiled = compiled
        self.options = options
        self.aeg = aeg_from_langgraph(compiled)
        self.tool_times = options.pop("tool_times", None) or ToolTimeModel(prior_mean_s=0.1)
        self.last_session: ClaimedSession | None = None

    def session(self, **overrides: Any) -> ClaimedSession:
        options = {**self.options, **overrides}
        options.setdefault("graph", self.aeg)
        options.setdefault("tool_times", self.tool_times)
        backend = options.pop("backend")
        session = ClaimedSession(backend, **options)
        self.last_session = session
        return session

    async def ainvoke(self, input: Any, config: Any = None, **kwargs: Any) -> Any:
        async with self.session():
            return await self.compiled.ainvoke(input, config, **kwargs)

    async def astream(self, input: Any, config: Any = None, **kwargs: Any) -> AsyncIterator[Any]:
        async with self.session():
            async for chunk in self.compiled.astream(input, config, **kwargs):
                yield chunk

    def invoke(self, input: Any, config: Any = None, **kwargs: Any) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.ainvoke(input, config, **kwargs))
        raise UsageError(
            "invoke", "called inside a running event loop: use `await graph.ainvoke(...)`"
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self.compiled, name)


@overload
def claimed_session(target: None = None, /, **options: Any) -> Callable[[Any], Any]: ...
@overload
def claimed_session(
    target: Callable[..., Awaitable[T]], /, **options: Any
) -> Callable[..., Awaitable[T]]: ...
@overload
def claimed_session(target: Any, /, **options: Any) -> Any: ...


def claimed_session(target: Any = None, /, **options: Any) -> Any:
    """Run each call of ``target`` in its own ``ClaimedSession(**options)``.

    ``options`` are ``ClaimedSession``'s (``backend`` is required). ``target`` is an async
    function (the workflow: it reaches its session with ``current_session()``) or a compiled
    LangGraph graph (returns a ``ClaimedGraph``). Used bare or with arguments::

        @claimed_session(backend=backend)
        async def research(topic): ...

        graph = claimed_session(builder.compile(), backend=backend)
    """
    if "backend" not in options:
        raise UsageError("backend", "claimed_session needs backend=... (a Backend or BackendPool)")
    ClaimedSession(**options)  # validate every option now, not at the first run

    def decorate(fn: Any) -> Any:
        if _is_compiled_graph(fn):
            return ClaimedGraph(fn, dict(options))
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

        @functools.wraps(fn)
        async def run(*args: Any, **kwargs: Any) -> Any:
            opts = dict(options)
            backend = opts.pop("backend")
            async with ClaimedSession(backend, **opts):
                return await fn(*args, **kwargs)

        return run

    return decorate if target is None else decorate(target)
