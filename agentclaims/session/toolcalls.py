"""``SessionTools``: the session's tool-call API.

A tool call starts (the agent's claim held across it as planned, or the session's reaction
applied: ``toolhold``) and ends (its real duration learned by the wait model, counted, logged).
``async with session.tool_call(...)`` wraps both; LangGraph's tools are recorded the same way by
``agentclaims.bindings.tools`` (``start_tool`` / ``finish_tool``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentclaims.errors import UsageError
from agentclaims.session.toolhold import defer, hold_for_tool

if TYPE_CHECKING:
    from agentclaims.session.held import HeldClaim
    from agentclaims.session.state import SessionState

__all__ = ["SessionTools", "ToolRun", "in_explicit_tool_call"]

_in_tool: ContextVar[bool] = ContextVar("agentclaims_in_tool", default=False)


def in_explicit_tool_call() -> bool:
    """Whether the code running is inside ``async with session.tool_call(...)``."""
    return _in_tool.get()


@dataclass(slots=True)
class ToolRun:
    """One tool call in progress (``ClaimedSession.start_tool``)."""

    tool: str
    agent: str
    predicted_s: float
    held: HeldClaim | None
    started: float
    error: str | None = None
    deferral: asyncio.Future[HeldClaim | None] | None = None
    """The claim asked for again while the tool runs (reaction ``defer``); cancelled when
    the tool ends."""


class SessionTools:
    """Starts and finishes ``session``'s tool calls."""

    def __init__(self, session: SessionState) -> None:
        self._s = session
        self._running: set[asyncio.Future[HeldClaim | None]] = set()
        """Deferrals asking again for a claim while their tools run (``toolhold.defer``)."""

    async def cancel_deferrals(self) -> None:
        """Stop the deferrals still running (the session ends)."""
        running = list(self._running)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    @contextlib.asynccontextmanager
    async def tool_call(self, tool: str, *, node: str | None = None) -> AsyncIterator[None]:
        """``start_tool``, the block, ``finish_tool`` (``ClaimedSession.tool_call``)."""
        run = await self.start_tool(tool, node=node)
        token = _in_tool.set(True)
        try:
            yield
        except BaseException as exc:
            run.error = type(exc).__name__
            raise
        finally:
            _in_tool.reset(token)
            self.finish_tool(run)

    async def start_tool(
        self, tool: str, *, node: str | None = None, step_node: str | None = None
    ) -> ToolRun:
        """A tool call starts (``ClaimedSession.start_tool``)."""
        if not isinstance(tool, str) or not tool:
            raise UsageError("tool", f"must be a non-empty string, got {tool!r}")
        s = self._s
        if not s.lifecycle.entered:
            raise UsageError(
                "session",
                "a tool call is held inside the session's `async with` block: this session "
                + ("has ended" if s.end_reason is not None else "was not entered"),
            )
        await s.calls.settle()
        agent = s.workflow.agent_of_tool(node or s.last_agent)
        predicted = s.workflow.tool_started(tool, agent, step_node)
        async with s.keeper.lock:
            held, case = await hold_for_tool(s, tool, agent, predicted)
        deferral = None
        if case is not None:  # asked for again while the tool runs, never before it
            deferral = asyncio.ensure_future(defer(case, s.sleep))
            self._running.add(deferral)
            deferral.add_done_callback(self._running.discard)
        return ToolRun(tool, agent, predicted, held, s.clock(), deferral=deferral)

    def finish_tool(self, run: ToolRun) -> None:
        """A tool call ended (``ClaimedSession.finish_tool``)."""
        s = self._s
        deferral = run.deferral
        if deferral is not None:  # what it got while the tool ran held the prefix across it
            if not deferral.done():
                deferral.cancel()
            elif not deferral.cancelled() and deferral.exception() is None:
                run.held = deferral.result()
        if not s.lifecycle.entered:
            return  # it outlasted the session (ended by another task): its stats are final
        duration = max(0.0, s.clock() - run.started)
        s.workflow.tool_finished(run.tool, run.agent, duration)
        s.stats.tool_calls += 1
        if s.log is not None:
            held = run.held
            s.log.tool_call(
                tool=run.tool,
                duration_s=round(duration, 6),
                predicted_s=round(run.predicted_s, 6),
                ttl_s=None if held is None else held.plan.ttl_s,
                claim_ids=[] if held is None else [held.claim_id],
                node=run.agent,
                error=run.error,
            )
