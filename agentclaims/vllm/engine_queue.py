"""``EngineQueue``: how long calls have lately waited in vLLM's queue, and how long a prefill
took, from vLLM's own histograms.

vLLM times every request it schedules: ``vllm:request_queue_time_seconds`` (arrival to
first scheduled) and ``vllm:request_prefill_time_seconds`` (first scheduled to first token),
and counts the tokens its prefill computed (``vllm:request_prefill_kv_computed_tokens``, the
cached ones left out): the prefill time over those tokens is a computed token's time.
Between two reads of its ``/metrics``, the change of a histogram's sum over the change of its
count is the mean over the requests scheduled in between (at the first read, since vLLM
began), whoever sent them. The gateway's promotions weigh one against the other
(``agentclaims.gateway.queueing``): the wait a workflow's call skips against the prefill the
callers it overtakes then wait for.

Reads are made only while calls come (``figures`` starts one when the last is older than
``every_s``) and never two at once; a read that fails, or a vLLM that began its counts again
(a restart), leaves the figures as they were or starts them afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from urllib.parse import urlencode

from prometheus_client.parser import text_string_to_metric_families

from agentclaims.protocol.writer import QueueFigures

__all__ = ["EngineQueue", "QueueFigures"]

log = logging.getLogger(__name__)

QUEUE = "vllm:request_queue_time_seconds"
PREFILL = "vllm:request_prefill_time_seconds"
COMPUTED = "vllm:request_prefill_kv_computed_tokens"
_READ = tuple(f"{name}_{part}" for name in (QUEUE, PREFILL, COMPUTED) for part in ("sum", "count"))
PAGE = "/metrics"
PATH = "/metrics/?" + urlencode([("name[]", name) for name in _READ])
"""vLLM's metrics asked for the six series only (prometheus_client's ``name[]`` filter): vLLM
0.32 answers ``/metrics`` with its whole page (58 KB, about 5-8 ms of its API server's CPU on
the tiny model) whatever the query, and ``/metrics/`` from prometheus_client's own app, which
filters (under 1 KB, about 0.5 ms). A vLLM that answers it 404 is read at ``PAGE`` after."""
WEIGHT = 0.5
"""How much one read's means count against what came before (an exponential average)."""


def _mixed(fresh: QueueFigures, old: QueueFigures) -> QueueFigures:
    """``fresh`` weighed against ``old`` (``WEIGHT``); a token's time unknown on one side is
    the other's."""
    token_s = fresh.token_s if old.token_s is None else old.token_s
    if fresh.token_s is not None and old.token_s is not None:
        token_s = WEIGHT * fresh.token_s + (1 - WEIGHT) * old.token_s
    return QueueFigures(
        WEIGHT * fresh.wait_s + (1 - WEIGHT) * old.wait_s,
        WEIGHT * fresh.prefill_s + (1 - WEIGHT) * old.prefill_s,
        token_s,
    )


class EngineQueue:
    """vLLM's queue and prefill times lately; ``figures()`` is ``None`` until a read saw
    requests scheduled."""

    def __init__(
        self,
        get_text: Callable[..., Awaitable[tuple[int, str]]],
        every_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._get_text = get_text
        self.every_s = every_s
        self._clock = clock
        self._last_read = -float("inf")
        self._path = PATH
        self._reading: asyncio.Task[None] | None = None
        self._totals = dict.fromkeys(_READ, 0.0)
        """The histograms' sums and counts at the last read (zeros before the first: its
        means are since vLLM began)."""
        self._figures: QueueFigures | None = None

    @property
    def latest(self) -> QueueFigures | None:
        """The figures as the last read left them (reads nothing)."""
        return self._figures

    def figures(self) -> QueueFigures | None:
        """The latest figures; starts a read (in the background) when the last is stale."""
        now = self._clock()
        if now - self._last_read >= self.every_s and self._reading is None:
            self._last_read = now
            self._reading = asyncio.get_running_loop().create_task(self._read())
        return self._figures

    async def _read(self) -> None:
        try:
            status, text = await self._get_text(self._path, timeout_s=5.0)
            if status == 200:
                self.absorb(text)
            elif status == 404 and self._path != PAGE:
                self._path = PAGE  # no filtered page here: the whole one from now on
        except Exception as exc:  # a figure missed: the next read tries again
            log.debug("vLLM's /metrics not read: %s", exc)
        finally:
            self._reading = None

    def absorb(self, text: str) -> None:
        """Take in one ``/metrics`` page (Prometheus text): the six series' answer, or a
        whole page, whose other lines are left out before parsing."""
        wanted = "\n".join(line for line in text.splitlines() if line.startswith(_READ))
        totals = dict.fromkeys(_READ, 0.0)
        for family in text_string_to_metric_families(wanted + "\n"):
            for sample in family.samples:
                if sample.name in totals:  # every engine's, summed
                    totals[sample.name] += sample.value
        before, self._totals = self._totals, totals
        waited = totals[f"{QUEUE}_count"] - before[f"{QUEUE}_count"]
        filled = totals[f"{PREFILL}_count"] - before[f"{PREFILL}_count"]
        if waited < 0 or filled < 0:  # vLLM counts from zero again: figures afresh
            self._figures = None
            return
        if waited == 0 or filled == 0:
            return
        computed = totals[f"{COMPUTED}_sum"] - before[f"{COMPUTED}_sum"]
        prefilled = totals[f"{PREFILL}_sum"] - before[f"{PREFILL}_sum"]
        fresh = QueueFigures(
            (totals[f"{QUEUE}_sum"] - before[f"{QUEUE}_sum"]) / waited,
            prefilled / filled,
            prefilled / computed if computed > 0 else None,
        )
        old = self._figures
        self._figures = fresh if old is None else _mixed(fresh, old)

    async def aclose(self) -> None:
        if self._reading is not None:
            self._reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reading
