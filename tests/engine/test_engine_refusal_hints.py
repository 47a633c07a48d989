"""What a refusal tells the client: capacity versus claims, and when to come back."""

from __future__ import annotations

from agentclaims.contract import ArbiterAction, Feasibility, ProtectionMode
from agentclaims.engine import KVEngine


def test_request_larger_than_pool_with_its_hits_needs_capacity(chain, warmup):
    """A request whose cached head plus new blocks exceed the pool is capacity_required."""
    engine = KVEngine(10, 4)
    head = chain(1, 6)
    warmup(engine, "r1", head)
    outcome = engine.begin("r2", [*head, *chain(2, 5)])  # 6 hits + 5 new > 10
    assert outcome.action is ArbiterAction.CAPACITY_REQUIRED
    assert outcome.feasibility is Feasibility.INFEASIBLE_EXCEEDS_CAPACITY
    assert outcome.blocking_claim_ids == ()


def test_refusal_by_hard_claims_with_ttl_hints_their_end(chain, spec, warmup, clock):
    """Hard claims that carry a TTL still refuse, naming themselves, and hint when they end."""
    engine = KVEngine(10, 4, clock=clock)
    held = chain(1, 6)
    warmup(engine, "r1", held)
    assert engine.submit_claim(
        spec("c1", held, ProtectionMode.HARD_PROTECTED, ttl_s=2.5), held
    ).accepted
    clock.advance(0.5)
    outcome = engine.begin("r2", chain(2, 6))
    assert outcome.action is ArbiterAction.REFUSE_ACTIVE
    assert outcome.blocking_claim_ids == ("c1",)
    assert outcome.retry_after_s == 2.0


def test_refusal_by_hard_claim_without_ttl_gives_no_hint(chain, spec, warmup):
    """A hard claim with no end gives no retry hint: waiting is not known to help."""
    engine = KVEngine(10, 4)
    held = chain(1, 6)
    warmup(engine, "r1", held)
    engine.submit_claim(spec("c1", held, ProtectionMode.HARD_PROTECTED), held)
    assert engine.begin("r2", chain(2, 6)).retry_after_s is None
