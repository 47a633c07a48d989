"""The levels on a served engine (vLLM through the gateway): the same obligations, its own pool.

The reference scenarios drive a synthetic pool of any size by block hashes and count steps. A
vLLM server has one pool, fixed at start, serves token ids only, bounds every prompt by its
``max_model_len`` and counts claim TTLs in seconds; its connector caps holds so that one
max-length request always fits. So on it (the descriptor's ``kv_side`` is ``vllm``) each level
keeps its obligation and changes its set-up:

- the pool is vLLM's (``usable_blocks``); a fresh instance is every hold revoked and vLLM's
  prefix cache reset; residency is vLLM's own KV events joined to the gateway's hashes;
- "resident" is a full-length prompt, "pressure" enough full-length prompts to turn the pool
  over, and an active request that cannot fit beside the claims is a full-length request sent
  while a long-running one decodes, with claims held up to the connector's cap (the cap leaves
  room for one max-length request, so a single request never conflicts);
- an expiring claim runs on a TTL of seconds, waited out;
- L2 and L6 cannot be arranged on vLLM and report ``not_exposed`` (why, in the detail);
- on stock vLLM (no connector answers) a claim that must be held is refused, and the levels
  that need one report ``not_exposed``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from agentclaims.conformance.lowering import check_hard_lowering
from agentclaims.conformance.probe import (
    OWNER_SCOPE,
    ProbeRecord,
    claim_spec,
    lost_blocks,
    select_events,
)
from agentclaims.conformance.target import ServedPool, Target
from agentclaims.conformance.verdict import (
    LevelResult,
    Verdict,
    c1_verdict,
    check_replay,
    ended_before_loss,
    hard_claim_held,
)
from agentclaims.contract import (
    BlockHash,
    CacheIdentity,
    ClaimEvent,
    ClaimId,
    ClaimState,
    ConformanceStatus,
    EventName,
    Feasibility,
    ProtectionMode,
    RequestId,
)
from agentclaims.engine.blocks import hash_token_blocks
from agentclaims.errors import OperationNotExposed
from agentclaims.protocol import ActiveOutcome, ActiveRequest, ActiveServing, ClaimDecision

__all__ = ["SERVED_LEVELS"]

E = EventName
_EXPIRING_TTL_S = 3.0
_BURSTS = 5


def _tokens(tag: str, n: int) -> list[int]:
    """A distinct prompt per tag (ids 3..999: inside any vocabulary the suite runs on)."""
    seed = hashlib.blake2b(tag.encode(), digest_size=8).digest()
    return [
        3
        + int.from_bytes(hashlib.blake2b(seed + i.to_bytes(4, "big"), digest_size=4).digest()) % 997
        for i in range(n)
    ]


class _Run:
    """One served scenario: its prompts, requests and claims on the shared pool."""

    def __init__(self, target: Target, pool: ServedPool, level: str) -> None:
        self.target = target
        self.pool = pool
        self.level = level
        self.identity: CacheIdentity | None = None

    async def fresh(self) -> CacheIdentity:
        self.identity = await self.target.fresh(self.pool.usable_blocks)
        return self.identity

    def prompt(self, tag: str, blocks: int | None = None) -> list[int]:
        n = self.pool.prompt_blocks if blocks is None else blocks
        return _tokens(f"{self.level}:{tag}", n * self.pool.block_size)

    def hashes(self, tokens: Sequence[int]) -> list[BlockHash]:
        return hash_token_blocks(list(tokens), self.pool.block_size)

    async def serve(self, request_id: str, tokens: Sequence[int], decode: int = 1) -> ActiveOutcome:
        backend = self.target.backend
        if not isinstance(backend, ActiveServing):
            raise OperationNotExposed(self.target.name, "serve")
        request = ActiveRequest(
            RequestId(request_id),
            segments=(tuple(tokens),),
            reply_tokens=(0,) * decode,
            owner_scope=OWNER_SCOPE,
            chat=False,
        )
        return (await backend.serve(request)).outcome

    async def claim(
        self, claim_id: str, tokens: Sequence[int], mode: ProtectionMode, **extra: Any
    ) -> ClaimDecision:
        """Serve ``tokens`` and claim their prefix; a claim stock vLLM cannot hold is
        ``not_exposed``."""
        assert self.identity is not None
        await self.serve(f"{claim_id}-served", tokens)
        spec = claim_spec(claim_id, self.hashes(tokens), mode, self.identity, **extra)
        decision = await self.target.backend.submit_claim(spec, None)
        if not decision.accepted and not self.pool.connector:
            raise OperationNotExposed(
                self.target.name, f"{mode.value} claims (stock vLLM: {decision.reason})"
            )
        return decision

    async def fill(self, mode: ProtectionMode, probe_blocks: int) -> tuple[list[str], int]:
        """Claims of ``mode`` beside the probe's, up to the connector's cap on held blocks
        (the last one as long as the room left); their ids and the blocks held in all."""
        ids: list[str] = []
        held = probe_blocks
        full = self.pool.prompt_blocks
        while self.pool.cap_blocks - held >= 1:
            blocks = min(full, self.pool.cap_blocks - held)
            cid = f"{self.level}-filler-{len(ids)}"
            decision = await self.claim(cid, self.prompt(f"filler-{len(ids)}", blocks), mode)
            if not decision.accepted:
                break
            ids.append(cid)
            held += blocks
        return ids, held

    async def burst(self, tag: str, held_blocks: int) -> tuple[list[ActiveOutcome], int]:
        """Active work that cannot fit beside ``held_blocks``: two long-running requests sent
        at once, each with a prompt of two blocks over half of what the holds leave free (at the
        cap: one max-length request's worth and a watermark) and a reply as long as the model
        allows. Whichever vLLM admits first, the other cannot start beside it without held
        blocks, and both live for many decode steps, so they meet at admission however slow
        the machine is (no wait on vLLM's events, no race with a short request). Their
        outcomes and the blocks both want at once. If nothing met the claims, they are sent
        again, at most ``_BURSTS`` times."""
        bs, mml = self.pool.block_size, self.pool.max_model_len
        free = max(1, self.pool.usable_blocks - held_blocks)
        # a margin over half: vLLM may hold a block more than the prompt for the first decode
        blocks = min(free // 2 + 2, free, max(1, (mml - 2) // bs))
        reply = max(1, mml - blocks * bs - 1)  # as long as it may: the two must overlap
        outcomes: list[ActiveOutcome] = []
        for attempt in range(_BURSTS):
            since = max((e.seq for e in await self.events()), default=0)
            name = f"{self.level}-{tag}{attempt}"
            outcomes = list(
                await asyncio.gather(
                    *(
                        self.serve(f"{name}-{part}", _tokens(f"{name}:{part}", blocks * bs), reply)
                        for part in ("a", "b")
                    )
                )
            )
            if await self.collided(outcomes, since):
                break
        demand = 2 * -(-(blocks * bs + reply) // bs)
        return outcomes, held_blocks + demand

    async def collided(self, outcomes: Sequence[ActiveOutcome], since: int) -> bool:
        """Whether the active work met the claims: a request refused, or an event of it."""
        if any(not o.served for o in outcomes):
            return True
        names = (E.ACTIVE_REQUEST_REFUSED, E.ACTIVE_REQUEST_DEFERRED, E.RESIDENT_CLAIM_DEMOTED)
        return bool(select_events([e for e in await self.events() if e.seq > since], *names))

    async def pressure(self, tag: str) -> None:
        """Unclaimed full-length prompts, one after another, turning the whole pool over."""
        for i in range(self.pool.usable_blocks // self.pool.prompt_blocks + 2):
            await self.serve(f"{self.level}-{tag}-{i}", self.prompt(f"{tag}-{i}"))

    async def events(self) -> list[ClaimEvent]:
        return await self.target.events(0)


def _not_exposed(level: str, why: str) -> LevelResult:
    return LevelResult(level, ConformanceStatus.NOT_EXPOSED, detail=why)


# ---------------------------------------------------------------------------------- levels
async def level_l1(target: Target, pool: ServedPool) -> LevelResult:
    """No accepted claim: pressure evicts a resident prefix, and none of it is harm."""

    v = Verdict("L1")
    run = _Run(target, pool, "L1")
    await run.fresh()
    resident = run.prompt("resident")
    served = await run.serve("l1-resident", resident)
    await run.pressure("pressure")
    lost = await lost_blocks(target, run.hashes(resident))
    events = await run.events()
    harms = select_events(events, E.RESIDENT_CLAIM_HARMED)
    victims = select_events(events, E.ALLOCATION_VICTIM_SELECTED)
    v.cite(*harms, *victims)
    v.require(served.served, f"the resident request was not served ({served.action.value})")
    v.require(lost > 0, "no resident block was evicted under pressure")
    v.require(not harms, f"{len(harms)} resident_claim_harmed events with no claim accepted")
    v.require(not victims, f"{len(victims)} claimed victims with no claim accepted")
    return v.result(
        f"{lost} of {pool.prompt_blocks} unclaimed resident blocks evicted by pressure "
        f"(vLLM's own KV events); harm 0"
    )


async def level_l2(target: Target, pool: ServedPool) -> LevelResult:
    return _not_exposed(
        "L2",
        "vLLM caches every full block it computes: a request cannot be served without admitting "
        "its KV for future reuse (no write no-admit to test)",
    )


async def _hard_probe(
    run: _Run, mode: ProtectionMode
) -> tuple[ProbeRecord, list[ActiveOutcome], list[str]]:
    """The probe on the served pool: a claimed full-length prompt, claims of the same mode
    up to the cap beside it, then active work that cannot fit beside them."""
    await run.fresh()
    resident = run.prompt("resident")
    cid = ProbeRecord.claim_id
    decision = await run.claim(cid, resident, mode)
    fillers, held = await run.fill(mode, run.pool.prompt_blocks) if decision.accepted else ([], 0)
    outcomes, demand = await run.burst("active", held)
    if mode is not ProtectionMode.HARD_PROTECTED:
        await run.pressure("after")  # what the shed holds let go is now evicted
    hashes = run.hashes(resident)
    refused = [o for o in outcomes if not o.served]
    backend = run.target.backend
    view = await backend.get_claim(cid, OWNER_SCOPE) if decision.accepted else None  # type: ignore[arg-type]
    record = ProbeRecord(
        usable_blocks=run.pool.usable_blocks,
        mode=mode,
        resident=tuple(hashes),
        active=(),
        decision=decision,
        outcome=(refused or outcomes)[0],
        resident_lost=await lost_blocks(run.target, hashes),
        events=tuple(await run.events()),
        claim_view=view,
        demand_blocks=demand,
    )
    return record, outcomes, fillers


async def level_l3(target: Target, pool: ServedPool) -> LevelResult:
    """An accepted hard claim turns a burst that cannot fit beside it into explicit refusals."""

    v = Verdict("L3")
    if pool.max_ttl_s and pool.max_defer_s and pool.max_ttl_s <= pool.max_defer_s:
        return v.not_evaluated(
            f"the connector defers up to {pool.max_defer_s} s, as long as any hold lives "
            f"({pool.max_ttl_s} s): a blocked request waits instead of being refused"
        )
    probe, outcomes, fillers = await _hard_probe(
        _Run(target, pool, "L3"), ProtectionMode.HARD_PROTECTED
    )
    cid = probe.claim_id
    victims = hard_claim_held(v, probe)
    if victims is None:
        return v.result("")
    refused = [o for o in outcomes if not o.served]
    refused_ids = {o.request_id for o in refused}
    v.require(bool(refused), f"all {len(outcomes)} active requests served beside the hard claims")
    for o in refused:
        v.require(
            cid in o.blocking_claim_ids,
            f"{o.request_id}: blocking {list(o.blocking_claim_ids)} lacks {cid}",
        )
    events = [e for e in probe.named(E.ACTIVE_REQUEST_REFUSED) if e.request_id in refused_ids]
    v.cite(*events)
    v.require(
        {e.request_id for e in events} == refused_ids,
        f"active_request_refused for {sorted({str(e.request_id) for e in events})}, refused {sorted(refused_ids)}",
    )
    for e in events:
        blocking = list(e.data.get("blocking_claim_ids", ()))
        v.require(cid in blocking, f"#{e.seq}: blocking_claim_ids {blocking} do not name {cid}")
        v.require(
            e.data.get("feasibility") == Feasibility.INFEASIBLE_PRESERVE_RESIDENT_AND_ACTIVE,
            f"#{e.seq}: feasibility {e.data.get('feasibility')!r}",
        )
        v.require(int(e.data.get("shortfall_blocks") or 0) > 0, f"#{e.seq}: no shortfall")
    v.require(not victims, f"{len(victims)} claimed victim/harm events")
    v.require(probe.resident_lost == 0, f"{probe.resident_lost} claimed blocks lost")
    state = None if probe.claim_view is None else probe.claim_view.state
    v.require(state is ClaimState.MATERIALIZED, f"claim ended up {state}, expected materialized")
    return v.result(
        f"{len(refused)} of {len(outcomes)} active requests refused "
        f"({Feasibility.INFEASIBLE_PRESERVE_RESIDENT_AND_ACTIVE.value}, blocking [{cid}, "
        f"{len(fillers)} more]) beside {probe.demand_blocks} blocks wanted of "
        f"{pool.usable_blocks}; 0 claimed blocks lost"
    )


async def level_l4(target: Target, pool: ServedPool) -> LevelResult:
    """A demotable claim gives way to a burst: demoted, with its event, before any loss."""

    v = Verdict("L4")
    probe, outcomes, _ = await _hard_probe(_Run(target, pool, "L4"), ProtectionMode.DEMOTABLE)
    if not v.require(
        probe.decision is not None and probe.decision.accepted,
        "the demotable claim was not accepted",
    ):
        return v.result("")
    unserved = [o for o in outcomes if not o.served]
    v.require(not unserved, f"{len(unserved)} active requests not served beside soft claims")
    return await ended_before_loss(
        v, target, list(probe.events), probe.resident, probe.claim_id, E.RESIDENT_CLAIM_DEMOTED
    )


async def level_l5(target: Target, pool: ServedPool) -> LevelResult:
    """An expiring claim protects until its TTL (seconds on vLLM), then expires before any loss."""

    v = Verdict("L5")
    run = _Run(target, pool, "L5")
    await run.fresh()
    resident = run.prompt("resident")
    hashes = run.hashes(resident)
    began = time.monotonic()
    decision = await run.claim(
        ProbeRecord.claim_id, resident, ProtectionMode.EXPIRING, ttl_s=_EXPIRING_TTL_S
    )
    if not v.require(decision.accepted, f"expiring claim not accepted ({decision.reason})"):
        return v.result("")
    await run.pressure("before")
    lost_early = await lost_blocks(target, hashes)
    if time.monotonic() - began >= _EXPIRING_TTL_S:
        return v.not_evaluated(
            f"the pressure outlasted the claim's {_EXPIRING_TTL_S} s TTL on this machine"
        )
    v.require(lost_early == 0, f"{lost_early} claimed blocks lost before the claim expired")
    await asyncio.sleep(max(0.0, began + _EXPIRING_TTL_S + 0.5 - time.monotonic()))
    late = await run.serve("l5-after-expiry", run.prompt("late"))
    await run.pressure("after")
    v.require(late.served, f"active request not served after expiry ({late.action.value})")
    await lost_blocks(target, hashes)  # vLLM's events caught up before the stream is read
    events = await run.events()
    result = await ended_before_loss(
        v, target, events, hashes, ProbeRecord.claim_id, E.RESIDENT_CLAIM_EXPIRED
    )
    if result.passed:
        return dataclasses.replace(
            result, detail=f"0 lost before its {_EXPIRING_TTL_S} s TTL; then: {result.detail}"
        )
    return result


async def level_l6(target: Target, pool: ServedPool) -> LevelResult:
    return _not_exposed(
        "L6",
        "the loss of block 0 alone cannot be arranged on vLLM: a hold covers a leading prefix "
        "only (no anchor on blocks 1..n), vLLM frees a prefix tail first, and a claim re-runs "
        "its prefix, recomputing a lost block 0 (the late claim then materializes for real)",
    )


async def level_l7(target: Target, pool: ServedPool) -> LevelResult:
    """Acceptance, materialization, conflict, blocking ids and the end, rebuilt from events."""

    v = Verdict("L7")
    run = _Run(target, pool, "L7")
    identity = await run.fresh()
    held, mismatched = "l7-held", "l7-mismatched"
    resident = run.prompt("resident")
    hashes = run.hashes(resident)
    decision = await run.claim(held, resident, ProtectionMode.HARD_PROTECTED)
    if not v.require(decision.accepted, f"{held} not accepted ({decision.reason})"):
        return v.result("")
    wrong = dataclasses.replace(identity, model_id=f"{identity.model_id}-other")
    other = run.hashes(run.prompt("other", 2))
    await target.backend.submit_claim(
        claim_spec(mismatched, other, ProtectionMode.HARD_PROTECTED, wrong), None
    )
    _, held_blocks = await run.fill(ProtectionMode.HARD_PROTECTED, pool.prompt_blocks)
    outcomes, _ = await run.burst("conflict", held_blocks)
    conflicts = sorted(str(o.request_id) for o in outcomes if not o.served)
    v.require(bool(conflicts), "no burst request was refused beside the hard claims")
    await target.release_claim(ClaimId(held), OWNER_SCOPE)
    await run.pressure("after-release")
    lost = await lost_blocks(target, hashes)
    events = await run.events()
    wire = [ClaimEvent.from_json(e.to_json()) for e in events]
    lifecycle = (E.RESIDENT_CLAIM_ACCEPTED, E.RESIDENT_CLAIM_MATERIALIZED, E.RESIDENT_CLAIM_EXPIRED)
    v.cite(*select_events(wire, *lifecycle, claim_id=held))
    v.cite(*select_events(wire, E.RESIDENT_CLAIM_REJECTED, claim_id=mismatched))
    v.cite(
        *[
            e
            for e in select_events(wire, E.ACTIVE_REQUEST_REFUSED)
            if str(e.request_id) in conflicts
        ]
    )
    v.cite(*select_events(wire, E.RESIDENT_CLAIM_BLOCK_LOST_AFTER_RELEASE, claim_id=held)[:1])
    replayed = await check_replay(
        v,
        target,
        wire,
        held,
        mismatched,
        conflicts,
        lost,
        usable_blocks=pool.usable_blocks,
        distinct=True,
    )
    if not replayed:
        return v.result("")
    return v.result(
        f"{len(wire)} events replayed: {held} accepted, materialized (vLLM's events), blocking "
        f"{len(conflicts)} refused requests, {ClaimState.EXPIRED} (released), {lost} "
        f"post-release losses; {mismatched} refused; all match the backend's view"
    )


async def level_c1(target: Target, pool: ServedPool) -> LevelResult:
    """Lowering hard to soft_priority on vLLM is classified unsound (``rejected``)."""

    v = Verdict("C1")
    hard, _, _ = await _hard_probe(_Run(target, pool, "C1h"), ProtectionMode.HARD_PROTECTED)
    soft, _, _ = await _hard_probe(_Run(target, pool, "C1s"), ProtectionMode.SOFT_PRIORITY)
    for probe in (hard, soft):
        if probe.decision is None or not probe.decision.accepted:
            assert probe.mode is not None
            return v.not_evaluated(f"the {probe.mode.value} probe claim was not accepted")
    baseline, lowered = check_hard_lowering(hard), check_hard_lowering(soft)
    v.cite(*hard.named(E.ACTIVE_REQUEST_REFUSED))
    v.cite(*soft.named(E.RESIDENT_CLAIM_DEMOTED, E.RESIDENT_CLAIM_HARMED, claim_id=soft.claim_id))
    return c1_verdict(v, baseline, lowered)


ServedScenario = Callable[[Target, ServedPool], Awaitable[LevelResult]]

SERVED_LEVELS: Mapping[str, ServedScenario] = {
    "L1": level_l1,
    "L2": level_l2,
    "L3": level_l3,
    "L4": level_l4,
    "L5": level_l5,
    "L6": level_l6,
    "L7": level_l7,
    "C1": level_c1,
}
"""Every level's served variant, keyed as ``scenarios.LEVELS``."""
