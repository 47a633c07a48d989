"""A workflow's call goes ahead of one-shot calls in the real vLLM's queue (the gateway's
``priority``, ``agentclaims.gateway.queueing``), within the gateway's bound; a caller's own
``priority`` never reaches vLLM.

A vLLM of its own runs two sequences at once (``--max-num-seqs 2``). Two long one-shot calls
straight to vLLM fill it, one ending seconds before the other; three more queue behind them;
then a call of the SDK's comes through the gateway. The order the answers come in says who
got the freed place first: the SDK's call overtakes the calls queued before it, and with
``--promote 0`` it waits its turn behind them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from conftest import VllmServer, serve_vllm
from prometheus_client.parser import text_string_to_metric_families
from servers import gateway_process

pytestmark = pytest.mark.vllm

FILLERS = 2  # the server's --max-num-seqs
QUEUED = 3
RUN = 400  # tokens each queued call and the SDK's decode: one after another, they end about
# two seconds apart (vLLM's API server hands answers on in bursts of up to a second here)


@pytest.fixture(scope="module")
def two_seqs(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """vLLM with the connector running two sequences at once, 2,048 tokens long at most."""
    flags = ("--blocks", "160", "--max-model-len", "2048")
    with serve_vllm(
        tiny_model, tmp_path_factory, "two-seqs", flags=flags, extra=("--max-num-seqs", "2")
    ) as server:
        yield server


async def _done_at(http: httpx2.AsyncClient, url: str, body: dict[str, Any]) -> float:
    """When a completion's answer came (perf_counter)."""
    r = await http.post(url, json=body)
    assert r.status_code == 200, r.text
    return time.perf_counter()


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


async def _until(http: httpx2.AsyncClient, vllm: VllmServer, running: int, waiting: int) -> None:
    """Wait (10 s at most) until vLLM's own gauges say so: the queue is built as the test says,
    not guessed from sleeps (a loaded machine can take longer to hand a call on)."""
    want = {"vllm:num_requests_running": running, "vllm:num_requests_waiting": waiting}
    seen: dict[str, float] = {}
    for _ in range(200):
        text = (await http.get(f"{vllm.url}/metrics")).text
        seen = {
            family.name: sum(sample.value for sample in family.samples)
            for family in text_string_to_metric_families(text)
            if family.name in want
        }
        if seen == want:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"vLLM's queue never reached {want}: {seen}")


async def _overtaken(vllm: VllmServer, gateway: str, tag: str) -> int:
    """How many of the calls queued before it the SDK's call finished ahead of."""
    direct = f"{vllm.url}/v1/chat/completions"
    async with httpx2.AsyncClient(timeout=120) as http:
        # the gateway's first call starts its side (the connector's handshake) and takes no
        # promotion: the one measured below is the second
        warm = await http.post(f"{gateway}/v1/chat/completions", json=_call(None, tag, 1))
        assert warm.status_code == 200, warm.text
        fill = [
            asyncio.ensure_future(
                _done_at(http, direct, _call(vllm.model, f"{tag}f{i}", 1000 * (i + 1)))
            )
            for i in range(FILLERS)
        ]
        await _until(http, vllm, running=FILLERS, waiting=0)
        queued = [
            asyncio.ensure_future(_done_at(http, direct, _call(vllm.model, f"{tag}q{i}", RUN)))
            for i in range(QUEUED)
        ]
        await _until(http, vllm, running=FILLERS, waiting=QUEUED)  # in arrival order
        # the SDK's call, asking for the head of the queue itself as well (dropped)
        body = _call(None, f"{tag}sdk", RUN, priority=-100, agentclaims={"owner_scope": tag})
        sdk = asyncio.ensure_future(_done_at(http, f"{gateway}/v1/chat/completions", body))
        await _until(http, vllm, running=FILLERS, waiting=QUEUED + 1)
        # queued while both fillers still ran: the first place freed is the one it may take
        assert not any(f.done() for f in fill), "a filler ended before the SDK's call queued"
        mine = await sdk
        theirs = await asyncio.gather(*queued)
        await asyncio.gather(*fill)
    return sum(mine < t for t in theirs)


async def test_a_workflows_call_goes_ahead_of_one_shot_calls_queued_before_it(
    two_seqs: VllmServer,
) -> None:
    args = ("--kv", "vllm", "--upstream", two_seqs.url, "--claims-key", two_seqs.key)
    with gateway_process(*args) as gateway:
        overtaken = await _overtaken(two_seqs, gateway, "prio-on")
        async with httpx2.AsyncClient(timeout=30) as http:
            stats = (await http.get(f"{gateway}/v1/stats")).json()["gateway"]["promotions"]
    # the first place freed (seconds after it came) went to it
    assert stats["promoted"] == 1, stats
    assert overtaken >= QUEUED - 1, (overtaken, stats)
    assert stats["in_flight"] == stats["workflows_in_flight"] == 0

    with gateway_process(*args, "--promote", "0") as gateway:
        overtaken = await _overtaken(two_seqs, gateway, "prio-off")
    # unpromoted, it waits behind them: its own priority -100 never reached vLLM
    assert overtaken <= 1, overtaken
