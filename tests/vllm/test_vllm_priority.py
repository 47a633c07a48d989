"""A workflow's call goes ahead of one-shot calls in the real vLLM's queue (the gateway's
``priority``, ``agentclaims.gateway.queueing``), within the gateway's bound; a caller's own
``priority`` never reaches vLLM.

A vLLM of its own runs two sequences at once (``--max-num-seqs 2``). Two long one-shot calls
straight to vLLM fill it; three more queue behind them; then a call of the SDK's comes
through the gateway, and the test ends the first filler (its client goes away and vLLM aborts
it), freeing one place. The order their first chunks come in (the order vLLM scheduled them)
says who got it: the SDK's call overtakes the calls queued before it, and with ``--promote 0``
it waits its turn behind them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple
from urllib.parse import urlencode

import httpx2
import pytest
from conftest import VllmServer, serve_vllm
from prometheus_client.parser import text_string_to_metric_families
from servers import gateway_process

from agentclaims.vllm.engine_queue import COMPUTED, PATH, PREFILL, QUEUE

pytestmark = pytest.mark.vllm

FILLERS = 2  # the server's --max-num-seqs
QUEUED = 3
RUN = 400  # tokens each queued call and the SDK's decode: each holds its place for a second
# or more, so a call that waits for a place starts well after the one that took it
FILL = 8000  # a filler's tokens at most: the test ends it itself. Long (half a minute or
# more here), so that a loaded machine still builds the queue behind the fillers before they end
# (the CI run of 60a5e95 saw 2,000-token fillers end first in three tries in a row)
TRIES = 3
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
GAUGES_PATH = "/metrics/?" + urlencode([("name[]", name) for name in GAUGES])
"""The two gauges alone (vLLM filters its page by ``name[]``): polled every 50 ms, the whole
page would cost vLLM's API server and the test several ms a read on a shared machine."""


class Round(NamedTuple):
    overtaken: int
    """How many of the calls queued before the SDK's it started ahead of."""
    order: str
    """Who started when (for a failure's message)."""


class QueueNotBuilt(Exception):
    """A call ended before vLLM's queue was as the test needs it (a loaded machine)."""

    sdk_sent = False  # whether the round had sent the gateway its SDK call


