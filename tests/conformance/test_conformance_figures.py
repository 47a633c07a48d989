"""The contract's reference figures, and the hard-lowering checker, on the embedded engine."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentclaims.conformance import (
    allocator_probe,
    capacity_sweep,
    check_hard_lowering,
    reference_target,
)
from agentclaims.contract import (
    ArbiterAction,
    EventName,
    Feasibility,
    LoweringClass,
    ProtectionMode,
)
from agentclaims.errors import UsageError


async def test_allocator_probe_has_a_shortfall_of_fifty() -> None:
    """60 resident + 70 active against 80 usable: refused under hard, shortfall 50."""
    probe = await allocator_probe(reference_target(), 80, ProtectionMode.HARD_PROTECTED)
    assert probe.outcome.action is ArbiterAction.REFUSE_ACTIVE
    assert probe.outcome.feasibility is Feasibility.INFEASIBLE_PRESERVE_RESIDENT_AND_ACTIVE
    assert probe.outcome.shortfall_blocks == 50
    assert probe.outcome.blocking_claim_ids == (probe.claim_id,)
    assert probe.resident_lost == 0


async def test_capacity_sweep_matches_the_reference_figures() -> None:
    """Over 80..150 usable: 50/40/30/20/10/0/0/0 lost unprotected; hard refused below 130."""
    rows = await capacity_sweep(reference_target())
    assert [r.usable_blocks for r in rows] == [80, 90, 100, 110, 120, 130, 140, 150]
    assert [r.resident_lost_unprotected for r in rows] == [50, 40, 30, 20, 10, 0, 0, 0]
    assert [r.hard_served for r in rows] == [r.usable_blocks >= 130 for r in rows]
    assert [r.hard_shortfall_blocks for r in rows] == [50, 40, 30, 20, 10, 0, 0, 0]
    assert all(r.hard_resident_lost == 0 for r in rows)
    assert rows[0].to_dict()["hard_action"] == "refuse_active"


@settings(max_examples=25, deadline=None)
@given(
    resident=st.integers(1, 40),
    active=st.integers(1, 40),
    spare=st.integers(0, 40),
)
def test_probe_loses_exactly_the_overflow(resident: int, active: int, spare: int) -> None:
    """For any sizes, unprotected loss is the overflow; a hard claim loses nothing and is
    refused exactly when resident + active exceeds the pool, by the overflow."""
    usable = max(resident, active) + spare
    overflow = max(0, resident + active - usable)

    async def both() -> tuple[int, int, bool, int]:
        backend = reference_target()
        plain = await allocator_probe(
            backend, usable, resident_blocks=resident, active_blocks=active
        )
        hard = await allocator_probe(
            backend,
            usable,
            ProtectionMode.HARD_PROTECTED,
            resident_blocks=resident,
            active_blocks=active,
        )
        return (
            plain.resident_lost,
            hard.resident_lost,
            hard.outcome.served,
            hard.outcome.shortfall_blocks,
        )

    plain_lost, hard_lost, hard_served, shortfall = asyncio.run(both())
    assert plain_lost == overflow
    assert hard_lost == 0
    assert hard_served is (overflow == 0)
    assert shortfall == overflow


async def test_soft_lowering_of_hard_is_rejected_with_a_counterexample() -> None:
    """Under the probe a soft claim is harmed where hard refuses: hard -> soft is rejected."""
    probe = await allocator_probe(reference_target(), 80, ProtectionMode.SOFT_PRIORITY)
    verdict = check_hard_lowering(probe)
    assert verdict.lowering_class is LoweringClass.REJECTED
    assert verdict.violated == (
        "active_not_served",
        "no_claimed_victim",
        "refusal_names_claim",
        "no_harm",
    )
    assert probe.named(EventName.RESIDENT_CLAIM_HARMED, claim_id=probe.claim_id)


async def test_hard_run_that_holds_is_not_rejected() -> None:
    """The reference engine's hard claim keeps every obligation under the probe."""
    probe = await allocator_probe(reference_target(), 80, ProtectionMode.HARD_PROTECTED)
    verdict = check_hard_lowering(probe)
    assert verdict.lowering_class is LoweringClass.ADAPTER_POLICY
    assert verdict.violated == ()


async def test_weaker_mode_is_rejected_by_rule_without_a_counterexample() -> None:
    """With room to spare, soft_priority shows no violation but is still rejected (fail closed)."""
    probe = await allocator_probe(reference_target(), 150, ProtectionMode.SOFT_PRIORITY)
    verdict = check_hard_lowering(probe)
    assert verdict.lowering_class is LoweringClass.REJECTED
    assert probe.outcome.served
    assert verdict.violated == ()


async def test_checker_needs_a_claimed_probe() -> None:
    """Classifying a probe that ran without a claim is a usage error naming probe.mode."""
    probe = await allocator_probe(reference_target(), 80)
    with pytest.raises(UsageError, match=r"probe\.mode"):
        check_hard_lowering(probe)
