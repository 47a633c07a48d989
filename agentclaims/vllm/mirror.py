"""``ClaimMirror``: the vLLM side's record of its claims, mirrored from the connector.

The connector in vLLM holds the blocks and decides; the gateway keeps what it heard: each
claim's state and held blocks (from the connector's answers and events, re-sequenced into the
gateway's own ``EventLog``), the view a reader gets, and, with vLLM's KV events
(``KVEventsObserver``), the join that sees a claim materialize in vLLM's own cache, counts its
blocks lost after it ended, and judges harm (fail closed: a held block that vLLM dropped is a
connector bug, and no claim is accepted after it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from agentclaims import kernel
from agentclaims.contract import (
    BACKEND_RESTART,
    ArbiterAction,
    BlockHash,
    ClaimId,
    ClaimSpec,
    ClaimState,
    Decision,
    EventName,
    backend_restart_end,
    owned_claim,
)
from agentclaims.errors import BackendError, BackendUnavailable
from agentclaims.kernel import CLAIMS_KEPT, EVENTS_KEPT, Claim, EventLog, EventSource, forget_ended
from agentclaims.protocol import ClaimDecision, ClaimView
from agentclaims.vllm.client import ConnectorAnswer
from agentclaims.vllm.observer import KVEventsObserver

__all__ = ["ClaimMirror", "MirroredClaim"]

log = logging.getLogger("agentclaims.vllm")

KEY_REFUSED = "vLLM's connector refuses this gateway's signed claim operations"
"""How ``ClaimMirror.fault`` begins when the claims key is not the connector's."""

_CONTRACT_EVENTS = {e.value for e in EventName}
_VERDICTS = {
    EventName.ACTIVE_REQUEST_DEFERRED.value: "deferred",
    EventName.ACTIVE_REQUEST_REFUSED.value: "refused",
}
"""The connector's admission verdicts on a request, by event: what ``ClaimMirror.verdicts``
counts."""


class MirroredClaim(Claim):
    """A claim as the gateway mirrors it from the connector's answers and events."""

    __slots__ = ("expires_at_ns", "hashes", "held_blocks", "lost", "made")

    def __init__(
        self,
        spec: ClaimSpec,
        state: ClaimState,
        held_blocks: int,
        *,
        hashes: tuple[BlockHash, ...] = (),
        end_reason: str | None = None,
    ) -> None:
        super().__init__(spec, state)
        self.held_blocks = held_blocks
        self.end_reason = end_reason
        self.expires_at_ns: int | None = None
        self.hashes = hashes
        """The claimed blocks' hashes (the gateway's), head first: what the observer joins."""
        self.lost: set[BlockHash] = set()
        """Claimed blocks seen leaving vLLM's cache after the claim ended (each counted once)."""
        self.made = 0
        """Its place among the mirror's claims, in the order they were made (``ClaimMirror.put``)."""

    @property
    def held(self) -> bool:
        """The connector holds its blocks (as far as the gateway has heard)."""
        live = self.state in (ClaimState.ACCEPTED, ClaimState.MATERIALIZED)
        return live and self.held_blocks > 0


def _has_ended(claim: MirroredClaim) -> bool:
    return claim.state.terminal


