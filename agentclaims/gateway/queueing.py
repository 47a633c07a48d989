"""Where a call goes in the engine's queue: a workflow's call ahead of one-shot calls, a
bounded number at a time.

An agent's workflow is a chain of calls, each waiting on the one before: a second one of
its calls spends queued is a second added to the whole workflow, and to every block-second
its claims hold meanwhile. A one-shot call is a single wait. So the gateway sends the SDK's
calls (those with an ``agentclaims`` object: a claimed session's steps) to vLLM with a
higher scheduling priority (``PROMOTED``; vLLM orders its waiting queue by priority, then
arrival, under ``--scheduling-policy priority``, which ``agentclaims vllm serve`` sets with
the connector). A call whose prefix a claim held up to it (it releases a claim the engine
still holds, as the SDK's call does when its claim supersedes the one held across the wait)
has a short prefill: the callers it overtakes wait little for it. A call whose prefix nothing
held makes each of them wait a whole prefill: it goes ahead only where the wait it skips is at
least ``margin`` prefills, as vLLM's own histograms say of the requests it scheduled lately
(``agentclaims.vllm.engine_queue``; until they say, it goes ahead). Promoting every workflow
call kept the matrix's heavy other tenant waiting 1.50x longer at its TTFT p99 in cell 3
(a ~90 ms queue, prefills as long); by this rule 0.93x, while cell 8 (a 3 s queue) kept its
gain (benchmarks/results/2026-12-06-promote-by-time.md). At most ``most`` promoted calls are
in flight at once (until a whole answer is written, or a stream's first token), and none
while more than ``crowd`` workflow calls are: a crowd of agents would fill the engine's batch
by itself, and promoted it would leave one-shot callers only what it does not want.

What the overtaken callers lose is bounded too. Each promotion puts every caller then waiting
back by about the promoted call's prefill, so over any stretch of time their waits grow by the
promoted calls' prefills over the time itself, however many of them wait (Little's law: n
callers waiting wait n seconds a second; a promotion adds n prefills). So each promoted call
is charged its prefill once answered: the tokens vLLM computed for it (its answer's prompt
tokens less the cached ones; a call whose prefix a claim held computes few) times a computed
token's prefill time lately, or vLLM's mean prefill where that is not known (a stream, a
failed call). Promoted calls are paced to take at most ``share`` of the time: a call goes
ahead only once the budget, filling at ``share`` a second, has paid for those before it, and
nothing is saved up in quiet spells (a burst would land on the callers waiting then). Over a
caller's wait of W seconds the promotions add at most ``share * W`` and one prefill per
promoted call in flight. The rest go in arrival order, counted (``over_share``). Issue 42
bounds the other callers' TTFT p99 at 1.2x: ``SHARE`` is three quarters of its 0.2, a quarter
left for the estimate's error (benchmarks/results/2026-12-07-promotion-share.md). What the
other callers pay is measured, not assumed: the matrix benchmark reports the other tenant's
TTFT p99 beside every cell (docs/vllm.md, "Benchmarks").

A caller never sets its own place: the gateway drops a body's ``priority`` field.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from agentclaims.errors import UsageError
from agentclaims.protocol.writer import QueueTimes

__all__ = [
    "CROWD",
    "DECISIONS",
    "DEFAULT_PROMOTED",
    "MARGIN",
    "PROMOTED",
    "SHARE",
    "Promotions",
    "engine_orders",
]

PROMOTED = -1
"""vLLM's ``priority`` for a promoted call (lower goes first; every other call has 0)."""
DEFAULT_PROMOTED = 1
"""Promoted calls in flight at most, by default: one, so a one-shot call waiting in vLLM's
queue is overtaken by at most one workflow call at a time. With four (every agent of a
four-agent cell) the matrix's heavy other tenant waited 2.7x longer at its p99; with one,
1.08x (benchmarks/results/2026-12-06-matrix-promotions.md)."""
CROWD = 4
"""Workflow calls in flight above which none is promoted: half of the batch ``agentclaims
vllm serve`` gives vLLM (``--max-num-seqs 8``). Twelve agents promoted one at a time kept
the matrix's heavy other tenant waiting 1.37x longer at its p99 (cell 15)."""

MARGIN = 2.0
"""An unheld call goes ahead where the queue's wait is at least this many prefills."""
DECISIONS = ("promoted", "passed_over", "short_wait", "over_share")
"""What ``take`` decided for workflow calls, each counted (``Promotions.stats``, ``/metrics``)."""
SHARE = 0.15
"""The share of the time promoted calls may put the callers they overtake back by (each
charged its prefill)."""


def engine_orders(writer: object) -> bool:
    """Whether ``writer``'s engine orders its queue by a call's ``priority``: a vLLM whose
    connector said, at the start, that vLLM runs ``--scheduling-policy priority``
    (``VllmKV.orders_by_priority``). Unknown is no (fail closed): before that answer, on a
    stock vLLM or one scheduling first come, first served, and on the reference engine, no
    call is promoted (and none is counted as promoted)."""
    return getattr(writer, "orders_by_priority", False) is True


