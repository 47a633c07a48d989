"""The conformance levels on the embedded engine, and on backends that break the contract."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from agentclaims.conformance import (
    LEVELS,
    ConformanceBackend,
    EmbeddedConformanceBackend,
    OperationNotExposed,
    run_level,
    run_suite,
)
from agentclaims.contract import ClaimEvent, ClaimSpec, ConformanceStatus, EventName, ProtectionMode
from agentclaims.engine import ActiveOutcome, BlockHash, ClaimDecision
from agentclaims.errors import BackendUnavailable, UnknownNameError, UsageError

PASS, FAIL = ConformanceStatus.PASS, ConformanceStatus.FAIL


class SilentEvictionBackend(EmbeddedConformanceBackend):
    """Runs hard claims as soft_priority and hides the victim and harm events: hard-claimed
    blocks are evicted silently."""

    name = "silent-eviction"

    async def submit_claim(
        self, spec: ClaimSpec, block_hashes: Sequence[BlockHash]
    ) -> ClaimDecision:
        if spec.protection_mode is ProtectionMode.HARD_PROTECTED:
            spec = spec.with_mode(ProtectionMode.SOFT_PRIORITY)
        return await super().submit_claim(spec, block_hashes)

    async def events(self, since: int = 0) -> list[ClaimEvent]:
        hidden = (EventName.ALLOCATION_VICTIM_SELECTED, EventName.RESIDENT_CLAIM_HARMED)
        return [e for e in await super().events(since) if e.event not in hidden]


class EventDroppingBackend(EmbeddedConformanceBackend):
    """Enforces like the reference engine but drops the demotion and expiry events."""

    name = "event-dropping"

    async def events(self, since: int = 0) -> list[ClaimEvent]:
        dropped = (EventName.RESIDENT_CLAIM_DEMOTED, EventName.RESIDENT_CLAIM_EXPIRED)
        return [e for e in await super().events(since) if e.event not in dropped]


class NoSurvivalBackend(EmbeddedConformanceBackend):
    """Cannot say which blocks are resident (like a runtime without per-block residency)."""

    name = "no-survival"

    async def survival(self, block_hashes: Sequence[BlockHash]) -> list[bool]:
        raise OperationNotExposed(self.name, "survival")


def test_embedded_backend_satisfies_the_protocol() -> None:
    """The embedded adapter is a ConformanceBackend."""
    assert isinstance(EmbeddedConformanceBackend(), ConformanceBackend)


@pytest.mark.parametrize("level", list(LEVELS))
async def test_every_level_passes_on_the_embedded_engine(level: str) -> None:
    """Each level passes on the reference engine, citing at least one event."""
    result = await run_level(EmbeddedConformanceBackend(), level)
    assert result.status is PASS, result.detail
    assert result.evidence
    assert [e.seq for e in result.evidence] == sorted({e.seq for e in result.evidence})


async def test_l3_cites_the_refusal_and_reports_the_shortfall() -> None:
    """L3's evidence holds the refusal event and its detail the shortfall of 50."""
    result = await run_level(EmbeddedConformanceBackend(), "L3")
    assert EventName.ACTIVE_REQUEST_REFUSED in {e.event for e in result.evidence}
    assert "shortfall 50" in result.detail


async def test_each_level_runs_on_a_fresh_instance() -> None:
    """Every scenario starts a new engine, so event seq numbers restart at 1."""
    backend = EmbeddedConformanceBackend()
    await run_level(backend, "L1")
    first_run = backend.engine.run_id
    await run_level(backend, "L2")
    assert backend.engine.run_id != first_run
    assert backend.engine.events_since(0)[0].seq == 1


async def test_silent_eviction_of_hard_claims_fails_the_hard_levels() -> None:
    """A backend that evicts hard-claimed blocks silently fails L3, L7 and C1, and only
    the levels without a hard claim still pass."""
    results = await run_suite(SilentEvictionBackend())
    for level in ("L3", "L7", "C1"):
        assert results[level].status is FAIL, level
    for level in ("L1", "L2", "L4", "L5"):
        assert results[level].status is PASS, level
    assert "active request served" in results["L3"].detail


