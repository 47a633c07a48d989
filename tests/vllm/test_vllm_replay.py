"""Captured claim operations do not replay on a vLLM started again: every envelope is signed
for one connector instance and an issue time, and a vLLM started after them with the same key
(a new process: what a restart is to the connector) refuses each one the first saw or was
sent, with the reason, and holds nothing."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Prompts, serve_vllm

from agentclaims.vllm import ConnectorClient

pytestmark = pytest.mark.vllm


def hold(claim_id: str) -> dict[str, Any]:
    return {"op": "hold", "claim_id": claim_id, "mode": "hard_protected", "ttl_s": 60}


async def test_envelopes_captured_before_a_restart_are_refused_after_it(
    tiny_model: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    prompts = Prompts(7_777)
    prompt = prompts(3 * 32 + 5)
    with serve_vllm(tiny_model, tmp_path_factory, "replay-before") as server:  # then stopped
        client = ConnectorClient(server.url, server.key, model=server.model)
        try:
            unbound = client.envelope([hold("before-0")])  # the instance not yet known
            assert "instance" not in unbound
            first = await client.complete(prompt, kv_transfer_params={"agentclaims": unbound})
            assert first.result_of("before-0")["decision"] == "accepted"
            assert client.instance is not None
            bound = client.envelope([hold("before-1")])
            assert bound["instance"] == client.instance
            answer = await client.complete(prompt, kv_transfer_params={"agentclaims": bound})
            assert answer.result_of("before-1")["decision"] == "accepted"
            unsent = client.envelope([hold("before-2")])  # signed, never sent
            old_instance = client.instance
        finally:
            await client.operate([{"op": "revoke_all", "reason": "test_end"}])
            await client.aclose()
    with serve_vllm(tiny_model, tmp_path_factory, "replay-after") as server:
        client = ConnectorClient(server.url, server.key, model=server.model)
        try:
            reasons = {}
            for name, envelope in (("unbound", unbound), ("bound", bound), ("unsent", unsent)):
                answer = await client.complete(prompt, kv_transfer_params={"agentclaims": envelope})
                [result] = answer.results
                assert result["ok"] is False, (name, result)
                reasons[name] = result["reason"]
            assert client.instance not in (None, old_instance)
            assert reasons["bound"] == "signed for another connector instance"
            assert reasons["unbound"].startswith("stale envelope: issued before")
            assert reasons["unsent"] == "signed for another connector instance"
            rejected = [
                e for e in client.seen if e.get("event") == "claim_operations_rejected"
            ]  # fmt: skip
            assert len(rejected) >= 3
            view = await client.operate([])
            assert view.held_blocks == 0  # nothing the captured envelopes asked for is held
            fresh = await client.complete(prompt, [hold("after-1")])  # the control
            assert fresh.result_of("after-1")["decision"] == "accepted"
        finally:
            await client.operate([{"op": "revoke_all", "reason": "test_end"}])
            await client.aclose()