class Promotions:
    """The gateway's promoted calls: ``take`` one for a call, ``give_back`` it when the call
    is answered (or its stream has begun); ``most`` 0 promotes none."""

    def __init__(
        self,
        most: int = DEFAULT_PROMOTED,
        crowd: int = CROWD,
        queue: QueueTimes | None = None,
        margin: float = MARGIN,
        share: float = SHARE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(most, bool) or not isinstance(most, int) or most < 0:
            raise UsageError("promote", f"must be a non-negative integer, got {most!r}")
        if isinstance(crowd, bool) or not isinstance(crowd, int) or crowd < 1:
            raise UsageError("crowd", f"must be a positive integer, got {crowd!r}")
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not margin >= 0:
            raise UsageError("margin", f"must be a non-negative number, got {margin!r}")
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
            raise UsageError("share", f"must be a number in (0, 1], got {share!r}")
        self.most = most
        self.crowd = crowd
        self.queue = queue
        """The engine's queue times lately (``None``: unknown, an unheld call goes ahead)."""
        self.margin = margin
        self.share = share
        self._clock = clock
        self._budget = 0.0
        """What the pacing has paid for (never above 0; in debt after a promotion, until
        ``share`` of the time since has paid its prefill)."""
        self._at = clock()
        self.in_flight = 0
        self.workflows = 0
        """Workflow calls in flight, promoted or not."""
        self.promoted = 0
        """Calls promoted so far."""
        self.passed_over = 0
        """Workflow calls that went in arrival order: ``most`` promoted ones, or more than
        ``crowd`` workflow calls, were in flight."""
        self.short_wait = 0
        """Unheld workflow calls that went in arrival order: the queue's wait was under
        ``margin`` prefills."""
        self.over_share = 0
        """Workflow calls that went in arrival order: promoted calls had taken their
        ``share`` of the time lately."""

    def take(self, workflow: bool, held: bool = True) -> int | None:
        """The priority a call goes with: ``PROMOTED`` for a workflow's call while fewer than
        ``most`` promoted ones and at most ``crowd`` workflow calls (itself included) are in
        flight, the engine's queue worth skipping where its prefix is not ``held``, and the
        promoted calls before it paid for (``share``); else ``None`` (vLLM's default). A
        workflow's call counts until ``give_back``."""
        if not workflow or self.most == 0:
            return None
        self.workflows += 1
        if not held and not self.worth_skipping():
            self.short_wait += 1
            return None
        if self.in_flight >= self.most or self.workflows > self.crowd:
            self.passed_over += 1
            return None
        if not self._paid():
            self.over_share += 1
            return None
        self.in_flight += 1
        self.promoted += 1
        return PROMOTED

    def worth_skipping(self) -> bool:
        """Whether the engine's queue lately kept calls at least ``margin`` prefills: unknown
        counts as yes (the figures come with the first calls)."""
        figures = None if self.queue is None else self.queue.figures()
        return figures is None or figures.wait_s >= self.margin * figures.prefill_s

    def _paid(self) -> bool:
        """Whether the promoted calls so far are paid for: the budget, filled at ``share`` a
        second since the last ask (never above 0), is not in debt."""
        now = self._clock()
        self._budget = min(0.0, self._budget + self.share * max(0.0, now - self._at))
        self._at = now
        return self._budget >= 0

    def give_back(
        self, workflow: bool, priority: int | None, computed_tokens: int | None = None
    ) -> None:
        """The call ``take(workflow)`` gave ``priority`` to is answered (or streaming); a
        promoted one is charged its prefill (``cost``)."""
        if workflow and self.most:
            self.workflows -= 1
        if priority is not None:
            self.in_flight -= 1
            self._paid()  # the budget filled up to now, then the charge
            self._budget -= self.cost(computed_tokens)

    def cost(self, computed_tokens: int | None) -> float:
        """What a promoted call puts each overtaken caller back by: the prefill of the
        ``computed_tokens`` its answer says vLLM computed (a computed token's time lately),
        else (a stream, a failed call, an engine that does not count them) vLLM's mean
        prefill lately; nothing before the first figures."""
        figures = None if self.queue is None else self.queue.latest
        if figures is None:
            return 0.0
        if computed_tokens is not None and figures.token_s is not None:
            return figures.token_s * max(0, computed_tokens)
        return figures.prefill_s

    def stats(self) -> dict[str, int | float | None]:
        figures = None if self.queue is None else self.queue.latest
        return {
            "most": self.most,
            "in_flight": self.in_flight,
            "crowd": self.crowd,
            "workflows_in_flight": self.workflows,
            "promoted": self.promoted,
            "passed_over": self.passed_over,
            "short_wait": self.short_wait,
            "over_share": self.over_share,
            "margin": self.margin,
            "share": self.share,
            "queue_wait_s": None if figures is None else round(figures.wait_s, 4),
            "prefill_s": None if figures is None else round(figures.prefill_s, 4),
            "prefill_token_s": None if figures is None else figures.token_s,
        }

    async def aclose(self) -> None:
        if self.queue is not None:
            await self.queue.aclose()
