"""LangSmith's ``traceable`` without its thread hops while nothing is traced.

``create_agent`` wraps every middleware hook (``awrap_model_call``, ``awrap_tool_call``) in
LangSmith's ``traceable``. With tracing off, each wrapped call still hands two small functions
(the run's set-up and its end) to a worker thread and runs the hook in a task of its own: about
0.25 ms of CPU per hook call on this project's machine, two or more hook calls per LLM call,
against 0.03 ms without the hops (benchmarks/results/2026-12-05-sdk-langsmith-inline.md).

``inline_untraced()`` installs, through LangSmith's own extension point for that hand-off
(``langsmith.set_runtime_overrides``), one that runs those functions on the calling thread
while nothing is traced, and hands them to the thread exactly as before whenever tracing is
on. An override the application installed is left in place. LangSmith is imported only here.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

__all__ = ["inline_untraced", "run_untraced_inline"]

_log = structlog.get_logger("agentclaims.langsmith")


async def run_untraced_inline(
    default: Callable[..., Awaitable[Any]],
    ctx: contextvars.Context,
    func: Callable[..., Any],
    /,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """LangSmith's ``aio_to_thread`` override: ``func`` runs in ``ctx`` on this thread where
    ``ctx`` traces nothing (LangSmith then sets up no run and sends nothing: the functions are
    a few dictionary reads), else through LangSmith's ``default`` (a worker thread)."""
    from langsmith.utils import tracing_is_enabled

    if ctx.run(tracing_is_enabled):
        return await default(ctx, func, *args, **kwargs)
    return ctx.run(func, *args, **kwargs)


def inline_untraced() -> bool:
    """Install ``run_untraced_inline`` as LangSmith's ``aio_to_thread`` override, unless
    another one is installed (the application's: left alone). Returns whether ours is the one
    in place."""
    import langsmith

    try:
        from langsmith._runtime_overrides import get_runtime_overrides
    except ImportError:  # a LangSmith that cannot say what is installed: leave it as it is
        return False
    current = get_runtime_overrides().aio_to_thread
    if current is run_untraced_inline:
        return True
    if current is not None:
        _log.debug("langsmith_override_kept", override=repr(current))
        return False
    langsmith.set_runtime_overrides(aio_to_thread=run_untraced_inline)
    return True
