"""``agentclaims bench sdk``: the SDK's own time per LLM call, without any I/O.

A ``ClaimedSession`` follows a random walk over a random 1,000-node Agent Execution Graph
(agent steps, each with a tool step that returns to it and conditional edges to other agents;
agents share a few prefixes, as a team shares a system prompt). Per LLM call it times the whole
path a user pays around the network, each step as the session runs it:

1. before the call: ``session.before_call(node)`` (online learning of the transition,
   steps-to-execution advance, the extension object);
2. serialising the request: the extension object the session adds to the request body, to
   JSON (the messages themselves are the client library's, paid with or without the SDK);
3. after the call: ``workflow.after_call`` (the STE read for the log, the wait starts);
4. re-planning: ``plan_after_call`` (context from STE, reuse probability and tool times, the
   planner's decision), the claim (``ClaimSpec`` with its ``ReuseHint``) built and serialised
   as it goes on the wire, and ``workflow.to_release`` over every held claim of other nodes.

The network round trips themselves and logging are I/O and not counted. The session runs on a
virtual clock: each call takes a simulated LLM latency and each tool round a simulated tool time
(per tool), so the waits the session learns are those of an agent, not of this loop, and every
run makes exactly the same calls with the same answers.

Each call is timed by the wall clock and by the CPU time of this thread; the goal (p99 <= 100
µs) is judged on CPU time. The same walk runs several times (``runs``) and each call's cost is
its median over the runs: on a shared machine other processes come in bursts that slow whole
stretches of one run (its CPU time too, under a hypervisor), and a burst seldom hits the same
calls twice, while what a call itself costs (a hit table, a claim built) is the same in every
run. Each run's own figures are reported beside it. Figures are printed (or one JSON object with
``--json``); nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections import Counter
from typing import Any, NamedTuple

from agentclaims.backends.embedded import EmbeddedBackend
from agentclaims.contract import CacheIdentity, ClaimSpec
from agentclaims.errors import UsageError
from agentclaims.graph import END, START, AgentExecutionGraph
from agentclaims.planner import ClaimPlan
from agentclaims.protocol import SEQUENCE_OBJECT
from agentclaims.session import ClaimedSession

__all__ = ["GOAL_P99_US", "bench_sdk", "random_graph", "run"]

GOAL_P99_US = 100.0
_TOOLS = ("search", "fetch", "code", "draft")


def random_graph(nodes: int, *, seed: int = 0, shared_prefixes: int = 8) -> AgentExecutionGraph:
    """A random AEG of about ``nodes`` steps: half agents, each with its own tool step (which
    returns to it), conditional edges to 1-3 other agents, and now and then to ``__end__``;
    every agent uses its own prefix and one of ``shared_prefixes`` shared ones."""
    rng = random.Random(seed)
    graph = AgentExecutionGraph()
    agents = [f"agent{i}" for i in range(nodes // 2)]
    for i, agent in enumerate(agents):
        graph.add_node(
            agent, "agent", prefixes=[f"pfx-own{i}-4", f"pfx-shared{i % shared_prefixes}-8"]
        )
        tool = f"tool{i}:{_TOOLS[i % len(_TOOLS)]}"
        graph.add_node(tool, "tool")
        graph.add_edge(agent, tool, "conditional")
        graph.add_edge(tool, agent, "plain")
    graph.add_edge(START, agents[0], "plain")
    for agent in agents:
        for other in rng.sample(agents, rng.randint(1, 3)):
            if other != agent:
                graph.add_edge(agent, other, "conditional")
        if rng.random() < 0.05:
            graph.add_edge(agent, END, "conditional")
    return graph


def _walk(graph: AgentExecutionGraph, calls: int, seed: int) -> list[tuple[str, tuple[str, ...]]]:
    """``calls`` LLM calls ``(agent, tools its reply asks for)`` along a random walk."""
    rng = random.Random(seed)
    agents = [n for n in graph.nodes if graph.node_kind(n) == "agent"]
    node = graph.successors(START)[0]
    out: list[tuple[str, tuple[str, ...]]] = []
    while len(out) < calls:
        succ = [s for s in graph.successors(node) if s != END] or [rng.choice(agents)]
        nxt = rng.choice(succ)
        if graph.node_kind(nxt) == "tool":
            out.append((node, (nxt.rsplit(":", 1)[1],)))  # a tool round, back to this agent
        else:
            out.append((node, ()))
            node = nxt
    return out


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


_LLM_S = (0.4, 2.5)  # simulated LLM latency range (uniform)
_TOOL_S = {"search": 0.8, "fetch": 1.5, "code": 4.0, "draft": 0.3}  # typical tool times


class _VirtualClock:
    """Seconds that move only when the simulated workflow says so (deterministic runs)."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Run(NamedTuple):
    """One run of the walk."""

    wall: list[float]  # each call's wall microseconds
    cpu: list[float]  # each call's CPU microseconds
    plans: Counter[str]
    graph_nodes: int
    graph_edges: int
    held_at_end: int


