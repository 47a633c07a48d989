"""Where a call goes in the engine's queue: a workflow's call ahead of one-shot calls, a
bounded number at a time.

An agent's workflow is a chain of calls, each waiting on the one before: a second one of
its calls spends queued is a second added to the whole workflow, and to every block-second
its claims hold meanwhile. A one-shot call is a single wait. So the gateway sends the SDK's
calls (those with an ``agentclaims`` object: a claimed session's steps) to vLLM with a
higher scheduling priority (``PROMOTED``; vLLM orders its waiting queue by priority, then
arrival, under ``--scheduling-policy priority``, which ``agentclaims vllm serve`` sets with
the connector). At most ``most`` promoted calls are in flight at once (until a whole answer
is written, or a stream's first token): the rest go in arrival order, as every call does on
an engine without the policy, so one-shot callers keep their share of the engine. What the
other callers pay is measured, not assumed: the matrix benchmark reports the other tenant's
TTFT p99 beside every cell (docs/benchmarks.md).

A caller never sets its own place: the gateway drops a body's ``priority`` field.
"""

from __future__ import annotations

from agentclaims.errors import UsageError

__all__ = ["DEFAULT_PROMOTED", "PROMOTED", "Promotions"]

PROMOTED = -1
"""vLLM's ``priority`` for a promoted call (lower goes first; every other call has 0)."""
DEFAULT_PROMOTED = 1
"""Promoted calls in flight at most, by default: one, so a one-shot call waiting in vLLM's
queue is overtaken by at most one workflow call at a time. With four (every agent of a
four-agent cell) the matrix's heavy other tenant waited 2.7x longer at its p99; with one,
1.08x (benchmarks/results/2026-12-06-matrix-promotions.md)."""


class Promotions:
    """The gateway's promoted calls: ``take`` one for a call, ``give_back`` it when the call
    is answered (or its stream has begun); ``most`` 0 promotes none."""

    def __init__(self, most: int = DEFAULT_PROMOTED) -> None:
        if isinstance(most, bool) or not isinstance(most, int) or most < 0:
            raise UsageError("promote", f"must be a non-negative integer, got {most!r}")
        self.most = most
        self.in_flight = 0
        self.promoted = 0
        """Calls promoted so far."""
        self.passed_over = 0
        """Workflow calls that went in arrival order: ``most`` were in flight."""

    def take(self, workflow: bool) -> int | None:
        """The priority a call goes with: ``PROMOTED`` for a workflow's call while fewer than
        ``most`` are in flight (it then counts as one until ``give_back``), else ``None``
        (vLLM's default)."""
        if not workflow or self.most == 0:
            return None
        if self.in_flight >= self.most:
            self.passed_over += 1
            return None
        self.in_flight += 1
        self.promoted += 1
        return PROMOTED

    def give_back(self, priority: int | None) -> None:
        """The call ``take`` gave ``priority`` to is answered (or streaming)."""
        if priority is not None:
            self.in_flight -= 1

    def stats(self) -> dict[str, int]:
        return {
            "most": self.most,
            "in_flight": self.in_flight,
            "promoted": self.promoted,
            "passed_over": self.passed_over,
        }
