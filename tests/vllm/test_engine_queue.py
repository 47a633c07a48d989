"""``EngineQueue`` (``agentclaims.vllm.engine_queue``) on Prometheus text as
``prometheus_client`` writes it, with vLLM's histogram names: the means between two reads
over the requests scheduled in between, an average over reads (the first: since vLLM
began), nothing from a read that saw no request, figures afresh after a restart (counts
lower), reads started only when stale and one at a time, a failed read changing nothing.
A computed token's prefill time is the prefill time over the tokens vLLM says it computed
(none said: ``None``, the other figures as ever). A read asks for the six series only (prometheus_client's ``name[]`` filter, which vLLM's
``/metrics`` serves); a whole page is read as well. The real vLLM's own answer is read in
tests/vllm/test_vllm_priority.py."""

from __future__ import annotations

import asyncio
from urllib.parse import parse_qs, urlsplit

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from agentclaims.vllm.engine_queue import (
    COMPUTED,
    PAGE,
    PATH,
    PREFILL,
    QUEUE,
    WEIGHT,
    EngineQueue,
    QueueFigures,
)


def _near(wait_s: float, prefill_s: float) -> object:
    """Equal to ``QueueFigures`` near these (``pytest.approx`` does not read dataclasses)."""

    class Near:
        def __eq__(self, other: object) -> bool:
            return isinstance(other, QueueFigures) and (other.wait_s, other.prefill_s) == (
                pytest.approx(wait_s),
                pytest.approx(prefill_s),
            )

        def __repr__(self) -> str:
            return f"~QueueFigures({wait_s}, {prefill_s})"

    return Near()


