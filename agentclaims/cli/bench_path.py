"""The claimed session's whole per-call path, as an agent process pays it.

A real LangGraph agent/tool loop (LangChain's ``create_agent``: a model node, a tool node)
runs ``sessions`` workflows at once in this process, each ``calls`` model calls long, its
context growing with every tool result, on the embedded default and over HTTP (a real
``agentclaims serve`` process on loopback with the same scripted replies), with the
``ClaimsMiddleware`` and without it. Per LLM call it measures this process's CPU (transport,
planning, outcome and event handling, logging: everything the session adds, and LangChain's,
LangGraph's and the OpenAI client's own work beside it), the event loop's lag (a ticker that
asks to wake every 5 ms; p99 of how late it woke), and the requests that went to the gateway
beyond the completions. Each tool call waits ``tool_s`` on average (jittered +-50%): at the
default 10 ms the calls come as fast as the process makes them, the loop is never idle and its
lag is mostly the queue of ready work; ``tool_s=1`` paces the sessions as agents whose tools
take a second, where the lag shows how long the session's work holds the loop. Runs alternate
with and without the session, ``rounds`` of each; each mode's figure is the median of its
rounds, and what the session adds is the median of each round's difference between the modes
(load that drifts between rounds cancels). Over the embedded default the gateway and the
engine run in this process too, so its CPU includes theirs.

A third loop in each round carries a middleware that does nothing in the same two hooks
(``awrap_model_call``, ``awrap_tool_call``): what LangChain charges any middleware with them
(``create_agent`` wraps each hook in LangSmith's ``traceable``). The session's own CPU is what
it adds over that loop. The session's middleware has LangSmith run ``traceable``'s own work
inline while nothing is traced (``agentclaims.bindings.langsmith``); the bench does the same
before any mode runs, so the no-op middleware is charged as the session's is.

Figures are printed; nothing here asserts a speed.
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import json
import os
import random
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from agentclaims.cli.heap import collector_time, settled_heap
from agentclaims.cli.resample import bootstrap_90
from agentclaims.errors import UsageError

__all__ = ["bench_path"]

TICK_S = 0.005
MODES = ("without", "hooks", "with")


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _script(calls: int) -> dict[str, list[Any]]:
    """The model calls the tool ``calls - 1`` times, then answers."""
    tools: list[Any] = [
        {"tool": "search", "arguments": {"query": f"q{i}"}} for i in range(calls - 1)
    ]
    return {"*": [*tools, "done."]}


@contextlib.contextmanager
def _gateway(script: Path) -> Iterator[str]:
    """``agentclaims serve`` on a free loopback port with ``script``; stopped by its PID."""
    import httpx2

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [sys.executable, "-m", "agentclaims.cli.main", "serve", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--blocks", "65536", "--script", str(script), "--decode-ms", "0"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the gateway exited with status {proc.returncode}")
            with contextlib.suppress(httpx2.HTTPError):
                if httpx2.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("the gateway did not come up within 30 s")
            time.sleep(0.1)
        yield url
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)


async def _lag(samples: list[float], stop: asyncio.Event) -> None:
    """How late the loop woke for each ``TICK_S`` sleep (s)."""
    while not stop.is_set():
        asked = time.perf_counter()
        await asyncio.sleep(TICK_S)
        samples.append(max(0.0, time.perf_counter() - asked - TICK_S))


def _hooks() -> Any:
    """A middleware with the session's two hooks, doing nothing in them."""
    from langchain.agents.middleware import AgentMiddleware

    class Hooks(AgentMiddleware):
        async def awrap_model_call(self, request: Any, handler: Any) -> Any:
            return await handler(request)

        async def awrap_tool_call(self, request: Any, handler: Any) -> Any:
            return await handler(request)

    return Hooks()


def _python_calls(profile: Any, llm: int) -> dict[str, Any]:
    """What ``profile`` counted, per LLM call: every Python function call, and each of
    agentclaims' own functions (``agentclaims/<module path>:<function>``)."""
    import pstats

    total = 0
    ours: dict[str, int] = {}
    for (path, _line, name), (_, calls, *_rest) in pstats.Stats(profile).stats.items():  # type: ignore[attr-defined]
        total += calls
        at = path.replace("\\", "/").rfind("/agentclaims/")
        if at >= 0:
            where = f"{path[at + 1 :]}:{name}"
            ours[where] = ours.get(where, 0) + calls
    return {
        "python_calls_per_call": total / llm,
        "agentclaims_calls_per_call": {k: n / llm for k, n in ours.items()},
    }


