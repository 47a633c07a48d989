"""The conformance levels on the reference engine, and on backends that break the contract,
through the claims protocol: directly, through the gateway in-process, and over real HTTP."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from mutants import (
    ONE_PER_LEVEL,
    Crashing,
    DropsLifecycleEvents,
    NoBlockResidency,
    SilentEviction,
    SoftAsHard,
    Unreachable,
)
from servers import app_in_thread

from agentclaims.backends import EmbeddedBackend, HTTPBackend
from agentclaims.conformance import LEVELS, Target, reference_target, run_level, run_suite
from agentclaims.contract import ConformanceStatus, EventName
from agentclaims.errors import UnknownNameError, UsageError
from agentclaims.gateway import ScriptedModel, create_app
from agentclaims.protocol import ClaimsProtocol

PASS, FAIL = ConformanceStatus.PASS, ConformanceStatus.FAIL


@contextlib.asynccontextmanager
async def direct(kv: Any) -> AsyncIterator[ClaimsProtocol]:
    yield kv


@contextlib.asynccontextmanager
async def in_process(kv: Any) -> AsyncIterator[ClaimsProtocol]:
    async with EmbeddedBackend(1, kv=kv, name="mutant") as backend:
        yield backend


@contextlib.asynccontextmanager
async def over_http(kv: Any) -> AsyncIterator[ClaimsProtocol]:
    with app_in_thread(create_app(kv, ScriptedModel())) as url:
        async with HTTPBackend(url) as backend:
            yield backend


PATHS: dict[str, Callable[[Any], contextlib.AbstractAsyncContextManager[ClaimsProtocol]]] = {
    "direct": direct,
    "embedded": in_process,
    "http": over_http,
}


@pytest.mark.parametrize("level", list(LEVELS))
async def test_every_level_passes_on_the_reference_engine(level: str) -> None:
    """Each level passes on the reference engine, citing at least one event in order."""
    result = await run_level(reference_target(), level)
    assert result.status is PASS, result.detail
    assert result.evidence
    assert [e.seq for e in result.evidence] == sorted({e.seq for e in result.evidence})


async def test_l3_cites_the_refusal_and_reports_the_shortfall() -> None:
    """L3's evidence holds the refusal event and its detail the shortfall of 50."""
    result = await run_level(reference_target(), "L3")
    assert EventName.ACTIVE_REQUEST_REFUSED in {e.event for e in result.evidence}
    assert "shortfall 50" in result.detail


async def test_each_level_runs_on_a_fresh_instance_whose_events_continue() -> None:
    """Every scenario starts a new engine (a new run id) whose sequence continues the
    previous one's: a reader resuming the stream never sees numbers go backwards."""
    target = reference_target()
    await run_level(target, "L1")
    kv: Any = target.backend
    first_run, first_last = kv.engine.run_id, kv.engine.last_seq
    await run_level(target, "L2")
    assert kv.engine.run_id != first_run
    assert kv.engine.events_since(0)[0].seq == first_last + 1


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("level", [lvl for lvl in ONE_PER_LEVEL if lvl != "C1"])
async def test_a_mutant_fails_exactly_its_level(path: str, level: str) -> None:
    """A backend breaking one obligation fails exactly that obligation's level, and every
    other level still passes, on every path to the backend (C1's mutant: see below)."""
    async with PATHS[path](ONE_PER_LEVEL[level]()) as backend:
        results = await run_suite(backend)
    failing = {lvl for lvl, r in results.items() if r.status is not PASS}
    assert failing == {level}, {lvl: r.detail for lvl, r in results.items() if lvl in failing}
    assert results[level].status is FAIL


@pytest.mark.parametrize("path", list(PATHS))
async def test_soft_behaving_as_hard_makes_c1_only_approximate(path: str) -> None:
    """When soft claims are kept like hard ones, hard -> soft is rejected by rule only: C1 is
    approximate, L6 cannot arrange a soft loss, and nothing fails."""
    async with PATHS[path](SoftAsHard()) as backend:
        results = await run_suite(backend)
    assert results["C1"].status is ConformanceStatus.APPROXIMATE
    assert "no counterexample observed" in results["C1"].detail
    assert results["L6"].status is ConformanceStatus.NOT_EVALUATED
    assert {r.status for lvl, r in results.items() if lvl not in ("C1", "L6")} == {PASS}


@pytest.mark.parametrize("path", list(PATHS))
async def test_reference_engine_passes_on_every_path(path: str) -> None:
    """The same scenarios report the same statuses directly, in-process and over HTTP."""
    from mutants import reference_kv

    async with PATHS[path](reference_kv()) as backend:
        results = await run_suite(backend)
    assert {lvl: r.status for lvl, r in results.items()} == dict.fromkeys(LEVELS, PASS)