class _Vllm:
    """vLLM's two histograms, in a registry of their own (two engines, as vLLM labels them)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ["engine", "model_name"]
        self.queue = Histogram(
            "vllm:request_queue_time_seconds", "", labels, registry=self.registry
        )
        self.prefill = Histogram(
            "vllm:request_prefill_time_seconds", "", labels, registry=self.registry
        )
        self.computed = Histogram(
            "vllm:request_prefill_kv_computed_tokens", "", labels, registry=self.registry
        )
        self.pages = 0
        self.paths: list[str] = []

    def schedule(
        self, wait_s: float, prefill_s: float, engine: str = "0", computed: int | None = None
    ) -> None:
        self.queue.labels(engine, "m").observe(wait_s)
        self.prefill.labels(engine, "m").observe(prefill_s)
        if computed is not None:
            self.computed.labels(engine, "m").observe(computed)

    def page(self) -> str:
        return generate_latest(self.registry).decode()

    async def get_text(self, path: str, *, timeout_s: float) -> tuple[int, str]:
        """``/metrics/`` as vLLM's prometheus_client app answers it: only the samples its
        ``name[]`` parameters name (``/metrics``: the whole page)."""
        self.paths.append(path)
        url = urlsplit(path)
        if url.path == "/metrics":
            self.pages += 1
            return 200, self.page()
        assert url.path == "/metrics/"
        names = parse_qs(url.query)["name[]"]
        assert sorted(names) == sorted(
            f"{h}_{part}" for h in (QUEUE, PREFILL, COMPUTED) for part in ("sum", "count")
        )
        self.pages += 1
        return 200, generate_latest(self.registry.restricted_registry(names)).decode()


def test_the_means_between_reads_averaged_over_reads() -> None:
    vllm = _Vllm()
    queue = EngineQueue(vllm.get_text)
    queue.absorb(vllm.page())  # nothing scheduled yet
    assert queue.latest is None
    vllm.schedule(0.2, 0.1)
    vllm.schedule(0.4, 0.3, engine="1")
    queue.absorb(vllm.page())
    assert queue.latest == _near(0.3, 0.2)
    queue.absorb(vllm.page())  # nothing scheduled since: unchanged
    assert queue.latest == _near(0.3, 0.2)
    vllm.schedule(1.3, 0.2)
    queue.absorb(vllm.page())
    mixed = QueueFigures(WEIGHT * 1.3 + (1 - WEIGHT) * 0.3, WEIGHT * 0.2 + (1 - WEIGHT) * 0.2)
    assert queue.latest == _near(mixed.wait_s, mixed.prefill_s)


def test_a_computed_tokens_prefill_time_is_the_prefill_over_the_tokens_computed() -> None:
    vllm = _Vllm()
    queue = EngineQueue(vllm.get_text)
    vllm.schedule(0.2, 0.3, computed=900)
    vllm.schedule(0.2, 0.1, computed=100)
    queue.absorb(vllm.page())
    assert queue.latest is not None
    assert queue.latest.token_s == pytest.approx(0.4 / 1000)
    vllm.schedule(0.2, 0.05)  # a request whose computed tokens the page does not count
    queue.absorb(vllm.page())
    assert queue.latest.token_s == pytest.approx(0.4 / 1000)  # nothing to divide: kept
    vllm.schedule(0.2, 0.2, computed=100)
    queue.absorb(vllm.page())
    fresh = 0.2 / 100
    assert queue.latest.token_s == pytest.approx(WEIGHT * fresh + (1 - WEIGHT) * 0.4 / 1000)
    other = _Vllm()  # an engine that counts no computed tokens
    unsaid = EngineQueue(other.get_text)
    other.schedule(0.2, 0.3)
    unsaid.absorb(other.page())
    assert unsaid.latest == _near(0.2, 0.3)
    assert unsaid.latest.token_s is None


def test_the_first_read_gives_the_means_since_vllm_began() -> None:
    vllm = _Vllm()
    vllm.schedule(0.1, 0.5)
    vllm.schedule(0.3, 0.1)
    queue = EngineQueue(vllm.get_text)
    queue.absorb(vllm.page())
    assert queue.latest == _near(0.2, 0.3)


def test_a_restarted_vllm_starts_the_figures_afresh() -> None:
    vllm = _Vllm()
    queue = EngineQueue(vllm.get_text)
    queue.absorb(vllm.page())
    vllm.schedule(0.5, 0.1)
    queue.absorb(vllm.page())
    assert queue.latest is not None
    restarted = _Vllm()
    queue.absorb(restarted.page())  # every count lower: a new process
    assert queue.latest is None
    restarted.schedule(0.05, 0.1)
    queue.absorb(restarted.page())
    assert queue.latest == _near(0.05, 0.1)


async def test_reads_start_when_stale_one_at_a_time_and_a_failed_one_changes_nothing() -> None:
    vllm = _Vllm()
    now = [0.0]
    queue = EngineQueue(vllm.get_text, every_s=1.0, clock=lambda: now[0])
    assert queue.figures() is None
    assert queue.figures() is None  # fresh: no second read
    await asyncio.sleep(0)
    assert vllm.pages == 1
    vllm.schedule(0.4, 0.1)
    now[0] = 1.0
    queue.figures()
    await asyncio.sleep(0)
    assert vllm.pages == 2
    assert vllm.paths == [PATH, PATH]  # the four series only
    assert queue.figures() == _near(0.4, 0.1)

    async def broken(path: str, *, timeout_s: float) -> tuple[int, str]:
        raise OSError("connection refused")

    queue._get_text = broken
    now[0] = 2.0
    queue.figures()
    await asyncio.sleep(0)
    assert queue.latest == _near(0.4, 0.1)
    await queue.aclose()


async def test_a_vllm_without_the_filtered_page_is_read_whole() -> None:
    vllm = _Vllm()
    answers: list[str] = []

    async def no_filter(path: str, *, timeout_s: float) -> tuple[int, str]:
        answers.append(path)
        if path != PAGE:
            return 404, "Not Found"
        return await vllm.get_text(path, timeout_s=timeout_s)

    now = [0.0]
    queue = EngineQueue(no_filter, clock=lambda: now[0])
    queue.figures()
    await asyncio.sleep(0)
    vllm.schedule(0.3, 0.1)
    now[0] = 1.0
    queue.figures()
    await asyncio.sleep(0)
    assert answers == [PATH, PAGE]
    assert queue.latest == _near(0.3, 0.1)
    await queue.aclose()