async def _one(
    backend: Any,
    sessions: int,
    calls: int,
    mode: str,
    tag: str,
    tool_s: float,
    *,
    profile: bool = False,
) -> dict[str, Any]:
    """One run: ``sessions`` agent loops at once (``mode``: ``without`` middleware, the
    no-op ``hooks``, ``with`` the session; each tool waits ``tool_s`` on average); CPU per
    LLM call, loop lag, requests. ``profile``: the run's Python function calls are counted
    too (``cProfile``; its CPU figure is then the profiler's as well, not to be compared)."""
    from langchain.agents import create_agent
    from langchain_core.messages import HumanMessage
    from langchain_core.tools import tool

    import agentclaims

    jitter = random.Random(f"{sessions}/{calls}")  # the same waits in every mode
    pace = 0.0  # the warm run's tools answer at once

    @tool
    async def search(query: str) -> str:
        """Search the sources."""
        await asyncio.sleep(pace * jitter.uniform(0.5, 1.5))
        return f"results for {query}: " + "kv cache prefix block claim " * 6

    middleware: list[Any] = []
    if mode != "without":
        middleware.append(_hooks() if mode == "hooks" else agentclaims.ClaimsMiddleware(backend))
    agent = create_agent(agentclaims.chat_model(backend), [search], middleware=middleware)

    async def workflow(i: int) -> None:
        task = f"{tag} task {i}: " + "find the papers on agent KV caches " * 12
        await agent.ainvoke({"messages": [HumanMessage(task)]}, {"recursion_limit": 4 * calls})

    await workflow(-1)  # warm: imports, caches, the descriptor read once
    pace = tool_s
    # what is alive now (modules, the warm run's leftovers) is never scanned again: a full
    # collection costs about a millisecond a call, and where it lands is chance, not the mode
    with settled_heap(), collector_time() as collecting:
        before = await _requests(backend)
        lag: list[float] = []
        stop = asyncio.Event()
        ticker = asyncio.ensure_future(_lag(lag, stop))
        profiler = cProfile.Profile() if profile else None
        cpu = _cpu_s()
        if profiler is not None:
            profiler.enable()
        await asyncio.gather(*(workflow(i) for i in range(sessions)))
        if profiler is not None:
            profiler.disable()
        cpu = _cpu_s() - cpu
        gc_s = collecting[0]
    stop.set()
    await ticker
    after = await _requests(backend)
    llm = sessions * calls
    others = _others(after) - _others(before)
    ordered = sorted(lag) or [0.0]
    return {
        "cpu_ms_per_call": cpu * 1000 / llm,
        "gc_ms_per_call": gc_s * 1000 / llm,
        "lag_p99_ms": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000,
        "extra_requests_per_call": others / llm,
        **({} if profiler is None else _python_calls(profiler, llm)),
    }


BUSIEST = 8
"""The session's functions a profiled row names, most calls per LLM call first."""


def _counts(counted: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A row's Python calls per LLM call (one counted run of each mode): each mode's, what the
    session adds over no middleware and over the no-op one (``own``), and the session's
    functions that the session's mode calls most beyond the no-op's."""
    per = {mode: counted[mode]["python_calls_per_call"] for mode in MODES}
    mine = counted["with"]["agentclaims_calls_per_call"]
    theirs = counted["hooks"]["agentclaims_calls_per_call"]
    added = {k: n - theirs.get(k, 0.0) for k, n in mine.items()}
    busiest = sorted(added.items(), key=lambda kv: (-kv[1], kv[0]))[:BUSIEST]
    return {
        "python_calls_per_call": per,
        "session_python_calls_per_call": per["with"] - per["without"],
        "own_python_calls_per_call": per["with"] - per["hooks"],
        "busiest": [{"function": k, "calls_per_call": round(n, 2)} for k, n in busiest],
    }


def _paired(a: Sequence[dict[str, float]], b: Sequence[dict[str, float]], key: str) -> float:
    """The median over rounds of ``a``'s ``key`` less ``b``'s in the same round."""
    return statistics.median(x[key] - y[key] for x, y in zip(a, b, strict=True))


def _interval(
    a: Sequence[dict[str, float]], b: Sequence[dict[str, float]], key: str, resamples: int = 2000
) -> tuple[float, float]:
    """A 90% interval for ``_paired(a, b, key)``: the 5th and 95th percentiles of the median
    of the rounds' differences over ``resamples`` resamplings of the rounds (a fixed seed: the
    same rounds give the same interval). One round: that round's difference, twice."""
    diffs = [x[key] - y[key] for x, y in zip(a, b, strict=True)]
    return bootstrap_90(lambda rng: statistics.median(rng.choices(diffs, k=len(diffs))), resamples)