@pytest.fixture(scope="module")
def two_seqs(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """vLLM with the connector running two sequences at once, 8,192 tokens long at most, with
    blocks for two whole fillers and the four calls behind them (none is preempted). The tiny
    Llama was built with 2,048 positions; its rotary embedding runs past them, and vLLM lets a
    longer length through with ``VLLM_ALLOW_LONG_MAX_MODEL_LEN``."""
    flags = ("--blocks", "640", "--max-model-len", "8192")
    with serve_vllm(
        tiny_model,
        tmp_path_factory,
        "two-seqs",
        flags=flags,
        extra=("--max-num-seqs", "2"),
        env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"},
    ) as server:
        yield server


async def _done_at(http: httpx2.AsyncClient, url: str, body: dict[str, Any]) -> float:
    """When a completion's answer came (perf_counter)."""
    r = await http.post(url, json=body)
    assert r.status_code == 200, r.text
    return time.perf_counter()


async def _started_at(http: httpx2.AsyncClient, url: str, body: dict[str, Any]) -> float:
    """When a streamed completion's first chunk came (perf_counter): vLLM sends it after the
    request's first step, so the order of first chunks is the order vLLM scheduled the calls
    in. (The order answers end in is not: two calls running at once end in the same step,
    and which answer is handed on first is chance.) The stream is read to its end."""
    started = None
    async with http.stream("POST", url, json={**body, "stream": True}) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if started is None and line.startswith("data:"):
                started = time.perf_counter()
    assert started is not None, "no chunk came"
    return started


async def _filler(url: str, body: dict[str, Any]) -> float:
    """A call on a connection of its own: cancelling it closes the connection, and vLLM
    aborts the request (its routes end a request whose client went away)."""
    async with httpx2.AsyncClient(timeout=120) as http:
        return await _done_at(http, url, body)


def _call(model: str | None, tag: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": f"{tag} go"}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        **extra,
    }
    if model is not None:
        body["model"] = model
    return body


def _log_tail(vllm: VllmServer) -> str:
    """The end of vLLM's log, for a failure's message, without the test's reads of the gauges
    (every 50 ms: they would fill it)."""
    lines = vllm.log.read_text(errors="replace").splitlines()
    return "\n".join(line for line in lines if "/metrics" not in line)[-4000:]


def _outcome(index: int, call: asyncio.Future[float]) -> str:
    """How the ``index``-th call of ``_until``'s list ended: when, or what it raised."""
    if call.cancelled():
        return f"#{index} cancelled"
    failed = call.exception()
    if failed is not None:
        return f"#{index} {failed!r}"
    return f"#{index} answered {time.perf_counter() - call.result():.2f} s ago"


async def _until(
    http: httpx2.AsyncClient,
    vllm: VllmServer,
    calls: Sequence[asyncio.Future[float]],
    running: int,
    waiting: int,
) -> None:
    """Wait (60 s at most) until vLLM's own gauges say so: the queue is built as the test says,
    not guessed from sleeps. vLLM sets them after each engine step, so a slow step shows the
    queue late, not wrongly. ``QueueNotBuilt`` if one of ``calls`` ended first."""
    want = dict(zip(GAUGES, (running, waiting), strict=True))
    seen: dict[str, float] = {}
    states: list[tuple[float, ...]] = []  # each (running, waiting) seen, in order, once
    start = last = time.monotonic()
    deadline, polls, longest = start + 60, 0, 0.0
    while last < deadline:
        text = (await http.get(f"{vllm.url}{GAUGES_PATH}")).text
        polls, now = polls + 1, time.monotonic()
        longest, last = max(longest, now - last), now
        seen = {
            family.name: sum(sample.value for sample in family.samples)
            for family in text_string_to_metric_families(text)
            if family.name in want
        }
        state = tuple(seen.get(name, -1.0) for name in want)
        if not states or states[-1] != state:
            states.append(state)
        ended = [_outcome(i, call) for i, call in enumerate(calls) if call.done()]
        if ended:
            raise QueueNotBuilt(
                f"call {ended} ended before vLLM's queue reached {want}: {seen} "
                f"({polls} reads in {now - start:.2f} s, the longest gap {longest:.2f} s; "
                f"(running, waiting) {states})"
            )
        if seen == want:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"vLLM's queue never reached {want}: {seen}\n{_log_tail(vllm)}")


async def _round(http: httpx2.AsyncClient, vllm: VllmServer, gateway: str, tag: str) -> Round:
    """Two fillers hold vLLM's two places, three one-shot calls queue behind them, then the
    SDK's call; the test ends the first filler, freeing one place. Returns how many of the
    calls queued before it the SDK's call started ahead of (its first chunk came first)."""
    direct = f"{vllm.url}/v1/chat/completions"
    fill = [
        asyncio.ensure_future(_filler(direct, _call(vllm.model, f"{tag}f{i}", FILL)))
        for i in range(FILLERS)
    ]
    queued: list[asyncio.Future[float]] = []
    sdk: asyncio.Future[float] | None = None
    try:
        await _until(http, vllm, fill, running=FILLERS, waiting=0)
        queued = [
            asyncio.ensure_future(_started_at(http, direct, _call(vllm.model, f"{tag}q{i}", RUN)))
            for i in range(QUEUED)
        ]
        await _until(http, vllm, [*fill, *queued], running=FILLERS, waiting=QUEUED)
        # the SDK's call, asking for the head of the queue itself as well (dropped)
        body = _call(None, f"{tag}sdk", RUN, priority=-100, agentclaims={"owner_scope": tag})
        sdk = asyncio.ensure_future(_started_at(http, f"{gateway}/v1/chat/completions", body))
        # queued while both fillers still ran: the first place freed is the one it may take
        await _until(http, vllm, [*fill, *queued, sdk], running=FILLERS, waiting=QUEUED + 1)
        fill[0].cancel()
        freed = time.perf_counter()
        mine = await sdk
        theirs = await asyncio.gather(*queued)
        order = ", ".join(
            f"{name} {at - freed:+.2f} s"
            for name, at in sorted(
                [("sdk", mine), *((f"q{i}", t) for i, t in enumerate(theirs))],
                key=lambda item: item[1],
            )
        )
        return Round(sum(mine < t for t in theirs), f"first chunks after the place freed: {order}")
    except QueueNotBuilt as failed:
        failed.sdk_sent = sdk is not None
        raise
    finally:
        for filler in fill:
            filler.cancel()
        await asyncio.gather(*fill, *queued, *([sdk] if sdk else []), return_exceptions=True)
        await _until(http, vllm, [], running=0, waiting=0)