async def test_silent_eviction_of_hard_claims_fails_the_hard_levels() -> None:
    """Evicting hard-claimed blocks silently fails L3, L7 and C1; the levels without a hard
    claim still pass."""
    results = await run_suite(SilentEviction())
    for level in ("L3", "L7", "C1"):
        assert results[level].status is FAIL, level
    for level in ("L1", "L2", "L4", "L5"):
        assert results[level].status is PASS, level
    assert "active request served" in results["L3"].detail


async def test_dropped_lifecycle_events_fail_the_ordering_levels() -> None:
    """Dropping demoted/expired events fails L4, L5 and L7."""
    results = await run_suite(DropsLifecycleEvents())
    for level in ("L4", "L5", "L7"):
        assert results[level].status is FAIL, level
    assert "expected one resident_claim_demoted event, got 0" in results["L4"].detail
    for level in ("L1", "L2", "L3"):
        assert results[level].status is PASS, level


@pytest.mark.parametrize("path", list(PATHS))
async def test_a_missing_operation_is_not_exposed_never_pass(path: str) -> None:
    """Without per-block residency every level is not_exposed, naming the operation."""
    async with PATHS[path](NoBlockResidency()) as backend:
        results = await run_suite(backend)
    assert {r.status for r in results.values()} == {ConformanceStatus.NOT_EXPOSED}
    assert all("block_residency" in r.detail for r in results.values())


async def test_a_backend_without_instance_control_is_not_exposed() -> None:
    """A backend that speaks only the claims API cannot start a scenario: not_exposed."""

    class ClaimsOnly:
        name = "claims-only"

        def __init__(self) -> None:
            self.inner = reference_target().backend

        def __getattr__(self, item: str) -> Any:
            if item in ("fresh_instance", "step", "serve", "block_residency"):
                raise AttributeError(item)
            return getattr(self.inner, item)

        async def submit_claim(self, *a: Any, **k: Any) -> Any:
            return await self.inner.submit_claim(*a, **k)

        async def get_claim(self, *a: Any, **k: Any) -> Any:
            return await self.inner.get_claim(*a, **k)

        async def renew_claim(self, *a: Any, **k: Any) -> Any:
            return await self.inner.renew_claim(*a, **k)

        async def release_claim(self, *a: Any, **k: Any) -> Any:
            return await self.inner.release_claim(*a, **k)

        async def events(self, *a: Any, **k: Any) -> Any:
            return await self.inner.events(*a, **k)

        async def residency(self, *a: Any, **k: Any) -> Any:
            return await self.inner.residency(*a, **k)

        async def descriptor(self) -> Any:
            return await self.inner.descriptor()

    results = await run_suite(ClaimsOnly())
    assert {r.status for r in results.values()} == {ConformanceStatus.NOT_EXPOSED}
    assert "fresh_instance" in results["L1"].detail


async def test_an_unreachable_backend_is_not_evaluated() -> None:
    """A backend that cannot be reached yields not_evaluated."""
    result = await run_level(Unreachable(), "L1")
    assert result.status is ConformanceStatus.NOT_EVALUATED
    assert "connection refused" in result.detail


async def test_an_unexpected_error_fails_closed() -> None:
    """Any other error during a scenario is a fail, with the error in the detail."""
    result = await run_level(Crashing(), "L2")
    assert result.status is FAIL
    assert result.detail == "RuntimeError: boom"


async def test_unknown_level_is_a_usage_error() -> None:
    """Asking for a level that does not exist names the field and the known levels."""
    with pytest.raises(UnknownNameError, match="level"):
        await run_suite(reference_target(), ["L9"])


async def test_something_that_speaks_no_protocol_is_a_usage_error() -> None:
    """Driving an object that is not a claims backend is a usage error naming it."""
    with pytest.raises(UsageError, match="backend"):
        Target(object())  # type: ignore[arg-type]


async def test_injected_clock_stamps_events_and_moves_only_when_told() -> None:
    """Event timestamps come from the manual clock; it moves only when told."""
    from agentclaims.conformance import ManualClock
    from agentclaims.contract import BlockHash

    clock = ManualClock()
    target = reference_target(clock=clock)
    await target.fresh(8)
    start = clock()
    await target.begin("r1", [BlockHash(1)])
    clock.advance(1.5)
    await target.begin("r2", [BlockHash(2)])
    stamps = [e.timestamp_ns for e in await target.events(0)]
    assert stamps == [start, start + 1_500_000_000]
    with pytest.raises(UsageError, match="seconds"):
        clock.advance(-1)
    assert clock() == start + 1_500_000_000