class ClaimMirror:
    """The claims this gateway made on vLLM, and their events."""

    def __init__(
        self,
        source: EventSource,
        lock: asyncio.Lock,
        *,
        ask: Callable[[], Awaitable[ConnectorAnswer]],
        release: Callable[[str, str], Awaitable[object]],
        observer: KVEventsObserver | None = None,
        max_requests: int = 100_000,
        max_claims: int = CLAIMS_KEPT,
    ) -> None:
        self._source = source
        self._lock = lock
        self._ask = ask
        """The connector's latest events, asked for now (an empty operation)."""
        self._release = release
        """Hand back whatever the connector still holds for a claim (its id, its tenant)."""
        self.claims: dict[str, MirroredClaim] = {}
        """Every claim kept, in the order made (``put``): the live ones and the last ended."""
        self._covering: dict[BlockHash, dict[str, None]] = {}
        """Block hash -> the kept claims on it (in the order made): the KV-events join's index."""
        self._made = 0
        self._max_claims = max_claims
        self.events = EventLog(source, EVENTS_KEPT)
        """The last ``EVENTS_KEPT`` events for readers (one further back reads as a gap)."""
        self.observer = observer
        """vLLM's KV events joined to the gateway's hashes: what ``blocks_stored`` and
        ``blocks_lost`` hear from (the KV side starts it)."""
        if observer is not None:
            observer.on_removed = self.blocks_lost
        self.judging: set[asyncio.Task[None]] = set()
        self.fault: str | None = None
        """Set when a held claim was harmed (a connector bug): no claim is accepted after it."""
        self.limits: dict[str, Any] = {}
        """The connector's limits as it last answered: ``cap_blocks``, ``max_ttl_s``,
        ``max_defer_s`` (what a hold may take, how long a request may be deferred)."""
        self._request_ids: OrderedDict[str, str] = OrderedDict()
        """vLLM's request id (``cmpl-<ours>``) -> the gateway's, for the connector's events."""
        self._max_requests = max_requests
        self.verdicts = dict.fromkeys(_VERDICTS.values(), 0)
        """Requests the connector's admission deferred or refused because held claims were in
        their way (its ``active_request_deferred`` / ``_refused`` events), every request's:
        this gateway's, another gateway's and those sent straight to vLLM (another tenant)."""

    def holds_any(self, claim_ids: Iterable[str]) -> bool:
        """Whether the connector holds the blocks of any of these claims, as far as the
        gateway has heard (``MirroredClaim.held``); an unknown id holds nothing. A pure query."""
        claims = self.claims
        return any(c is not None and c.held for c in map(claims.get, claim_ids))

    def name_request(self, vllm_id: str, ours: str) -> None:
        """vLLM calls the gateway's request ``ours`` ``vllm_id`` in its events."""
        self._request_ids[vllm_id] = ours
        while len(self._request_ids) > self._max_requests:
            self._request_ids.popitem(last=False)

    def put(self, claim: MirroredClaim) -> MirroredClaim:
        """Keep ``claim`` (one of the same id is replaced), indexed by its blocks; past
        ``max_claims``, the oldest that ended are forgotten."""
        cid = claim.spec.claim_id
        old = self.claims.pop(cid, None)
        if old is not None:
            self._unindex(old)
        self._made += 1
        claim.made = self._made
        self.claims[cid] = claim
        for h in claim.hashes:
            self._covering.setdefault(h, {})[cid] = None
        forget_ended(self.claims, self._max_claims, _has_ended, self._unindex)
        return claim

    def covering(self, hashes: set[BlockHash]) -> list[MirroredClaim]:
        """The kept claims on any of ``hashes``, in the order they were made."""
        covering = self._covering
        ids = {cid for h in hashes for cid in covering.get(h, ())}
        return sorted((self.claims[cid] for cid in ids), key=lambda c: c.made)

    def _unindex(self, claim: MirroredClaim) -> None:
        cid = claim.spec.claim_id
        for h in claim.hashes:
            ids = self._covering.get(h)
            if ids is not None:
                ids.pop(cid, None)
                if not ids:
                    del self._covering[h]

    def restart(self) -> None:
        """A fresh instance: no claim, no event kept; the numbers go on (the past reads as a
        gap)."""
        self.claims.clear()
        self._covering.clear()
        self.events = EventLog(self._source, EVENTS_KEPT, first_seq=self.events.seq)

    def end_all(self, detail: str) -> None:
        """vLLM's engine died: every live claim ends with its event (a materialized one
        ``resident_claim_harmed``, cause ``backend_restart``: its blocks went with the engine;
        one not yet seen resident ``resident_claim_expired``, reason ``backend_restart``)."""
        for claim in self.claims.values():
            if not claim.state.live:
                continue
            name, claim.state, data = backend_restart_end(claim.state is ClaimState.MATERIALIZED)
            claim.end_reason = "harmed" if claim.state is ClaimState.HARMED else BACKEND_RESTART
            claim.held_blocks = 0
            if claim.state is ClaimState.HARMED:  # its predicate held, and went with the engine
                data |= {
                    "predicate": "leading_prefix_at_least",
                    "predicate_before": True,
                    "predicate_after": False,
                }
            self.emit(name, claim.spec.claim_id, None, **data, detail=detail)

    def emit(
        self, name: EventName, claim_id: str | None, request_id: str | None, **data: Any
    ) -> None:
        claim = self.claims.get(claim_id) if claim_id else None
        self.events.emit(
            name,
            claim=claim,
            claim_id=claim_id if claim is None else None,
            request_id=request_id,
            **data,
        )

    def our_request(self, vllm_id: Any) -> str | None:
        """The gateway's request id for vLLM's (which adds ``cmpl-`` and ``-<n>`` suffixes)."""
        if not isinstance(vllm_id, str):
            return None
        candidate = vllm_id
        while candidate:
            if candidate in self._request_ids:
                return self._request_ids[candidate]
            head, sep, _ = candidate.rpartition("-")
            if not sep:
                break
            candidate = head
        return vllm_id

    def absorb(self, answer: ConnectorAnswer) -> None:
        """The connector's new events, in the gateway's stream; claim states follow them."""
        reply = answer.reply
        if reply is not None:
            for key in ("cap_blocks", "max_ttl_s", "max_defer_s"):
                value = getattr(reply, key)
                if value is not None:
                    self.limits[key] = value
        for raw in answer.events:
            name = raw.get("event")
            if name not in _CONTRACT_EVENTS:
                continue
            cid = raw.get("claim_id")
            data = {
                k: v
                for k, v in raw.items()
                if k not in ("seq", "event", "claim_id", "timestamp_ns", "request_id")
            }
            if name == EventName.RESIDENT_CLAIM_MATERIALIZED.value and self.observer is not None:
                continue  # seen in vLLM's own cache instead (_confirm)
            verdict = _VERDICTS.get(name)
            if verdict is not None:
                self.verdicts[verdict] += 1
            claim = self.claims.get(cid) if cid else None
            if claim is not None:
                if name == EventName.RESIDENT_CLAIM_EXPIRED.value:
                    claim.state, claim.end_reason = ClaimState.EXPIRED, str(raw.get("reason"))
                    claim.held_blocks = 0
                elif name == EventName.RESIDENT_CLAIM_DEMOTED.value:
                    claim.state, claim.held_blocks = ClaimState.DEMOTED, 0
            self.emit(EventName(name), cid, self.our_request(raw.get("request_id")), **data)

    def check_key(self, answer: ConnectorAnswer) -> None:
        """The connector's answer to the gateway's first signed operations: an envelope it
        refused (``--claims-key`` is not the key it was started with, or the clocks disagree)
        suspends every claim with why, as a fault does; an accepted one lifts that again."""
        refused = next(
            (r.get("reason") for r in answer.results if r.get("ok") is False and "op" not in r),
            None,
        )
        if refused is not None:
            self.fault = f"{KEY_REFUSED}: {refused} (is --claims-key the connector's key?)"
            log.error("agentclaims: %s", self.fault)
        elif self.fault is not None and self.fault.startswith(KEY_REFUSED):
            self.fault = None

    def refuse(self, spec: ClaimSpec, reason: str, request_id: str | None) -> ClaimDecision:
        """A claim refused before it reached vLLM: its events and decision, as the engine's."""
        claim = self.put(MirroredClaim(spec, ClaimState.SUBMITTED, 0))
        kernel.submitted(self.events, claim, request_id)
        return kernel.refuse(self.events, claim, reason, request_id)

    def decide(
        self, spec: ClaimSpec, answer: ConnectorAnswer, hashes: Sequence[BlockHash]
    ) -> ClaimDecision:
        try:
            result = answer.result_of(spec.claim_id)
        except KeyError:
            result = {
                "decision": "rejected",
                "reason": "the connector did not answer for this claim",
            }
        accepted = result.get("decision") == "accepted"
        state = ClaimState(result.get("state", "refused")) if accepted else ClaimState.REFUSED
        claim = MirroredClaim(
            spec,
            state,
            int(result.get("blocks") or 0),
            hashes=tuple(hashes[: spec.footprint_blocks]),
            end_reason=None if accepted else str(result.get("reason")),
        )
        ttl = result.get("ttl_s")
        if accepted and isinstance(ttl, int | float):  # the connector's clock: held from now
            claim.expires_at_ns = time.time_ns() + int(ttl * 1e9)
        self.put(claim)
        if claim.held and self.observer is not None:
            claim.state = ClaimState.ACCEPTED
            self._confirm(claim)
        state = claim.state
        return ClaimDecision(
            ClaimId(spec.claim_id),
            Decision.ACCEPTED if accepted else Decision.REJECTED,
            state,
            None if accepted else ArbiterAction.REFUSE_RESIDENCY_CLAIM,
            None if accepted else str(result.get("reason")),
        )

    # ------------------------------------------------------------------ the KV-events join
    def _confirm(self, claim: MirroredClaim) -> None:
        """An accepted hold is materialized once vLLM's own events show every claimed block
        stored (the connector holds them; this is the engine saying they are cached)."""
        observer = self.observer
        if observer is None or claim.state is not ClaimState.ACCEPTED or not claim.held:
            return
        wanted = claim.spec.footprint_blocks
        if len(claim.hashes) != wanted or observer.leading_run(claim.hashes) < wanted:
            return  # not every claimed block is known, or not all seen cached yet
        claim.state = ClaimState.MATERIALIZED
        self.emit(
            EventName.RESIDENT_CLAIM_MATERIALIZED,
            claim.spec.claim_id,
            None,
            blocks=len(claim.hashes),
            seen="vllm_kv_events",
        )

    def blocks_stored(self, stored: set[BlockHash]) -> None:
        for claim in self.covering(stored):
            if claim.state is ClaimState.ACCEPTED:
                self._confirm(claim)

    def blocks_lost(self, lost: set[BlockHash], why: str) -> None:
        """vLLM dropped blocks: after a claim's end they are counted as losses after release;
        a claim the gateway still believes held is judged once the connector's latest events
        are in (it may have shed or expired it meanwhile), and is harmed if it still holds."""
        suspects = []
        for claim in self.covering(lost):
            hit = lost.intersection(claim.hashes) - claim.lost
            if not hit:
                continue
            if claim.held:
                suspects.append(claim.spec.claim_id)
            elif claim.state in (ClaimState.EXPIRED, ClaimState.DEMOTED):
                self._count_lost(claim, hit, why)
        if suspects:
            task = asyncio.ensure_future(self._judge(suspects, lost, why))
            self.judging.add(task)
            task.add_done_callback(self.judging.discard)

    def _count_lost(self, claim: MirroredClaim, hit: set[BlockHash], why: str) -> None:
        claim.lost |= hit
        self.emit(
            EventName.RESIDENT_CLAIM_BLOCK_LOST_AFTER_RELEASE,
            claim.spec.claim_id,
            None,
            blocks=len(hit),
            positions=[i for i, h in enumerate(claim.hashes) if h in hit],
            cause=why,
        )

    async def _judge(self, claim_ids: Sequence[str], lost: set[BlockHash], why: str) -> None:
        answer = None
        with contextlib.suppress(BackendError, BackendUnavailable):  # else: judged as known
            answer = await self._ask()
        harmed = []
        async with self._lock:
            if answer is not None:
                self.absorb(answer)
            for cid in claim_ids:
                claim = self.claims.get(cid)
                hit = set() if claim is None else lost.intersection(claim.hashes) - claim.lost
                if claim is None or not hit:
                    continue
                if claim.held:
                    self._harm(claim, hit, why)
                    harmed.append(claim)
                elif claim.state in (ClaimState.EXPIRED, ClaimState.DEMOTED):
                    self._count_lost(claim, hit, why)
        for claim in harmed:  # hand back whatever the connector still holds for it
            with contextlib.suppress(BackendError, BackendUnavailable):
                await self._release(claim.spec.claim_id, claim.spec.owner_scope)

    def _harm(self, claim: MirroredClaim, hit: set[BlockHash], why: str) -> None:
        """A held claim's block left vLLM's cache: the connector failed its one job. The claim
        is harmed, with the cause, and the KV side fails closed (no claim accepted after)."""
        cid = claim.spec.claim_id
        positions = [i for i, h in enumerate(claim.hashes) if h in hit]
        cause = f"vLLM dropped held block(s) {positions} ({why}) while the connector held them"
        claim.lost |= hit
        self.fault = f"claim {cid}: {cause}: a connector bug; claims are suspended"
        log.error("agentclaims: %s", self.fault)
        if claim.state is ClaimState.MATERIALIZED:
            claim.held_blocks = 0
            after = 0 if self.observer is None else self.observer.leading_run(claim.hashes)
            kernel.harm(
                self.events,
                claim,
                cause,
                connector_bug=True,
                predicate="leading_prefix_at_least",
                leading_run_after=after,
                positions=positions,
            )

    def owned(self, claim_id: str, owner_scope: str) -> MirroredClaim:
        return owned_claim(self.claims, claim_id, owner_scope)

    @staticmethod
    def end(claim: MirroredClaim) -> None:
        """A released claim the connector did not hold (demoted, best effort) ends here."""
        if claim.end_reason is None:
            claim.state, claim.end_reason, claim.held_blocks = ClaimState.EXPIRED, "released", 0

    def view(self, claim: MirroredClaim) -> ClaimView:
        held = claim.held_blocks
        return claim.view(
            present_blocks=held,
            holds=claim.state is ClaimState.MATERIALIZED and held >= claim.spec.footprint_blocks,
            expires_at_ns=claim.expires_at_ns,
        )
