"""What a refusal tells the client: capacity versus claims, and when to come back."""

from __future__ import annotations

from agentclaims.contract import ArbiterAction, ClaimSpec, Feasibility, ProtectionMode
from agentclaims.engine import BlockHash, KVEngine, prefix_id_of


def _chain(base: int, n: int) -> list[BlockHash]:
    return [BlockHash(base + i) for i in range(n)]


class Clock:
    def __init__(self) -> None:
        self.ns = 1_000_000_000

    def __call__(self) -> int:
        return self.ns


def test_request_larger_than_pool_with_its_hits_needs_capacity():
    """A request whose cached head plus new blocks exceed the pool is capacity_required."""
    engine = KVEngine(10, 4)
    head = _chain(1, 6)
    engine.begin("r1", head)
    engine.finish("r1")
    outcome = engine.begin("r2", [*head, *_chain(100, 5)])  # 6 hits + 5 new > 10
    assert outcome.action is ArbiterAction.CAPACITY_REQUIRED
    assert outcome.feasibility is Feasibility.INFEASIBLE_EXCEEDS_CAPACITY
    assert outcome.blocking_claim_ids == ()


def test_refusal_by_hard_claims_with_ttl_hints_their_end():
    """Hard claims that carry a TTL still refuse, naming themselves, and hint when they end."""
    clock = Clock()
    engine = KVEngine(10, 4, clock=clock)
    held = _chain(1, 6)
    engine.begin("r1", held)
    engine.finish("r1")
    spec = ClaimSpec(
        "c1",
        "wf",
        prefix_id_of(held),
        engine.cache_identity,
        6,
        ProtectionMode.HARD_PROTECTED,
        ttl_s=2.5,
    )
    assert engine.submit_claim(spec, held).accepted
    clock.ns += 500_000_000
    outcome = engine.begin("r2", _chain(100, 6))
    assert outcome.action is ArbiterAction.REFUSE_ACTIVE
    assert outcome.blocking_claim_ids == ("c1",)
    assert outcome.retry_after_s == 2.0


def test_refusal_by_hard_claim_without_ttl_gives_no_hint():
    """A hard claim with no end gives no retry hint: waiting is not known to help."""
    engine = KVEngine(10, 4)
    held = _chain(1, 6)
    engine.begin("r1", held)
    engine.finish("r1")
    spec = ClaimSpec(
        "c1", "wf", prefix_id_of(held), engine.cache_identity, 6, ProtectionMode.HARD_PROTECTED
    )
    engine.submit_claim(spec, held)
    assert engine.begin("r2", _chain(100, 6)).retry_after_s is None
