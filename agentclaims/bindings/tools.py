"""Tool calls LangGraph runs (``ToolNode``, ``create_react_agent``'s tools, tools returning a
``Command``), seen by the session through LangChain's callbacks.

A ``ClaimedGraph`` adds one ``ToolCallRecorder`` to every run's config. When a tool starts
inside a claimed session, the recorder calls ``ClaimedSession.start_tool`` (claim work in
flight settled, the agent's claim renewed to the predicted tool time) before the tool runs,
and ``finish_tool`` when it ends or fails: the tool is logged (``tool_call``, with its
duration), counted (``stats.tool_calls``) and its duration fed to the tool-time model. A tool
called inside ``async with session.tool_call(...)`` is not counted twice. LangChain is imported
only here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler, BaseCallbackManager

from agentclaims.session.portal import run_sync
from agentclaims.session.session import (
    ClaimedSession,
    ToolRun,
    current_session,
    in_explicit_tool_call,
)

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

__all__ = ["ToolCallRecorder", "with_tool_recorder"]

_IGNORED = property(lambda self: True, doc="This handler takes no such event.")


class ToolCallRecorder(BaseCallbackHandler):
    """Reports each LangChain tool run to the current session (see the module).

    A synchronous handler on purpose: LangChain runs it in a worker thread for async tool runs
    and inline for sync ones, and in both lets its errors through (``raise_error``), where it
    would swallow an async handler's errors in a synchronous tool run. Its work runs on the
    session's loop (``agentclaims.session.portal.run_sync``)."""

    raise_error = True
    """A refusal the session's reaction turns into an error (``fail``) stops the tool before
    it starts, as the reaction promises; LangChain would otherwise swallow it."""

    # Tool events only (LangChain files them under ``ignore_agent``). Every other event of a
    # run (each chain's start and end, each model call's) would be handed to a worker thread
    # for a method that does nothing: about seven thread hand-offs per LLM call in a claimed
    # graph, now none.
    ignore_chain = ignore_llm = ignore_chat_model = _IGNORED
    ignore_retriever = ignore_retry = ignore_custom_event = _IGNORED

    def __init__(self) -> None:
        self._runs: dict[UUID, tuple[ClaimedSession, ToolRun]] = {}

    def on_tool_start(
        self,
        serialized: dict[str, Any] | None,
        input_str: str,
        *,
        run_id: UUID,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        session = current_session()
        if session is None or not session.lifecycle.entered or in_explicit_tool_call():
            return  # outside a session, after its end (a task that outlived it) or counted
        name = str((serialized or {}).get("name") or kwargs.get("name") or "tool")
        step_node = (
            session.current_node(metadata)
            if isinstance(metadata, Mapping) and "langgraph_node" in metadata
            else None
        )
        start = session.start_tool(name, step_node=step_node)
        run = run_sync(start, loop=session.loop, what="tool")
        self._runs[run_id] = (session, run)

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._finish(run_id, None)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._finish(run_id, type(error).__name__)

    def _finish(self, run_id: UUID, error: str | None) -> None:
        entry = self._runs.pop(run_id, None)
        if entry is None:
            return
        session, run = entry
        run.error = error

        async def finish() -> None:
            session.finish_tool(run)

        run_sync(finish(), loop=session.loop, what="tool")


def with_tool_recorder(config: RunnableConfig | None) -> RunnableConfig:
    """``config`` with a fresh ``ToolCallRecorder`` among its callbacks (a copy: the caller's
    config is left as it was)."""
    out: dict[str, Any] = dict(config or {})
    callbacks = out.get("callbacks")
    recorder = ToolCallRecorder()
    if callbacks is None:
        out["callbacks"] = [recorder]
    elif isinstance(callbacks, BaseCallbackManager):
        manager = callbacks.copy()
        manager.add_handler(recorder, inherit=True)
        out["callbacks"] = manager
    else:
        out["callbacks"] = [*callbacks, recorder]
    return out  # type: ignore[return-value]
