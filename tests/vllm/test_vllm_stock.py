"""The gateway in front of stock vLLM (`agentclaims vllm serve --no-connector`: no claim can be
held there): conformance reports what the evidence shows, never more."""

from __future__ import annotations

from collections.abc import Iterator

import httpx2
import pytest
from conftest import serve_vllm
from servers import gateway_process

from agentclaims.backends import HTTPBackend
from agentclaims.contract import ConformanceStatus

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def stock_gateway(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Stock vLLM (its KV events on, no connector) and the gateway in front of it."""
    with serve_vllm(tiny_model, tmp_path_factory, "stock", connector=False) as server:
        args = ("--kv", "vllm", "--upstream", server.url, "--claims-key", "unused")
        with gateway_process(*args, "--kv-events", server.events) as url:
            yield url


async def test_conformance_on_stock_vllm_passes_only_what_it_runs(stock_gateway: str) -> None:
    """No connector answers: L1 runs for real (unclaimed blocks evicted, no harm) and passes;
    every level that needs a claim held is not_exposed, naming the refusal; L2 and L6 are
    not_exposed as on any vLLM. The descriptor classes every held mode rejected."""
    from agentclaims.conformance import run_suite

    async with HTTPBackend(stock_gateway, timeout_s=120) as backend:
        results = await run_suite(backend)
        desc = await backend.descriptor()
    status = {level: r.status for level, r in results.items()}
    assert status == {
        "L1": ConformanceStatus.PASS,
        **dict.fromkeys(("L2", "L3", "L4", "L5", "L6", "L7", "C1"), ConformanceStatus.NOT_EXPOSED),
    }, "\n".join(f"{level} {r.status.value}: {r.detail}" for level, r in results.items())
    for level in ("L3", "L4", "L5", "L7", "C1"):
        assert "stock vLLM" in results[level].detail
        assert "no agentclaims connector" in results[level].detail
    assert desc["connector"] is False
    classes = {mode: entry["lowering_class"] for mode, entry in desc["modes"].items()}
    for mode in ("hard_protected", "expiring", "soft_priority", "demotable", "offloadable"):
        assert classes[mode] == "rejected", classes


async def test_no_call_goes_ahead_on_a_vllm_that_does_not_order_by_priority(
    stock_gateway: str,
) -> None:
    """Stock vLLM (first come, first served here; no connector to say otherwise): the gateway
    sends the SDK's calls with no place in the queue of their own, and counts none promoted."""
    body = {
        "messages": [{"role": "user", "content": "stock go"}],
        "max_tokens": 2,
        "agentclaims": {"owner_scope": "stock-order"},
    }
    async with httpx2.AsyncClient(timeout=120) as http:
        for _ in range(2):  # the first starts the gateway's side, the second knows the engine
            answered = await http.post(f"{stock_gateway}/v1/chat/completions", json=body)
            assert answered.status_code == 200, answered.text
        stats = (await http.get(f"{stock_gateway}/v1/stats")).json()["gateway"]["promotions"]
    assert stats["engine_orders_by_priority"] is False, stats
    assert stats["promoted"] == stats["workflows_in_flight"] == 0, stats
