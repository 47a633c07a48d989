"""How long tools take, and how long to keep a program's KV pinned across a tool call.

:class:`ToolTimeModel` keeps, per tool name, a bounded history of observed durations, its
empirical CDF ``F``, and Continuum's TTL rule (arXiv 2511.02230)::

    B    = T * eta + reload_s          # what an eviction costs the next turn, in seconds
    tau* = argmax_{tau in {0} ∪ observed} F(tau) * B - tau

``T`` is the recent queueing delay of evicted requests, ``eta`` a turn-correlation factor,
``reload_s`` the time to recompute (or reload) the context. With few samples (``<=
cold_start_samples``, 100 as in the paper) an exponential prior with the observed mean ``mu``
(or ``prior_mean_s`` when nothing was observed) gives ``tau* = mu * ln(B / mu)`` if ``B > mu``,
else 0.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from collections.abc import Iterable
from typing import Literal

from agentclaims.errors import UnknownNameError, UsageError

__all__ = ["ToolTimeModel"]

_TTL_CANDIDATES = 64
"""Most candidate TTLs ``ToolTimeModel.ttl`` evaluates (order statistics of the history)."""


class ToolTimeModel:
    """Per-tool duration history, empirical CDF, prediction and Continuum TTL."""

    __slots__ = ("_cold_start", "_history", "_node_tools", "_prior_mean", "_samples", "_sorted")

    def __init__(
        self,
        *,
        history: int = 1000,
        cold_start_samples: int = 100,
        prior_mean_s: float = 1.0,
    ) -> None:
        if isinstance(history, bool) or not isinstance(history, int) or history < 1:
            raise UsageError("history", f"must be an integer >= 1, got {history!r}")
        if (
            isinstance(cold_start_samples, bool)
            or not isinstance(cold_start_samples, int)
            or cold_start_samples < 0
        ):
            raise UsageError(
                "cold_start_samples", f"must be an integer >= 0, got {cold_start_samples!r}"
            )
        _check_seconds("prior_mean_s", prior_mean_s, positive=True)
        self._history = history
        self._cold_start = cold_start_samples
        self._prior_mean = float(prior_mean_s)
        self._samples: dict[str, deque[float]] = {}
        self._sorted: dict[str, list[float]] = {}
        self._node_tools: dict[str, tuple[str, ...]] = {}

    @property
    def tools(self) -> list[str]:
        """Names of the tools observed so far, sorted."""
        return sorted(self._samples)

    def note_node_tools(self, node: str, tools: Iterable[str]) -> None:
        """The tools ``node``'s last reply called, in any run sharing this model: what its
        next run's first reply is expected to call (its wait learned under their names)."""
        self._node_tools[node] = tuple(tools)

    def node_tools(self, node: str) -> tuple[str, ...] | None:
        """The tools ``node``'s last reply called in any run sharing this model, if known."""
        return self._node_tools.get(node)

    def observe(self, tool: str, seconds: float) -> None:
        """Record that ``tool`` took ``seconds`` (the oldest sample drops past ``history``)."""
        _check_tool(tool)
        _check_seconds("seconds", seconds)
        samples = self._samples.get(tool)
        if samples is None:
            samples = self._samples[tool] = deque(maxlen=self._history)
        ordered = self._sorted.get(tool)
        value = float(seconds)
        if ordered is not None:  # kept sorted as it goes: no sort per prediction
            if len(samples) == self._history:
                del ordered[bisect.bisect_left(ordered, samples[0])]
            bisect.insort(ordered, value)
        samples.append(value)

    def observe_many(self, tool: str, durations: Iterable[float]) -> None:
        """Record several durations of ``tool`` (all are checked before any is recorded)."""
        _check_tool(tool)
        values = list(durations)
        for value in values:
            _check_seconds("durations", value)
        for value in values:
            self.observe(tool, value)

    def samples(self, tool: str) -> tuple[float, ...]:
        """The durations kept for ``tool``, oldest first."""
        _check_tool(tool)
        return tuple(self._samples.get(tool, ()))

    def count(self, tool: str) -> int:
        """How many durations are kept for ``tool``."""
        _check_tool(tool)
        return len(self._samples.get(tool, ()))

    def cdf(self, tool: str, seconds: float) -> float:
        """Empirical ``F(seconds)``: the fraction of kept durations ``<= seconds`` (0 if none)."""
        _check_tool(tool)
        if math.isnan(seconds):
            raise UsageError("seconds", "must not be NaN")
        ordered = self._ordered(tool)
        if not ordered:
            return 0.0
        return bisect.bisect_right(ordered, seconds) / len(ordered)

    def mean(self, tool: str) -> float:
        """Mean observed duration of ``tool``, or the prior mean when nothing was observed."""
        _check_tool(tool)
        samples = self._samples.get(tool)
        return statistics.fmean(samples) if samples else self._prior_mean

    def predict(self, tool: str, *, statistic: Literal["median", "mean"] = "median") -> float:
        """Expected duration of ``tool``: the median (default) or mean of the kept durations;
        the prior mean when nothing was observed."""
        _check_tool(tool)
        if statistic not in ("median", "mean"):
            raise UnknownNameError("statistic", statistic, ("median", "mean"))
        ordered = self._ordered(tool)
        if not ordered:
            return self._prior_mean
        if statistic == "mean":
            return statistics.fmean(ordered)
        return _median(ordered)

    def ttl(
        self,
        tool: str,
        *,
        queue_delay_s: float,
        eta: float = 1.0,
        reload_s: float = 0.0,
    ) -> float:
        """Continuum's pin TTL ``tau*`` in seconds for a call of ``tool`` (see module doc).

        ``queue_delay_s`` is ``T``, ``eta`` the turn-correlation factor, ``reload_s`` the
        recompute/reload time of the context. Ties go to the shortest TTL.
        """
        _check_tool(tool)
        _check_seconds("queue_delay_s", queue_delay_s)
        _check_seconds("eta", eta)
        _check_seconds("reload_s", reload_s)
        return self._ttl(self._ordered(tool), queue_delay_s * eta + reload_s)

    def _ttl(self, ordered: list[float], benefit: float) -> float:
        if len(ordered) <= self._cold_start:
            mu = statistics.fmean(ordered) if ordered else self._prior_mean
            if mu <= 0.0:
                return 0.0
            return mu * math.log(benefit / mu) if benefit > mu else 0.0
        return _continuum_tau(ordered, benefit)

    def forecast(
        self, tool: str, *, queue_delay_s: float, reload_s: float = 0.0, waited_s: float = 0.0
    ) -> tuple[float, float]:
        """``(predict(tool), ttl(tool, queue_delay_s=..., reload_s=...))`` in one call (the
        session's per-call path asks for both).

        ``waited_s``: the wait began that long ago and is not over. Both figures then come
        from the durations longer than it, less it (the wait's remaining time, given that it
        lasted this long): a claim renewed mid-wait gets the TTL the rest of the wait needs,
        not the whole wait's again. A wait longer than every one observed falls back to the
        prior (the exponential's remaining time does not depend on the time waited)."""
        _check_tool(tool)
        _check_seconds("queue_delay_s", queue_delay_s)
        _check_seconds("reload_s", reload_s)
        _check_seconds("waited_s", waited_s)
        ordered = self._ordered(tool)
        if waited_s > 0.0 and ordered:
            ordered = [d - waited_s for d in ordered[bisect.bisect_right(ordered, waited_s) :]]
        return (
            _median(ordered) if ordered else self._prior_mean,
            self._ttl(ordered, queue_delay_s + reload_s),
        )

    def __repr__(self) -> str:
        return f"ToolTimeModel(tools={len(self._samples)}, history={self._history})"

    def _ordered(self, tool: str) -> list[float]:
        ordered = self._sorted.get(tool)
        if ordered is None:
            ordered = sorted(self._samples.get(tool, ()))
            self._sorted[tool] = ordered
        return ordered