async def test_dropped_lifecycle_events_fail_the_ordering_levels() -> None:
    """A backend that drops demoted/expired events fails L4, L5 and L7."""
    results = await run_suite(EventDroppingBackend())
    for level in ("L4", "L5", "L7"):
        assert results[level].status is FAIL, level
    assert "expected one resident_claim_demoted event, got 0" in results["L4"].detail
    for level in ("L1", "L2", "L3"):
        assert results[level].status is PASS, level


async def test_a_missing_operation_is_not_exposed_never_pass() -> None:
    """Without per-block residency every level is not_exposed, naming the operation."""
    results = await run_suite(NoSurvivalBackend())
    assert {r.status for r in results.values()} == {ConformanceStatus.NOT_EXPOSED}
    assert all("survival" in r.detail for r in results.values())


class _DownBackend(EmbeddedConformanceBackend):
    """A backend whose requests cannot reach the server."""

    async def begin(
        self, request_id: str, block_hashes: Sequence[BlockHash], *, admit: bool = True
    ) -> ActiveOutcome:
        raise BackendUnavailable("connection refused")


class _CrashingBackend(EmbeddedConformanceBackend):
    """A backend that answers a request with an unexpected error."""

    async def begin(
        self, request_id: str, block_hashes: Sequence[BlockHash], *, admit: bool = True
    ) -> ActiveOutcome:
        raise RuntimeError("boom")


async def test_an_unreachable_backend_is_not_evaluated() -> None:
    """A backend that cannot be reached yields not_evaluated."""
    result = await run_level(_DownBackend(), "L1")
    assert result.status is ConformanceStatus.NOT_EVALUATED
    assert "connection refused" in result.detail


async def test_an_unexpected_error_fails_closed() -> None:
    """Any other error during a scenario is a fail, with the error in the detail."""
    result = await run_level(_CrashingBackend(), "L2")
    assert result.status is FAIL
    assert result.detail == "RuntimeError: boom"


async def test_unknown_level_is_a_usage_error() -> None:
    """Asking for a level that does not exist names the field and the known levels."""
    with pytest.raises(UnknownNameError, match="level"):
        await run_suite(EmbeddedConformanceBackend(), ["L9"])


class _SoftAsHardBackend(EmbeddedConformanceBackend):
    """Honours soft_priority claims as hard: the probe cannot show soft's weakness."""

    async def submit_claim(
        self, spec: ClaimSpec, block_hashes: Sequence[BlockHash]
    ) -> ClaimDecision:
        if spec.protection_mode is ProtectionMode.SOFT_PRIORITY:
            spec = spec.with_mode(ProtectionMode.HARD_PROTECTED)
        return await super().submit_claim(spec, block_hashes)


async def test_c1_without_a_counterexample_is_only_approximate() -> None:
    """When soft behaves like hard, C1 rejects the lowering by rule only: approximate."""
    result = await run_level(_SoftAsHardBackend(), "C1")
    assert result.status is ConformanceStatus.APPROXIMATE
    assert "no counterexample observed" in result.detail


async def test_injected_clock_stamps_events_and_moves_only_when_told() -> None:
    """Event timestamps come from the manual clock; advance_clock moves it, negatives fail."""
    backend = EmbeddedConformanceBackend()
    await backend.fresh(8)
    start = backend.clock()
    await backend.begin("r1", [BlockHash(1)])
    await backend.finish("r1")
    await backend.advance_clock(1.5)
    await backend.begin("r2", [BlockHash(2)])
    await backend.finish("r2")
    stamps = [e.timestamp_ns for e in await backend.events(0)]
    assert stamps == [start, start + 1_500_000_000]
    with pytest.raises(UsageError, match="seconds"):
        await backend.advance_clock(-1)
    assert backend.clock() == start + 1_500_000_000
