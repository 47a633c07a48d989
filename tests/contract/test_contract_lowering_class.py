"""The lowering classes, ranked by what the evidence shows."""

from __future__ import annotations

from agentclaims.contract import LoweringClass


def test_class_ranks_put_unknown_at_the_bottom() -> None:
    """Weakest first: unknown, rejected, approximation, observational, policy, native."""
    ranked = sorted(LoweringClass, key=lambda c: c.rank)
    assert [c.value for c in ranked] == [
        "unknown",
        "rejected",
        "approximation_substrate",
        "adapter_observational",
        "adapter_policy",
        "native_conformance",
    ]
    assert [c.rank for c in ranked] == list(range(6))
