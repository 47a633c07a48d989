"""Ending a claim hands its blocks back tail first, like finishing a request."""

from __future__ import annotations

import pytest

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


@pytest.mark.parametrize("done", [False, True])
def test_a_done_release_hands_its_blocks_back_as_the_next_victims(chain, spec, warmup, done):
    """Released ``done`` (nothing will use the prefix again), a claim's blocks go before an
    older unclaimed prefix, tail first; released otherwise, they are the most recently used."""
    engine = KVEngine(12, 4)
    old, prompt = chain(1, 4), chain(2, 4)
    warmup(engine, "r0", old)
    warmup(engine, "r1", prompt)
    engine.submit_claim(spec("c1", prompt, ProtectionMode.SOFT_PRIORITY), prompt)
    engine.release_claim("c1", "wf", done=done)
    engine.begin("r2", chain(3, 6))  # 4 free + 2 evictions
    kept = (engine.resident_run(old), engine.resident_run(prompt))
    assert kept == ((4, 2) if done else (2, 4))
