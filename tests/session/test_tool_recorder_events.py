"""A claimed graph's tool recorder takes LangChain's tool events only: a real supervisor run
hands the loop's executor none of the recorder's chain or model events (LangChain would
otherwise run each, a method that does nothing, on a worker thread), and its tool calls are
still seen and counted."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections import Counter
from collections.abc import Callable
from typing import Any

from langchain_core.messages import HumanMessage

import agentclaims
from agentclaims.backends.embedded import EmbeddedBackend
from agentclaims.bindings.decorators import claimed_session
from agentclaims.bindings.tools import ToolCallRecorder
from agentclaims.demo.workflows import build_supervisor, script, task_for


class RecorderEvents(concurrent.futures.ThreadPoolExecutor):
    """The loop's default executor, counting the recorder's events it is handed, by name."""

    def __init__(self) -> None:
        super().__init__(max_workers=2)
        self.events: Counter[str] = Counter()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        # LangChain hands a sync handler's event over as ``partial(ctx.run, method, ...)``
        if isinstance(fn, functools.partial) and fn.args:
            method = fn.args[0]
            if isinstance(getattr(method, "__self__", None), ToolCallRecorder):
                self.events[method.__name__] += 1
        return super().submit(fn, *args, **kwargs)


async def test_only_tool_events_reach_the_recorder() -> None:
    executor = RecorderEvents()
    asyncio.get_running_loop().set_default_executor(executor)
    backend = EmbeddedBackend(num_blocks=2048, block_size=16, script=script)
    try:
        graph = claimed_session(build_supervisor(agentclaims.chat_model(backend)), backend=backend)
        await graph.ainvoke({"messages": [HumanMessage(task_for(1))]}, {"recursion_limit": 60})
        stats = graph.last_session.stats
    finally:
        await backend.aclose()
    assert stats.llm_calls >= 6
    assert stats.tool_calls >= 2
    assert set(executor.events) == {"on_tool_start", "on_tool_end"}
    assert executor.events["on_tool_start"] == stats.tool_calls
