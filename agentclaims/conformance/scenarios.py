"""The conformance levels L1-L7 and C1, each an executable scenario over a ``Target``.

Every scenario starts a fresh instance, drives it, reads the events, and returns a
``LevelResult``: a status, the events that decided it (``seq`` and name) and a short detail.
A scenario never passes on missing evidence: an operation the backend lacks gives
``not_exposed``, a set-up the backend did not let it reach gives ``not_evaluated``, and anything
else that goes wrong (an exception included) gives ``fail``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Mapping

from agentclaims.conformance.lowering import check_hard_lowering
from agentclaims.conformance.probe import (
    OWNER_SCOPE,
    PROBE_ACTIVE_BLOCKS,
    PROBE_CLAIM_ID,
    PROBE_RESIDENT_BLOCKS,
    PROBE_USABLE_BLOCKS,
    allocator_probe,
    claim_spec,
    lost_blocks,
    prepare_resident,
    select_events,
    serve,
    synthetic_blocks,
)
from agentclaims.conformance.target import Target
from agentclaims.conformance.verdict import (
    Evidence,
    LevelResult,
    Verdict,
    c1_verdict,
    check_replay,
    ended_before_loss,
    hard_claim_held,
    single,
)
from agentclaims.contract import (
    ArbiterAction,
    ClaimEvent,
    ClaimId,
    ClaimState,
    ConformanceStatus,
    EventName,
    Feasibility,
    ProtectionMode,
    leading_run,
)
from agentclaims.errors import (
    BackendUnavailable,
    OperationNotExposed,
    UnknownNameError,
)
from agentclaims.protocol import ClaimsProtocol

__all__ = [
    "LEVELS",
    "Evidence",
    "LevelResult",
    "as_target",
    "run_level",
    "run_suite",
    "suite_not_evaluated",
]

E = EventName
_SHORTFALL = PROBE_RESIDENT_BLOCKS + PROBE_ACTIVE_BLOCKS - PROBE_USABLE_BLOCKS


# ---------------------------------------------------------------------------------- L1 / L2
async def level_l1(backend: Target) -> LevelResult:
    """No accepted claim: evictions happen, and none of them is harm."""
    v = Verdict("L1")
    probe = await allocator_probe(backend)
    harms = probe.named(E.RESIDENT_CLAIM_HARMED)
    victims = probe.named(E.ALLOCATION_VICTIM_SELECTED)
    v.cite(*probe.named(E.FUTURE_REUSE_ADMITTED), *harms, *victims)
    v.require(probe.outcome.served, f"active request not served ({probe.outcome.action.value})")
    v.require(probe.resident_lost > 0, "no resident block was evicted under pressure")
    v.require(not harms, f"{len(harms)} resident_claim_harmed events with no claim accepted")
    v.require(not victims, f"{len(victims)} claimed victims reported with no claim accepted")
    return v.result(
        f"active served ({probe.outcome.action.value}); {probe.resident_lost} unclaimed "
        "resident blocks evicted; harm 0"
    )


async def level_l2(backend: Target) -> LevelResult:
    """Write no-admit denies future reuse but still allocates from the shared pool."""
    v = Verdict("L2")
    probe = await allocator_probe(backend, admit=False)
    rid = probe.request_id
    denied = select_events(probe.events, E.FUTURE_REUSE_DENIED, request_id=rid)
    admitted = select_events(probe.events, E.FUTURE_REUSE_ADMITTED, request_id=rid)
    v.cite(*denied, *admitted)
    kept = sum(await backend.survival(probe.active))
    v.require(probe.outcome.served, f"active request not served ({probe.outcome.action.value})")
    v.require(
        probe.outcome.action is ArbiterAction.SERVE_ACTIVE_NO_ADMIT,
        f"action {probe.outcome.action.value}, expected serve_active_no_admit",
    )
    v.require(len(denied) == 1, f"future_reuse_denied emitted {len(denied)} times, expected once")
    v.require(not admitted, "the no-admit request's KV was admitted for future reuse")
    v.require(kept == 0, f"{kept} blocks of the no-admit request stayed reusable")
    v.require(
        probe.resident_lost > 0,
        "the no-admit request evicted no resident block: active KV did not share the pool",
    )
    return v.result(
        f"active served (serve_active_no_admit); future_reuse_denied once; "
        f"{probe.resident_lost} resident blocks still evicted"
    )


# ---------------------------------------------------------------------------------- L3
async def level_l3(backend: Target) -> LevelResult:
    """An accepted hard claim turns the 60 + 70 > 80 probe into an explicit refusal."""
    v = Verdict("L3")
    probe = await allocator_probe(backend, mode=ProtectionMode.HARD_PROTECTED)
    cid = probe.claim_id
    victims = hard_claim_held(v, probe)
    if victims is None:
        return v.result("")
    v.require(not probe.outcome.served, f"active request served ({probe.outcome.action.value})")
    v.require(not victims, f"{len(victims)} claimed victim/harm events")
    v.require(probe.resident_lost == 0, f"{probe.resident_lost} claimed blocks lost")
    refusal = single(
        v,
        select_events(probe.events, E.ACTIVE_REQUEST_REFUSED, request_id=probe.request_id),
        E.ACTIVE_REQUEST_REFUSED,
    )
    if refusal is not None:
        blocking = list(refusal.data.get("blocking_claim_ids", ()))
        feasibility = refusal.data.get("feasibility")
        shortfall = refusal.data.get("shortfall_blocks")
        v.require(cid in blocking, f"blocking_claim_ids {blocking} do not name {cid}")
        v.require(
            feasibility == Feasibility.INFEASIBLE_PRESERVE_RESIDENT_AND_ACTIVE,
            f"feasibility {feasibility!r}",
        )
        v.require(shortfall == _SHORTFALL, f"shortfall {shortfall!r}, expected {_SHORTFALL}")
    state = None if probe.claim_view is None else probe.claim_view.state
    v.require(state is ClaimState.MATERIALIZED, f"claim ended up {state}, expected materialized")
    return v.result(
        f"active refused ({Feasibility.INFEASIBLE_PRESERVE_RESIDENT_AND_ACTIVE.value}, "
        f"shortfall {_SHORTFALL}, blocking [{cid}]); 0 claimed victims"
    )


# ---------------------------------------------------------------------------------- L4 / L5
async def level_l4(backend: Target) -> LevelResult:
    """A demotable claim under pressure is demoted, with its event, before it loses a block."""
    v = Verdict("L4")
    probe = await allocator_probe(backend, mode=ProtectionMode.DEMOTABLE)
    v.require(probe.outcome.served, f"active request not served ({probe.outcome.action.value})")
    return await ended_before_loss(
        v, backend, list(probe.events), probe.resident, probe.claim_id, E.RESIDENT_CLAIM_DEMOTED
    )


async def level_l5(backend: Target) -> LevelResult:
    """An expiring claim protects until ``duration_steps`` end, then expires before any loss."""
    v = Verdict("L5")
    steps = 2
    _, resident, decision = await prepare_resident(
        backend, PROBE_USABLE_BLOCKS, ProtectionMode.EXPIRING, duration_steps=steps
    )
    if not v.require(decision is not None and decision.accepted, "expiring claim not accepted"):
        return v.result("")
    active = synthetic_blocks("probe-active", PROBE_ACTIVE_BLOCKS)
    early = await serve(backend, "l5-before-expiry", active)
    lost_early = await lost_blocks(backend, resident)
    v.require(lost_early == 0, f"{lost_early} claimed blocks lost before the claim expired")
    await backend.step(steps)
    late = await serve(backend, "l5-after-expiry", active)
    v.require(late.served, f"active request not served after expiry ({late.action.value})")
    events = await backend.events(0)
    v.cite(*select_events(events, E.ACTIVE_REQUEST_DEFERRED, E.ACTIVE_REQUEST_REFUSED))
    result = await ended_before_loss(
        v, backend, events, resident, PROBE_CLAIM_ID, E.RESIDENT_CLAIM_EXPIRED
    )
    if result.passed:
        return dataclasses.replace(
            result, detail=f"before expiry: {early.action.value}; after: {result.detail}"
        )
    return result


# ---------------------------------------------------------------------------------- L6
async def level_l6(backend: Target) -> LevelResult:
    """59 of 60 blocks surviving is not materialization when block 0 is lost."""
    v = Verdict("L6")
    n = PROBE_RESIDENT_BLOCKS
    prefix = synthetic_blocks("l6-prefix", n)

    # (a) block 0 lost through an unclaimed path, then claimed: accepted, not materialized.
    identity = await backend.fresh(n)
    await serve(backend, "l6-head", prefix[:1])  # oldest resident: the first LRU victim
    await serve(backend, "l6-tail", prefix[1:])
    await serve(backend, "l6-pressure", synthetic_blocks("l6-pressure", 1), admit=False)
    survived = await backend.survival(prefix)
    if survived[0] or sum(survived) != n - 1:
        return v.not_evaluated(
            f"could not arrange the loss of block 0 alone (leading run {leading_run(survived)}, "
            f"{sum(survived)} of {n} resident)"
        )
    claim_a = "l6-late-claim"
    decision = await backend.submit_claim(
        claim_spec(claim_a, prefix, ProtectionMode.HARD_PROTECTED, identity), prefix
    )
    view = await backend.get_claim(ClaimId(claim_a), OWNER_SCOPE)
    events = await backend.events(0)
    v.cite(*select_events(events, E.RESIDENT_CLAIM_ACCEPTED, claim_id=claim_a))
    materialized = select_events(events, E.RESIDENT_CLAIM_MATERIALIZED, claim_id=claim_a)
    v.cite(*materialized)
    v.require(decision.accepted, f"claim {claim_a} not accepted ({decision.reason})")
    v.require(not materialized, f"{claim_a} materialized with block 0 missing")
    v.require(not view.predicate_holds, f"{claim_a}: the backend says its predicate holds")
    v.require(view.state is not ClaimState.MATERIALIZED, f"{claim_a} is {view.state}")

    # (b) a materialized soft claim loses only block 0 (the rest is held by a hard claim): harm.
    identity = await backend.fresh(n + 1)
    await serve(backend, "l6-resident", prefix)
    await backend.submit_claim(
        claim_spec("l6-anchor", prefix[1:], ProtectionMode.HARD_PROTECTED, identity), prefix[1:]
    )
    claim_b = "l6-soft-claim"
    decision = await backend.submit_claim(
        claim_spec(claim_b, prefix, ProtectionMode.SOFT_PRIORITY, identity), prefix
    )
    await serve(backend, "l6-pressure", synthetic_blocks("l6-pressure", 2), admit=False)
    survived = await backend.survival(prefix)
    if survived[0] or sum(survived) != n - 1:
        return v.not_evaluated(
            f"could not arrange the loss of block 0 alone under a soft claim "
            f"(leading run {leading_run(survived)}, {sum(survived)} of {n} resident)"
        )
    events = await backend.events(0)
    v.cite(*select_events(events, E.RESIDENT_CLAIM_MATERIALIZED, claim_id=claim_b))
    harm = single(
        v, select_events(events, E.RESIDENT_CLAIM_HARMED, claim_id=claim_b), E.RESIDENT_CLAIM_HARMED
    )
    if harm is not None:
        before, after = harm.data.get("predicate_before"), harm.data.get("predicate_after")
        v.require(
            before is True and after is False,
            f"harm says predicate before={before!r} after={after!r}",
        )
    view = await backend.get_claim(ClaimId(claim_b), OWNER_SCOPE)
    v.require(view.state is ClaimState.HARMED, f"{claim_b} is {view.state}, expected harmed")
    return v.result(
        f"{n - 1} of {n} blocks survive, leading run 0: a late claim stays "
        f"{ClaimState.ACCEPTED} (not materialized); a materialized soft claim is harmed"
    )


# ---------------------------------------------------------------------------------- L7
async def level_l7(backend: Target) -> LevelResult:
    """Acceptance, materialization, conflict, blocking ids and the end rebuild from events."""
    v = Verdict("L7")
    identity, resident, _ = await prepare_resident(backend, PROBE_USABLE_BLOCKS)
    held, mismatched, conflict = "l7-held", "l7-mismatched", "l7-conflict"
    await backend.submit_claim(
        claim_spec(held, resident, ProtectionMode.HARD_PROTECTED, identity), resident
    )
    other = synthetic_blocks("l7-other", 4)
    wrong = dataclasses.replace(identity, model_id=f"{identity.model_id}-other")
    await backend.submit_claim(
        claim_spec(mismatched, other, ProtectionMode.HARD_PROTECTED, wrong), other
    )
    active = synthetic_blocks("probe-active", PROBE_ACTIVE_BLOCKS)
    refused = await backend.begin(conflict, active)
    v.require(not refused.served, "the conflicting request was served over a hard claim")
    await backend.release_claim(ClaimId(held), OWNER_SCOPE)
    await serve(backend, "l7-after-release", active)
    lost = await lost_blocks(backend, resident)

    events = await backend.events(0)
    wire = [ClaimEvent.from_json(e.to_json()) for e in events]  # the events alone, as sent
    lifecycle = (E.RESIDENT_CLAIM_ACCEPTED, E.RESIDENT_CLAIM_MATERIALIZED, E.RESIDENT_CLAIM_EXPIRED)
    v.cite(*select_events(wire, *lifecycle, claim_id=held))
    v.cite(*select_events(wire, E.RESIDENT_CLAIM_REJECTED, claim_id=mismatched))
    v.cite(*select_events(wire, E.ACTIVE_REQUEST_REFUSED, request_id=conflict))
    v.cite(*select_events(wire, E.RESIDENT_CLAIM_BLOCK_LOST_AFTER_RELEASE, claim_id=held)[:1])
    if not await check_replay(v, backend, wire, held, mismatched, [conflict], lost):
        return v.result("")
    return v.result(
        f"{len(wire)} events replayed: {held} accepted, materialized, blocking [{conflict}], "
        f"{ClaimState.EXPIRED} (released), {lost} post-release losses; {mismatched} refused; "
        "all match the backend's view"
    )


# ---------------------------------------------------------------------------------- C1
async def level_c1(backend: Target) -> LevelResult:
    """Lowering hard to soft_priority is classified unsound (``rejected``)."""
    v = Verdict("C1")
    hard = await allocator_probe(backend, mode=ProtectionMode.HARD_PROTECTED)
    soft = await allocator_probe(backend, mode=ProtectionMode.SOFT_PRIORITY)
    baseline, lowered = check_hard_lowering(hard), check_hard_lowering(soft)
    v.cite(*hard.named(E.ACTIVE_REQUEST_REFUSED))
    v.cite(*soft.named(E.RESIDENT_CLAIM_HARMED, claim_id=soft.claim_id))
    v.cite(*soft.named(E.ALLOCATION_VICTIM_SELECTED, claim_id=soft.claim_id)[:1])
    return c1_verdict(v, baseline, lowered)


# ---------------------------------------------------------------------------------- running
Scenario = Callable[[Target], Awaitable[LevelResult]]

LEVELS: Mapping[str, Scenario] = {
    "L1": level_l1,
    "L2": level_l2,
    "L3": level_l3,
    "L4": level_l4,
    "L5": level_l5,
    "L6": level_l6,
    "L7": level_l7,
    "C1": level_c1,
}
"""Every level, in the order the suite runs them."""


def as_target(backend: Target | ClaimsProtocol) -> Target:
    """``backend`` as the scenarios drive it (a ``UsageError`` if it speaks no protocol)."""
    return backend if isinstance(backend, Target) else Target(backend)


async def run_level(backend: Target | ClaimsProtocol, level: str) -> LevelResult:
    """Run one level; a missing operation is ``not_exposed``, an unreachable backend
    ``not_evaluated``, and any other error ``fail`` (fail closed)."""
    scenario = LEVELS.get(level)
    if scenario is None:
        raise UnknownNameError("level", level, list(LEVELS))
    target = as_target(backend)
    try:
        pool = await target.served_pool()
        if pool is not None:  # a served engine (vLLM): the same obligations on its own pool
            from agentclaims.conformance.served import SERVED_LEVELS

            return await SERVED_LEVELS[level](target, pool)
        return await scenario(target)
    except OperationNotExposed as exc:
        return LevelResult(level, ConformanceStatus.NOT_EXPOSED, detail=str(exc))
    except BackendUnavailable as exc:
        return LevelResult(level, ConformanceStatus.NOT_EVALUATED, detail=str(exc))
    except Exception as exc:
        return LevelResult(level, ConformanceStatus.FAIL, detail=f"{type(exc).__name__}: {exc}")


async def run_suite(
    backend: Target | ClaimsProtocol, levels: Iterable[str] | None = None
) -> dict[str, LevelResult]:
    """Run the given levels (all by default) in order, each on a fresh instance."""
    chosen = list(LEVELS) if levels is None else list(levels)
    for level in chosen:
        if level not in LEVELS:
            raise UnknownNameError("level", level, list(LEVELS))
    target = as_target(backend)
    results = {level: await run_level(target, level) for level in chosen}
    await target.tidy()
    return results


def suite_not_evaluated(reason: str) -> dict[str, LevelResult]:
    """Every level as ``not_evaluated``, for a backend the suite cannot drive yet."""
    return {
        level: LevelResult(level, ConformanceStatus.NOT_EVALUATED, detail=reason)
        for level in LEVELS
    }