def _run_once(nodes: int, calls: int, seed: int) -> _Run:
    """One run of the walk on a fresh graph and session."""
    graph = random_graph(nodes, seed=seed)
    backend = EmbeddedBackend(num_blocks=64)  # never contacted: only its name is read
    clock = _VirtualClock()
    session = ClaimedSession(backend, graph=graph, workflow_id="bench", clock=clock)
    workflow = session.workflow
    identity = CacheIdentity("bench", "scripted", "agentclaims-bytes", "default", 16)
    walk = _walk(graph, calls, seed)
    rng = random.Random(seed + 1)
    delays = [
        rng.uniform(*_LLM_S) + (rng.expovariate(1 / _TOOL_S[tools[0]]) if tools else 0.0)
        for _, tools in walk
    ]
    held: dict[str, tuple[str, ClaimPlan]] = {}
    wall: list[float] = []
    cpu: list[float] = []
    modes: Counter[str] = Counter()
    perf, thread = time.perf_counter_ns, time.thread_time_ns
    for i, (node, tools) in enumerate(walk):
        prefix_id = f"pfx-{node}-{i % 7}-{8 + i % 24}"
        c0, w0 = thread(), perf()
        extension = session.before_call(node)
        json.dumps({"agentclaims": extension})
        workflow.near_ste(node)
        workflow.after_call(node, tools)
        ctx, plan = session.plan_after_call(node, prefix_id, tools)
        if plan.mode is not None:
            spec = ClaimSpec(
                claim_id=f"bench-c{i}",
                owner_scope=session.owner_scope,
                object_id=SEQUENCE_OBJECT if i % 2 else prefix_id,
                cache_identity=identity,
                footprint_blocks=max(1, ctx.footprint_blocks),
                protection_mode=plan.mode,
                ttl_s=plan.ttl_s,
                reuse_hint=workflow.reuse_hint(node, ctx, tool=tools[0] if tools else None),
            )
            json.dumps(spec.to_dict())
            held[node] = (prefix_id, plan)
        else:
            held.pop(node, None)
        for other in workflow.to_release(held, node):
            del held[other]
        w1, c1 = perf(), thread()
        wall.append((w1 - w0) / 1_000)
        cpu.append((c1 - c0) / 1_000)
        modes[plan.mode.value if plan.mode is not None else "none"] += 1
        clock.now += delays[i]  # the model answers, the tools run: the next call comes later
    return _Run(wall, cpu, modes, len(graph), len(graph.edges()), len(held))


def bench_sdk(
    nodes: int = 1_000, calls: int = 20_000, *, seed: int = 0, runs: int = 5
) -> dict[str, Any]:
    """Time ``calls`` per-call SDK paths on a ``nodes``-step graph, the same walk ``runs``
    times; figures in microseconds. The headline figures are over each call's median across
    the runs (``median_us``, ``p99_us``, ``cpu_median_us``, ``cpu_p99_us``); ``per_run`` holds
    each run's own median and p99 of CPU time."""
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise UsageError("runs", f"must be an integer >= 1, got {runs!r}")
    results = [_run_once(nodes, calls, seed) for _ in range(runs)]
    first = results[0]
    if any(r.plans != first.plans for r in results):  # the virtual clock makes every run the same
        raise RuntimeError("bench sdk: runs of the same walk planned differently")
    wall = [
        statistics.median(per_call) for per_call in zip(*(r.wall for r in results), strict=True)
    ]
    cpu = [statistics.median(per_call) for per_call in zip(*(r.cpu for r in results), strict=True)]
    per_run = [
        {
            "cpu_median_us": round(statistics.median(r.cpu), 2),
            "cpu_p99_us": round(_percentile(r.cpu, 0.99), 2),
        }
        for r in results
    ]
    cpu_p99 = _percentile(cpu, 0.99)
    return {
        "graph_nodes": first.graph_nodes,
        "graph_edges": first.graph_edges,
        "calls": calls,
        "runs": runs,
        "median_us": round(statistics.median(wall), 2),
        "p99_us": round(_percentile(wall, 0.99), 2),
        "cpu_median_us": round(statistics.median(cpu), 2),
        "cpu_p99_us": round(cpu_p99, 2),
        "max_us": round(max(wall), 2),
        "per_run": per_run,
        "per_run_cpu_p99_median_us": round(statistics.median(r["cpu_p99_us"] for r in per_run), 2),
        "plans": dict(sorted(first.plans.items())),
        "held_claims_at_end": first.held_at_end,
        "goal_p99_us": GOAL_P99_US,
        "meets_goal": cpu_p99 <= GOAL_P99_US,
    }