def _continuum_tau(ordered: list[float], benefit: float) -> float:
    """``argmax_tau F(tau) * benefit - tau`` over ``tau = 0`` and the candidate durations of
    the sorted history ``ordered``; ties go to the shortest ``tau``.

    Candidates: every observed duration up to ``_TTL_CANDIDATES`` of them, else that many
    evenly spaced order statistics (F is exact at each; the argmax is then within ``benefit /
    _TTL_CANDIDATES`` of the exact one), so a call costs the same at any history. They are
    tried longest first: ``F * benefit`` only falls from one to the next and durations are
    ``>= 0``, so once it is below the best value found (or not above the value at 0) no
    shorter candidate can win, and the search stops there with the same answer as trying all.
    """
    n = len(ordered)
    right = bisect.bisect_right
    at_zero = right(ordered, 0.0) / n * benefit  # tau = 0
    best, best_tau = -math.inf, 0.0
    step = max(1, n // _TTL_CANDIDATES)
    last = n - 1
    for i in reversed(range(step - 1, n, step)):
        tau = ordered[i]
        # F(ordered[i]) counts the durations up to ordered[i]: i + 1 unless equal ones follow
        j = i + 1 if i == last or ordered[i + 1] != tau else right(ordered, tau, i + 1)
        gain = j / n * benefit
        if gain < best or gain <= at_zero:
            break
        value = gain - tau
        if value >= best:  # the shorter of equal values
            best, best_tau = value, tau
    return best_tau if best > at_zero else 0.0


def _median(ordered: list[float]) -> float:
    """The median of a sorted non-empty list (as ``statistics.median``, without sorting it)."""
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2


def _check_tool(tool: object) -> None:
    if not isinstance(tool, str) or not tool.strip():
        raise UsageError("tool", f"must be a non-empty string, got {tool!r}")


def _check_seconds(field: str, value: object, *, positive: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageError(field, f"must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise UsageError(field, f"must be a finite number {bound}, got {value!r}")
