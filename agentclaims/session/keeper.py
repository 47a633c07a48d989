"""``ClaimKeeper``: the claim on each agent node's prefix, revised after each of its calls.

After an answered call the keeper plans the claim on what the node's conversation leaves
cached and holds it (on its own, or as the call carried it where claims ride on requests),
lets the superseded one go, and releases the claims of other nodes whose reuse became
unlikely. A refused claim is relaxed one mode down or, under ``fail``, raises; what the
planner wanted and did not get waits for the node's next tool call (``toolhold``). With the
default planner (``auto``) it follows what the backend's descriptor says it ranks or sheds by.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentclaims.contract import PrefixId, ReuseHint, prefix_blocks
from agentclaims.errors import BackendUnavailable
from agentclaims.planner import (
    POOL_KEEPS,
    SAVES_LESS,
    ClaimPlan,
    PlannerPolicy,
    PrefixContext,
    relax_mode,
)
from agentclaims.protocol import SEQUENCE_OBJECT
from agentclaims.session.claims import ClaimIO, release_at_once, released_states
from agentclaims.session.held import Wanted
from agentclaims.session.options import UNRANKED
from agentclaims.session.poolshare import DENSER_HOLDS
from agentclaims.session.workflow import wait_key

if TYPE_CHECKING:
    from agentclaims.session.held import HeldClaim
    from agentclaims.session.riding import Riding
    from agentclaims.session.state import SessionState

__all__ = ["ClaimKeeper"]

_END_REASONS = {POOL_KEEPS: "pool_keeps", SAVES_LESS: "saves_less", DENSER_HOLDS: "capacity"}
"""The end reason of a held claim a fresh plan no longer wants, by the plan's reason."""

_RANKED, _HELD, _UNRANKED = "ranked", "held", UNRANKED
"""What ``auto`` plans on a backend that ranks by reuse hints, on one that sheds holds by
their hints and takes claims riding on requests, and on any other."""


