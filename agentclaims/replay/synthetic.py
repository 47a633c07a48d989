"""Seeded synthetic workloads shaped like the example agents, as :class:`Trace` s.

Three workflow shapes, mixed: a ReAct loop (one agent calling tools, think times drawn from a
lognormal), a supervisor with tool-using workers (a sub-agent group per round), and map-reduce
(a fan-out of workers, then a reducer turn). Every workflow of one shape starts with that
shape's system prompt, the same block ids across workflows (ids are global here, so workflows
share prefixes the way real deployments share system prompts).
"""

from __future__ import annotations

import random

from agentclaims.errors import UsageError
from agentclaims.replay.traces import SessionScript, SubAgentGroup, Trace, TraceRequest

__all__ = ["synthetic_workload"]

_SHAPES = ("react", "supervisor", "mapreduce")
_SYSTEM_BLOCKS = 24


class _Ids:
    def __init__(self, start: int) -> None:
        self.next = start

    def take(self, n: int) -> tuple[int, ...]:
        out = tuple(range(self.next, self.next + n))
        self.next += n
        return out


def _loop(
    rng: random.Random,
    ids: _Ids,
    name: str,
    kind: str,
    system: tuple[int, ...],
    turns: int,
    block_size: int,
) -> SessionScript:
    ctx = system + ids.take(rng.randint(2, 8))
    steps: list[TraceRequest | SubAgentGroup] = []
    for turn in range(turns):
        last = turn == turns - 1
        steps.append(
            TraceRequest(
                delay_s=0.0 if turn == 0 else rng.lognormvariate(1.5, 1.0),
                input_tokens=len(ctx) * block_size + rng.randint(0, block_size - 1),
                output_tokens=rng.randint(20, 400),
                block_hashes=ctx,
                stop="end_turn" if last else "tool_use",
                input_kind="text" if turn == 0 else "tool_result",
            )
        )
        ctx = ctx + ids.take(rng.randint(1, 12))
    return SessionScript(name, kind, tuple(steps))


def _workflow(rng: random.Random, index: int, block_size: int) -> Trace:
    shape = _SHAPES[rng.randrange(len(_SHAPES))]
    system = tuple(
        range(1 + _SHAPES.index(shape) * 1000, 1 + _SHAPES.index(shape) * 1000 + _SYSTEM_BLOCKS)
    )
    ids = _Ids(1_000_000 * (index + 1))
    name = f"syn-{index:05d}-{shape}"
    if shape == "react":
        root = _loop(rng, ids, name, "main", system, rng.randint(3, 12), block_size)
        return Trace(name, block_size, root, "synthetic")
    worker_system = tuple(s + 500 for s in system)
    rounds = 1 if shape == "mapreduce" else rng.randint(1, 3)
    plan = _loop(rng, ids, name, "main", system, 2 * rounds + 1, block_size)
    steps: list[TraceRequest | SubAgentGroup] = []
    for i, req in enumerate(plan.steps):
        steps.append(req)
        if i < 2 * rounds and i % 2 == 0:
            fan = rng.randint(2, 6) if shape == "mapreduce" else rng.randint(1, 3)
            workers = tuple(
                _loop(
                    rng,
                    ids,
                    f"{name}/w{i}-{k}",
                    "worker",
                    worker_system,
                    rng.randint(1, 5),
                    block_size,
                )
                for k in range(fan)
            )
            steps.append(SubAgentGroup(workers, tuple(rng.uniform(0, 0.5) for _ in workers)))
    return Trace(name, block_size, SessionScript(name, "main", tuple(steps)), "synthetic")


def synthetic_workload(workflows: int, *, seed: int = 0, block_size: int = 64) -> list[Trace]:
    """``workflows`` seeded workflows (same seed, same traces), in the trace loader's format."""
    if isinstance(workflows, bool) or not isinstance(workflows, int) or workflows < 1:
        raise UsageError("workflows", f"must be an integer >= 1, got {workflows!r}")
    rng = random.Random(seed)
    return [_workflow(rng, i, block_size) for i in range(workflows)]