def _others(calls: dict[str, int]) -> int:
    """Requests beyond the completions (the bench's own reads of ``/v1/stats`` left out)."""
    return sum(v for k, v in calls.items() if "completions" not in k and "/v1/stats" not in k)


async def _requests(backend: Any) -> dict[str, int]:
    """The gateway's requests by route (``/v1/stats``)."""
    stats = await backend.metrics()
    calls: dict[str, int] = dict((stats.get("gateway") or {}).get("calls") or {})
    return calls


async def _bench(
    backends: Sequence[str],
    sessions: Sequence[int],
    calls: int,
    rounds: int,
    tool_s: float,
    url: str,
    profile: bool = False,
) -> dict[str, Any]:
    import agentclaims
    from agentclaims.bindings.langsmith import inline_untraced
    from agentclaims.gateway.text import load_script

    # what the session's middleware does to LangSmith when it is made, done before any mode
    # runs: the no-op middleware's rounds run under the same LangSmith as the session's
    inline_untraced()
    script = _script(calls)

    async def run(kind: str, n: int, mode: str, tag: str, counted: bool = False) -> dict[str, Any]:
        """One run of ``mode`` on a fresh backend of ``kind``, closed after it."""
        backend: Any = (
            agentclaims.EmbeddedBackend(
                num_blocks=65536, block_size=16, script=load_script(json.dumps(script))
            )
            if kind == "embedded"
            else agentclaims.HTTPBackend(url)
        )
        try:
            return await _one(backend, n, calls, mode, tag, tool_s, profile=counted)
        finally:
            await backend.aclose()

    rows: list[dict[str, Any]] = []
    for kind in backends:
        for n in sessions:
            runs: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
            for r in range(rounds):
                order = MODES if r % 2 == 0 else MODES[::-1]
                for mode in order:
                    runs[mode].append(await run(kind, n, mode, f"{kind}{n}{r}{mode}"))
            # one more run of each mode, counted, not timed
            counted = (
                {m: await run(kind, n, m, f"{kind}{n}p{m}", counted=True) for m in MODES}
                if profile
                else {}
            )
            med = {
                mode: {k: statistics.median(x[k] for x in xs) for k in xs[0]}
                for mode, xs in runs.items()
            }
            # each round's modes ran one after the other: a difference within a round leaves
            # out what drifts between rounds (the machine's other load), so the figures are
            # the medians of the rounds' differences, not differences of the modes' medians
            added = _paired(runs["with"], runs["without"], "cpu_ms_per_call")
            hooks = _paired(runs["hooks"], runs["without"], "cpu_ms_per_call")
            own = _paired(runs["with"], runs["hooks"], "cpu_ms_per_call")
            rows.append(
                {
                    "backend": kind,
                    "sessions": n,
                    "llm_calls": n * calls,
                    "without": med["without"],
                    "hooks": med["hooks"],
                    "with": med["with"],
                    "session_cpu_ms_per_call": added,
                    "session_cpu_ms_interval": _interval(
                        runs["with"], runs["without"], "cpu_ms_per_call"
                    ),
                    "hooks_cpu_ms_per_call": hooks,
                    "own_cpu_ms_per_call": own,
                    "own_cpu_ms_interval": _interval(
                        runs["with"], runs["hooks"], "cpu_ms_per_call"
                    ),
                    "gc_ms_per_call_added": _paired(
                        runs["with"], runs["without"], "gc_ms_per_call"
                    ),
                    "session_share": added / med["with"]["cpu_ms_per_call"],
                    "lag_p99_added_ms": _paired(runs["with"], runs["without"], "lag_p99_ms"),
                    "rounds": runs,
                    **(_counts(counted) if counted else {}),
                }
            )
    return {"calls_per_workflow": calls, "rounds": rounds, "tool_s": tool_s, "rows": rows}