class ClaimKeeper:
    """Holds, revises and relaxes ``session``'s claims, one round of claim work at a time."""

    def __init__(self, session: SessionState, *, auto_planner: bool) -> None:
        self._s = session
        self.lock = asyncio.Lock()
        """Held by each round of claim work (after a call, before a tool, a relax)."""
        self._auto_planner = auto_planner
        """The planner follows the backend: ``ranked`` where it ranks by hints, ``held``
        where it sheds holds by their hints and claims ride on its requests, else ``default``
        (until the backend's descriptor is read, ``default``)."""
        self._ranking: str | None = None
        """With ``auto``: the preset the backend last read called for (``None``: not read)."""

    async def follow_backend(self) -> None:
        """With the default planner (``"auto"``): plan ``ranked`` (soft: every prefix claimed
        ``best_effort`` with its reuse hint, ranked by the backend, never harmed) on a backend
        whose descriptor states ``ranks_by_hints``; ``held`` (every likely prefix held
        ``demotable`` with its hint, shed farthest next use first) on one that states
        ``sheds_by_hints`` and ``claims_ride_on_requests`` (vLLM with the connector: a hold
        rides on the call, so holding costs no request); ``default`` on any other. The
        descriptor is the one the claims read anyway (once per backend, again after a
        reroute)."""
        if not self._auto_planner:
            return
        s = self._s
        facts = s.io.facts
        try:
            if await facts.ranks_by_hints(s.backend):
                name = _RANKED
            elif await facts.holds_by_hints(s.backend):
                name = _HELD
            else:
                name = _UNRANKED
        except BackendUnavailable:
            return  # keep planning as before; a claim to submit meets the outage itself
        if name != self._ranking:  # per call: only a change of backend changes it
            self._ranking = name
            policy = PlannerPolicy.named(name)
            s.planner.policy = policy
            s.io.policy = policy

    async def after_call(
        self,
        node: str,
        riding: Riding | None,
        extension: Mapping[str, Any],
        sequence: str | None,
        tool_names: Sequence[str],
    ) -> None:
        """The claim work after ``node``'s answered call (``riding``: what it carried): its
        own claim revised, other nodes' claims released where their reuse became unlikely,
        then the new events taken."""
        async with self.lock:
            if "events" in extension:  # the session's events, up to the answer
                name = riding.backend if riding is not None else self._s.backend.name
                self._s.io.events.carried(name, extension["events"])
            if riding is None:
                await self.replan(node, sequence, tool_names)
            else:
                await self._after_riding(node, riding, extension, sequence, tool_names)
            await self._revise_others(node)
            await self._s.outcomes.take_events()

    async def replan(self, node: str, prefix_id: str | None, tool_names: Sequence[str]) -> None:
        """Claim ``node``'s prefix as planned now; the claim it held before is released."""
        s = self._s
        await self.follow_backend()
        old = s.io.held.pop(node, None)
        if prefix_id:
            ctx, plan = s.workflow.plan_after_call(node, prefix_id, tool_names)
            hint = s.workflow.reuse_hint(node, ctx, tool=wait_key(node, tool_names))
            await self.hold(node, PrefixId(prefix_id), plan, ctx, hint)
        if old is not None:
            await self._end(old, "superseded")

    async def _after_riding(
        self,
        node: str,
        riding: Riding,
        extension: Mapping[str, Any],
        prefix_id: str | None,
        tool_names: Sequence[str],
    ) -> None:
        """A call that carried its claim and releases is answered: the releases end, the
        claim is held as decided, then revised with what the reply says (its tool calls):
        released when its reuse became unlikely (a pin at once, a soft hold with the next
        call), renewed when the wait now expected is longer than its TTL. A refused one is
        relaxed one mode down and claimed on its own; a call that carried none gets the claim
        its reply calls for on its own (``replan``)."""
        s, io = self._s, self._s.io
        io.released_with_call(riding.releases, extension)
        backend = s.route.named(riding.backend)
        if riding.claim_id is None or riding.plan is None:
            # a call that went without a claim by choice (the pool keeps its prefix, or the
            # claim saves less than it costs, and the answer called the tools expected): the
            # claim it held before goes, and none is made on its own (that is a request)
            stands = riding.declined_for(tool_names)
            await self.replan(node, None if stands else prefix_id, tool_names)
            return
        old = io.held.pop(node, None)
        if old is not None:
            io.let_go(old, "superseded")
        held = io.adopt(backend, node, riding.claim_id, riding.plan, extension, prefix_id)
        if held is None:
            await self._riding_refused(node, riding, prefix_id, tool_names)
            return
        if riding.when_done and not tool_names:
            # the agent is done: the gateway let the claim go as it answered
            why = "session_end" if s.workflow.run_ends_when_done else "reuse_unlikely"
            if _ended_with_call(io, held, extension, why):
                share = s.workflow.share
                if share is not None:
                    share.drop((s.workflow.owner, node))
                return
        io.held[node] = held
        s.wanted.pop(node, None)
        made_with_call = getattr(backend, "claimed_with_call", None)
        if callable(made_with_call):  # a fleet: the claim lives where the call was answered
            made_with_call(held.claim_id)
        ctx, plan = s.workflow.plan_after_call(node, held.prefix_id, tool_names)
        if plan.mode is None:  # its reuse became unlikely (the human is next, say)
            del io.held[node]  # or the pool keeps it anyway (its answer said so)
            why = _END_REASONS.get(plan.reason, "reuse_unlikely")
            if release_at_once(held, io.clock(), room=ctx.pool_room):
                await io.release(backend, held, why)  # a pin for a while yet: now
            else:
                io.let_go(held, why)  # with the next call (a pin: unless its TTL ends first)
        elif plan.ttl_s is not None and s.planner.policy.needs_renewal(held.plan.ttl_s, plan.ttl_s):
            await io.renew(backend, held, plan.ttl_s)

    async def _riding_refused(
        self,
        node: str,
        riding: Riding,
        prefix_id: str | None,
        tool_names: Sequence[str],
    ) -> None:
        """The claim a call carried was refused: as ``ClaimIO.submit`` does with a refusal,
        fail (``on_refused="fail"``) or relax one mode down and claim that on its own."""
        assert riding.plan is not None
        assert riding.plan.mode is not None
        assert riding.claim_id is not None
        s = self._s
        reason = s.io.last_refusal
        weaker = s.io.react_to_refusal(
            riding.claim_id, riding.plan.mode, node, f"{node}'s {SEQUENCE_OBJECT}"
        )
        if not prefix_id:
            return
        ctx, plan = s.workflow.plan_after_call(node, prefix_id, tool_names)
        if weaker is not None and plan.mode is not None:
            hint = s.workflow.reuse_hint(node, ctx, tool=wait_key(node, tool_names))
            weaker_plan = ClaimPlan(weaker, plan.ttl_s, plan.reason)
            await self.hold(node, PrefixId(prefix_id), weaker_plan, ctx, hint)
        held = s.io.held.get(node)
        if plan.mode is not None and (held is None or held.plan.mode is not plan.mode):
            # what the planner wanted and did not get: the node's next tool call reacts to
            # it (defer, reroute, relax, fail), as after a claim refused on its own
            s.wanted[node] = Wanted(PrefixId(prefix_id), plan, ctx, reason)

    async def hold(
        self,
        node: str,
        prefix_id: PrefixId,
        plan: ClaimPlan,
        ctx: PrefixContext,
        hint: ReuseHint | None = None,
    ) -> None:
        """Claim ``prefix_id`` for ``node`` as ``plan`` says; what a refusal left unclaimed is
        ``wanted`` (the node's next tool call reacts to it)."""
        s = self._s
        s.wanted.pop(node, None)
        if plan.mode is not None:
            s.io.last_refusal = None
            held = await s.io.submit(s.backend, node, prefix_id, plan, ctx, hint)
            if held is not None:
                s.io.held[node] = held
            if held is None or held.plan.mode is not plan.mode:
                # refused (relaxed, or dropped): a tool call next reacts to it (toolhold)
                s.wanted[node] = Wanted(prefix_id, plan, ctx, s.io.last_refusal)

    async def _revise_others(self, node: str) -> None:
        """Release claims of other nodes whose reuse became unlikely."""
        s, io = self._s, self._s.io
        held = {n: (h.prefix_id, h.plan) for n, h in io.held.items()}
        for other in s.workflow.to_release(held, node):
            await self._end(io.held.pop(other), "reuse_unlikely")

    async def _end(self, claim: HeldClaim, why: str) -> None:
        """Let ``claim`` go: with the next call to its backend where releases ride there and
        it needs no release of its own (``release_at_once``), else released now."""
        io = self._s.io
        backend = self._s.route.named(claim.backend)
        if not release_at_once(claim, io.clock()) and await io.facts.rides(backend):
            io.let_go(claim, why)
        else:
            await io.release(backend, claim, why)

    async def relax_claims(self, claim_ids: Sequence[str]) -> int:
        """Downgrade the claims among ``claim_ids`` one mode each; how many."""
        relaxed = 0
        async with self.lock:
            for node, held in list(self._s.io.held.items()):
                if held.claim_id not in claim_ids or held.plan.mode is None:
                    continue
                await self.relax_one(node, held, held.plan.ttl_s, "relaxed")
                relaxed += 1
        return relaxed

    async def relax_one(
        self, node: str, held: HeldClaim, ttl_s: float | None, why: str, **fields: Any
    ) -> HeldClaim | None:
        """Let ``held`` go and hold its prefix one mode weaker (``ClaimedSession.relax_one``)."""
        s, io = self._s, self._s.io
        assert held.plan.mode is not None
        weaker = relax_mode(held.plan.mode, io.policy.soft_mode)
        del io.held[node]
        await io.release(s.route.named(held.backend), held, "relaxed")
        s.stats.claims_relaxed += 1
        s.log_reaction(
            "relax",
            claim_id=held.claim_id,
            from_mode=held.plan.mode.value,
            to_mode=None if weaker is None else weaker.value,
            node=node,
            **fields,
        )
        if weaker is None:
            return None
        ctx = PrefixContext(held.prefix_id, prefix_blocks(held.prefix_id))
        await self.hold(node, held.prefix_id, ClaimPlan(weaker, ttl_s, why), ctx)
        return io.held.get(node)


def _ended_with_call(
    io: ClaimIO, held: HeldClaim, extension: Mapping[str, Any], reason: str
) -> bool:
    """Whether the answer that made ``held`` also released it (``release_when_done``): then
    it ended there, for ``reason``, with the state the answer gave."""
    state = released_states(extension).get(held.claim_id)
    if state is None:
        return False
    held.state, held.end_reason = state, reason
    io.ended.append(held)
    io.log_end(held, reason)
    return True
