"""Claims for LangChain 1.x agents (``langchain.agents.create_agent``) as agent middleware.

::

    claims = agentclaims.ClaimsMiddleware(backend, log_dir="agentclaims-logs")
    agent = create_agent(agentclaims.chat_model(backend), tools, middleware=[claims])
    await agent.ainvoke({"messages": [...]})

Each run of the agent (``ainvoke``, ``astream``, ``invoke``, ...) is one ``ClaimedSession``:

* ``before_agent`` opens it and puts its key in the agent's state (a private field,
  ``agentclaims_run``, kept out of the agent's input and output); ``after_agent`` ends it
  (``completed``) and lets its claims go;
* ``wrap_model_call`` makes it the current session around the model call, so the claims
  transport of ``agentclaims.chat_model(backend)`` carries its claims (node ``model``, the
  step from LangGraph's metadata);
* ``wrap_tool_call`` holds the agent's prefix claim across each tool call and reacts to a
  refusal before the tool runs, as ``session.tool_call`` does; the tool's real duration feeds
  the wait model that TTLs come from.

A run that raises out of a model or tool call (an error, a cancellation, an ``interrupt()``
of human-in-the-loop) ends its session at once: ``error``/``cancelled``, or ``closed`` for an
interrupt, its claims released, nothing left held while the run is gone. When the run goes on
after all (an outer retry middleware, a run resumed after an interrupt), its next call opens a
new session under the same key. Inside ``claimed_session(agent, ...)`` the middleware uses that
session and opens none of its own.

The wait model (``tool_times``) and the Agent Execution Graph (``create_agent``'s
``model <-> tools`` loop, ``aeg``) are shared by every run of one middleware, so waits and
transitions are learned across runs, as a ``ClaimedGraph`` learns them. LangChain is imported
only here.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, NotRequired, Unpack

from langchain.agents.middleware import AgentMiddleware, AgentState
from langchain.agents.middleware.types import PrivateStateAttr
from langgraph.errors import GraphInterrupt

from agentclaims.bindings.decorators import checked_backend
from agentclaims.bindings.openai import is_claims_client
from agentclaims.errors import UsageError
from agentclaims.graph import END, START, AgentExecutionGraph, ToolTimeModel
from agentclaims.session import ClaimedSession
from agentclaims.session.options import SessionOptions
from agentclaims.session.portal import run_sync
from agentclaims.session.session import current_session

if TYPE_CHECKING:
    from langchain.agents.middleware import ModelRequest, ModelResponse, ToolCallRequest
    from langchain_core.messages import ToolMessage
    from langgraph.runtime import Runtime
    from langgraph.types import Command

    from agentclaims.backends.base import Backend
    from agentclaims.backends.pool import BackendPool

__all__ = ["ClaimsMiddleware", "ClaimsState", "create_agent_aeg"]

RUN_KEY = "agentclaims_run"
"""The agent-state field naming a run's session (private: not in the agent's input or output)."""


class ClaimsState(AgentState[Any]):
    """``create_agent``'s state, with the key of the run's claimed session."""

    agentclaims_run: NotRequired[Annotated[str, PrivateStateAttr]]


def create_agent_aeg(model_node: str = "model", tools_node: str = "tools") -> AgentExecutionGraph:
    """The Agent Execution Graph of ``create_agent``'s loop: ``START -> model``, the model's
    tool calls sent to ``tools`` (or the end), ``tools -> model``."""
    graph = AgentExecutionGraph()
    graph.add_node(model_node, "agent")
    graph.add_node(tools_node, "tool")
    graph.add_edge(START, model_node)
    graph.add_edge(model_node, tools_node, "send")
    graph.add_edge(model_node, END, "conditional")
    graph.add_edge(tools_node, model_node, "conditional")
    return graph


class ClaimsMiddleware(AgentMiddleware[ClaimsState, Any, Any]):
    """Give a ``create_agent`` agent claims without wrapping it (see the module).

    ``backend`` and ``options`` are ``claimed_session``'s (``SessionOptions``), checked now: a
    bad one raises ``UsageError`` here, not at the first run. The agent's model must send
    through ``backend``'s claims transport: ``agentclaims.chat_model(backend)``.
    ``last_session`` is the session of the run opened last.

    ``inline_hooks`` (default ``True``): ``create_agent`` wraps the two hooks in LangSmith's
    ``traceable``, which hands its own work to a worker thread twice per hook call even with
    tracing off (about 0.25 ms of CPU each); the middleware has LangSmith run that work inline
    while nothing is traced (``agentclaims.bindings.langsmith``; an override the application
    installed is kept). ``False`` leaves LangSmith as it is.
    """

    state_schema = ClaimsState

    def __init__(
        self,
        backend: Backend | BackendPool,
        *,
        inline_hooks: bool = True,
        **options: Unpack[SessionOptions],
    ) -> None:
        super().__init__()
        if not isinstance(inline_hooks, bool):
            raise UsageError("inline_hooks", f"must be true or false, got {inline_hooks!r}")
        self.backend = checked_backend(backend, options, "ClaimsMiddleware")
        if inline_hooks:
            from agentclaims.bindings.langsmith import inline_untraced

            inline_untraced()
        graph, tool_times = options.pop("graph", None), options.pop("tool_times", None)
        # an empty graph given is kept (learned online, shared), not swapped for the default
        self.aeg: AgentExecutionGraph = create_agent_aeg() if graph is None else graph
        self.tool_times: ToolTimeModel = (
            ToolTimeModel(prior_mean_s=0.1) if tool_times is None else tool_times
        )
        self.options = options
        self.last_session: ClaimedSession | None = None
        self._runs: dict[str, ClaimedSession] = {}

    @property
    def open_sessions(self) -> int:
        """Sessions of runs that have not ended yet."""
        return len(self._runs)

    async def aclose(self) -> None:
        """End the session of every run still open (reason ``closed``): for an application
        that stops with agent runs left paused or abandoned."""
        while self._runs:
            _, session = self._runs.popitem()
            session.ending("closed")
            await session.__aexit__(asyncio.CancelledError, asyncio.CancelledError(), None)

    # ------------------------------------------------------------------ the run's session
    async def _open(self, key: str) -> ClaimedSession:
        from langgraph.config import get_config

        options: SessionOptions = {"graph": self.aeg, "tool_times": self.tool_times, **self.options}
        configurable = get_config().get("configurable") or {}
        thread = configurable.get("thread_id")
        if thread not in (None, "") and options.get("thread_id") is None:
            options["thread_id"] = str(thread)
        session = ClaimedSession(self.backend, **options)
        session.workflow.run_ends_when_done = True  # the agent's run is the session
        await session.__aenter__()
        self._runs[key] = session
        self.last_session = session
        return session

    async def _session_of(self, state: Any) -> tuple[ClaimedSession, str | None]:
        """The run's session and its key (``None``: an outer ``claimed_session``'s)."""
        outer = current_session()
        if outer is not None:
            return outer, None
        key = state.get(RUN_KEY) if isinstance(state, dict) else None
        if not isinstance(key, str):
            raise UsageError(
                "middleware",
                "this agent's state has no claimed session: add ClaimsMiddleware to "
                "create_agent(middleware=[...]) of the agent that runs it",
            )
        session = self._runs.get(key)
        return (session if session is not None else await self._open(key)), key

    async def _end(self, key: str | None, exc: BaseException | None) -> None:
        """End the run's own session: after the agent (``exc`` None), or when ``exc`` leaves a
        model or tool call (an interrupt ends it ``closed``)."""
        session = self._runs.pop(key, None) if key is not None else None
        if session is None:
            return
        if isinstance(exc, GraphInterrupt):
            session.ending("closed")
        await session.__aexit__(None if exc is None else type(exc), exc, None)

    # ------------------------------------------------------------------ hooks (async)
    async def abefore_agent(self, state: ClaimsState, runtime: Runtime[Any]) -> dict[str, Any]:
        if current_session() is not None:
            return {}
        key = uuid.uuid4().hex
        await self._open(key)
        return {RUN_KEY: key}

    async def aafter_agent(self, state: ClaimsState, runtime: Runtime[Any]) -> dict[str, Any]:
        key = state.get(RUN_KEY)
        if current_session() is None and isinstance(key, str):
            await self._end(key, None)
        return {}

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        session, key = await self._session_of(request.state)
        try:
            _check_model(request.model)
            with session.activated():
                return await handler(request)
        except BaseException as exc:
            await self._end(key, exc)
            raise

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        session, key = await self._session_of(request.state)
        try:
            with session.activated():
                async with session.tool_call(str(request.tool_call["name"])):
                    return await handler(request)
        except BaseException as exc:
            await self._end(key, exc)
            raise

    # ------------------------------------------------------------------ hooks (sync)
    # ``agent.invoke`` / ``agent.stream``: the sessions live on the process's background loop
    # (``agentclaims.session.portal``), where the claims transport's sync client sends.
    def before_agent(self, state: ClaimsState, runtime: Runtime[Any]) -> dict[str, Any]:
        return run_sync(self.abefore_agent(state, runtime), what="before_agent")

    def after_agent(self, state: ClaimsState, runtime: Runtime[Any]) -> dict[str, Any]:
        return run_sync(self.aafter_agent(state, runtime), what="after_agent")

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any]:
        session, key = run_sync(self._session_of(request.state), what="wrap_model_call")
        try:
            _check_model(request.model)
            with session.activated():
                return handler(request)
        except BaseException as exc:
            run_sync(self._end(key, exc), loop=session.loop, what="wrap_model_call")
            raise

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        session, key = run_sync(self._session_of(request.state), what="wrap_tool_call")
        run = run_sync(
            session.start_tool(str(request.tool_call["name"])),
            loop=session.loop,
            what="wrap_tool_call",
        )
        try:
            with session.activated():
                result = handler(request)
        except BaseException as exc:
            run.error = type(exc).__name__
            run_sync(self._finish_then_end(session, run, key, exc), loop=session.loop)
            raise
        run_sync(_finish(session, run), loop=session.loop, what="wrap_tool_call")
        return result

    async def _finish_then_end(
        self, session: ClaimedSession, run: Any, key: str | None, exc: BaseException
    ) -> None:
        session.finish_tool(run)
        await self._end(key, exc)


async def _finish(session: ClaimedSession, run: Any) -> None:
    session.finish_tool(run)


def _check_model(model: Any) -> None:
    """The agent's model sends through a claims transport (``agentclaims.chat_model``)."""
    clients = (getattr(model, "http_async_client", None), getattr(model, "http_client", None))
    if not any(is_claims_client(client) for client in clients):
        raise UsageError(
            "model",
            f"ClaimsMiddleware needs the agent's model to send through agentclaims, got "
            f"{type(model).__name__}: create it with agentclaims.chat_model(backend, model=...)",
        )
