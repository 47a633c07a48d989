"""``SessionOptions``: the keyword options of a ``ClaimedSession``, as one typed dict, and
``check_options``, the one place they are checked.

``claimed_session(target, backend=..., **options)`` and ``ClaimedGraph.session(**overrides)``
take them as ``**options: Unpack[SessionOptions]``, so a type checker knows every option's name
and type; at run time an unknown name raises ``UnknownNameError`` and a bad value
``UsageError`` when the workflow is decorated, not at its first run (``check_options``, which
``ClaimedSession`` runs too). Every option is optional; its default is ``ClaimedSession``'s.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO, TypedDict, cast

from agentclaims.errors import UnknownNameError, UsageError
from agentclaims.graph import AgentExecutionGraph, EngineCosts, ToolTimeModel
from agentclaims.planner import ClaimPlanner, PlannerPolicy
from agentclaims.session.reactions import ReactionPolicy

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from agentclaims.backends.base import Backend
    from agentclaims.backends.pool import BackendPool

__all__ = [
    "AUTO_PLANNER",
    "CheckedOptions",
    "LogStream",
    "SessionOptions",
    "Sleep",
    "check_option_names",
    "check_options",
]

Sleep = Callable[[float], Awaitable[None]]
LogStream = TextIO | str | os.PathLike[str]
"""Where a session's log lines also go: an open text stream (left open) or a file path
(opened for appending, closed when the session ends)."""

AUTO_PLANNER = "auto"
"""The default ``planner``: the preset follows what the backend says it does
(``ClaimKeeper.follow_backend``)."""
UNRANKED = "default"
"""The preset ``auto`` plans with until the backend's descriptor says otherwise."""


class SessionOptions(TypedDict, total=False):
    """The keyword arguments of ``ClaimedSession`` besides ``backend``; all optional."""

    workflow_id: str | None
    """Names the run in logs and in its owner scope (``workflow:<workflow_id>``); a non-empty
    string, with ``log_dir`` one that names a file (no ``/``, ``\\``, ``.`` or ``..``). Two
    sessions running at once in a process may not share it. Default: a fresh
    ``wf-<12 hex digits>``."""
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
    log_stream: LogStream | None
    """Also (or only) write the outcome log's lines to this stream: an open text stream (left
    open) or a file path (appended to, closed at the run's end). Default: none."""
    horizon: int
    """How many steps ahead steps-to-execution and reuse are searched; an integer >= 1.
    Default: 4."""
    reload_s_per_block: float
    """Seconds to recompute or reload one KV block, the cost a claim saves (Continuum's TTL
    rule); a finite number >= 0. Default: 0.002."""
    queue_delay_s: float
    """Recent queueing delay of a request whose prefix was evicted (Continuum's ``T``), in
    seconds; a finite number >= 0. Default: 0.05."""
    engine_costs: EngineCosts | None
    """Learn ``reload_s_per_block`` from the engine's own answers: each answered call's time,
    the prompt blocks computed for it and the tokens it generated feed this model, and the
    session plans with its fitted cost per block (``reload_s_per_block`` until it is learned:
    ``EngineCosts(prior_reload_s_per_block=...)``). Share one across runs to learn faster.
    Default: ``None`` (``reload_s_per_block`` as given)."""
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


@dataclass(frozen=True, slots=True)
class CheckedOptions:
    """A session's options, checked and with their defaults: what ``ClaimedSession`` is built
    from. ``planner`` and ``reaction`` are objects (a name became its preset); ``auto_planner``
    says the planner follows the backend."""

    pool: BackendPool | None
    backend: Backend | None
    workflow_id: str | None
    thread_id: str | None
    graph: AgentExecutionGraph
    planner: ClaimPlanner
    auto_planner: bool
    reaction: ReactionPolicy
    tool_times: ToolTimeModel
    log_dir: Path | None
    log_stream: LogStream | None
    horizon: int
    reload_s_per_block: float
    queue_delay_s: float
    engine_costs: EngineCosts | None
    sleep: Sleep
    clock: Callable[[], float]
    tracing: bool | None
    tracer_provider: TracerProvider | None


