"""Reactions around a tool call: what the session does when the claim that should hold an
agent's prefix across the tool was refused, or cannot be renewed to the predicted tool time.

The session's reaction policy (``ReactionPolicy.on_refused``) applies to the tool call itself,
as it starts:

* ``defer``: the tool starts at once, and the session asks again (the planned claim, or the
  renewal) while it runs, backing off (``initial_delay_s`` doubling up to ``max_delay_s``)
  until it holds the claim as planned, the policy's ``deadline_s`` passes or the tool ends
  (``defer``, run beside the tool by ``SessionTools``). Waiting before the tool would keep the prefix no better (it is not
  claimed meanwhile either) and would delay the agent by the wait: the agent's completion
  time is the measure, so the wait overlaps the tool;
* ``reroute``: move the session to a member of its pool that accepts the claim (one where the
  prefix is resident first), so the tool's follow-up LLM call goes there; without a pool or a
  member that accepts, as ``defer``;
* ``relax``: run the tool under a weaker claim (the next mode down, with the wanted TTL);
* ``fail``: raise ``ClaimRefused`` before the tool starts.

Every decision is logged (``reaction_<kind>``) with the tool, the claim and the reason.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentclaims.contract import PrefixId, ProtectionMode, prefix_blocks
from agentclaims.errors import BackendError, ClaimRefused, UsageError
from agentclaims.planner import ClaimPlan, PrefixContext
from agentclaims.session.held import Wanted

if TYPE_CHECKING:
    from agentclaims.session.held import HeldClaim
    from agentclaims.session.state import SessionState

__all__ = ["ToolCase", "Wanted", "defer", "hold_for_tool"]


async def hold_for_tool(
    session: SessionState, tool: str, agent: str, predicted_s: float
) -> tuple[HeldClaim | None, ToolCase | None]:
    """Make sure ``agent``'s prefix is held as planned across ``tool`` (predicted to take
    ``predicted_s``), applying the session's reaction when it is not: the claim held then,
    and under ``defer`` the case to ask again for while the tool runs (``defer``)."""
    io = session.io
    held = io.held.get(agent)
    want_ttl = predicted_s * session.planner.policy.ttl_margin
    wanted = session.wanted.get(agent)
    if wanted is not None and (held is None or held.plan.mode is not wanted.plan.mode):
        problem, reason = "refused", wanted.refusal or io.last_refusal or "refused"
        del session.wanted[agent]  # reacted to once (parallel tool calls do not wait again)
    elif held is not None and session.planner.policy.needs_renewal(held.plan.ttl_s, want_ttl):
        if await io.renew(session.route.named(held.backend), held, want_ttl):
            return held, None
        problem, reason = "renewal_refused", io.last_refusal or "renewal refused"
    else:
        return held, None
    policy = session.reaction.on_refused
    claim_id = None if held is None else held.claim_id
    fields = {"tool": tool, "node": agent, "reason": f"{problem}: {reason}"}
    if policy == "fail":
        session.stats.fails += 1
        session.log_reaction("fail", claim_id=claim_id, outcome=problem, **fields)
        raise ClaimRefused(
            f"tool {tool!r} not started: the claim on {agent}'s prefix was {problem} "
            f"({reason}); reaction fail"
        )
    case = ToolCase(session, agent, held, wanted, want_ttl, problem, fields)
    if policy == "relax":
        return await _relax(case), None
    if policy == "reroute":
        moved = await _reroute(case)
        if moved is not None:
            return moved, None
    return held, case


@dataclass(slots=True)
class ToolCase:
    """One tool call whose claim is not as planned: what the reactions work from."""

    session: SessionState
    agent: str
    held: HeldClaim | None
    wanted: Wanted | None
    want_ttl: float
    problem: str
    fields: dict[str, str]


def _plan_for(
    held: HeldClaim | None, wanted: Wanted | None, want_ttl: float
) -> tuple[PrefixId, ClaimPlan, PrefixContext] | None:
    """What to ask for again: the wanted claim, or the held one renewed to ``want_ttl``."""
    if wanted is not None:
        plan = wanted.plan
        if plan.mode in (ProtectionMode.HARD_PROTECTED, ProtectionMode.EXPIRING):
            plan = ClaimPlan(plan.mode, max(plan.ttl_s or 0.0, want_ttl), plan.reason)
        return wanted.prefix_id, plan, wanted.ctx
    if held is None:
        return None
    plan = ClaimPlan(held.plan.mode, want_ttl, held.plan.reason)
    return held.prefix_id, plan, PrefixContext(held.prefix_id, _blocks(held.prefix_id))


def _blocks(prefix_id: str) -> int:
    return prefix_blocks(prefix_id)


async def _swap(
    session: SessionState, agent: str, old: HeldClaim | None, new: HeldClaim, reason: str
) -> HeldClaim:
    """Hold ``new`` for ``agent``, letting ``old`` go."""
    session.io.held[agent] = new
    session.wanted.pop(agent, None)
    if old is not None and old is not new:
        await session.io.release(session.route.named(old.backend), old, reason)
    return new


async def defer(case: ToolCase, sleep: Callable[[float], Awaitable[None]]) -> HeldClaim | None:
    """Ask again for what ``case`` wanted, backing off between attempts, until it is held as
    planned or ``deadline_s`` passes (the tool's end cancels it: ``SessionTools``). Each
    attempt takes the keeper's lock, its waits do not. The claim held in the end."""
    session, agent, held, want_ttl = case.session, case.agent, case.held, case.want_ttl
    problem, fields = case.problem, case.fields
    io = session.io
    reaction = session.reaction
    again = _plan_for(held, case.wanted, want_ttl)
    if again is None:
        return held
    prefix_id, plan, ctx = again
    waited, delay, attempt = 0.0, reaction.initial_delay_s, 0
    try:
        while waited + delay <= reaction.deadline_s:
            attempt += 1
            session.stats.deferrals += 1
            session.stats.deferral_s += delay
            session.log_reaction(
                "defer",
                claim_id=None if held is None else held.claim_id,
                outcome=problem,
                delay_s=round(delay, 6),
                attempt=attempt,
                **fields,
            )
            await sleep(delay)
            waited += delay
            async with session.keeper.lock:
                if io.held.get(agent) is not held:
                    return io.held.get(agent)  # the node's next call planned anew meanwhile
                if problem == "renewal_refused" and held is not None:
                    if await io.renew(session.route.named(held.backend), held, want_ttl):
                        return held
                else:
                    submit = io.submit(session.backend, agent, prefix_id, plan, ctx, strict=True)
                    new = await _submitted(submit)
                    if new is not None:
                        return await _swap(session, agent, held, new, "superseded")
            delay = min(delay * 2, reaction.max_delay_s)
        why = "its deadline passed"
    except asyncio.CancelledError:
        why = "the tool ended first"
        _drop(case, held, waited, why)
        raise
    _drop(case, held, waited, why)
    return held


async def _submitted(submit: Awaitable[HeldClaim | None]) -> HeldClaim | None:
    """``submit``'s claim, the submission carried to its end even if the tool ends meanwhile
    (the deferral is cancelled then): the engine may have accepted it already, and a claim it
    holds that the session does not know of would stay held until its TTL. A claim that lands
    so is returned all the same (held, not lost); none: the cancellation goes on."""
    task = asyncio.ensure_future(submit)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        if task.cancelled() or task.exception() is not None or task.result() is None:
            raise
        return task.result()


def _drop(case: ToolCase, held: HeldClaim | None, waited: float, why: str) -> None:
    fields = case.fields
    case.session.log_reaction(
        "drop",
        claim_id=None if held is None else held.claim_id,
        outcome=case.problem,
        waited_s=round(waited, 6),
        **{**fields, "reason": f"{fields['reason']}; {why}: the tool ran under what is held"},
    )


async def _relax(case: ToolCase) -> HeldClaim | None:
    """Run under a weaker claim: what submission already relaxed to, or the held claim one
    mode down with the wanted TTL when its renewal was refused."""
    held, wanted = case.held, case.wanted
    if wanted is not None:  # the submission relaxed already: say so, for the tool
        case.session.log_reaction(
            "relax",
            claim_id=None if held is None else held.claim_id,
            from_mode=None if wanted.plan.mode is None else wanted.plan.mode.value,
            to_mode=None if held is None or held.plan.mode is None else held.plan.mode.value,
            **case.fields,
        )
        return held
    assert held is not None
    fields = {k: v for k, v in case.fields.items() if k != "node"}
    return await case.session.keeper.relax_one(
        case.agent, held, case.want_ttl, "relaxed for a tool call", **fields
    )


async def _reroute(case: ToolCase) -> HeldClaim | None:
    """Move to a pool member that accepts the claim; ``None`` when none does (or no pool)."""
    session, agent, fields = case.session, case.agent, case.fields
    route = session.route
    again = _plan_for(case.held, case.wanted, case.want_ttl)
    if route.pool is None or again is None:
        return None
    prefix_id, plan, ctx = again
    old = session.backend
    for candidate in await route.candidates([prefix_id]):
        try:
            new = await session.io.submit(candidate, agent, prefix_id, plan, ctx, strict=True)
        except (UsageError, BackendError):  # e.g. the prefix is unknown there
            continue
        if new is not None:
            break
    else:
        return None
    await session.lifecycle.release_all(reason="rerouted")
    new_backend = route.move_to(candidate.name)
    session.io.held[agent] = new
    session.wanted.pop(agent, None)
    session.stats.reroutes += 1
    session.log_reaction(
        "reroute",
        claim_id=new.claim_id,
        from_backend=old.name,
        to_backend=new_backend.name,
        **fields,
    )
    return new
