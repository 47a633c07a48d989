"""Per-LLM-call planning cost of the graph reuse model on a random 1,000-node agent graph.

Each call: advance the frontier to the next node of a random walk, then read the STE and the
reuse probability (horizon 8) of every prefix the node uses. Prints median and p99 in
microseconds, cold (empty caches) and warm (after ``SteTracker.precompute()``).

    .venv/bin/python benchmarks/bench_graph.py [--nodes 1000] [--calls 20000] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from agentclaims.graph import END, START, AgentExecutionGraph, SteTracker


def build(nodes: int, rng: random.Random, joins: int) -> AgentExecutionGraph:
    """Random agent graph: 70% agents (a shared system prompt plus 1-2 of 50 prefixes), 30%
    tools; 1-3 conditional successors each (some observed), ``joins`` random AND-joins."""
    g = AgentExecutionGraph()
    names = [f"n{i}" for i in range(nodes)]
    for name in names:
        if rng.random() < 0.7:
            own = {f"p{rng.randrange(50)}" for _ in range(rng.randint(1, 2))}
            g.add_node(name, "agent", prefixes={"sys", *own})
        else:
            g.add_node(name, "tool")
    g.add_edge(START, names[0])
    for name in names:
        for target in rng.sample(names, rng.randint(1, 3)):
            g.add_edge(name, target, "conditional", count=rng.randrange(5))
        if rng.random() < 0.05:
            g.add_edge(name, END, "conditional")
    for _ in range(joins):
        g.add_join(rng.sample(names, 2), rng.choice(names))
    return g


def walk(g: AgentExecutionGraph, calls: int, rng: random.Random) -> list[str]:
    """A random walk of agent calls (restarting at the entry after __end__)."""
    out: list[str] = []
    node = START
    while len(out) < calls:
        probs = g.transition_probabilities(node)
        node = rng.choices(list(probs), weights=list(probs.values()))[0] if probs else START
        if node in (START, END):
            node = START
            continue
        out.append(node)
    return out


def measure(tracker: SteTracker, path: list[str]) -> list[float]:
    """Microseconds per call of: advance + prefix STE + prefix reuse probability."""
    graph = tracker.graph
    prefixes = {n: sorted(graph.prefixes_of(n)) for n in set(path)}
    timings: list[float] = []
    clock = time.perf_counter_ns
    for node in path:
        t0 = clock()
        tracker.advance((node,))
        for prefix in prefixes[node]:
            tracker.prefix_ste(prefix)
            tracker.reuse(prefix)
        timings.append((clock() - t0) / 1000)
    return timings


def report(label: str, timings: list[float]) -> None:
    ordered = sorted(timings)
    p99 = ordered[int(0.99 * (len(ordered) - 1))]
    print(
        f"{label:<28} median {statistics.median(ordered):8.1f} us   "
        f"p99 {p99:8.1f} us   max {ordered[-1]:9.1f} us"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for joins in (0, args.nodes // 50):
        run(args.nodes, args.calls, joins, random.Random(args.seed))


def run(nodes: int, calls: int, joins: int, rng: random.Random) -> None:
    """Build, walk and measure one configuration."""
    g = build(nodes, rng, joins)
    path = walk(g, calls, rng)
    print(f"\n== {joins} AND-joins")
    print(f"graph: {len(g)} nodes, {len(g.edges())} edges, {len(g.prefix_users())} prefixes")

    report("cold (lazy caches)", measure(SteTracker(g), path))

    tracker = SteTracker(g)
    t0 = time.perf_counter()
    computed = tracker.precompute()
    print(f"precompute: {computed} snapshots + reuse tables in {time.perf_counter() - t0:.2f} s")
    report("warm (after precompute)", measure(tracker, path))
    print(f"STE snapshots cached after the walk: {tracker.cached_snapshots}")


if __name__ == "__main__":
    main()
