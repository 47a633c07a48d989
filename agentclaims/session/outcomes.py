"""``ClaimOutcomes``: the session's reactions to what its events say happened to its claims.

A harmed claim ends (``harmed``) and, under ``on_harmed="fail"``, raises ``ClaimHarmed``. A
held claim that lapsed (demoted or expired) while its node still waits on its prefix is
renewed, re-planned once per wait (one mode down when the backend shed it for memory), or
dropped, as the reaction policy's ``on_lapsed`` says.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentclaims.errors import ClaimHarmed
from agentclaims.planner import ClaimPlan, relax_mode
from agentclaims.session.claims import protects_at_least

if TYPE_CHECKING:
    from agentclaims.session.events import EventOutcomes
    from agentclaims.session.held import HeldClaim
    from agentclaims.session.state import SessionState

__all__ = ["ClaimOutcomes"]


class ClaimOutcomes:
    """Reacts to harm and lapses of ``session``'s claims."""

    def __init__(self, session: SessionState) -> None:
        self._s = session
        self._replanned: dict[str, float] = {}
        """node -> the start of the wait in which its lapsed claim was re-planned (once)."""

    async def take_events(self) -> None:
        """Take this session's new events and react to what they did to its claims."""
        s = self._s
        await self.react(await s.io.events.take(s.route.backends()))

    async def react(self, taken: EventOutcomes, *, lapses: bool = True) -> None:
        """End the harmed claims (raising ``ClaimHarmed`` under ``fail``); with ``lapses``,
        react to the lapsed ones."""
        s, io = self._s, self._s.io
        share = s.workflow.share
        if share is not None:  # how many of the process's soft holds the engine sheds
            share.note_holds(taken.events)
        for held, ev in taken.harmed:
            s.route.observe_harm()
            if io.held.get(held.node) is held:
                del io.held[held.node]
                held.end_reason = "harmed"
                io.ended.append(held)
                io.log_end(held, "harmed", cause=ev.data.get("cause"))
            cause = ev.data.get("cause")
            if s.reaction.on_harmed == "fail":
                s.stats.fails += 1
                s.log_reaction("fail", claim_id=held.claim_id, outcome=ev.event.value, cause=cause)
                raise ClaimHarmed(
                    f"claim {held.claim_id} on {held.prefix_id} ({held.node}) was harmed: "
                    f"{cause or 'its prefix lost blocks while the claim held'}",
                    claim_id=held.claim_id,
                    event=ev,
                )
        for held, ev in taken.lapsed if lapses else ():
            if io.held.get(held.node) is not held:
                continue  # already let go: nothing to do
            await self._lapsed(held, ev.event.value)

    async def _lapsed(self, held: HeldClaim, what: str) -> None:
        """A held claim was demoted or expired while its node still waits on its prefix."""
        s, io = self._s, self._s.io
        backend = s.route.named(held.backend)
        policy = s.reaction.on_lapsed
        # seen from now, in the node's wait: its remaining time, not the whole wait again
        ctx = s.workflow.context(held.node, held.prefix_id, (), mid_wait=True)
        if policy == "renew" and held.plan.ttl_s is not None:
            if await io.renew(backend, held, ctx.ttl_s or held.plan.ttl_s):
                return
            policy = "replan"
        del io.held[held.node]
        reason = "demoted" if what.endswith("demoted") else "expired"
        await io.release(backend, held, reason)
        # One re-plan per wait: a claim that lapses again before the node's next call would
        # only be claimed again on the same evidence, a pin renewed forever by its heartbeat.
        wait = s.workflow.wait_started(held.node)
        if policy == "replan" and wait is not None and self._replanned.get(held.node) == wait:
            policy = "drop"
        if policy == "drop":
            s.log_reaction("drop", claim_id=held.claim_id, outcome=what, node=held.node)
            return
        if wait is not None:
            self._replanned[held.node] = wait
        plan = s.planner.plan(ctx)
        if reason == "demoted" and held.plan.mode is not None and plan.mode is not None:
            # the backend shed it for memory: the same mode would be shed again. One step
            # down the ladder (on vLLM a demotable hold goes to best effort, which it only
            # watches: no claim, and the reaction says so)
            weaker = relax_mode(held.plan.mode, s.planner.policy.soft_mode)
            if protects_at_least(plan.mode, held.plan.mode):
                plan = ClaimPlan(weaker, plan.ttl_s, f"{plan.reason}; one step below demoted")
        s.stats.claims_replanned += 1
        s.log_reaction(
            "replan",
            claim_id=held.claim_id,
            outcome=what,
            node=held.node,
            to_mode=None if plan.mode is None else plan.mode.value,
        )
        await s.keeper.hold(held.node, held.prefix_id, plan, ctx)
