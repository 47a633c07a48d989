"""Ending a claim hands its blocks back tail first, like finishing a request."""

from __future__ import annotations

from agentclaims.contract import ProtectionMode
from agentclaims.engine import KVEngine


def test_released_claim_loses_its_tail_first_under_lru(chain, spec, warmup):
    """After release, eviction under LRU takes the claimed prefix's tail, keeping block 0."""
    engine = KVEngine(10, 4)
    prompt = chain(1, 6)
    warmup(engine, "r1", prompt)
    assert engine.submit_claim(spec("c1", prompt, ProtectionMode.HARD_PROTECTED), prompt).accepted
    engine.release_claim("c1", "wf")
    engine.begin("r2", chain(2, 7))  # 4 free + 3 evictions
    assert engine.resident_run(prompt) == 3
    lost = [
        e.data["position"]
        for e in engine.take_events()
        if e.event.value.endswith("lost_after_release")
    ]
    assert lost == [5, 4, 3]


def test_claim_submission_keeps_the_lru_order_of_its_blocks(chain, spec, warmup):
    """Claiming and releasing a prefix leaves its head the most recently used block."""
    engine = KVEngine(8, 4)
    prompt = chain(1, 4)
    warmup(engine, "r1", prompt)
    engine.submit_claim(spec("c1", prompt, ProtectionMode.SOFT_PRIORITY), prompt)
    engine.release_claim("c1", "wf")
    engine.begin("r2", chain(2, 5))  # 4 free + 1 eviction
    assert engine.resident_run(prompt) == 3