def bench_path(
    *,
    backends: Sequence[str] = ("embedded", "http"),
    sessions: Sequence[int] = (6, 50),
    calls: int = 19,
    rounds: int = 3,
    tool_s: float = 0.01,
    profile: bool = False,
) -> dict[str, Any]:
    """The whole path's figures (see the module), one row per backend x session count;
    ``profile``: each row also counts the Python function calls per LLM call of one more run
    of each mode (deterministic where CPU time wanders by a millisecond from run to run)."""
    for name in backends:
        if name not in ("embedded", "http"):
            raise UsageError("backends", f"unknown backend {name!r}; expected embedded or http")
    if not sessions or any(
        isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sessions
    ):
        raise UsageError("sessions", f"must be positive integers, got {sessions!r}")
    for field, value, least in (("calls", calls, 2), ("rounds", rounds, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise UsageError(field, f"must be an integer >= {least}, got {value!r}")
    if isinstance(tool_s, bool) or not isinstance(tool_s, int | float) or not 0 <= tool_s <= 60:
        raise UsageError("tool_s", f"must be a number of seconds in [0, 60], got {tool_s!r}")
    with contextlib.ExitStack() as stack:
        url = ""
        if "http" in backends:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            (folder / "script.json").write_text(json.dumps(_script(calls)))
            url = stack.enter_context(_gateway(folder / "script.json"))
        return asyncio.run(
            _bench(
                tuple(backends), tuple(sessions), calls, rounds, float(tool_s), url, bool(profile)
            )
        )


def table(result: dict[str, Any]) -> str:
    """The figures as a table."""
    lines = [
        f"whole path: a create_agent tool loop, {result['calls_per_workflow']} model calls per "
        f"workflow, tools waiting {result['tool_s'] * 1000:g} ms on average, medians of "
        f"{result['rounds']} alternating rounds",
        f"  {'backend':<9}{'sessions':>9}{'cpu/call w/o':>14}{'with':>8}{'session':>9}"
        f"{'share':>7}{'hooks':>9}{'own':>9}{'lag p99 w/o':>13}{'with':>8}"
        f"{'extra req/call':>16}",
    ]
    for row in result["rows"]:
        w, c = row["without"], row["with"]
        lines.append(
            f"  {row['backend']:<9}{row['sessions']:>9}{w['cpu_ms_per_call']:>11.2f} ms"
            f"{c['cpu_ms_per_call']:>8.2f}{row['session_cpu_ms_per_call']:>6.2f} ms"
            f"{row['session_share']:>7.0%}{row['hooks_cpu_ms_per_call']:>6.2f} ms"
            f"{row['own_cpu_ms_per_call']:>6.2f} ms{w['lag_p99_ms']:>10.2f} ms"
            f"{c['lag_p99_ms']:>8.2f}{c['extra_requests_per_call']:>16.3f}"
        )
    lines.append(
        "  hooks: a middleware doing nothing in the session's two hooks costs this over none "
        "(LangChain's); own: the session over it"
    )
    lines.append(
        "  90% intervals of the medians (a bootstrap over the rounds), and the collector's "
        "time the session adds (inside its CPU):"
    )
    for row in result["rows"]:
        (s_lo, s_hi), (o_lo, o_hi) = row["session_cpu_ms_interval"], row["own_cpu_ms_interval"]
        lines.append(
            f"  {row['backend']:<9}{row['sessions']:>9}   session {s_lo:.2f} to {s_hi:.2f} ms"
            f"   own {o_lo:.2f} to {o_hi:.2f} ms   gc {row['gc_ms_per_call_added']:+.2f} ms"
        )
    for row in result["rows"]:
        if "python_calls_per_call" not in row:
            continue
        per = row["python_calls_per_call"]
        lines.append(
            f"  Python calls per LLM call, {row['backend']} x {row['sessions']} (one counted run "
            f"each): without {per['without']:,.0f}, hooks {per['hooks']:,.0f}, with "
            f"{per['with']:,.0f}; the session adds {row['session_python_calls_per_call']:,.0f}"
            f" (own {row['own_python_calls_per_call']:,.0f}); its busiest:"
        )
        lines.extend(f"    {b['calls_per_call']:>7.2f}  {b['function']}" for b in row["busiest"])
    return "\n".join(lines)