#: the flag of each field the benches name in their errors
_FLAGS = {
    "runs": "--runs",
    "backends": "--backends",
    "sessions": "--sessions",
    "rounds": "--rounds",
    "tool_s": "--tool-s",
}


def _check_flags(runs: object, path_args: dict[str, Any] | None) -> None:
    """Each number's bounds, checked before either bench runs; the error names the flag as
    it was typed."""
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise UsageError("--runs", f"must be an integer >= 1, got {runs!r}")
    if path_args is None:
        return
    sessions = path_args["sessions"]
    if not sessions or any(
        isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sessions
    ):
        shown = " ".join(str(n) for n in sessions) or "none"
        raise UsageError("--sessions", f"must be positive integers, got {shown}")
    rounds = path_args["rounds"]
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise UsageError("--rounds", f"must be an integer >= 1, got {rounds!r}")
    tool_s = path_args["tool_s"]
    if isinstance(tool_s, bool) or not isinstance(tool_s, int | float) or not 0 <= tool_s <= 60:
        raise UsageError("--tool-s", f"must be a number of seconds in [0, 60], got {tool_s!r}")


def run(args: argparse.Namespace) -> int:
    """Entry point of ``agentclaims bench sdk``: print the figures (``--json``: as JSON).
    Every flag is checked before either bench runs; a bad one exits 2 naming it as typed."""
    path_args: dict[str, Any] | None = None
    if not getattr(args, "planner_only", True):
        path_args = {
            "backends": getattr(args, "backends", ("embedded", "http")),
            "sessions": getattr(args, "sessions", (6, 50)),
            "rounds": getattr(args, "rounds", 3),
            "tool_s": getattr(args, "tool_s", 0.01),
            "profile": getattr(args, "profile", False),
        }
    try:
        runs = getattr(args, "runs", 5)
        _check_flags(runs, path_args)
        result = bench_sdk(runs=runs)
        if path_args is not None:
            from agentclaims.cli.bench_path import bench_path

            result["path"] = bench_path(**path_args)
    except UsageError as exc:
        if exc.field in _FLAGS:
            exc = UsageError(_FLAGS[exc.field], exc.message)
        print(f"agentclaims bench sdk: {exc}", file=sys.stderr)
        return 2
    if getattr(args, "json", False):
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"SDK overhead per LLM call (before, request JSON, after, STE, re-plan, held claims; "
        f"no I/O): "
        f"{result['graph_nodes']:,}-node graph, {result['graph_edges']:,} edges, "
        f"{result['calls']:,} calls on a random walk, the same walk {result['runs']} times, "
        f"each call's median over the runs"
    )
    print(f"  {'':<6}{'median':>10}{'p99':>10}   goal p99 <= {GOAL_P99_US:g} µs (CPU time)")
    print(f"  {'wall':<6}{result['median_us']:>10.1f}{result['p99_us']:>10.1f}")
    print(
        f"  {'cpu':<6}{result['cpu_median_us']:>10.1f}{result['cpu_p99_us']:>10.1f}"
        f"   {'meets' if result['meets_goal'] else 'MISSES'} the goal"
    )
    runs = ", ".join(f"{r['cpu_median_us']:.1f}/{r['cpu_p99_us']:.1f}" for r in result["per_run"])
    print(f"  each run on its own, cpu median/p99: {runs}")
    print(f"  plans: {', '.join(f'{k} {v:,}' for k, v in result['plans'].items())}")
    if "path" in result:
        from agentclaims.cli.bench_path import table

        print()
        print(table(result["path"]))
    return 0
