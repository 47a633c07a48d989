"""Ending a claim hands its blocks back tail first, like finishing a request."""

from __future__ import annotations

from agentclaims.contract import ClaimSpec, ProtectionMode
from agentclaims.engine import BlockHash, KVEngine, prefix_id_of


def _chain(base: int, n: int) -> list[BlockHash]:
    return [BlockHash(base + i) for i in range(n)]


def test_released_claim_loses_its_tail_first_under_lru():
    """After release, eviction under LRU takes the claimed prefix's tail, keeping block 0."""
    engine = KVEngine(10, 4)
    prompt = _chain(1000, 6)
    engine.begin("r1", prompt)
    engine.finish("r1")
    spec = ClaimSpec(
        "c1", "wf", prefix_id_of(prompt), engine.cache_identity, 6, ProtectionMode.HARD_PROTECTED
    )
    assert engine.submit_claim(spec, prompt).accepted
    engine.release_claim("c1", "wf")
    engine.begin("r2", _chain(5000, 7))  # 4 free + 3 evictions
    assert engine.resident_run(prompt) == 3
    lost = [
        e.data["position"]
        for e in engine.take_events()
        if e.event.value.endswith("lost_after_release")
    ]
    assert lost == [5, 4, 3]


def test_claim_submission_keeps_the_lru_order_of_its_blocks():
    """Claiming and releasing a prefix leaves its head the most recently used block."""
    engine = KVEngine(8, 4)
    prompt = _chain(1, 4)
    engine.begin("r1", prompt)
    engine.finish("r1")
    spec = ClaimSpec(
        "c1", "wf", prefix_id_of(prompt), engine.cache_identity, 4, ProtectionMode.SOFT_PRIORITY
    )
    engine.submit_claim(spec, prompt)
    engine.release_claim("c1", "wf")
    engine.begin("r2", _chain(900, 5))  # 4 free + 1 eviction
    assert engine.resident_run(prompt) == 3
