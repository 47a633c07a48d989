"""`ClaimsMiddleware` has LangSmith run `traceable`'s own work inline while nothing is traced:
a real `create_agent` agent's hooks then hand nothing to a worker thread; with tracing on, or
with an override the application installed, LangSmith works as before."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

import langsmith
import pytest
from langchain.agents import create_agent
from langchain_core.tools import tool
from langsmith._runtime_overrides import get_runtime_overrides
from langsmith.run_helpers import tracing_context
from surface import SCRIPT, ask

import agentclaims
from agentclaims.backends.embedded import EmbeddedBackend
from agentclaims.bindings.langsmith import run_untraced_inline
from agentclaims.bindings.middleware import ClaimsMiddleware
from agentclaims.errors import UsageError


@tool
async def search(query: str) -> str:
    """Search the papers."""
    return f"results for {query}"


@pytest.fixture(autouse=True)
def no_override() -> Iterator[None]:
    """Each test starts and ends with LangSmith's default hand-off (other tests' middleware
    installed ours in this process)."""
    langsmith.set_runtime_overrides()
    yield
    langsmith.set_runtime_overrides()


class CountingExecutor(concurrent.futures.ThreadPoolExecutor):
    """The loop's default executor, counting what LangSmith's tracing hands it."""

    def __init__(self) -> None:
        super().__init__(max_workers=2)
        self.langsmith = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        # LangSmith submits ``partial(ctx.run, func, ...)``: its run's set-up, or its end
        # (itself a ``partial`` of LangSmith's function)
        func = (getattr(fn, "args", None) or (None,))[0]
        func = getattr(func, "func", func)
        if getattr(func, "__module__", "").startswith("langsmith."):
            self.langsmith += 1
        return super().submit(fn, *args, **kwargs)


async def hand_offs(*, inline_hooks: bool) -> tuple[int, str]:
    """LangSmith's hand-offs to a worker thread in one run of a real agent (two model calls
    and a tool call, so three hook calls), and its answer."""
    executor = CountingExecutor()
    asyncio.get_running_loop().set_default_executor(executor)
    backend = EmbeddedBackend(256, 16, script=SCRIPT)
    try:
        claims = ClaimsMiddleware(backend, inline_hooks=inline_hooks)
        agent = create_agent(agentclaims.chat_model(backend), [search], middleware=[claims])
        result = await agent.ainvoke(ask())
    finally:
        await backend.aclose()
    return executor.langsmith, result["messages"][-1].content


async def test_untraced_hooks_hand_nothing_to_a_thread() -> None:
    handed, answer = await hand_offs(inline_hooks=True)
    assert answer == "found three papers on it"
    assert handed == 0
    assert get_runtime_overrides().aio_to_thread is run_untraced_inline


async def test_without_inline_hooks_langsmith_hands_off_as_before() -> None:
    handed, answer = await hand_offs(inline_hooks=False)
    assert answer == "found three papers on it"
    assert handed >= 6  # set-up and end of each of the three hook calls
    assert get_runtime_overrides().aio_to_thread is None


async def test_an_applications_override_is_kept() -> None:
    async def theirs(default: Any, ctx: Any, func: Any, /, *args: Any, **kwargs: Any) -> Any:
        return await default(ctx, func, *args, **kwargs)

    langsmith.set_runtime_overrides(aio_to_thread=theirs)
    ClaimsMiddleware(EmbeddedBackend(64, 16))
    assert get_runtime_overrides().aio_to_thread is theirs


def test_inline_hooks_is_checked_before_anything_changes() -> None:
    with pytest.raises(UsageError, match="inline_hooks"):
        ClaimsMiddleware(EmbeddedBackend(64, 16), inline_hooks="yes")  # type: ignore[arg-type]
    assert get_runtime_overrides().aio_to_thread is None


@pytest.mark.parametrize("traced", [False, True])
async def test_traced_work_still_goes_to_langsmiths_thread(traced: bool) -> None:
    """The override runs inline only where the context traces nothing: under a real
    ``tracing_context(enabled=True)`` it hands the call to LangSmith's default."""
    defaulted: list[Any] = []
    ran: list[str] = []

    async def default(ctx: contextvars.Context, func: Any, /, *args: Any, **kwargs: Any) -> Any:
        defaulted.append(func)
        return ctx.run(func, *args, **kwargs)

    def work(tag: str) -> str:
        ran.append(tag)
        return tag

    with tracing_context(enabled=traced):
        ctx = contextvars.copy_context()
    assert await run_untraced_inline(default, ctx, work, "x") == "x"
    assert ran == ["x"]
    assert defaulted == ([work] if traced else [])
