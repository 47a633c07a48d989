"""What the conformance scenarios share with the served-level suite (``served``): a level's
result and the events that decided it, the verdict a scenario collects its checks in, and the
checks both kinds of run make on any engine (a claim ended before its blocks were lost, the
event stream replayed, C1 from two lowering classifications)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from agentclaims.conformance.lowering import LoweringVerdict
from agentclaims.conformance.probe import (
    OWNER_SCOPE,
    PROBE_USABLE_BLOCKS,
    ProbeRecord,
    lost_blocks,
    select_events,
)
from agentclaims.conformance.target import Target
from agentclaims.contract import (
    SCHEMA_VERSION,
    ClaimEvent,
    ClaimId,
    ConformanceStatus,
    EventName,
    LoweringClass,
    rebuild_claims,
)
from agentclaims.contract.ids import BlockHash
from agentclaims.errors import AgentClaimsError

__all__ = [
    "LOSS_EVENTS",
    "Evidence",
    "LevelResult",
    "Verdict",
    "c1_verdict",
    "check_envelope",
    "check_replay",
    "ended_before_loss",
    "hard_claim_held",
    "single",
]

E = EventName
LOSS_EVENTS = (
    E.ALLOCATION_VICTIM_SELECTED,
    E.RESIDENT_CLAIM_HARMED,
    E.RESIDENT_CLAIM_BLOCK_LOST_AFTER_RELEASE,
)
"""Events that say a claimed block was lost."""


@dataclass(frozen=True, slots=True)
class Evidence:
    """One event that decided a level."""

    seq: int
    event: str

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "event": self.event}

    def __str__(self) -> str:
        return f"#{self.seq} {self.event}"


@dataclass(frozen=True, slots=True)
class LevelResult:
    """The outcome of one level on one backend."""

    level: str
    status: ConformanceStatus
    evidence: tuple[Evidence, ...] = ()
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.status is ConformanceStatus.PASS

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status.value,
            "evidence": [e.to_dict() for e in self.evidence],
            "detail": self.detail,
        }


class Verdict:
    """Collects one scenario's evidence and failed checks, then says the status."""

    __slots__ = ("evidence", "failures", "level")

    def __init__(self, level: str) -> None:
        self.level = level
        self.evidence: dict[int, Evidence] = {}
        self.failures: list[str] = []

    def cite(self, *events: ClaimEvent) -> None:
        for e in events:
            self.evidence[e.seq] = Evidence(e.seq, e.event.value)

    def require(self, ok: bool, failure: str) -> bool:
        if not ok:
            self.failures.append(failure)
        return ok

    def fail(self, failure: str) -> None:
        self.failures.append(failure)

    def result(
        self, detail: str, status: ConformanceStatus = ConformanceStatus.PASS
    ) -> LevelResult:
        """``status`` with ``detail`` if every check held, else ``fail`` with what broke."""
        if self.failures:
            status, detail = ConformanceStatus.FAIL, "; ".join(self.failures)
        cited = tuple(self.evidence[s] for s in sorted(self.evidence))
        return LevelResult(self.level, status, cited, detail)

    def not_evaluated(self, why: str) -> LevelResult:
        return self.result(why, ConformanceStatus.NOT_EVALUATED)


def single(v: Verdict, events: list[ClaimEvent], what: str) -> ClaimEvent | None:
    """The one event of a kind, or ``None`` after recording why there is not exactly one."""
    v.cite(*events)
    if v.require(len(events) == 1, f"expected one {what} event, got {len(events)}"):
        return events[0]
    return None


def hard_claim_held(v: Verdict, probe: ProbeRecord) -> list[ClaimEvent] | None:
    """Cite the probe claim's acceptance, materialization and any victim or harm events of it;
    the latter, or ``None`` after recording that the hard claim was not accepted (L3)."""
    cid = probe.claim_id
    v.cite(*probe.named(E.RESIDENT_CLAIM_ACCEPTED, E.RESIDENT_CLAIM_MATERIALIZED, claim_id=cid))
    victims = probe.named(E.ALLOCATION_VICTIM_SELECTED, E.RESIDENT_CLAIM_HARMED, claim_id=cid)
    v.cite(*victims)
    accepted = probe.decision is not None and probe.decision.accepted
    return victims if v.require(accepted, "the hard claim was not accepted") else None