async def _overtaken(
    vllm: VllmServer, gateway: str, tag: str, expected: Callable[[int], bool]
) -> tuple[int, int]:
    """``_round``, built again (``TRIES`` at most) where a loaded machine let a call end before
    the queue stood, or where the order of first chunks was not ``expected`` (the test reads
    that order on its own shared cores: a round a stall of the test's process reordered is
    tried again; a gateway that does not promote fails every round). Returns the count of the
    round that met ``expected`` and how many SDK calls the gateway was sent."""
    async with httpx2.AsyncClient(timeout=120) as http:
        # the gateway's first call starts its side (the connector's handshake) and takes no
        # promotion: the one measured is the second; and vLLM's first steps of two sequences
        # at once are taken here
        warm = await http.post(f"{gateway}/v1/chat/completions", json=_call(None, tag, 1))
        assert warm.status_code == 200, warm.text
        direct = f"{vllm.url}/v1/chat/completions"
        await asyncio.gather(*(_done_at(http, direct, _call(vllm.model, tag, 8)) for _ in "ab"))
        sent = 0
        failures: list[str] = []
        for attempt in range(TRIES):
            try:
                round_ = await _round(http, vllm, gateway, f"{tag}{attempt}")
            except QueueNotBuilt as failed:
                sent += failed.sdk_sent
                failures.append(str(failed))
                continue
            sent += 1
            if expected(round_.overtaken):
                return round_.overtaken, sent
            promotions = (await http.get(f"{gateway}/v1/stats")).json()["gateway"]["promotions"]
            failures.append(f"overtook {round_.overtaken}: {round_.order}; {promotions}")
        # (every try: what ended each, or the order it saw, and vLLM's log, its engine's death
        # included)
        raise AssertionError("\n".join([*failures, _log_tail(vllm)]))


async def test_a_workflows_call_goes_ahead_of_one_shot_calls_queued_before_it(
    two_seqs: VllmServer,
) -> None:
    args = ("--kv", "vllm", "--upstream", two_seqs.url, "--claims-key", two_seqs.key)
    with gateway_process(*args) as gateway:
        overtaken, sent = await _overtaken(
            two_seqs, gateway, "prio-on", lambda overtaken: overtaken >= QUEUED - 1
        )
        async with httpx2.AsyncClient(timeout=30) as http:
            stats = (await http.get(f"{gateway}/v1/stats")).json()["gateway"]["promotions"]
    # the connector said vLLM orders its queue by priority; the first place freed went to it
    assert stats["engine_orders_by_priority"] is True, stats
    # every SDK call sent was promoted, or went in arrival order for a reason the gateway
    # counts: a try the loaded machine spoiled can leave vLLM's figures saying its queue was
    # short (``short_wait``), and the next try's call then waits its turn
    assert stats["promoted"] >= 1, stats
    counted = ("promoted", "short_wait", "passed_over", "over_share")
    assert sum(stats[k] for k in counted) == sent, (stats, sent)
    # and vLLM's own queue and prefill times were read (from its /metrics) for the next ones
    assert stats["queue_wait_s"] is not None, stats
    assert stats["prefill_s"] is not None, stats
    assert stats["prefill_token_s"] is not None, stats  # a computed token's prefill time
    async with httpx2.AsyncClient(timeout=30) as http:  # the six series only, as it reads them
        filtered = await http.get(f"{two_seqs.url}{PATH}")
    series = {line.split("{")[0] for line in filtered.text.splitlines() if line[:1] != "#"}
    assert filtered.status_code == 200
    names = (QUEUE, PREFILL, COMPUTED)
    assert series == {f"{name}_{part}" for name in names for part in ("sum", "count")}
    assert overtaken >= QUEUED - 1, overtaken
    assert stats["in_flight"] == stats["workflows_in_flight"] == 0

    with gateway_process(*args, "--promote", "0") as gateway:
        overtaken, _ = await _overtaken(
            two_seqs, gateway, "prio-off", lambda overtaken: overtaken <= 1
        )
    # unpromoted, it waits behind them: its own priority -100 never reached vLLM
    assert overtaken <= 1, overtaken