def check_options(backend: object, options: SessionOptions) -> CheckedOptions:
    """Every option checked (an unknown name: ``UnknownNameError``; a bad value:
    ``UsageError`` naming it), with the defaults filled in."""
    from agentclaims.backends.pool import BackendPool

    check_option_names(options)
    o = options
    tracing, tracer_provider = o.get("tracing"), o.get("tracer_provider")
    _check_tracing(tracing, tracer_provider)
    pool = backend if isinstance(backend, BackendPool) else None
    if pool is None and not _looks_like_backend(backend):
        raise UsageError("backend", f"expected a Backend or BackendPool, got {backend!r}")
    for name in ("workflow_id", "thread_id"):
        value = o.get(name)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise UsageError(name, f"must be a non-empty string, got {value!r}")
    log_dir, log_stream = _log_sinks(o.get("log_dir"), o.get("log_stream"))
    workflow_id = o.get("workflow_id")
    if log_dir is not None and workflow_id is not None and not _file_name(workflow_id):
        raise UsageError(
            "workflow_id", f"{workflow_id!r} cannot name a file in log_dir (no '/', '\\', '..')"
        )
    graph = o.get("graph")
    if graph is not None and not isinstance(graph, AgentExecutionGraph):
        raise UsageError("graph", f"expected an AgentExecutionGraph, got {type(graph).__name__}")
    horizon = o.get("horizon", 4)
    if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
        raise UsageError("horizon", f"must be an integer >= 1, got {horizon!r}")
    reload_s = o.get("reload_s_per_block", 0.002)
    queue_s = o.get("queue_delay_s", 0.05)
    for name, number in (("reload_s_per_block", reload_s), ("queue_delay_s", queue_s)):
        if not _seconds(number):
            raise UsageError(name, f"must be a finite number >= 0, got {number!r}")
    tool_times = o.get("tool_times")
    if tool_times is not None and not isinstance(tool_times, ToolTimeModel):
        raise UsageError("tool_times", f"expected a ToolTimeModel, got {tool_times!r}")
    sleep, clock = o.get("sleep", asyncio.sleep), o.get("clock", time.monotonic)
    for name, fn in (("sleep", sleep), ("clock", clock)):
        if not callable(fn):
            raise UsageError(name, f"must be callable, got {fn!r}")
    costs = o.get("engine_costs")
    if costs is not None and not isinstance(costs, EngineCosts):
        raise UsageError("engine_costs", f"expected an EngineCosts, got {costs!r}")
    planner, auto = _planner(o.get("planner", AUTO_PLANNER))
    reaction = o.get("reaction", "defer")
    if isinstance(reaction, str):
        reaction = ReactionPolicy.named(reaction)
    elif not isinstance(reaction, ReactionPolicy):
        raise UsageError(
            "reaction", f"expected a reaction name or ReactionPolicy, got {reaction!r}"
        )
    return CheckedOptions(
        pool=pool,
        backend=None if pool is not None else backend,  # type: ignore[arg-type]
        workflow_id=workflow_id,
        thread_id=o.get("thread_id"),
        graph=graph if graph is not None else AgentExecutionGraph(),
        planner=planner,
        auto_planner=auto,
        reaction=reaction,
        tool_times=ToolTimeModel(prior_mean_s=0.1) if tool_times is None else tool_times,
        log_dir=log_dir,
        log_stream=log_stream,
        horizon=horizon,
        reload_s_per_block=reload_s,
        queue_delay_s=queue_s,
        engine_costs=costs,
        sleep=sleep,
        clock=clock,
        tracing=tracing,
        tracer_provider=tracer_provider,
    )


def _planner(planner: object) -> tuple[ClaimPlanner, bool]:
    """The planner object of the ``planner`` option, and whether it follows the backend."""
    auto = planner == AUTO_PLANNER
    if isinstance(planner, str):
        if not auto and planner not in PlannerPolicy.preset_names():
            raise UnknownNameError(
                "planner policy", planner, [AUTO_PLANNER, *PlannerPolicy.preset_names()]
            )
        return ClaimPlanner(PlannerPolicy.named(UNRANKED if auto else planner)), auto
    if isinstance(planner, PlannerPolicy):
        return ClaimPlanner(planner), False
    if isinstance(planner, ClaimPlanner):
        return planner, False
    raise UsageError(
        "planner", f"expected a policy name, PlannerPolicy or ClaimPlanner, got {planner!r}"
    )


def _check_tracing(tracing: object, tracer_provider: object) -> None:
    """``tracing`` is ``None``, ``True`` or ``False`` (``True`` needs the OpenTelemetry API);
    ``tracer_provider`` is ``None`` or has ``get_tracer``."""
    if tracing is not None and not isinstance(tracing, bool):
        raise UsageError(
            "tracing", f"must be True, False or None (on when a provider is set), got {tracing!r}"
        )
    if tracer_provider is not None and not callable(getattr(tracer_provider, "get_tracer", None)):
        raise UsageError(
            "tracer_provider",
            f"expected an OpenTelemetry TracerProvider, got {type(tracer_provider).__name__}",
        )
    if tracing is True:
        try:
            import opentelemetry.trace  # noqa: F401
        except ImportError as exc:
            raise UsageError(
                "tracing",
                "tracing=True needs the OpenTelemetry API, which is not installed: "
                "pip install 'agentclaims[otel]' (and an OpenTelemetry SDK with an exporter)",
            ) from exc


def _seconds(value: object) -> bool:
    """A finite number of seconds >= 0 (not a bool)."""
    return (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and value >= 0
    )


def _file_name(workflow_id: str) -> bool:
    """Whether ``<workflow_id>.jsonl`` names a file inside the log folder (``WorkflowLog``'s
    rule)."""
    return workflow_id not in (".", "..") and not any(c in workflow_id for c in "/\\\0")


def _log_sinks(log_dir: object, log_stream: object) -> tuple[Path | None, LogStream | None]:
    """``log_dir`` a path, ``log_stream`` a path or a text stream (anything with ``write``)."""
    if log_dir is not None and not isinstance(log_dir, str | os.PathLike):
        raise UsageError("log_dir", f"expected a folder path, got {log_dir!r}")
    if log_stream is not None and not (
        isinstance(log_stream, str | os.PathLike) or callable(getattr(log_stream, "write", None))
    ):
        raise UsageError("log_stream", f"expected a path or a text stream, got {log_stream!r}")
    return (
        None if log_dir is None else Path(log_dir),
        cast("LogStream | None", log_stream),
    )


def _looks_like_backend(obj: object) -> bool:
    return all(
        hasattr(obj, name) for name in ("submit_claim", "release_claim", "http_client", "name")
    )