async def ended_before_loss(
    v: Verdict,
    backend: Target,
    events: list[ClaimEvent],
    resident: Sequence[BlockHash],
    claim_id: str,
    end: EventName,
) -> LevelResult:
    """The claim ended by ``end`` before any loss; later losses are post-release, not harm."""
    ended = single(v, select_events(events, end, claim_id=claim_id), end)
    losses = select_events(events, *LOSS_EVENTS, claim_id=claim_id)
    harms = select_events(losses, E.RESIDENT_CLAIM_HARMED)
    post = select_events(losses, E.RESIDENT_CLAIM_BLOCK_LOST_AFTER_RELEASE)
    v.cite(*harms, *post[:1])
    lost = await lost_blocks(backend, resident)
    counted = sum(int(e.data.get("blocks", 1)) for e in post)
    v.require(not harms, f"{len(harms)} resident_claim_harmed events")
    v.require(lost > 0, "no claimed block was lost after the claim ended: nothing exercised")
    v.require(
        counted == lost,
        f"{lost} claimed blocks lost, {counted} counted as {E.RESIDENT_CLAIM_BLOCK_LOST_AFTER_RELEASE}",
    )
    if ended is None:
        return v.result("")
    early = [e for e in losses if e.seq < ended.seq]
    if early:
        v.cite(early[0])
        v.fail(f"{len(early)} losses before {end} (first #{early[0].seq})")
    return v.result(
        f"{end} at #{ended.seq} before all {lost} losses; harm 0; "
        f"{counted} counted as {E.RESIDENT_CLAIM_BLOCK_LOST_AFTER_RELEASE}"
    )


async def check_replay(
    v: Verdict,
    backend: Target,
    wire: list[ClaimEvent],
    held: str,
    mismatched: str,
    blocking: Sequence[str],
    lost: int,
    *,
    usable_blocks: int = PROBE_USABLE_BLOCKS,
    distinct: bool = False,
) -> bool:
    """L7's replay check, on any engine: the wire events rebuild the claims, carry the
    envelope, agree with the backend's views; ``held`` accepted, materialized, blocking exactly
    ``blocking`` (``distinct``: as a sorted set) and counting its ``lost`` post-release losses;
    ``mismatched`` rejected. False when the stream does not replay at all."""
    try:
        rebuilt = rebuild_claims(wire)
    except AgentClaimsError as exc:
        v.fail(f"the stream does not replay: {exc}")
        return False
    check_envelope(v, wire, usable_blocks)
    for cid in (held, mismatched):
        view = await backend.get_claim(ClaimId(cid), OWNER_SCOPE)
        hist = rebuilt.get(cid)
        if not v.require(hist is not None, f"no event names claim {cid}"):
            continue
        assert hist is not None
        v.require(
            hist.state is view.state,
            f"{cid}: rebuilt state {hist.state}, backend says {view.state}",
        )
        v.require(
            hist.end_reason == view.end_reason,
            f"{cid}: rebuilt end reason {hist.end_reason!r}, backend says {view.end_reason!r}",
        )
    h = rebuilt.get(held)
    if h is not None:
        v.require(E.RESIDENT_CLAIM_ACCEPTED in h.events, f"{held}: acceptance not in the trace")
        v.require(h.materialized, f"{held}: materialization not in the trace")
        got = sorted(set(h.blocking_requests)) if distinct else h.blocking_requests
        v.require(
            got == list(blocking),
            f"{held}: rebuilt blocking requests {got}, expected {list(blocking)}",
        )
        v.require(
            lost > 0 and h.blocks_lost_after_release == lost,
            f"{held}: {lost} blocks lost, trace counts {h.blocks_lost_after_release}",
        )
    m = rebuilt.get(mismatched)
    if m is not None:
        v.require(E.RESIDENT_CLAIM_REJECTED in m.events, f"{mismatched}: rejection not in trace")
    return True


def check_envelope(
    v: Verdict, events: Iterable[ClaimEvent], usable_blocks: int = PROBE_USABLE_BLOCKS
) -> None:
    """Every event carries the contract's envelope, for one run on one instance."""
    runs = {e.run_id for e in events}
    v.require(len(runs) == 1, f"events from {len(runs)} runs")
    for e in events:
        if not v.require(
            e.schema_version == SCHEMA_VERSION and e.usable_blocks == usable_blocks,
            f"#{e.seq}: schema_version {e.schema_version}, usable_blocks {e.usable_blocks}",
        ):
            return


def c1_verdict(v: Verdict, baseline: LoweringVerdict, lowered: LoweringVerdict) -> LevelResult:
    """C1 from the two classifications, on any engine: the hard probe's lowering must be
    sound and hard -> soft_priority ``rejected`` (``approximate`` when only the rule says so,
    no counterexample seen)."""
    v.require(
        baseline.lowering_class is not LoweringClass.REJECTED,
        f"the hard claim itself breaks {', '.join(baseline.violated)}: "
        "no sound baseline to tell hard from soft",
    )
    v.require(
        lowered.lowering_class is LoweringClass.REJECTED,
        f"hard_protected -> soft_priority classified {lowered.lowering_class}",
    )
    if not lowered.violated:
        return v.result(
            f"{LoweringClass.REJECTED} by rule only: {lowered.reason}; no counterexample observed",
            ConformanceStatus.APPROXIMATE,
        )
    return v.result(
        f"hard_protected -> soft_priority: {lowered.lowering_class} ({lowered.reason}); "
        f"hard baseline: {baseline.lowering_class}"
    )
