"""The session's claim I/O: submit, renew, release, and the events that follow them.

``ClaimIO`` holds the claims of one session (one per agent node), talks to backends only
through the claims protocol, and takes the session's events after every call (never only at
the end: ``ClaimEvents``, in ``events``), so each lands in the outcome log as it happens and a
claim's state here is the backend's. What each backend's descriptor says is read once
(``BackendFacts``, in ``facts``). What to do about an event (renew, re-plan, drop, fail) is
the session's reaction policy; ``ClaimIO`` reports which held claims lapsed or were harmed.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import structlog

from agentclaims.contract import (
    ArbiterAction,
    ClaimEvent,
    ClaimId,
    ClaimSpec,
    EventName,
    OwnerScope,
    PrefixId,
    ProtectionMode,
    ReuseHint,
)
from agentclaims.errors import (
    BackendError,
    ClaimOutcomeError,
    ClaimRefused,
    UsageError,
)
from agentclaims.lowering import MappingResult, honours
from agentclaims.planner import (
    ClaimPlan,
    PlannerPolicy,
    PrefixContext,
    claim_down_the_ladder,
    relax_mode,
)
from agentclaims.protocol import SEQUENCE_OBJECT, ClaimDecision, EventPage, Renewal
from agentclaims.session.events import ClaimEvents, EventOutcomes
from agentclaims.session.facts import BackendFacts
from agentclaims.session.held import HeldClaim
from agentclaims.session.reactions import ReactionPolicy

if TYPE_CHECKING:
    from agentclaims.observability import WorkflowLog
    from agentclaims.protocol import ClaimsProtocol

__all__ = [
    "PIN_MODES",
    "PIN_RIDE_S",
    "ClaimIO",
    "EventOutcomes",
    "HeldClaim",
    "protects_at_least",
    "release_at_once",
]

_log = structlog.get_logger("agentclaims.session")

DONE_REASONS = frozenset({"session_end", "rerouted", "reuse_unlikely"})
"""End reasons after which nothing here uses the prefix again (the run ended, it moved to
another instance, its reuse became unlikely): released ``done``, so the KV side evicts those
blocks first (released without it they would wait as the freshest and outlive prefixes used
since)."""
PIN_MODES = (ProtectionMode.EXPIRING, ProtectionMode.HARD_PROTECTED)
"""The modes that pin with a TTL (a release of one is sent at once, unless its TTL is about to
end: ``PIN_RIDE_S``)."""
PIN_RIDE_S = 1.0
"""A pin let go whose TTL ends within this many seconds is not released on its own: the release
rides on the session's next call, or the TTL ends it first. Its blocks stay pinned that long
at most, which costs less than a request of its own."""
_STRENGTH = (
    ProtectionMode.HARD_PROTECTED,
    ProtectionMode.EXPIRING,
    ProtectionMode.SOFT_PRIORITY,
    ProtectionMode.DEMOTABLE,
    ProtectionMode.OFFLOADABLE,
    ProtectionMode.BEST_EFFORT,
)
"""Every mode, strongest first."""
_FALLBACK = tuple(m for m in _STRENGTH if m is not ProtectionMode.OFFLOADABLE)
"""Strongest first: a mode the backend does not honour falls back to the next it does (a soft
claim to demotable: kept under pressure until demoted, with the event, instead of dropped)."""


def protects_at_least(mode: ProtectionMode, than: ProtectionMode) -> bool:
    """Whether ``mode`` protects at least as strongly as ``than``."""
    return _STRENGTH.index(mode) <= _STRENGTH.index(than)


REFUSAL_MEMORY_S = 1.0
"""How long a refusal of a riding claim's mode steers the session's next riding claims one
mode down (the backend's room changes as other calls come and go: after that, it asks
again)."""


def log_planned(
    log: WorkflowLog | None,
    claim_id: str,
    prefix_id: str,
    mode: ProtectionMode,
    ttl: float | None,
    ctx: PrefixContext,
    plan: ClaimPlan,
    node: str,
) -> None:
    """The ``claim_planned`` line of a claim the session submits: its mode and TTL, the
    evidence it was planned on, and the seconds it was expected to save and to cost."""
    if log is not None:
        log.claim_planned(
            claim_id=claim_id,
            prefix_id=prefix_id,
            mode=mode.value,
            ttl_s=ttl,
            ste=ctx.ste,
            reuse_probability=round(ctx.reuse_probability, 6),
            reason=plan.reason,
            node=node,
            expected_wait_s=ctx.expected_wait_s,
            wait_learned=ctx.wait_learned,
            saving_s=plan.saving_s,
            cost_s=plan.cost_s,
        )


class ClaimIO:
    """The claims of one session, and every claim round trip it makes."""

    _ids = itertools.count(1)

    def __init__(
        self,
        session_id: str,
        owner_scope: OwnerScope,
        policy: PlannerPolicy,
        reaction: ReactionPolicy,
        stats: Any,
        clock: Callable[[], float],
        log: Callable[[], WorkflowLog | None],
    ) -> None:
        self.session_id = session_id
        self.owner_scope = owner_scope
        self.policy = policy
        self.reaction = reaction
        self.stats = stats
        self.clock = clock
        self.outcome_log = log
        """The session's outcome log, if it writes one (asked each time: it opens on entering)."""
        self.held: dict[str, HeldClaim] = {}  # node -> claim held for its next call
        self.ended: list[HeldClaim] = []
        self.facts = BackendFacts()
        """What each backend's descriptor says (read once)."""
        self.releasing: list[HeldClaim] = []
        """Claims let go that ride on this session's next call to their backend
        (``claims_ride_on_requests``): still this session's until that call's answer
        confirms them (or the session's end releases them on their own)."""
        self.calling: str | None = None
        """The node of the LLM call in flight (reactions to it are logged under it)."""
        self.request_nodes: dict[str, str] = {}  # request id -> node, for its events' lines
        self.last_refusal: str | None = None
        """Why the backend last refused a claim or a renewal (its reason)."""
        self.events = ClaimEvents(self)
        """The events of these claims, taken after every call."""
        self._refused_lately: dict[tuple[str, ProtectionMode], float] = {}
        """(backend, mode) -> when a claim riding in that mode was last refused: the backend
        had no room for it then (see ``REFUSAL_MEMORY_S``)."""

    def log_reaction(self, kind: str, **fields: Any) -> None:
        log = self.outcome_log()
        if log is not None:
            if fields.get("node") is None:
                fields["node"] = self.node_of(fields.get("claim_id"), fields.get("request_id"))
            log.reaction(kind, **fields)

    def node_of(self, claim_id: str | None, request_id: str | None = None) -> str | None:
        """The node a claim (or a request) is for, when this session knows it; else the node
        of the call in flight."""
        if claim_id is not None:
            for held in (*self.held.values(), *self.ended):
                if held.claim_id == claim_id:
                    return held.node
        if request_id is not None and request_id in self.request_nodes:
            return self.request_nodes[request_id]
        return self.calling

    async def honoured(
        self, backend: ClaimsProtocol, mode: ProtectionMode | None, node: str, prefix_id: str
    ) -> ProtectionMode | None:
        """``mode``, or where ``backend`` does not honour it the mode ``_unproven`` relaxes
        it to (``None``: no claim), each such step counted and logged."""
        verdicts = await self.facts.lowering(backend)
        while mode is not None and not honours(verdicts[mode].lowering_class):
            mode = self._unproven(backend, mode, verdicts, node, PrefixId(prefix_id))
        return mode

    async def riding(
        self,
        backend: ClaimsProtocol,
        node: str,
        plan: ClaimPlan,
        ctx: PrefixContext,
        reuse_hint: ReuseHint | None,
    ) -> tuple[dict[str, Any], ClaimPlan] | None:
        """The claim to send with ``node``'s next call on what it leaves cached
        (``@sequence``): its wire object and the plan it carries (the mode ``backend``
        honours), planned and logged as a claim submitted on its own is; ``None``: no claim."""
        mode = await self.honoured(backend, plan.mode, node, SEQUENCE_OBJECT)
        now = self.clock()
        while mode is not None and (
            now - self._refused_lately.get((backend.name, mode), -REFUSAL_MEMORY_S)
            < REFUSAL_MEMORY_S
        ):
            # refused in this mode a moment ago: ask one mode down at once, not after another
            # refusal and a claim request of its own
            weaker = relax_mode(mode, self.policy.soft_mode)
            plan = ClaimPlan(weaker, plan.ttl_s, f"{plan.reason}; {mode.value} refused lately")
            mode = weaker
        if mode is None:
            return None
        claim_id = ClaimId(f"{self.session_id}-c{next(self._ids)}")
        ttl = plan.ttl_for(mode, self.policy.default_ttl_s)
        wire: dict[str, Any] = {
            "claim_id": claim_id,
            "owner_scope": self.owner_scope,
            "object_id": SEQUENCE_OBJECT,
            "cache_identity": (await self.facts.identity(backend)).to_dict(),
            "protection_mode": mode.value,
            "ttl_s": ttl,
        }
        if reuse_hint is not None:
            wire["reuse_hint"] = reuse_hint.to_dict()
        log_planned(self.outcome_log(), claim_id, SEQUENCE_OBJECT, mode, ttl, ctx, plan, node)
        self.stats.claims_submitted += 1
        return wire, ClaimPlan(mode, ttl, plan.reason, plan.saving_s, plan.cost_s)

    def adopt(
        self,
        backend: ClaimsProtocol,
        node: str,
        claim_id: str,
        plan: ClaimPlan,
        extension: Mapping[str, Any],
        prefix_id: str | None,
    ) -> HeldClaim | None:
        """The riding claim ``claim_id`` as its call's answer decided it (``decisions`` in
        the answer's ``extension``): held, or ``None`` when refused (counted, its reason in
        ``last_refusal``; a call answered without its decision is refused too: fail closed)."""
        raw = next(
            (d for d in extension.get("decisions") or () if d.get("claim_id") == claim_id), None
        )
        try:
            decision = None if raw is None else ClaimDecision.from_dict(raw)
        except UsageError:
            decision = None
        st = self.stats
        if decision is not None and not decision.accepted and plan.mode is not None:
            self._refused_lately[(backend.name, plan.mode)] = self.clock()
        if decision is None or not decision.accepted or prefix_id is None:
            st.claims_refused += 1
            self.last_refusal = (
                "the answer carried no decision for the claim"
                if decision is None
                else decision.reason or "refused"
            )
            return None
        assert plan.mode is not None
        st.claims_accepted += 1
        st.modes[plan.mode.value] = st.modes.get(plan.mode.value, 0) + 1
        return HeldClaim(
            ClaimId(claim_id),
            node,
            PrefixId(prefix_id),
            plan,
            backend.name,
            self.clock(),
            state=decision.state.value,
        )

    def let_go(self, held: HeldClaim, reason: str) -> None:
        """Let ``held`` go with this session's next call to its backend (it rides there)."""
        held.end_reason = reason
        self.releasing.append(held)

    def released_with_call(self, claims: Sequence[HeldClaim], extension: Mapping[str, Any]) -> None:
        """Claims that rode on a call as releases: ended, with the states its answer gave."""
        states = released_states(extension)
        for held in claims:
            if held not in self.releasing:
                continue  # ended meanwhile (lost with its instance)
            self.releasing.remove(held)
            held.state = states.get(held.claim_id, "unknown")
            self.ended.append(held)
            self.log_end(held, held.end_reason or "superseded")

    def _unproven(
        self,
        backend: ClaimsProtocol,
        mode: ProtectionMode,
        verdicts: dict[ProtectionMode, MappingResult],
        node: str,
        prefix_id: PrefixId,
    ) -> ProtectionMode | None:
        """Refuse locally a claim in ``mode``, which ``backend`` does not honour: counted as
        refused and logged with the reason, then (``on_unproven="relax"``) the strongest
        weaker mode the backend honours, or (``"refuse"``, or none honoured) no claim."""
        verdict = verdicts[mode]
        self.stats.claims_refused += 1
        why = f"{mode.value} is {verdict.lowering_class.value} on backend {backend.name!r}"
        fields: dict[str, Any] = {
            "outcome": ArbiterAction.REFUSE_RESIDENCY_CLAIM.value,
            "lowering_class": verdict.lowering_class.value,
            "reason": f"{why}: {'; '.join(verdict.reasons)}",
            "prefix_id": prefix_id,
            "node": node,
        }
        if self.reaction.on_unproven == "refuse":
            self.log_reaction("refuse", mode=mode.value, **fields)
            return None
        weaker = (
            next(
                (
                    m
                    for m in _FALLBACK[_FALLBACK.index(mode) + 1 :]
                    if m in verdicts and honours(verdicts[m].lowering_class)
                ),
                None,
            )
            if mode in _FALLBACK
            else None
        )
        self.stats.claims_relaxed += 1
        self.log_reaction(
            "relax",
            from_mode=mode.value,
            to_mode=None if weaker is None else weaker.value,
            **fields,
        )
        return weaker

    async def submit(
        self,
        backend: ClaimsProtocol,
        node: str,
        prefix_id: PrefixId,
        plan: ClaimPlan,
        ctx: PrefixContext,
        reuse_hint: ReuseHint | None = None,
        *,
        strict: bool = False,
    ) -> HeldClaim | None:
        """Submit ``plan`` on ``prefix_id``; a refusal relaxes the mode one step at a time
        (when the policy allows) or, under ``fail``, raises ``ClaimRefused``; ``strict``: a
        refusal just answers ``None`` (its reason in ``last_refusal``). ``reuse_hint`` (what the
        workflow knows about the next use) travels on the claim. A mode the backend does not
        honour (its lowering's class) is never submitted: see ``_unproven``."""
        st = self.stats
        verdicts = await self.facts.lowering(backend)
        held: HeldClaim | None = None
        last: tuple[ClaimId, ClaimDecision] | None = None

        def usable(mode: ProtectionMode) -> ProtectionMode | None:
            if honours(verdicts[mode].lowering_class):
                return mode
            return self._unproven(backend, mode, verdicts, node, prefix_id)

        async def attempt(mode: ProtectionMode) -> bool:
            nonlocal held, last
            claim_id = ClaimId(f"{self.session_id}-c{next(self._ids)}")
            ttl = plan.ttl_for(mode, self.policy.default_ttl_s)
            spec = ClaimSpec(
                claim_id=claim_id,
                owner_scope=self.owner_scope,
                object_id=prefix_id,
                cache_identity=await self.facts.identity(backend),
                footprint_blocks=ctx.footprint_blocks,
                protection_mode=mode,
                ttl_s=ttl,
                reuse_hint=reuse_hint,
            )
            log_planned(self.outcome_log(), claim_id, prefix_id, mode, ttl, ctx, plan, node)
            st.claims_submitted += 1
            decision = await backend.submit_claim(spec)
            if not decision.accepted:
                st.claims_refused += 1
                self.last_refusal = decision.reason or "refused"
                last = (claim_id, decision)
                return False
            st.claims_accepted += 1
            st.modes[mode.value] = st.modes.get(mode.value, 0) + 1
            held = HeldClaim(
                claim_id,
                node,
                prefix_id,
                ClaimPlan(mode, ttl, plan.reason),
                backend.name,
                self.clock(),
                state=decision.state.value,
            )
            return True

        def refused(mode: ProtectionMode) -> ProtectionMode | None:
            if strict or last is None:
                return None
            claim_id, decision = last
            return self.react_to_refusal(claim_id, mode, node, prefix_id, decision)

        await claim_down_the_ladder(plan.mode, attempt, usable=usable, refused=refused)
        return held

    def react_to_refusal(
        self,
        claim_id: str,
        mode: ProtectionMode,
        node: str,
        what: str,
        decision: ClaimDecision | None = None,
    ) -> ProtectionMode | None:
        """The session's one reaction to a refused claim (``last_refusal`` says why), made on
        its own or riding on a call: under ``on_refused="fail"`` a ``ClaimRefused`` naming
        ``what`` it was on; else the next weaker mode on the ladder (logged as ``relax``), or
        ``None`` where the session does not relax claims."""
        reason = self.last_refusal
        if self.reaction.on_refused == "fail":
            self.stats.fails += 1
            self.log_reaction("fail", claim_id=claim_id, outcome=reason, node=node)
            raise ClaimRefused(
                f"claim {claim_id} on {what} ({mode.value}) refused: {reason}", outcome=decision
            )
        if not self.reaction.relax_claims:
            return None
        weaker = relax_mode(mode, self.policy.soft_mode)
        self.stats.claims_relaxed += 1
        self.log_reaction(
            "relax",
            claim_id=claim_id,
            outcome=reason,
            from_mode=mode.value,
            to_mode=None if weaker is None else weaker.value,
            node=node,
        )
        return weaker

    async def renew(self, backend: ClaimsProtocol, held: HeldClaim, ttl_s: float) -> bool:
        """Extend ``held`` to ``ttl_s``; False (and logged) when the backend will not."""
        try:
            view = await backend.renew_claim(held.claim_id, self.owner_scope, Renewal(ttl_s=ttl_s))
        except (ClaimOutcomeError, UsageError, BackendError) as exc:
            self.last_refusal = str(exc)
            self.log_reaction("renew", claim_id=held.claim_id, outcome="refused", error=str(exc))
            return False
        held.plan = ClaimPlan(held.plan.mode, ttl_s, held.plan.reason)
        held.state = view.state.value
        self.stats.claims_renewed += 1
        self.log_reaction("renew", claim_id=held.claim_id, outcome=view.state.value, ttl_s=ttl_s)
        return True

    async def release_with_events(self, backend: ClaimsProtocol) -> Callable[..., Any] | None:
        """``backend``'s release whose answer brings the session's events (an agentclaims
        gateway whose answers carry events: ``HTTPBackend.release_claim_with_events``), or
        ``None`` where a release brings none."""
        release = getattr(backend, "release_claim_with_events", None)
        return release if callable(release) and await self.facts.events_ride(backend) else None

    async def release(self, backend: ClaimsProtocol, held: HeldClaim, reason: str) -> None:
        """Release ``held`` (its end reason recorded); a backend gone away is logged."""
        held.end_reason = reason
        done = reason in DONE_REASONS
        extra: dict[str, Any] = {}
        try:
            with_events = await self.release_with_events(backend)
            if with_events is not None:
                # its answer brings the session's events, the release's own: no poll after it
                view, page = await with_events(
                    held.claim_id,
                    self.owner_scope,
                    done=done,
                    events_since=self.events.cursor(backend),
                    id_prefix=self.session_id,
                )
                carried = self.events.carried(backend.name, page)
                harm = None if carried is None else _harm_of(carried, held.claim_id)
                if harm is not None:  # harmed while held, heard only now: its end says so
                    reason = held.end_reason = "harmed"
                    extra["cause"] = harm.data.get("cause")
            else:
                view = await backend.release_claim(held.claim_id, self.owner_scope, done=done)
            held.state = view.state.value
        except ClaimOutcomeError:
            raise
        except Exception as exc:  # a backend gone away must not leak the workflow's error
            _log.warning("claim_release_failed", claim_id=held.claim_id, error=repr(exc))
            held.state = "unknown"
        self.ended.append(held)
        self.log_end(held, reason, **extra)

    def log_end(self, held: HeldClaim, reason: str, **extra: Any) -> None:
        """Log that ``held`` ended (``claim_ended``): why, its last state, how long held."""
        log = self.outcome_log()
        if log is not None:
            log.claim_ended(
                claim_id=held.claim_id,
                node=held.node,
                prefix_id=held.prefix_id,
                mode=None if held.plan.mode is None else held.plan.mode.value,
                state=held.state,
                reason=reason,
                held_s=round(max(0.0, self.clock() - held.since), 6),
                **extra,
            )

    def lose(self, held: HeldClaim, reason: str) -> None:
        """``held`` is gone with the instance that held it (nothing to release): ended, with
        ``reason``, and logged like any other end."""
        if self.held.get(held.node) is held:
            del self.held[held.node]
        held.end_reason, held.state = reason, "unknown"
        self.ended.append(held)
        self.log_end(held, reason)


