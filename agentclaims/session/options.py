"""``SessionOptions``: the keyword options of a ``ClaimedSession``, as one typed dict.

``claimed_session(target, backend=..., **options)`` and ``ClaimedGraph.session(**overrides)``
take them as ``**options: Unpack[SessionOptions]``, so a type checker knows every option's name
and type; at run time an unknown name raises ``UnknownNameError`` and a bad value
``UsageError`` when the workflow is decorated, not at its first run. Every option is optional;
its default is ``ClaimedSession``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TextIO, TypedDict

from agentclaims.errors import UnknownNameError

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from agentclaims.graph import AgentExecutionGraph, ToolTimeModel
    from agentclaims.planner import ClaimPlanner, PlannerPolicy
    from agentclaims.session.reactions import ReactionPolicy
    from agentclaims.session.session import Sleep

__all__ = ["SessionOptions", "check_option_names"]


class SessionOptions(TypedDict, total=False):
    """The keyword arguments of ``ClaimedSession`` besides ``backend``; all optional."""

    workflow_id: str | None
    """Names the run in logs and in its owner scope (``workflow:<workflow_id>``); a non-empty
    string. Default: a fresh ``wf-<12 hex digits>``."""
    thread_id: str | None
    """The conversation this run is a turn of (a non-empty string), written on every log line
    so that ``agentclaims report`` links the turns. Default: none; a ``ClaimedGraph`` takes
    each run's ``config["configurable"]["thread_id"]``."""
    graph: AgentExecutionGraph | None
    """The workflow's Agent Execution Graph. Default: an empty one, learned online from the
    calls the session sees (a ``ClaimedGraph`` passes the graph extracted from LangGraph)."""
    planner: ClaimPlanner | PlannerPolicy | str
    """How claims are planned: ``auto``, a preset name (``default``, ``conservative``,
    ``aggressive``, ``priority``, ``ranked``, ``ranked-hard``, ``held``, ``off``), a ``PlannerPolicy`` or
    a ``ClaimPlanner``. Default: ``"auto"``: ``ranked`` on a backend whose descriptor states
    ``ranks_by_hints`` (soft, ranked claims), ``default`` on any other."""
    reaction: ReactionPolicy | str
    """What to do when the backend refuses or defers: a name (``defer``, ``reroute``,
    ``relax``, ``fail``) or a ``ReactionPolicy``. Default: ``"defer"``."""
    tool_times: ToolTimeModel | None
    """The wait model (per tool, per node) that TTLs come from. Default: a fresh
    ``ToolTimeModel(prior_mean_s=0.1)`` (a ``ClaimedGraph`` shares one across its runs)."""
    log_dir: str | Path | None
    """Write the run's outcome log to ``<log_dir>/<workflow_id>.jsonl``. Default: no file."""
    log_stream: TextIO | None
    """Also (or only) write the outcome log's lines to this stream. Default: none."""
    horizon: int
    """How many steps ahead steps-to-execution and reuse are searched; an integer >= 1.
    Default: 4."""
    reload_s_per_block: float
    """Seconds to recompute or reload one KV block, the cost a claim saves (Continuum's TTL
    rule); a number >= 0. Default: 0.002."""
    queue_delay_s: float
    """Recent queueing delay of a request whose prefix was evicted (Continuum's ``T``), in
    seconds; a number >= 0. Default: 0.05."""
    sleep: Sleep
    """How the session waits (deferrals): an async ``sleep(seconds)``. Default:
    ``asyncio.sleep``; tests pass a fake one."""
    clock: Callable[[], float]
    """Monotonic clock in seconds, for TTLs, tool durations and deadlines. Default:
    ``time.monotonic``."""
    tracing: bool | None
    """OpenTelemetry spans of the run (docs/logs.md, "OpenTelemetry traces"): ``True`` always
    (needs ``opentelemetry-api``, the ``otel`` extra), ``False`` never, ``None`` when a
    ``tracer_provider`` is given or the application set a global tracer provider (never
    importing ``opentelemetry`` to find out). Default: ``None``."""
    tracer_provider: TracerProvider | None
    """The OpenTelemetry ``TracerProvider`` the run's spans go to. Default: the global one."""


def check_option_names(options: Mapping[str, object]) -> None:
    """Raise ``UnknownNameError`` for a keyword that is not a ``SessionOptions`` field."""
    known = sorted(SessionOptions.__optional_keys__)
    for name in options:
        if name not in SessionOptions.__optional_keys__:
            raise UnknownNameError("option", name, known)
