"""The engine keeps the eviction policy it is given, even an empty one."""

from __future__ import annotations

from agentclaims.engine import KVEngine, PriorityPolicy


def test_an_empty_custom_policy_is_not_replaced_by_lru():
    """A policy with no candidates yet (len 0, falsy) is still the engine's policy."""
    policy = PriorityPolicy(lambda h: 0, name="mine")
    assert len(policy) == 0
    engine = KVEngine(8, 4, eviction_policy=policy)
    assert engine.policy is policy
    assert engine.policy_name == "mine"