def _harm_of(page: EventPage, claim_id: ClaimId) -> ClaimEvent | None:
    """``page``'s harm event of ``claim_id``, if it has one."""
    return next(
        (
            ev
            for ev in page.events
            if ev.claim_id == claim_id and ev.event is EventName.RESIDENT_CLAIM_HARMED
        ),
        None,
    )


def released_states(extension: Mapping[str, Any]) -> dict[str, str]:
    """The claims an answer says it released (its ``agentclaims.released``): id -> state."""
    return {
        r["claim_id"]: r["state"]
        for r in extension.get("released") or ()
        if isinstance(r, Mapping)
        and isinstance(r.get("claim_id"), str)
        and isinstance(r.get("state"), str)
    }


def release_at_once(held: HeldClaim, now: float, *, room: bool | None = None) -> bool:
    """Whether letting ``held`` go at ``now`` needs a release of its own: a pin whose TTL does
    not end within ``PIN_RIDE_S`` (a soft hold never: the engine sheds it as it needs), unless
    the pool has ``room`` for it beside the agents' working set (``PoolShare.room``): a pin
    left to its TTL there displaces nothing, and its release rides on the next call."""
    if held.plan.mode not in PIN_MODES or room is True:
        return False
    ttl = held.plan.ttl_s
    return ttl is None or held.since + ttl - now > PIN_RIDE_S
